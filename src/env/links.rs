//! Links of one case or one worker: proxies of its own in front of Redis, Postgres and each
//! backend, so the faults it receives (partitions, toxics) touch nothing else and, when recorded,
//! every round trip through them is attributed to it. A link set is reused from case to case; a
//! [`WireRoute`] says whose round trips it carries right now.

use crate::env::proxy::{FaultProxy, Proxy};
use crate::wire::{Holder, Request, RoundTrip, Sink, WireEvent, WireListener};
use futures::future::BoxFuture;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

/// A proxy made for one case, deleted when dropped.
#[derive(Debug)]
pub struct DedicatedProxy {
    pub(crate) proxy: Proxy,
    pub(crate) api: FaultProxy,
}

impl std::ops::Deref for DedicatedProxy {
    type Target = Proxy;
    fn deref(&self) -> &Proxy {
        &self.proxy
    }
}

impl Drop for DedicatedProxy {
    fn drop(&mut self) {
        // Drop cannot await: delete on the runtime if there is one (the proxy goes away right
        // after), else on a runtime of its own before returning.
        let api = self.api.clone();
        let name = self.proxy.name().to_owned();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let _ = api.delete(&name).await;
                });
            }
            Err(_) => {
                if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    let _ = rt.block_on(api.delete(&name));
                }
            }
        }
    }
}

/// Links of one case: proxies of its own in front of Redis, Postgres and (optionally) every
/// backend, so the faults it injects (partitions, toxics) touch no other case. Dropping it
/// deletes the proxies.
#[derive(Debug)]
pub struct CaseLinks {
    /// The case's proxy in front of Redis.
    pub redis: DedicatedProxy,
    /// The case's proxy in front of Postgres.
    pub postgres: DedicatedProxy,
    /// The case's proxy in front of each version's backend (empty unless asked for).
    pub backends: std::collections::BTreeMap<String, DedicatedProxy>,
    pub(crate) redis_url: String,
    pub(crate) database_url: String,
    /// Where recorded round trips go (None: not recorded).
    pub(crate) route: Option<Arc<WireRoute>>,
}

impl CaseLinks {
    /// Sends the round trips through these links to `listener`, attributed to `worker`, until
    /// [`CaseLinks::stop_recording`]; false if the links are not recorded.
    pub fn record(&self, worker: &str, listener: WireListener) -> bool {
        match &self.route {
            Some(route) => {
                *route.current.write().expect("poisoned") = Some((worker.to_owned(), listener));
                true
            }
            None => false,
        }
    }

    /// Stops delivering round trips (they are dropped until the next [`CaseLinks::record`]).
    pub fn stop_recording(&self) {
        if let Some(route) = &self.route {
            *route.current.write().expect("poisoned") = None;
        }
    }

    /// Asks `holder` before every client request through these links is forwarded (`None`: let
    /// everything through); false if the links cannot hold (not recorded, or opened without
    /// holds: [`crate::env::TestBed::links_with`]).
    pub fn hold(&self, holder: Option<Arc<dyn Holder>>) -> bool {
        match &self.route {
            Some(route) if route.holdable => {
                *route.holder.write().expect("poisoned") = holder;
                true
            }
            _ => false,
        }
    }

    /// Whether the holder of these links holds a request of the Redis link now (a command sent
    /// after it on the same connection waits behind it).
    pub fn holds_redis(&self) -> bool {
        self.route.as_ref().is_some_and(|route| {
            route
                .holder
                .read()
                .expect("poisoned")
                .as_ref()
                .is_some_and(|holder| holder.holding(self.redis.name()))
        })
    }

    /// The proxy (link) names of these links with their services (`redis`, `postgres`,
    /// `backend:{version}`), as round trips and holders name them.
    pub fn services(&self) -> Vec<(String, String)> {
        let mut out = vec![
            (self.redis.name().to_owned(), "redis".to_owned()),
            (self.postgres.name().to_owned(), "postgres".to_owned()),
        ];
        for (version, proxy) in &self.backends {
            out.push((proxy.name().to_owned(), format!("backend:{version}")));
        }
        out
    }

    /// The server processes of the Postgres connections made through these links (recorded
    /// links only), oldest first.
    pub fn backend_pids(&self) -> Vec<i32> {
        self.route.as_ref().map_or_else(Vec::new, |route| {
            route
                .pids
                .lock()
                .expect("poisoned")
                .iter()
                .copied()
                .collect()
        })
    }

    /// The client addresses (as the proxy saw each peer) of the connections through any of
    /// `links` (proxy names) with a request in flight now: started, not yet answered nor ended.
    /// Empty unless the links are recorded and holdable (their taps see requests start).
    pub fn in_flight(&self, links: &[&str]) -> Vec<SocketAddr> {
        self.route.as_ref().map_or_else(Vec::new, |route| {
            let mut out: Vec<SocketAddr> = route
                .conns
                .lock()
                .expect("poisoned")
                .iter()
                .filter(|((link, _), c)| links.contains(&link.as_str()) && c.started > c.finished)
                .map(|(_, c)| c.client)
                .collect();
            out.sort_unstable();
            out
        })
    }

    /// The proxy names of the links to the model backends.
    pub fn backend_links(&self) -> Vec<&str> {
        self.backends.values().map(|proxy| proxy.name()).collect()
    }

    /// Whether the links are recorded.
    pub fn is_recorded(&self) -> bool {
        self.route.is_some()
    }

    /// Redis URL through the case's proxy.
    pub fn redis_url(&self) -> &str {
        &self.redis_url
    }

    /// Postgres URL through the case's proxy.
    pub fn database_url(&self) -> &str {
        &self.database_url
    }

    /// Base URL of `version`'s backend through the case's proxy, if the links include backends.
    pub fn backend_url(&self, version: &str) -> Option<String> {
        self.backends
            .get(version)
            .map(|proxy| format!("http://{}", proxy.listen()))
    }
}

/// Where a link set's round trips go now: a link set serves one worker of one case at a time.
#[derive(Default)]
pub struct WireRoute {
    current: RwLock<Option<(String, WireListener)>>,
    /// Who decides on holds now (issue 13's wire scheduler), if anyone.
    holder: RwLock<Option<Arc<dyn Holder>>>,
    /// The taps ask [`WireRoute::holder`] (set at creation: a tap that may hold frames a request
    /// whole before forwarding it, which links that never hold need not pay for).
    pub(crate) holdable: bool,
    /// The server processes of the Postgres connections made through these links, recorded or
    /// not, newest last (bounded): a trigger's `pg_backend_pid()` names one of them when these
    /// links carried the write.
    pids: std::sync::Mutex<std::collections::VecDeque<i32>>,
    /// Per connection of these links (link name, the engine's id): the client's address and how
    /// many of its requests were started and finished, so a fault can find the connection, and
    /// through it the process, that has a request in flight (holdable routes only: their taps
    /// ask the holder as each request starts).
    conns: std::sync::Mutex<HashMap<(String, u64), Conn>>,
}

/// One connection through a link set, as its tap saw it.
#[derive(Debug, Clone, Copy)]
struct Conn {
    client: SocketAddr,
    started: u64,
    finished: u64,
}

/// Connections a link set remembers; idle ones are forgotten first beyond this.
const CONNS_KEPT: usize = 4096;

/// Server processes a link set remembers (a worker's reconnects after partitions and restarts).
const PIDS_KEPT: usize = 256;

impl std::fmt::Debug for WireRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let worker = self
            .current
            .read()
            .ok()
            .and_then(|c| c.as_ref().map(|(w, _)| w.clone()));
        f.debug_struct("WireRoute")
            .field("worker", &worker)
            .finish()
    }
}

impl WireRoute {
    /// The tap sink of one service of the link set.
    pub(crate) fn sink(self: &Arc<Self>, service: String) -> Arc<dyn Sink> {
        Arc::new(RouteSink {
            route: Arc::clone(self),
            service,
        })
    }
}

impl WireRoute {
    /// A route whose taps ask a holder.
    pub(crate) fn holdable() -> WireRoute {
        WireRoute {
            holdable: true,
            ..WireRoute::default()
        }
    }

    /// The tap holder of the link set: asks whoever [`CaseLinks::hold`] names.
    pub(crate) fn holder(self: &Arc<Self>) -> Arc<dyn Holder> {
        Arc::new(RouteHolder {
            route: Arc::clone(self),
        })
    }
}

struct RouteHolder {
    route: Arc<WireRoute>,
}

impl Holder for RouteHolder {
    fn before(
        &self,
        link: &str,
        conn: u64,
        first: u64,
        requests: &[Request],
    ) -> Option<BoxFuture<'static, crate::wire::Release>> {
        if let Some(known) = self
            .route
            .conns
            .lock()
            .expect("poisoned")
            .get_mut(&(link.to_owned(), conn))
        {
            known.started = known.started.max(first + requests.len() as u64);
        }
        let holder = self.route.holder.read().expect("poisoned").clone();
        holder.and_then(|holder| holder.before(link, conn, first, requests))
    }
}

struct RouteSink {
    route: Arc<WireRoute>,
    service: String,
}

impl Sink for RouteSink {
    fn opened(&self, link: &str, conn: u64, client: SocketAddr) {
        let mut conns = self.route.conns.lock().expect("poisoned");
        if conns.len() >= CONNS_KEPT {
            conns.retain(|_, c| c.started > c.finished);
        }
        conns.insert(
            (link.to_owned(), conn),
            Conn {
                client,
                started: 0,
                finished: 0,
            },
        );
    }

    fn opaque(&self, link: &str, conn: u64, _reason: &str) {
        // Nothing more comes from it: it can no longer be seen in flight.
        self.route
            .conns
            .lock()
            .expect("poisoned")
            .remove(&(link.to_owned(), conn));
    }

    fn round_trip(&self, trip: RoundTrip) {
        if let Some(known) = self
            .route
            .conns
            .lock()
            .expect("poisoned")
            .get_mut(&(trip.link.clone(), trip.conn))
        {
            known.finished = known.finished.max(trip.seq + 1);
        }
        if let Request::Postgres(crate::wire::PgRequest::Startup(startup)) = &trip.request
            && let Some(pid) = startup.backend_pid
        {
            let mut pids = self.route.pids.lock().expect("poisoned");
            if pids.len() >= PIDS_KEPT {
                pids.pop_front();
            }
            pids.push_back(pid);
        }
        let current = self.route.current.read().expect("poisoned");
        if let Some((worker, listener)) = current.as_ref() {
            listener(WireEvent {
                worker: worker.clone(),
                service: self.service.clone(),
                trip,
            });
        }
    }
}
