//! The proxies the API manages: their configuration and toxics (the source of truth) and the
//! noxious engine run that serves each enabled proxy.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bmrng::RequestSender;
use bmrng::error::RequestError;
use noxious::proxy::{ProxyConfig, ProxyRunner, Runner, Toxics};
use noxious::signal::{Close, Stop, Stopper};
use noxious::socket::TcpListener as EngineListener;
use noxious::tap::Tap;
use noxious::toxic::{
    StreamDirection, Toxic, ToxicEvent, ToxicEventKind, ToxicEventResult, ToxicKind,
};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use super::api::ApiError;
use super::listen::{PortClaim, listen_matches, resolve_listen};
use crate::env::proxy::json::{NewProxy, ProxyInfo, ToxicInfo};

/// A toxic change makes the engine rebuild every live link of the proxy; a wedged link must not
/// wedge the API, so past this the proxy is restarted instead.
const ENGINE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a proxy's restart waits for its port to be free again, and in what steps.
const REBIND: Duration = Duration::from_secs(2);
const REBIND_STEP: Duration = Duration::from_millis(50);

/// The engine reads at most 32 KiB per chunk, but a buffer may be handed back larger; this bounds
/// the chunk sizes that the bandwidth pacer must plan for.
const MAX_CHUNK: u64 = 64 * 1024;

/// Suffix of the hidden slicer paired with each bandwidth toxic (see [`pacer`]). The NUL cannot
/// appear in client-chosen names, which are rejected if they contain one.
pub(super) const PACER_SUFFIX: &str = "\u{0}pace";

/// The server's state, shared by the handlers.
pub(super) type Shared = Arc<Store>;

/// Every proxy, by name.
#[derive(Default)]
pub(super) struct Store {
    /// One lock for everything: API calls are rare and short, and serialising them keeps the
    /// proxies' runs, listen ports and toxic lists consistent without finer bookkeeping.
    pub(super) proxies: Mutex<BTreeMap<String, ProxyEntry>>,
}

impl Store {
    pub(super) async fn stop_all(&self) {
        let mut proxies = self.proxies.lock().await;
        for entry in proxies.values_mut() {
            entry.stop().await;
        }
    }
}

/// A proxy as the API sees it. `toxics` is the source of truth (in the order they were added);
/// the engine run, when there is one, mirrors it.
pub(super) struct ProxyEntry {
    pub(super) name: String,
    /// Always a concrete address (port 0 resolved), so re-enabling rebinds the same port.
    pub(super) listen: SocketAddr,
    /// The claim on `listen`'s port when racecert picked it: no other proxy of this process
    /// takes it while this one is disabled.
    _claim: Option<PortClaim>,
    pub(super) upstream: String,
    enabled: bool,
    toxics: Vec<Toxic>,
    pub(super) run: Option<EngineRun>,
    /// What observes (and may hold) the proxy's connections: set in process, never over the API.
    tap: Option<Arc<dyn Tap>>,
}

/// One run of the noxious engine. Its listen and upstream addresses are fixed for the run, so
/// changing them (or disabling the proxy) ends the run.
///
/// Unlike Toxiproxy, noxious 1.0.4 stops a direction's toxic chain as soon as its sender closes,
/// so bytes still held by a delaying toxic (latency, bandwidth, slicer, slow_close) are dropped:
/// a server that answers and closes at once may reach the client with nothing. Long-lived
/// connections (databases, caches) are unaffected until they close.
pub(super) struct EngineRun {
    events: RequestSender<ToxicEvent, ToxicEventResult>,
    pub(super) stopper: Stopper,
    closed: Close,
    task: JoinHandle<()>,
}

impl EngineRun {
    async fn start(
        name: &str,
        listen: SocketAddr,
        upstream: &str,
        toxics: &[Toxic],
        tap: Option<Arc<dyn Tap>>,
    ) -> Result<EngineRun, ApiError> {
        let config = ProxyConfig {
            name: name.to_owned(),
            listen: listen.to_string(),
            upstream: upstream.to_owned(),
            enabled: true,
            rand_seed: None,
        };
        // A restart binds the port its last run held a moment ago. Clients were told this
        // port, so it cannot move; a bind that finds it still in use is tried again for a
        // short while (seen once in CI, on a restart to take a tap), then reported.
        let mut waited = Duration::ZERO;
        let (listener, info) = loop {
            match ProxyRunner::initialize_proxy::<EngineListener>(
                config.clone(),
                engine_toxics(toxics),
            )
            .await
            {
                Err(err) if err.kind() == std::io::ErrorKind::AddrInUse && waited < REBIND => {
                    tokio::time::sleep(REBIND_STEP).await;
                    waited += REBIND_STEP;
                }
                Err(err) => {
                    return Err(ApiError::internal(format!(
                        "proxy {name}: listen on {listen}: {err}{}",
                        if waited.is_zero() {
                            String::new()
                        } else {
                            format!(" (still, after {waited:?})")
                        }
                    )));
                }
                Ok(bound) => break bound,
            }
        };
        let (events, receiver) = bmrng::channel(1);
        let (stop, stopper) = Stop::new();
        let (closed, closer) = Close::new();
        let proxy = name.to_owned();
        let task = tokio::spawn(async move {
            if let Err(err) =
                ProxyRunner::run_proxy_with_tap(listener, info, receiver, stop, closer, tap).await
            {
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
            // Aborting only asks: the listener is freed when the task is dropped, which
            // awaiting it waits for; binding its port again before that finds it in use.
            let _ = self.task.await;
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
    pub(super) async fn create(spec: NewProxy) -> Result<ProxyEntry, ApiError> {
        let (listen, claim) = resolve_listen(&spec.listen).await?;
        let mut entry = ProxyEntry {
            listen,
            _claim: claim,
            name: spec.name,
            upstream: spec.upstream,
            enabled: spec.enabled,
            toxics: Vec::new(),
            run: None,
            tap: None,
        };
        if entry.enabled {
            entry.start().await?;
        }
        Ok(entry)
    }

    pub(super) async fn start(&mut self) -> Result<(), ApiError> {
        if self.run.as_ref().is_some_and(EngineRun::is_alive) {
            self.enabled = true;
            return Ok(());
        }
        // Reap a run that died on its own before binding the port again.
        self.stop().await;
        match EngineRun::start(
            &self.name,
            self.listen,
            &self.upstream,
            &self.toxics,
            self.tap.clone(),
        )
        .await
        {
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

    pub(super) async fn stop(&mut self) {
        if let Some(run) = self.run.take() {
            run.stop(&self.name).await;
        }
    }

    /// Attaches (or removes) the proxy's tap. A running proxy restarts on the same port so the
    /// tap sees every connection from now on (live ones are closed: their bytes so far were not
    /// seen, and half a conversation would frame as garbage).
    pub(super) async fn set_tap(&mut self, tap: Option<Arc<dyn Tap>>) -> Result<(), ApiError> {
        self.tap = tap;
        if self.run.is_some() {
            self.stop().await;
            self.start().await?;
        }
        Ok(())
    }

    pub(super) async fn set_enabled(&mut self, enabled: bool) -> Result<(), ApiError> {
        if enabled {
            self.start().await
        } else {
            self.stop().await;
            self.enabled = false;
            Ok(())
        }
    }

    /// Applies a `POST /proxies/{name}`: a new listen or upstream address needs a new engine run.
    pub(super) async fn update(
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
        if let Some((listen, claim)) = new_listen {
            self.listen = listen;
            self._claim = claim;
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

    pub(super) async fn add_toxic(&mut self, toxic: Toxic) -> Result<(), ApiError> {
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

    pub(super) async fn update_toxic(&mut self, toxic: Toxic) -> Result<(), ApiError> {
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

    pub(super) async fn remove_toxic(&mut self, name: &str) -> Result<(), ApiError> {
        let Some(index) = self.toxics.iter().position(|toxic| toxic.name == name) else {
            return Err(ApiError::not_found("toxic not found"));
        };
        let toxic = self.toxics.remove(index);
        self.sync_engine(removal_events(&toxic)).await
    }

    pub(super) async fn clear_toxics(&mut self) -> Result<(), ApiError> {
        // One removal per toxic: noxious 1.0.4's "remove all" event only clears upstream toxics.
        let kinds = self.toxics.iter().rev().flat_map(removal_events).collect();
        self.toxics.clear();
        self.sync_engine(kinds).await
    }

    pub(super) fn toxic(&self, name: &str) -> Option<&Toxic> {
        self.toxics.iter().find(|toxic| toxic.name == name)
    }

    /// The toxics as the API lists them: upstream ones first, each direction in chain order.
    pub(super) fn toxic_infos(&self) -> Vec<ToxicInfo> {
        let upstream = self
            .toxics
            .iter()
            .filter(|toxic| toxic.direction == StreamDirection::Upstream);
        let downstream = self
            .toxics
            .iter()
            .filter(|toxic| toxic.direction == StreamDirection::Downstream);
        upstream.chain(downstream).map(ToxicInfo::of).collect()
    }

    /// The proxy as the API shows it.
    pub(super) fn info(&self) -> ProxyInfo {
        ProxyInfo {
            name: self.name.clone(),
            listen: self.listen.to_string(),
            upstream: self.upstream.clone(),
            enabled: self.enabled,
            toxics: self.toxic_infos(),
        }
    }
}

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
