//! A fault-injecting TCP proxy server that speaks Shopify Toxiproxy's HTTP API (v2, JSON) on top of
//! the `noxious` proxy engine, so racecert can put latency, timeouts, bandwidth limits, connection
//! resets and outages between the services under test and their clients, driven by the usual
//! Toxiproxy clients (`toxiproxy_rust`, toxiproxy-cli, the Go client) without shipping the Go
//! binary. The engine is racecert's patched copy (`vendor/noxious`), which adds `reset_peer`.

use std::collections::BTreeMap;
use std::fmt;
use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bmrng::RequestSender;
use bmrng::error::RequestError;
use noxious::proxy::{ProxyConfig, ProxyRunner, Runner, Toxics};
use noxious::signal::{Close, Stop, Stopper};
use noxious::socket::TcpListener as EngineListener;
use noxious::toxic::{
    StreamDirection, Toxic, ToxicEvent, ToxicEventKind, ToxicEventResult, ToxicKind,
};
use serde_json::{Map, Value, json};
use tokio::sync::{Mutex, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

use crate::Error;

/// Reported by `GET /version`: the Toxiproxy API level this server follows, and what it really is.
const VERSION: &str = "2.12.0-racecert-noxious";

/// Where a proxy listens when the client gives no listen address: any free loopback port.
const DEFAULT_LISTEN: &str = "127.0.0.1:0";

/// A toxic change makes the engine rebuild every live link of the proxy; a wedged link must not
/// wedge the API, so past this the proxy is restarted instead.
const ENGINE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long shutdown lets open API connections finish their request before dropping them.
const API_GRACE: Duration = Duration::from_secs(5);

/// Toxic attributes are milliseconds, KB/s or bytes; bounding them keeps the engine's arithmetic
/// (e.g. latency + jitter) from overflowing, and fits the u32 values `toxiproxy_rust` reads.
const MAX_ATTRIBUTE: u64 = u32::MAX as u64;

/// The engine reads at most 32 KiB per chunk, but a buffer may be handed back larger; this bounds
/// the chunk sizes that the bandwidth pacer must plan for.
const MAX_CHUNK: u64 = 64 * 1024;

/// Suffix of the hidden slicer paired with each bandwidth toxic (see [`pacer`]). The NUL cannot
/// appear in client-chosen names, which are rejected if they contain one.
const PACER_SUFFIX: &str = "\u{0}pace";

/// A running Toxiproxy-compatible API server, serving on the tokio runtime it was started on.
///
/// Dropping it stops the API and every proxy without waiting; [`ProxyServer::shutdown`] waits.
pub struct ProxyServer {
    addr: SocketAddr,
    store: Shared,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl ProxyServer {
    /// Binds the HTTP API on `listen` (port 0 allowed) and serves it on the current tokio runtime.
    pub async fn start(listen: SocketAddr) -> crate::Result<ProxyServer> {
        let listener = bind_api(listen).await?;
        let addr = listener.local_addr().map_err(|err| {
            Error::io(
                format!("reading the address of the proxy API on {listen}"),
                err,
            )
        })?;
        info!(%addr, version = VERSION, "toxiproxy API listening");
        let store = Shared::default();
        let (shutdown, signal) = oneshot::channel::<()>();
        let serving = run_api(listener, store.clone(), async move {
            // A dropped sender means the server handle is gone: shut down as well.
            let _ = signal.await;
        });
        let task = tokio::spawn(async move {
            if let Err(err) = serving.await {
                error!(%err, "toxiproxy API server failed");
            }
        });
        Ok(ProxyServer {
            addr,
            store,
            shutdown: Some(shutdown),
            task: Some(task),
        })
    }

    /// The bound address of the HTTP API.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL, e.g. "http://127.0.0.1:8474".
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops the API and every proxy (closing their listeners and connections), and waits for it.
    pub async fn shutdown(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(task) = self.task.take()
            && let Err(err) = task.await
        {
            warn!(%err, "toxiproxy API task ended abnormally");
        }
    }
}

impl Drop for ProxyServer {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        // The API task stops every proxy on its way out, but only while the runtime still runs;
        // signalling the engines here closes their listeners at once even if it is going away.
        if let Ok(proxies) = self.store.proxies.try_lock() {
            for run in proxies.values().filter_map(|entry| entry.run.as_ref()) {
                run.stopper.clone().stop();
            }
        }
    }
}

impl fmt::Debug for ProxyServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// Serve until `shutdown` resolves (used by `racecert proxy serve` in the container image).
pub async fn serve(
    listen: SocketAddr,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> crate::Result<()> {
    let listener = bind_api(listen).await?;
    let addr = listener.local_addr().unwrap_or(listen);
    info!(%addr, version = VERSION, "toxiproxy API listening");
    run_api(listener, Shared::default(), shutdown)
        .await
        .map_err(|err| Error::Proxy(format!("serving the proxy API on {addr}: {err}")))
}

async fn bind_api(listen: SocketAddr) -> crate::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|err| Error::io(format!("binding the proxy API on {listen}"), err))
}

/// Serves the API until `shutdown` (or until the HTTP server fails), then stops every proxy.
async fn run_api(
    listener: tokio::net::TcpListener,
    store: Shared,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // The signal is needed twice (graceful stop, then a deadline for it), so fan it out.
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut graceful_rx = stop_rx.clone();
    let mut deadline_rx = stop_rx;
    let server = axum::serve(listener, router(store.clone())).with_graceful_shutdown(async move {
        let _ = graceful_rx.wait_for(|stop| *stop).await;
    });
    let trigger = async move {
        shutdown.await;
        let _ = stop_tx.send(true);
        std::future::pending::<()>().await
    };
    let deadline = async move {
        let _ = deadline_rx.wait_for(|stop| *stop).await;
        tokio::time::sleep(API_GRACE).await;
    };
    let served = tokio::select! {
        result = server.into_future() => result,
        () = deadline => {
            warn!(grace = ?API_GRACE, "API connections still open after shutdown; dropping them");
            Ok(())
        }
        () = trigger => Ok(()),
    };
    store.stop_all().await;
    info!("toxiproxy API stopped");
    served
}

fn router(store: Shared) -> Router {
    Router::new()
        .route("/version", get(version))
        .route("/reset", post(reset))
        .route("/populate", post(populate))
        .route("/proxies", get(list_proxies).post(create_proxy))
        .route(
            "/proxies/{proxy}",
            get(show_proxy)
                .post(update_proxy)
                .patch(update_proxy)
                .delete(delete_proxy),
        )
        .route(
            "/proxies/{proxy}/toxics",
            get(list_toxics).post(create_toxic),
        )
        .route(
            "/proxies/{proxy}/toxics/{toxic}",
            get(show_toxic)
                .post(update_toxic)
                .patch(update_toxic)
                .delete(delete_toxic),
        )
        .fallback(unknown_route)
        .layer(middleware::from_fn(log_request))
        .with_state(store)
}

async fn log_request(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    debug!(%method, %path, status = response.status().as_u16(), "toxiproxy API request");
    response
}

// ---------------------------------------------------------------------------------------------
// State

type Shared = Arc<Store>;

#[derive(Default)]
struct Store {
    /// One lock for everything: API calls are rare and short, and serialising them keeps the
    /// proxies' runs, listen ports and toxic lists consistent without finer bookkeeping.
    proxies: Mutex<BTreeMap<String, ProxyEntry>>,
}

impl Store {
    async fn stop_all(&self) {
        let mut proxies = self.proxies.lock().await;
        for entry in proxies.values_mut() {
            entry.stop().await;
        }
    }
}

/// A proxy as the API sees it. `toxics` is the source of truth (in the order they were added);
/// the engine run, when there is one, mirrors it.
struct ProxyEntry {
    name: String,
    /// Always a concrete address (port 0 resolved), so re-enabling rebinds the same port.
    listen: SocketAddr,
    upstream: String,
    enabled: bool,
    toxics: Vec<Toxic>,
    run: Option<EngineRun>,
}

/// One run of the noxious engine. Its listen and upstream addresses are fixed for the run, so
/// changing them (or disabling the proxy) ends the run.
///
/// Unlike Toxiproxy, noxious 1.0.4 stops a direction's toxic chain as soon as its sender closes,
/// so bytes still held by a delaying toxic (latency, bandwidth, slicer, slow_close) are dropped:
/// a server that answers and closes at once may reach the client with nothing. Long-lived
/// connections (databases, caches) are unaffected until they close.
struct EngineRun {
    events: RequestSender<ToxicEvent, ToxicEventResult>,
    stopper: Stopper,
    closed: Close,
    task: JoinHandle<()>,
}

impl EngineRun {
    async fn start(
        name: &str,
        listen: SocketAddr,
        upstream: &str,
        toxics: &[Toxic],
    ) -> Result<EngineRun, ApiError> {
        let config = ProxyConfig {
            name: name.to_owned(),
            listen: listen.to_string(),
            upstream: upstream.to_owned(),
            enabled: true,
            rand_seed: None,
        };
        let (listener, info) =
            ProxyRunner::initialize_proxy::<EngineListener>(config, engine_toxics(toxics))
                .await
                .map_err(|err| {
                    ApiError::internal(format!("proxy {name}: listen on {listen}: {err}"))
                })?;
        let (events, receiver) = bmrng::channel(1);
        let (stop, stopper) = Stop::new();
        let (closed, closer) = Close::new();
        let proxy = name.to_owned();
        let task = tokio::spawn(async move {
            if let Err(err) = ProxyRunner::run_proxy(listener, info, receiver, stop, closer).await {
                // The engine gives up on accept errors (e.g. out of file descriptors).
                error!(proxy = %proxy, %err, "proxy stopped accepting connections");
            }
        });
        info!(proxy = %name, %listen, %upstream, "proxy started");
        Ok(EngineRun {
            events,
            stopper,
            closed,
            task,
        })
    }

    fn is_alive(&self) -> bool {
        !self.task.is_finished()
    }

    /// Stops accepting, closes every live connection, and waits until the listener is gone so
    /// that its port can be bound again.
    async fn stop(self, name: &str) {
        self.stopper.stop();
        if tokio::time::timeout(ENGINE_TIMEOUT, self.closed.recv())
            .await
            .is_err()
        {
            warn!(proxy = %name, "proxy did not stop in time; aborting it");
            self.task.abort();
        }
        info!(proxy = %name, "proxy stopped");
    }

    /// Applies toxic changes to the live connections, one engine event at a time.
    async fn apply(&self, proxy: &str, kinds: Vec<ToxicEventKind>) -> Result<(), String> {
        for kind in kinds {
            let event = ToxicEvent::new(proxy.to_owned(), kind);
            match tokio::time::timeout(ENGINE_TIMEOUT, self.events.send_receive(event)).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(err))) => return Err(format!("engine refused the change: {err}")),
                Ok(Err(RequestError::SendError(_) | RequestError::RecvError)) => {
                    return Err("engine is not running".to_owned());
                }
                Ok(Err(RequestError::RecvTimeoutError)) | Err(_) => {
                    return Err("engine did not answer in time".to_owned());
                }
            }
        }
        Ok(())
    }
}

impl ProxyEntry {
    /// A new proxy from a validated spec, already running if it is enabled.
    async fn create(spec: ProxySpec) -> Result<ProxyEntry, ApiError> {
        let mut entry = ProxyEntry {
            listen: resolve_listen(&spec.listen).await?,
            name: spec.name,
            upstream: spec.upstream,
            enabled: spec.enabled,
            toxics: Vec::new(),
            run: None,
        };
        if entry.enabled {
            entry.start().await?;
        }
        Ok(entry)
    }

    async fn start(&mut self) -> Result<(), ApiError> {
        if self.run.as_ref().is_some_and(EngineRun::is_alive) {
            self.enabled = true;
            return Ok(());
        }
        // Reap a run that died on its own before binding the port again.
        self.stop().await;
        match EngineRun::start(&self.name, self.listen, &self.upstream, &self.toxics).await {
            Ok(run) => {
                self.run = Some(run);
                self.enabled = true;
                Ok(())
            }
            Err(err) => {
                // Report what is really served: nothing.
                self.enabled = false;
                Err(err)
            }
        }
    }

    async fn stop(&mut self) {
        if let Some(run) = self.run.take() {
            run.stop(&self.name).await;
        }
    }

    async fn set_enabled(&mut self, enabled: bool) -> Result<(), ApiError> {
        if enabled {
            self.start().await
        } else {
            self.stop().await;
            self.enabled = false;
            Ok(())
        }
    }

    /// Applies a `POST /proxies/{name}`: a new listen or upstream address needs a new engine run.
    async fn update(
        &mut self,
        listen: Option<&str>,
        upstream: Option<&str>,
        enabled: Option<bool>,
    ) -> Result<(), ApiError> {
        let new_listen = match listen {
            Some(raw) if !listen_matches(raw, self.listen).await => {
                Some(resolve_listen(raw).await?)
            }
            _ => None,
        };
        let new_upstream = upstream
            .filter(|upstream| *upstream != self.upstream)
            .map(str::to_owned);
        let enabled = enabled.unwrap_or(self.enabled);
        if new_listen.is_none() && new_upstream.is_none() {
            return self.set_enabled(enabled).await;
        }
        self.stop().await;
        if let Some(listen) = new_listen {
            self.listen = listen;
        }
        if let Some(upstream) = new_upstream {
            self.upstream = upstream;
        }
        self.set_enabled(enabled).await
    }

    /// Pushes toxic changes into the running engine, if any. Should the engine refuse or stall,
    /// the proxy is restarted from `self.toxics`, so what is served never drifts from what the
    /// API reports (at the price of the live connections).
    async fn sync_engine(&mut self, kinds: Vec<ToxicEventKind>) -> Result<(), ApiError> {
        let Some(run) = &self.run else {
            return Ok(());
        };
        if let Err(err) = run.apply(&self.name, kinds).await {
            warn!(proxy = %self.name, %err, "engine failed a toxic change; restarting the proxy");
            self.stop().await;
            self.start().await?;
        }
        Ok(())
    }

    async fn add_toxic(&mut self, toxic: Toxic) -> Result<(), ApiError> {
        if self.toxic(&toxic.name).is_some() {
            return Err(ApiError::conflict("toxic already exists"));
        }
        let kinds = engine_parts(&toxic)
            .into_iter()
            .map(ToxicEventKind::AddToxic)
            .collect();
        self.toxics.push(toxic);
        self.sync_engine(kinds).await
    }

    async fn update_toxic(&mut self, toxic: Toxic) -> Result<(), ApiError> {
        let Some(slot) = self.toxics.iter_mut().find(|old| old.name == toxic.name) else {
            return Err(ApiError::not_found("toxic not found"));
        };
        let mut parts = engine_parts(&toxic);
        // A bandwidth toxic and its pacer are updated one after the other; the order keeps every
        // chunk within what the current rate can pace in between (see `pacer`).
        if let (ToxicKind::Bandwidth { rate: old }, ToxicKind::Bandwidth { rate: new }) =
            (slot.kind, toxic.kind)
            && effective_rate(new) > effective_rate(old)
        {
            parts.reverse();
        }
        *slot = toxic;
        let kinds = parts.into_iter().map(ToxicEventKind::UpdateToxic).collect();
        self.sync_engine(kinds).await
    }

    async fn remove_toxic(&mut self, name: &str) -> Result<(), ApiError> {
        let Some(index) = self.toxics.iter().position(|toxic| toxic.name == name) else {
            return Err(ApiError::not_found("toxic not found"));
        };
        let toxic = self.toxics.remove(index);
        self.sync_engine(removal_events(&toxic)).await
    }

    async fn clear_toxics(&mut self) -> Result<(), ApiError> {
        // One removal per toxic: noxious 1.0.4's "remove all" event only clears upstream toxics.
        let kinds = self.toxics.iter().rev().flat_map(removal_events).collect();
        self.toxics.clear();
        self.sync_engine(kinds).await
    }

    fn toxic(&self, name: &str) -> Option<&Toxic> {
        self.toxics.iter().find(|toxic| toxic.name == name)
    }

    /// Toxiproxy lists upstream toxics first, each direction in the order of its chain.
    fn toxics_json(&self) -> Value {
        let upstream = self
            .toxics
            .iter()
            .filter(|toxic| toxic.direction == StreamDirection::Upstream);
        let downstream = self
            .toxics
            .iter()
            .filter(|toxic| toxic.direction == StreamDirection::Downstream);
        Value::Array(upstream.chain(downstream).map(toxic_json).collect())
    }

    fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "listen": self.listen.to_string(),
            "upstream": self.upstream,
            "enabled": self.enabled,
            "toxics": self.toxics_json(),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Engine toxics

/// The engine's view of the API toxics, split by direction.
fn engine_toxics(toxics: &[Toxic]) -> Toxics {
    let mut split = Toxics::empty();
    for toxic in toxics.iter().flat_map(engine_parts) {
        match toxic.direction {
            StreamDirection::Upstream => split.upstream.push(toxic),
            StreamDirection::Downstream => split.downstream.push(toxic),
        }
    }
    split
}

/// The engine toxics that implement one API toxic, in chain order.
fn engine_parts(toxic: &Toxic) -> Vec<Toxic> {
    match toxic.kind {
        ToxicKind::Bandwidth { rate } => vec![pacer(toxic, rate), toxic.clone()],
        _ => vec![toxic.clone()],
    }
}

/// A bandwidth rate of 0 means no limit.
fn effective_rate(rate: u64) -> u64 {
    if rate == 0 { u64::MAX } else { rate }
}

fn removal_events(toxic: &Toxic) -> Vec<ToxicEventKind> {
    engine_parts(toxic)
        .into_iter()
        .rev()
        .map(|part| ToxicEventKind::RemoveToxic(part.name))
        .collect()
}

/// noxious 1.0.4's bandwidth toxic paces a chunk correctly only if it holds at most
/// `100 * rate` bytes: a larger one goes out 100 bytes per 100 ms (far below the rate) and can
/// underflow its sleep budget, a panic that drops the connection. A slicer placed right before it
/// keeps every chunk within that size. Fast rates need no slicing, but the pacer stays (as a
/// no-op) so that each bandwidth toxic always maps to the same two engine toxics.
fn pacer(toxic: &Toxic, rate: u64) -> Toxic {
    let slice = rate.saturating_mul(100);
    let kind = if rate == 0 || slice >= MAX_CHUNK {
        ToxicKind::Noop
    } else {
        ToxicKind::Slicer {
            average_size: slice,
            size_variation: 0,
            delay: 0,
        }
    };
    Toxic {
        kind,
        name: format!("{}{PACER_SUFFIX}", toxic.name),
        // Always on: the bandwidth toxic's own toxicity decides whether a connection is slowed.
        toxicity: 1.0,
        direction: toxic.direction,
    }
}

// ---------------------------------------------------------------------------------------------
// Wire format

/// Toxiproxy's toxic JSON: `{name, type, stream, toxicity, attributes}`.
fn toxic_json(toxic: &Toxic) -> Value {
    json!({
        "name": toxic.name,
        "type": toxic.kind.get_name(),
        "stream": toxic.direction.to_string(),
        "toxicity": toxic.toxicity,
        "attributes": attributes_json(&toxic.kind),
    })
}

fn attributes_json(kind: &ToxicKind) -> Value {
    match *kind {
        ToxicKind::Noop => json!({}),
        ToxicKind::Latency { latency, jitter } => json!({ "latency": latency, "jitter": jitter }),
        ToxicKind::Timeout { timeout } => json!({ "timeout": timeout }),
        ToxicKind::Bandwidth { rate } => json!({ "rate": rate }),
        ToxicKind::SlowClose { delay } => json!({ "delay": delay }),
        ToxicKind::Slicer {
            average_size,
            size_variation,
            delay,
        } => json!({
            "average_size": average_size,
            "size_variation": size_variation,
            "delay": delay,
        }),
        ToxicKind::LimitData { bytes } => json!({ "bytes": bytes }),
        ToxicKind::ResetPeer { timeout } => json!({ "timeout": timeout }),
    }
}

/// A proxy as given to `POST /proxies` or `POST /populate`.
struct ProxySpec {
    name: String,
    listen: String,
    upstream: String,
    enabled: bool,
}

/// `position` names the proxy in a populate list, for error messages.
fn parse_proxy_spec(value: &Value, position: Option<usize>) -> Result<ProxySpec, ApiError> {
    let at = position
        .map(|i| format!(" at proxy {}", i + 1))
        .unwrap_or_default();
    let fields = object(value, "proxy")?;
    let name = str_field(fields, "name")?.unwrap_or_default();
    if name.is_empty() {
        return Err(ApiError::bad_request(format!(
            "missing required field: name{at}"
        )));
    }
    let upstream = str_field(fields, "upstream")?.unwrap_or_default();
    if upstream.is_empty() {
        return Err(ApiError::bad_request(format!(
            "missing required field: upstream{at}"
        )));
    }
    Ok(ProxySpec {
        name: name.to_owned(),
        listen: str_field(fields, "listen")?.unwrap_or_default().to_owned(),
        upstream: upstream.to_owned(),
        enabled: bool_field(fields, "enabled")?.unwrap_or(true),
    })
}

/// Parses a new toxic with Toxiproxy's defaults: downstream, toxicity 1, name `{type}_{stream}`,
/// and attributes left out are 0.
fn parse_new_toxic(value: &Value) -> Result<Toxic, ApiError> {
    let fields = object(value, "toxic")?;
    let kind_name = str_field(fields, "type")?.unwrap_or_default();
    if kind_name.is_empty() {
        return Err(ApiError::bad_request("missing required field: type"));
    }
    let direction = match str_field(fields, "stream")?.unwrap_or_default() {
        "" | "downstream" => StreamDirection::Downstream,
        "upstream" => StreamDirection::Upstream,
        _ => {
            return Err(ApiError::bad_request(
                "stream was invalid, can be either upstream or downstream",
            ));
        }
    };
    let empty = Map::new();
    let attributes = object_field(fields, "attributes")?.unwrap_or(&empty);
    let kind = parse_kind(kind_name, attributes)?;
    let name = match str_field(fields, "name")? {
        Some(name) if !name.is_empty() => name.to_owned(),
        _ => format!("{kind_name}_{direction}"),
    };
    if name.contains('\0') {
        return Err(ApiError::bad_request("toxic names cannot contain NUL"));
    }
    Ok(Toxic {
        kind,
        name,
        toxicity: f32_field(fields, "toxicity")?.unwrap_or(1.0),
        direction,
    })
}

/// Applies a toxic update: given attributes are merged into the current ones, and toxicity is
/// replaced if given. Name, type and stream stay, as in Toxiproxy.
fn parse_toxic_update(current: &Toxic, value: &Value) -> Result<Toxic, ApiError> {
    let fields = object(value, "toxic")?;
    let mut attributes = match attributes_json(&current.kind) {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    if let Some(given) = object_field(fields, "attributes")? {
        attributes.extend(
            given
                .iter()
                .map(|(key, value)| (key.clone(), value.clone())),
        );
    }
    Ok(Toxic {
        kind: parse_kind(current.kind.get_name(), &attributes)?,
        name: current.name.clone(),
        toxicity: f32_field(fields, "toxicity")?.unwrap_or(current.toxicity),
        direction: current.direction,
    })
}

fn parse_kind(kind_name: &str, attributes: &Map<String, Value>) -> Result<ToxicKind, ApiError> {
    let attr = |key: &str| attribute(kind_name, attributes, key);
    let kind = match kind_name {
        "noop" => ToxicKind::Noop,
        "latency" => ToxicKind::Latency {
            latency: attr("latency")?,
            jitter: attr("jitter")?,
        },
        "timeout" => ToxicKind::Timeout {
            timeout: attr("timeout")?,
        },
        "bandwidth" => ToxicKind::Bandwidth {
            rate: attr("rate")?,
        },
        "slow_close" => ToxicKind::SlowClose {
            delay: attr("delay")?,
        },
        "slicer" => ToxicKind::Slicer {
            average_size: attr("average_size")?,
            size_variation: attr("size_variation")?,
            delay: attr("delay")?,
        },
        "limit_data" => ToxicKind::LimitData {
            bytes: attr("bytes")?,
        },
        "reset_peer" => ToxicKind::ResetPeer {
            timeout: attr("timeout")?,
        },
        other => {
            return Err(ApiError::bad_request(format!(
                "unsupported toxic type {other}"
            )));
        }
    };
    validate_kind(&kind)?;
    Ok(kind)
}

/// Rejects values the engine would mishandle (overflow panics, endless slicing).
fn validate_kind(kind: &ToxicKind) -> Result<(), ApiError> {
    match *kind {
        ToxicKind::Latency { latency, jitter } if jitter > latency => Err(ApiError::bad_request(
            "bad request body: latency jitter cannot exceed latency with this engine",
        )),
        ToxicKind::Slicer {
            average_size: 0, ..
        } => Err(ApiError::bad_request(
            "bad request body: slicer average_size must be at least 1",
        )),
        ToxicKind::Slicer {
            average_size,
            size_variation,
            ..
        } if size_variation >= average_size => Err(ApiError::bad_request(
            "bad request body: slicer size_variation must be less than average_size",
        )),
        _ => Ok(()),
    }
}

/// A missing (or null) attribute is 0, as Go's zero value in Toxiproxy.
fn attribute(kind_name: &str, attributes: &Map<String, Value>, key: &str) -> Result<u64, ApiError> {
    match attributes.get(key) {
        None | Some(Value::Null) => Ok(0),
        Some(value) => match value.as_u64() {
            Some(number) if number <= MAX_ATTRIBUTE => Ok(number),
            Some(number) => Err(ApiError::bad_request(format!(
                "bad request body: {kind_name} attribute {key} is above {MAX_ATTRIBUTE}: {number}"
            ))),
            None => Err(ApiError::bad_request(format!(
                "bad request body: {kind_name} attribute {key} must be an integer >= 0: {value}"
            ))),
        },
    }
}

fn parse_body(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|err| ApiError::bad_request(format!("bad request body: {err}")))
}

fn object<'a>(value: &'a Value, what: &str) -> Result<&'a Map<String, Value>, ApiError> {
    value
        .as_object()
        .ok_or_else(|| ApiError::bad_request(format!("bad request body: expected a {what} object")))
}

fn wrong_type(key: &str, expected: &str) -> ApiError {
    ApiError::bad_request(format!("bad request body: field {key} must be {expected}"))
}

fn str_field<'a>(fields: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, ApiError> {
    match fields.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(_) => Err(wrong_type(key, "a string")),
    }
}

fn bool_field(fields: &Map<String, Value>, key: &str) -> Result<Option<bool>, ApiError> {
    match fields.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(flag)) => Ok(Some(*flag)),
        Some(_) => Err(wrong_type(key, "a boolean")),
    }
}

fn f32_field(fields: &Map<String, Value>, key: &str) -> Result<Option<f32>, ApiError> {
    match fields.get(key) {
        None | Some(Value::Null) => Ok(None),
        // Toxiproxy keeps toxicity as a float32 too.
        Some(Value::Number(number)) => Ok(number.as_f64().map(|n| n as f32)),
        Some(_) => Err(wrong_type(key, "a number")),
    }
}

fn object_field<'a>(
    fields: &'a Map<String, Value>,
    key: &str,
) -> Result<Option<&'a Map<String, Value>>, ApiError> {
    match fields.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(map)) => Ok(Some(map)),
        Some(_) => Err(wrong_type(key, "an object")),
    }
}

// ---------------------------------------------------------------------------------------------
// Listen addresses

/// Toxiproxy takes Go-style ":8080" for all interfaces; an empty listen means a free loopback port.
fn listen_spec(raw: &str) -> String {
    let raw = raw.trim();
    if raw.is_empty() {
        DEFAULT_LISTEN.to_owned()
    } else if raw.starts_with(':') {
        format!("0.0.0.0{raw}")
    } else {
        raw.to_owned()
    }
}

/// The addresses a listen spec may mean, IPv4 first (where "localhost" clients usually connect).
async fn lookup_listen(raw: &str) -> Result<Vec<SocketAddr>, ApiError> {
    let spec = listen_spec(raw);
    if let Ok(addr) = spec.parse::<SocketAddr>() {
        return Ok(vec![addr]);
    }
    let mut addrs: Vec<SocketAddr> = tokio::net::lookup_host(spec.as_str())
        .await
        .map_err(|err| ApiError::bad_request(format!("invalid listen address {raw:?}: {err}")))?
        .collect();
    addrs.sort_by_key(|addr| !addr.is_ipv4());
    Ok(addrs)
}

/// A concrete address to listen on. Port 0 is resolved to a free port now, so that the proxy
/// keeps its port across disable/enable and reports where clients should connect.
async fn resolve_listen(raw: &str) -> Result<SocketAddr, ApiError> {
    let addr = lookup_listen(raw).await?.first().copied().ok_or_else(|| {
        ApiError::bad_request(format!("listen address {raw:?} resolves to nothing"))
    })?;
    if addr.port() != 0 {
        return Ok(addr);
    }
    // A disabled proxy has no listener, and the kernel hands ports of its ephemeral range to
    // outgoing connections: a port from that range can be gone when the proxy is enabled again
    // (seen under partitions, while clients reconnect in a loop). Ports just below the range
    // are never handed out that way.
    if let Some(range) = below_ephemeral_range() {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let span = range.end - range.start;
        let start = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for i in 0..span {
            let port = range.start + ((start + i) % span);
            let candidate = SocketAddr::new(addr.ip(), port as u16);
            if let Ok(probe) = std::net::TcpListener::bind(candidate) {
                drop(probe);
                NEXT.store(start + i + 1, std::sync::atomic::Ordering::Relaxed);
                return Ok(candidate);
            }
        }
    }
    std::net::TcpListener::bind(addr)
        .and_then(|probe| probe.local_addr())
        .map_err(|err| ApiError::internal(format!("finding a free port on {addr}: {err}")))
}

/// Up to 8,000 ports just below the kernel's ephemeral port range (Linux), if it can be read.
fn below_ephemeral_range() -> Option<std::ops::Range<u32>> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let low: u32 = text.split_whitespace().next()?.parse().ok()?;
    let start = low.saturating_sub(8_000).max(10_000);
    (start < low).then_some(start..low)
}

/// Whether a listen spec names the address a proxy already has (port 0 never does).
async fn listen_matches(raw: &str, current: SocketAddr) -> bool {
    lookup_listen(raw).await.is_ok_and(|addrs| {
        addrs
            .iter()
            .any(|addr| addr.port() != 0 && *addr == current)
    })
}

// ---------------------------------------------------------------------------------------------
// Handlers

/// An API error as Toxiproxy sends it: `{"error": "...", "status": N}`.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }

    fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }

    fn conflict(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, message)
    }

    fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    fn proxy_not_found() -> ApiError {
        ApiError::not_found("proxy not found")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            let status = self.status.as_u16();
            warn!(status, error = %self.message, "toxiproxy API request failed");
        }
        json_response(
            self.status,
            &json!({ "error": self.message, "status": self.status.as_u16() }),
        )
    }
}

type ApiResult = Result<Response, ApiError>;

fn json_response(status: StatusCode, value: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

async fn version() -> Response {
    ([(header::CONTENT_TYPE, "text/plain")], VERSION).into_response()
}

async fn unknown_route() -> ApiError {
    ApiError::not_found("not found")
}

/// Enables every proxy and removes all toxics.
async fn reset(State(store): State<Shared>) -> ApiResult {
    let mut proxies = store.proxies.lock().await;
    let mut failures = Vec::new();
    // Keep going past a failing proxy: a reset between tests should clean up all it can.
    for entry in proxies.values_mut() {
        let cleared = entry.clear_toxics().await;
        if let Err(err) = cleared.and(entry.start().await) {
            failures.push(format!("{}: {}", entry.name, err.message));
        }
    }
    if failures.is_empty() {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::internal(failures.join("; ")))
    }
}

/// Creates or replaces the given proxies; others are left alone.
async fn populate(State(store): State<Shared>, body: Bytes) -> ApiResult {
    let value = parse_body(&body)?;
    let list = value
        .as_array()
        .ok_or_else(|| ApiError::bad_request("bad request body: expected an array of proxies"))?;
    // Validate the whole request before changing anything.
    let mut specs: Vec<ProxySpec> = Vec::with_capacity(list.len());
    for (position, item) in list.iter().enumerate() {
        let spec = parse_proxy_spec(item, Some(position))?;
        if specs.iter().any(|seen| seen.name == spec.name) {
            return Err(ApiError::bad_request(format!(
                "duplicate proxy name {:?}",
                spec.name
            )));
        }
        specs.push(spec);
    }

    let mut proxies = store.proxies.lock().await;
    let mut populated = Vec::with_capacity(specs.len());
    for spec in specs {
        if let Some(existing) = proxies.get_mut(&spec.name)
            && existing.upstream == spec.upstream
            && listen_matches(&spec.listen, existing.listen).await
        {
            // Like Toxiproxy, an unchanged proxy keeps its toxics and live connections.
            existing.set_enabled(spec.enabled).await?;
            populated.push(existing.to_json());
            continue;
        }
        if let Some(mut replaced) = proxies.remove(&spec.name) {
            replaced.stop().await;
        }
        let entry = ProxyEntry::create(spec).await?;
        populated.push(entry.to_json());
        proxies.insert(entry.name.clone(), entry);
    }
    Ok(json_response(
        StatusCode::CREATED,
        &json!({ "proxies": populated }),
    ))
}

async fn list_proxies(State(store): State<Shared>) -> ApiResult {
    let proxies = store.proxies.lock().await;
    let listing: Map<String, Value> = proxies
        .iter()
        .map(|(name, entry)| (name.clone(), entry.to_json()))
        .collect();
    Ok(json_response(StatusCode::OK, &Value::Object(listing)))
}

async fn create_proxy(State(store): State<Shared>, body: Bytes) -> ApiResult {
    let spec = parse_proxy_spec(&parse_body(&body)?, None)?;
    let mut proxies = store.proxies.lock().await;
    if proxies.contains_key(&spec.name) {
        return Err(ApiError::conflict("proxy already exists"));
    }
    let entry = ProxyEntry::create(spec).await?;
    let created = entry.to_json();
    proxies.insert(entry.name.clone(), entry);
    Ok(json_response(StatusCode::CREATED, &created))
}

async fn show_proxy(State(store): State<Shared>, Path(proxy): Path<String>) -> ApiResult {
    let proxies = store.proxies.lock().await;
    let entry = proxies.get(&proxy).ok_or_else(ApiError::proxy_not_found)?;
    Ok(json_response(StatusCode::OK, &entry.to_json()))
}

async fn update_proxy(
    State(store): State<Shared>,
    Path(proxy): Path<String>,
    body: Bytes,
) -> ApiResult {
    let mut proxies = store.proxies.lock().await;
    let entry = proxies
        .get_mut(&proxy)
        .ok_or_else(ApiError::proxy_not_found)?;
    let value = parse_body(&body)?;
    let fields = object(&value, "proxy")?;
    let upstream = str_field(fields, "upstream")?;
    if upstream == Some("") {
        return Err(ApiError::bad_request(
            "bad request body: upstream cannot be empty",
        ));
    }
    entry
        .update(
            str_field(fields, "listen")?,
            upstream,
            bool_field(fields, "enabled")?,
        )
        .await?;
    Ok(json_response(StatusCode::OK, &entry.to_json()))
}

async fn delete_proxy(State(store): State<Shared>, Path(proxy): Path<String>) -> ApiResult {
    let mut proxies = store.proxies.lock().await;
    let mut entry = proxies
        .remove(&proxy)
        .ok_or_else(ApiError::proxy_not_found)?;
    entry.stop().await;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn list_toxics(State(store): State<Shared>, Path(proxy): Path<String>) -> ApiResult {
    let proxies = store.proxies.lock().await;
    let entry = proxies.get(&proxy).ok_or_else(ApiError::proxy_not_found)?;
    Ok(json_response(StatusCode::OK, &entry.toxics_json()))
}

async fn create_toxic(
    State(store): State<Shared>,
    Path(proxy): Path<String>,
    body: Bytes,
) -> ApiResult {
    let mut proxies = store.proxies.lock().await;
    let entry = proxies
        .get_mut(&proxy)
        .ok_or_else(ApiError::proxy_not_found)?;
    let toxic = parse_new_toxic(&parse_body(&body)?)?;
    let created = toxic_json(&toxic);
    entry.add_toxic(toxic).await?;
    Ok(json_response(StatusCode::OK, &created))
}

async fn show_toxic(
    State(store): State<Shared>,
    Path((proxy, toxic)): Path<(String, String)>,
) -> ApiResult {
    let proxies = store.proxies.lock().await;
    let entry = proxies.get(&proxy).ok_or_else(ApiError::proxy_not_found)?;
    let toxic = entry
        .toxic(&toxic)
        .ok_or_else(|| ApiError::not_found("toxic not found"))?;
    Ok(json_response(StatusCode::OK, &toxic_json(toxic)))
}

async fn update_toxic(
    State(store): State<Shared>,
    Path((proxy, toxic)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult {
    let mut proxies = store.proxies.lock().await;
    let entry = proxies
        .get_mut(&proxy)
        .ok_or_else(ApiError::proxy_not_found)?;
    let current = entry
        .toxic(&toxic)
        .ok_or_else(|| ApiError::not_found("toxic not found"))?;
    let updated = parse_toxic_update(current, &parse_body(&body)?)?;
    let shown = toxic_json(&updated);
    entry.update_toxic(updated).await?;
    Ok(json_response(StatusCode::OK, &shown))
}

async fn delete_toxic(
    State(store): State<Shared>,
    Path((proxy, toxic)): Path<(String, String)>,
) -> ApiResult {
    let mut proxies = store.proxies.lock().await;
    let entry = proxies
        .get_mut(&proxy)
        .ok_or_else(ApiError::proxy_not_found)?;
    entry.remove_toxic(&toxic).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::ErrorKind;
    use std::time::Instant;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use toxiproxy_rust::client::Client;
    use toxiproxy_rust::proxy::ProxyPack;

    /// Failure guard for waits that should end much sooner; not a timing assertion.
    const GUARD: Duration = Duration::from_secs(5);

    async fn start_server() -> ProxyServer {
        ProxyServer::start(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .expect("proxy API starts")
    }

    /// An upstream that greets each connection with `tag`, then echoes, so that tests can tell
    /// which upstream a proxied connection reached.
    async fn upstream(tag: &'static str) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().expect("upstream address");
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if socket.write_all(tag.as_bytes()).await.is_err() {
                        return;
                    }
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                if socket.write_all(&buf[..n]).await.is_err() {
                                    break;
                                }
                            }
                        }
                    }
                });
            }
        });
        addr
    }

    /// Runs a blocking `toxiproxy_rust` call off the runtime; its reqwest client is created and
    /// dropped inside, as blocking reqwest must not be dropped on an async thread.
    async fn with_client<T: Send + 'static>(
        api: SocketAddr,
        call: impl FnOnce(&Client) -> T + Send + 'static,
    ) -> T {
        tokio::task::spawn_blocking(move || call(&Client::new(api)))
            .await
            .expect("client call")
    }

    async fn populate_one(api: SocketAddr, name: &str, upstream: SocketAddr) -> SocketAddr {
        let pack = ProxyPack::new(name.to_owned(), "127.0.0.1:0".into(), upstream.to_string());
        let proxies = with_client(api, move |client| client.populate(vec![pack]))
            .await
            .expect("populate");
        assert_eq!(proxies.len(), 1);
        let listen: SocketAddr = proxies[0]
            .proxy_pack
            .listen
            .parse()
            .expect("concrete listen");
        assert_ne!(listen.port(), 0);
        listen
    }

    /// Raw HTTP, to see status codes and bodies exactly as sent.
    async fn http(api: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
        let mut socket = TcpStream::connect(api).await.expect("connect to API");
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {api}\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        socket
            .write_all(request.as_bytes())
            .await
            .expect("send request");
        let mut raw = Vec::new();
        tokio::time::timeout(GUARD, socket.read_to_end(&mut raw))
            .await
            .expect("response in time")
            .expect("read response");
        let text = String::from_utf8(raw).expect("utf-8 response");
        let (head, body) = text.split_once("\r\n\r\n").expect("HTTP head");
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .expect("status code");
        (status, body.to_owned())
    }

    async fn http_json(api: SocketAddr, method: &str, path: &str, body: &str) -> (u16, Value) {
        let (status, body) = http(api, method, path, body).await;
        let value = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&body).expect("JSON body")
        };
        (status, value)
    }

    async fn assert_error(
        api: SocketAddr,
        method: &str,
        path: &str,
        body: &str,
        status: u16,
    ) -> String {
        let (got, value) = http_json(api, method, path, body).await;
        assert_eq!(got, status, "{method} {path} {body}: {value}");
        assert_eq!(value["status"], json!(status));
        value["error"].as_str().expect("error message").to_owned()
    }

    /// Connects through a proxy and checks which upstream answered.
    async fn connect(addr: SocketAddr, tag: &str) -> TcpStream {
        let mut conn = TcpStream::connect(addr).await.expect("connect to proxy");
        let mut greeting = vec![0u8; tag.len()];
        tokio::time::timeout(GUARD, conn.read_exact(&mut greeting))
            .await
            .expect("greeting in time")
            .expect("greeting");
        assert_eq!(greeting, tag.as_bytes());
        conn
    }

    async fn round_trip(conn: &mut TcpStream, message: &[u8]) -> Duration {
        let started = Instant::now();
        conn.write_all(message).await.expect("send");
        let mut echoed = vec![0u8; message.len()];
        tokio::time::timeout(GUARD, conn.read_exact(&mut echoed))
            .await
            .expect("echo in time")
            .expect("echo");
        assert_eq!(echoed, message);
        started.elapsed()
    }

    async fn assert_closed(conn: &mut TcpStream) {
        let mut buf = [0u8; 64];
        match tokio::time::timeout(GUARD, conn.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => {}
            Ok(Ok(n)) => panic!("expected a closed connection, got {n} bytes"),
            Err(_) => panic!("connection still open"),
        }
    }

    async fn assert_refused(addr: SocketAddr) {
        let attempt = tokio::time::timeout(GUARD, TcpStream::connect(addr))
            .await
            .expect("connect fails fast");
        match attempt {
            Err(err) => assert_eq!(err.kind(), ErrorKind::ConnectionRefused),
            Ok(_) => panic!("{addr} still accepts connections"),
        }
    }

    #[tokio::test]
    async fn populate_passes_bytes_and_lists_toxics_as_toxiproxy_rust_reads_them() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<ProxyServer>();
        let server = start_server().await;
        let api = server.addr();
        assert_eq!(server.url(), format!("http://{api}"));
        let listen = populate_one(api, "echo", upstream("").await).await;

        let mut conn = connect(listen, "").await;
        round_trip(&mut conn, b"hello through the proxy").await;

        let version = with_client(api, |client| client.version()).await;
        assert_eq!(version.as_deref(), Ok(VERSION));

        with_client(api, |client| {
            let proxy = client.find_proxy("echo").expect("find proxy");
            proxy.with_latency("upstream".into(), 10, 5, 1.0);
            proxy.with_slicer("downstream".into(), 64, 8, 10, 0.5);
            proxy.with_bandwidth("downstream".into(), 1000, 1.0);
        })
        .await;
        // The live connection keeps working with the new toxics.
        round_trip(&mut conn, &[7u8; 300]).await;

        let all = with_client(api, |client| client.all())
            .await
            .expect("all proxies");
        let pack = &all["echo"].proxy_pack;
        assert_eq!(pack.name, "echo");
        assert_eq!(pack.listen, listen.to_string());
        assert!(pack.enabled);
        // What toxiproxy_rust deserialized, written back out for an exact comparison.
        let toxics = serde_json::to_value(&pack.toxics).expect("toxics as JSON");
        assert_eq!(
            toxics,
            json!([
                {"name": "latency_upstream", "type": "latency", "stream": "upstream",
                 "toxicity": 1.0, "attributes": {"latency": 10, "jitter": 5}},
                {"name": "slicer_downstream", "type": "slicer", "stream": "downstream",
                 "toxicity": 0.5,
                 "attributes": {"average_size": 64, "size_variation": 8, "delay": 10}},
                {"name": "bandwidth_downstream", "type": "bandwidth", "stream": "downstream",
                 "toxicity": 1.0, "attributes": {"rate": 1000}},
            ])
        );
        let listed = with_client(api, |client| client.find_proxy("echo")?.toxics())
            .await
            .expect("toxics of echo");
        assert_eq!(listed.len(), 3);
        server.shutdown().await;
    }

    #[tokio::test]
    async fn latency_toxic_delays_live_and_new_connections() {
        let server = start_server().await;
        let api = server.addr();
        let listen = populate_one(api, "slow", upstream("").await).await;
        let mut live = connect(listen, "").await;
        round_trip(&mut live, b"before").await;

        with_client(api, |client| {
            client.find_proxy("slow").expect("find proxy").with_latency(
                "downstream".into(),
                300,
                0,
                1.0,
            );
        })
        .await;
        assert!(round_trip(&mut live, b"live").await >= Duration::from_millis(300));
        let mut fresh = connect(listen, "").await;
        assert!(round_trip(&mut fresh, b"fresh").await >= Duration::from_millis(300));

        let (status, _) = http(api, "DELETE", "/proxies/slow/toxics/latency_downstream", "").await;
        assert_eq!(status, 204);
        round_trip(&mut live, b"after").await;
    }

    #[tokio::test]
    async fn timeout_toxic_stops_data_and_updates_merge_attributes() {
        let server = start_server().await;
        let api = server.addr();
        let listen = populate_one(api, "stall", upstream("").await).await;

        let (status, created) = http_json(
            api,
            "POST",
            "/proxies/stall/toxics",
            r#"{"type":"timeout","attributes":{"timeout":0}}"#,
        )
        .await;
        assert_eq!(status, 200, "{created}");
        assert_eq!(
            created,
            json!({"name": "timeout_downstream", "type": "timeout", "stream": "downstream",
                   "toxicity": 1.0, "attributes": {"timeout": 0}})
        );

        let mut conn = connect(listen, "").await;
        conn.write_all(b"anyone there?").await.expect("send");
        let mut buf = [0u8; 64];
        let silent = tokio::time::timeout(Duration::from_millis(400), conn.read(&mut buf)).await;
        assert!(silent.is_err(), "data passed a timeout toxic: {silent:?}");

        // With a timeout the toxic closes the connection; the update reaches the live one.
        let (status, updated) = http_json(
            api,
            "POST",
            "/proxies/stall/toxics/timeout_downstream",
            r#"{"attributes":{"timeout":100}}"#,
        )
        .await;
        assert_eq!(status, 200, "{updated}");
        assert_eq!(updated["attributes"], json!({"timeout": 100}));
        assert_closed(&mut conn).await;

        let (status, updated) = http_json(
            api,
            "POST",
            "/proxies/stall/toxics/timeout_downstream",
            r#"{"toxicity":0.5}"#,
        )
        .await;
        assert_eq!(status, 200, "{updated}");
        let (_, shown) =
            http_json(api, "GET", "/proxies/stall/toxics/timeout_downstream", "").await;
        assert_eq!(shown["attributes"], json!({"timeout": 100}));
        assert_eq!(shown["toxicity"], json!(0.5));
    }

    /// Reads once: a reset must surface as ECONNRESET, never as data or an orderly EOF.
    async fn assert_reset(conn: &mut TcpStream) {
        let mut buf = [0u8; 64];
        match tokio::time::timeout(GUARD, conn.read(&mut buf)).await {
            Err(_) => panic!("connection neither reset nor closed"),
            Ok(Err(err)) => assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}"),
            Ok(Ok(0)) => panic!("connection closed with a FIN, expected a reset"),
            Ok(Ok(n)) => panic!("{n} bytes passed a reset_peer toxic"),
        }
    }

    #[tokio::test]
    async fn reset_peer_toxic_resets_live_and_new_connections_once_data_flows() {
        let server = start_server().await;
        let api = server.addr();
        let listen = populate_one(api, "rst", upstream("hi").await).await;
        let mut live = connect(listen, "hi").await;

        let (status, created) = http_json(
            api,
            "POST",
            "/proxies/rst/toxics",
            r#"{"type":"reset_peer","stream":"upstream","attributes":{"timeout":150}}"#,
        )
        .await;
        assert_eq!(status, 200, "{created}");
        assert_eq!(
            created,
            json!({"name": "reset_peer_upstream", "type": "reset_peer", "stream": "upstream",
                   "toxicity": 1.0, "attributes": {"timeout": 150}})
        );

        // A live connection is reset once it sends, after the toxic's timeout.
        let started = Instant::now();
        live.write_all(b"PING").await.expect("send");
        assert_reset(&mut live).await;
        assert!(
            started.elapsed() >= Duration::from_millis(150),
            "reset before the timeout: {:?}",
            started.elapsed()
        );

        // A new connection is accepted (the greeting flows downstream, untouched), then reset
        // on its first upstream byte.
        let mut fresh = connect(listen, "hi").await;
        fresh.write_all(b"PING").await.expect("send");
        assert_reset(&mut fresh).await;

        // Removed, the proxy passes data again, and a normal close is a FIN again.
        let (status, _) = http(api, "DELETE", "/proxies/rst/toxics/reset_peer_upstream", "").await;
        assert_eq!(status, 204);
        let mut healed = connect(listen, "hi").await;
        round_trip(&mut healed, b"PING").await;
        healed.shutdown().await.expect("half-close");
        let mut buf = [0u8; 8];
        let end = tokio::time::timeout(GUARD, healed.read(&mut buf)).await;
        assert!(matches!(end, Ok(Ok(0))), "expected a FIN, got {end:?}");
    }

    #[tokio::test]
    async fn bytes_held_by_a_latency_toxic_reach_the_client_when_the_server_closes() {
        // A server that answers and closes at once, as an HTTP server with `Connection: close`.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let upstream = listener.local_addr().expect("upstream address");
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let _ = socket.write_all(b"the whole reply").await;
                drop(socket);
            }
        });
        let server = start_server().await;
        let api = server.addr();
        let listen = populate_one(api, "late", upstream).await;
        let (status, _) = http(
            api,
            "POST",
            "/proxies/late/toxics",
            r#"{"type":"latency","attributes":{"latency":200}}"#,
        )
        .await;
        assert_eq!(status, 200);

        let started = Instant::now();
        let mut conn = TcpStream::connect(listen).await.expect("connect");
        let mut reply = Vec::new();
        tokio::time::timeout(GUARD, conn.read_to_end(&mut reply))
            .await
            .expect("closed in time")
            .expect("read to the end");
        assert_eq!(reply, b"the whole reply");
        assert!(started.elapsed() >= Duration::from_millis(200));
    }

    #[tokio::test]
    async fn bandwidth_toxic_paces_large_chunks() {
        let server = start_server().await;
        let api = server.addr();
        let listen = populate_one(api, "thin", upstream("").await).await;
        let (status, body) = http(
            api,
            "POST",
            "/proxies/thin/toxics",
            r#"{"type":"bandwidth","attributes":{"rate":4}}"#,
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let mut conn = connect(listen, "").await;
        // 1200 bytes at 4 KB/s take 300 ms; unpaced, noxious would stall or drop this chunk.
        assert!(round_trip(&mut conn, &[1u8; 1200]).await >= Duration::from_millis(250));
    }

    #[tokio::test]
    async fn disable_refuses_and_closes_then_enable_rebinds_the_same_port() {
        let server = start_server().await;
        let api = server.addr();
        let listen = populate_one(api, "flaky", upstream("").await).await;
        let mut live = connect(listen, "").await;
        round_trip(&mut live, b"up").await;
        with_client(api, |client| {
            client
                .find_proxy("flaky")
                .expect("find proxy")
                .with_latency("downstream".into(), 1, 0, 1.0);
        })
        .await;

        with_client(api, |client| client.find_proxy("flaky")?.disable())
            .await
            .expect("disable");
        assert_closed(&mut live).await;
        assert_refused(listen).await;
        let (_, shown) = http_json(api, "GET", "/proxies/flaky", "").await;
        assert_eq!(shown["enabled"], json!(false));
        assert_eq!(shown["toxics"][0]["name"], json!("latency_downstream"));

        with_client(api, |client| client.find_proxy("flaky")?.enable())
            .await
            .expect("enable");
        let mut again = connect(listen, "").await;
        round_trip(&mut again, b"back").await;
        let (_, shown) = http_json(api, "GET", "/proxies/flaky", "").await;
        assert_eq!(shown["enabled"], json!(true));
        assert_eq!(shown["listen"], json!(listen.to_string()));
    }

    #[tokio::test]
    async fn api_errors_have_toxiproxy_status_codes() {
        let server = start_server().await;
        let api = server.addr();
        let up = upstream("").await;

        assert_eq!(
            assert_error(api, "GET", "/proxies/nope", "", 404).await,
            "proxy not found"
        );
        assert_error(
            api,
            "POST",
            "/proxies/nope/toxics",
            r#"{"type":"latency"}"#,
            404,
        )
        .await;
        assert_error(api, "DELETE", "/proxies/nope", "", 404).await;
        assert_error(api, "GET", "/no/such/route", "", 404).await;

        let create = format!(r#"{{"name":"p","upstream":"{up}","listen":"127.0.0.1:0"}}"#);
        let (status, created) = http_json(api, "POST", "/proxies", &create).await;
        assert_eq!(status, 201, "{created}");
        assert_ne!(created["listen"], json!("127.0.0.1:0"));
        assert_eq!(
            assert_error(api, "POST", "/proxies", &create, 409).await,
            "proxy already exists"
        );
        assert_error(api, "POST", "/proxies", r#"{"name":"q"}"#, 400).await;
        assert_error(api, "POST", "/populate", r#"{"name":"q"}"#, 400).await;

        let latency = r#"{"type":"latency","attributes":{"latency":5}}"#;
        let (status, _) = http(api, "POST", "/proxies/p/toxics", latency).await;
        assert_eq!(status, 200);
        assert_eq!(
            assert_error(api, "POST", "/proxies/p/toxics", latency, 409).await,
            "toxic already exists"
        );
        assert_eq!(
            assert_error(api, "POST", "/proxies/p/toxics", r#"{"type":"bogus"}"#, 400).await,
            "unsupported toxic type bogus"
        );
        for bad in [
            r#"{"type":"latency","name":"l2","attributes":{"latency":"slow"}}"#,
            r#"{"type":"latency","name":"l3","attributes":{"latency":-1}}"#,
            r#"{"type":"latency","name":"l4","attributes":{"latency":10,"jitter":20}}"#,
            r#"{"type":"slicer","attributes":{"average_size":0}}"#,
            r#"{"type":"slicer","attributes":{"average_size":10,"size_variation":10}}"#,
            r#"{"type":"timeout","stream":"sideways"}"#,
            r#"{"type":"timeout","toxicity":"high"}"#,
            r#"{"type":"timeout""#,
            "[]",
        ] {
            assert_error(api, "POST", "/proxies/p/toxics", bad, 400).await;
        }
        assert_error(
            api,
            "POST",
            "/proxies/p/toxics/latency_downstream",
            r#"{"attributes":{"latency":true}}"#,
            400,
        )
        .await;
        assert_error(api, "GET", "/proxies/p/toxics/nope", "", 404).await;
        assert_error(api, "POST", "/proxies/p/toxics/nope", "{}", 404).await;
        assert_error(api, "DELETE", "/proxies/p/toxics/nope", "", 404).await;
        assert_error(api, "POST", "/proxies/p", r#"{"enabled":"yes"}"#, 400).await;

        let (status, _) = http(api, "DELETE", "/proxies/p/toxics/latency_downstream", "").await;
        assert_eq!(status, 204);
        let (status, _) = http(api, "DELETE", "/proxies/p", "").await;
        assert_eq!(status, 204);
        assert_error(api, "GET", "/proxies/p", "", 404).await;
    }

    #[tokio::test]
    async fn changing_the_upstream_sends_new_connections_there() {
        let server = start_server().await;
        let api = server.addr();
        let first = upstream("A").await;
        let second = upstream("B").await;
        let listen = populate_one(api, "switch", first).await;
        let _on_first = connect(listen, "A").await;

        let (status, updated) = http_json(
            api,
            "POST",
            "/proxies/switch",
            &format!(r#"{{"upstream":"{second}"}}"#),
        )
        .await;
        assert_eq!(status, 200, "{updated}");
        assert_eq!(updated["upstream"], json!(second.to_string()));
        assert_eq!(updated["listen"], json!(listen.to_string()));
        let mut conn = connect(listen, "B").await;
        round_trip(&mut conn, b"second").await;
    }

    #[tokio::test]
    async fn reset_removes_toxics_and_enables_all_and_populate_keeps_unchanged_proxies() {
        let server = start_server().await;
        let api = server.addr();
        let up = upstream("").await;
        let one = populate_one(api, "one", up).await;
        let two = populate_one(api, "two", up).await;
        with_client(api, |client| {
            let proxy = client.find_proxy("one").expect("find one");
            proxy.with_timeout("upstream".into(), 0, 1.0);
            proxy.with_latency("downstream".into(), 5, 0, 1.0);
            client.find_proxy("two").expect("find two").disable()
        })
        .await
        .expect("disable two");

        // Populating the same address and upstream keeps the proxy and its toxics.
        let same = ProxyPack::new("one".into(), one.to_string(), up.to_string());
        let kept = with_client(api, move |client| client.populate(vec![same]))
            .await
            .expect("populate unchanged");
        assert_eq!(kept[0].proxy_pack.toxics.len(), 2);

        with_client(api, |client| client.reset())
            .await
            .expect("reset");
        let (status, _) = http(api, "POST", "/reset", "").await;
        assert_eq!(status, 204);
        let all = with_client(api, |client| client.all()).await.expect("all");
        for name in ["one", "two"] {
            assert!(all[name].proxy_pack.enabled, "{name} enabled");
            assert!(all[name].proxy_pack.toxics.is_empty(), "{name} toxics");
        }
        round_trip(&mut connect(one, "").await, b"one").await;
        round_trip(&mut connect(two, "").await, b"two").await;

        // A changed upstream replaces the proxy.
        let other = upstream("X").await;
        let changed = ProxyPack::new("two".into(), "127.0.0.1:0".into(), other.to_string());
        let replaced = with_client(api, move |client| client.populate(vec![changed]))
            .await
            .expect("populate changed");
        let listen: SocketAddr = replaced[0].proxy_pack.listen.parse().expect("listen");
        connect(listen, "X").await;
    }

    #[tokio::test]
    async fn shutdown_stops_the_api_and_every_proxy() {
        let server = start_server().await;
        let api = server.addr();
        let listen = populate_one(api, "gone", upstream("").await).await;
        let mut live = connect(listen, "").await;
        round_trip(&mut live, b"alive").await;

        server.shutdown().await;
        assert_refused(api).await;
        assert_refused(listen).await;
        assert_closed(&mut live).await;
    }

    #[tokio::test]
    async fn drop_stops_every_proxy() {
        let server = start_server().await;
        let listen = populate_one(server.addr(), "dropped", upstream("").await).await;
        drop(server);
        let deadline = Instant::now() + GUARD;
        while TcpStream::connect(listen).await.is_ok() {
            assert!(
                Instant::now() < deadline,
                "proxy still listening after drop"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn serve_runs_until_its_shutdown_future() {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("probe");
        let api = probe.local_addr().expect("probe address");
        drop(probe);
        let (stop, stopped) = oneshot::channel::<()>();
        let serving = tokio::spawn(serve(api, async move {
            let _ = stopped.await;
        }));
        let deadline = Instant::now() + GUARD;
        let (status, body) = loop {
            if TcpStream::connect(api).await.is_ok() {
                break http(api, "GET", "/version", "").await;
            }
            assert!(Instant::now() < deadline, "API never came up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!((status, body.as_str()), (200, VERSION));
        let listen = populate_one(api, "served", upstream("").await).await;

        let _ = stop.send(());
        let result = tokio::time::timeout(GUARD, serving)
            .await
            .expect("serve returns")
            .expect("serve task");
        assert!(result.is_ok());
        assert_refused(listen).await;
    }
}
