//! The fault plane of one case: the operations [`crate::fault::apply`] needs, on the case's real
//! services and workers. The services side ([`Services`]) is the same for every runner: it expires
//! leases through the harness's own connection, restarts the Redis container, cuts the links of
//! the case's workers (each worker has links of its own: [`WorkerLink`]), switches the
//! active-version pointer, and slows or fails the case's backend calls. The workers side
//! ([`Workers`]) is each runner's: a worker parked at a checkpoint, a free-running task, or a
//! process.

use crate::contract::Keys;
use crate::contract::defect::Defects;
use crate::contract::log::LogSink;
use crate::contract::worker::{BackendEndpoint, Infra};
use crate::env::backends::{Behaviour, ProgramGuard, Stalls};
use crate::env::proxy::{Direction, Toxic};
use crate::env::{CaseLinks, Target, TestBed};
use crate::fault::{PartitionTarget, Plane};
use crate::history::Recorder;
use crate::reference::cutover::Cutover;
use crate::{Error, Result};
use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::time::Duration;

/// How long a worker's Redis connection gets to answer after a healed partition or a restart
/// before the case goes on without waking it (it may be held by the schedule).
const WORKER_RECONNECT: Duration = Duration::from_secs(2);

/// The workers side of a case's plane.
pub trait Workers: Send {
    /// The id of worker `worker` (indices wrap around the case's workers).
    fn id(&self, worker: usize) -> String;
    /// Crashes the worker where it is: `Some(where)` when it had something in hand (`where` is a
    /// checkpoint name when the runner knows it), `None` when there was nothing to crash.
    fn crash(
        &mut self,
        worker: usize,
    ) -> impl Future<Output = Result<Option<Option<String>>>> + Send;
    /// Pauses the worker for up to `pause` and resumes it; how long it stayed paused, or None
    /// if this runner cannot pause workers.
    fn pause(
        &mut self,
        worker: usize,
        pause: Duration,
    ) -> impl Future<Output = Result<Option<Duration>>> + Send;
}

/// How a plane reaches the model backends to slow or fail them: per-case programs of the shared
/// wiremock backends (the calls carry the case's key prefix), or toxics on the backend proxies of
/// the case's workers. A mode of the plane, not a fault: the faults are `fault::Fault`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendControl {
    /// Programs of the backends, per case prefix.
    Programs,
    /// Toxics on the workers' own backend proxies.
    Toxics,
}

/// One worker's own links (proxies in front of Redis, Postgres and every backend, recorded when
/// the wire is) and the connections a worker in process uses through them. Reused from case to
/// case; a case cuts, slows and records only the links of its own workers.
#[derive(Debug)]
pub struct WorkerLink {
    /// The proxies.
    pub links: CaseLinks,
    /// Connections through them (for workers in process).
    pub infra: Option<Infra>,
    /// Every version's backend, through this worker's own backend proxy.
    pub backends: BTreeMap<String, BackendEndpoint>,
}

impl WorkerLink {
    /// New links on `bed` (recorded with `record`), and connections through them if `connect`.
    pub async fn open(bed: &TestBed, record: bool, connect: bool) -> Result<WorkerLink> {
        Self::open_with(bed, record, connect, false).await
    }

    /// [`WorkerLink::open`], recorded, and with `holdable` able to hold every request before it
    /// reaches its server (the wire scheduler's links).
    pub async fn open_with(
        bed: &TestBed,
        record: bool,
        connect: bool,
        holdable: bool,
    ) -> Result<WorkerLink> {
        let links = bed.links_with(true, record, holdable).await?;
        let mut backends = BTreeMap::new();
        for version in bed.versions() {
            backends.insert(
                version.to_owned(),
                BackendEndpoint {
                    name: crate::reference::endpoint_name(bed.backend(version)?.name()),
                    url: links.backend_url(version).unwrap_or_default(),
                },
            );
        }
        let infra = if connect {
            Some(Infra::connect(links.redis_url(), links.database_url()).await?)
        } else {
            None
        };
        Ok(WorkerLink {
            links,
            infra,
            backends,
        })
    }

    /// The in-process connections (links opened with `connect`).
    pub fn infra(&self) -> Result<&Infra> {
        self.infra
            .as_ref()
            .ok_or_else(|| Error::other("these links were opened without connections"))
    }
}

/// The services side of a case's plane.
pub struct Services<'b> {
    bed: &'b TestBed,
    keys: Keys,
    /// The harness's own connections (straight to the services, or through the shared proxies:
    /// [`TestBed::harness_redis_url`]): a case's partition cuts off its workers, not the harness.
    admin: Infra,
    /// The case's workers' links, in worker order.
    pub links: Vec<WorkerLink>,
    cut: HashSet<PartitionTarget>,
    backend_control: BackendControl,
    programs: BTreeMap<String, ProgramGuard>,
    toxics: BTreeMap<String, String>,
    cutover: Option<Cutover>,
    defects: Defects,
    backend_timeout: Duration,
    /// Idempotency keys of the case's requests, in submission order.
    pub requests: Vec<String>,
    /// The workers' call deadlines, when the runner holds them (controlled): a slowed backend
    /// then expires the caller's wait on arrival instead of making it wait out its timeout.
    pub deadlines: Option<crate::contract::checkpoint::Deadlines>,
    /// How a Redis restart lands on this case.
    pub restart: RestartScope,
    redis_restarted: bool,
}

/// How a `redis-restart` fault is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartScope {
    /// The Redis server process restarts: every case on the bed loses its state, so the case
    /// runs alone.
    Process,
    /// The case's own Redis is restarted as the case sees it: every socket of its workers
    /// dropped (their proxies disabled and enabled, as a dying server closes them) and every key
    /// of its namespace gone (leases, the stream and its consumer group, cache, version
    /// pointer), with no server restart. Other cases run on undisturbed, so the case need not run
    /// alone; what only a process restart changes (the server's run id, other tenants' keys) is
    /// not what a worker of this case can observe.
    Namespace,
}

impl std::fmt::Debug for Services<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Services")
            .field("keys", &self.keys.prefix())
            .field("cut", &self.cut)
            .finish_non_exhaustive()
    }
}

impl<'b> Services<'b> {
    /// The services of a case under `keys` on `bed`, whose workers use `links` (in worker
    /// order); backend faults are made the `backend_control` way.
    pub fn new(
        bed: &'b TestBed,
        keys: Keys,
        admin: Infra,
        links: Vec<WorkerLink>,
        backend_control: BackendControl,
        defects: Defects,
        backend_timeout: Duration,
    ) -> Services<'b> {
        Services {
            bed,
            keys,
            admin,
            links,
            cut: HashSet::new(),
            backend_control,
            programs: BTreeMap::new(),
            toxics: BTreeMap::new(),
            cutover: None,
            defects,
            backend_timeout,
            requests: Vec::new(),
            deadlines: None,
            restart: RestartScope::Process,
            redis_restarted: false,
        }
    }

    /// Records the round trips of worker `index`'s links into `recorder`, attributed to
    /// `worker`; whether they are recorded.
    pub fn record(&self, index: usize, worker: &str, recorder: &std::sync::Arc<Recorder>) -> bool {
        self.record_to(index, worker, recorder.wire_listener())
    }

    /// [`Services::record`] for every worker of `workers`, in order; whether all are recorded.
    pub fn record_all(
        &self,
        workers: &[crate::schedule::WorkerSpec],
        recorder: &std::sync::Arc<Recorder>,
    ) -> bool {
        workers.iter().enumerate().fold(true, |all, (index, spec)| {
            self.record(index, &spec.id, recorder) && all
        })
    }

    /// [`Services::record`] to any listener.
    pub fn record_to(
        &self,
        index: usize,
        worker: &str,
        listener: crate::wire::WireListener,
    ) -> bool {
        self.links
            .get(index)
            .is_some_and(|link| link.links.record(worker, listener))
    }

    /// Asks `holder` before each request of worker `index`'s links goes on; whether its links
    /// can hold.
    pub fn hold(&self, index: usize, holder: std::sync::Arc<dyn crate::wire::Holder>) -> bool {
        self.links
            .get(index)
            .is_some_and(|link| link.links.hold(Some(holder)))
    }

    /// Stops recording every link of the case and hands the links back (healed, holding
    /// nothing), to be reused.
    pub fn release_links(&mut self) -> Vec<WorkerLink> {
        for link in &self.links {
            link.links.stop_recording();
            link.links.hold(None);
        }
        std::mem::take(&mut self.links)
    }

    /// The case's key namespace.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The harness's connections.
    pub fn admin(&self) -> &Infra {
        &self.admin
    }

    /// Whether a link of the case is cut now.
    pub fn is_cut(&self) -> bool {
        !self.cut.is_empty()
    }

    /// Whether Redis restarted during the case (its queue must be recovered).
    pub fn redis_restarted(&self) -> bool {
        self.redis_restarted
    }

    /// The active version, as the pointer says now.
    pub async fn active_version(&self) -> Result<Option<String>> {
        let mut redis = self.admin.redis.clone();
        Ok(redis::cmd("GET")
            .arg(self.keys.active_version())
            .query_async(&mut redis)
            .await?)
    }

    /// Deletes the lease of `key` through the harness's connection; whether one was held.
    pub async fn delete_lease(&self, key: &str) -> Result<bool> {
        Ok(self.delete_leases(&[key.to_owned()]).await? == [true])
    }

    /// Deletes the leases of `keys` through the harness's connection, in one round trip; for
    /// each key, whether a lease was held.
    pub async fn delete_leases(&self, keys: &[String]) -> Result<Vec<bool>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.cmd("DEL").arg(self.keys.lease(key));
        }
        let deleted: Vec<i64> = pipe.query_async(&mut self.admin.redis.clone()).await?;
        Ok(deleted.into_iter().map(|d| d == 1).collect())
    }

    /// The time each job's lease has left to live, as its holder set it (`PTTL`): None when no
    /// lease is held, `Some(-1)` when it never expires.
    pub async fn lease_ttls(&self, keys: &[String]) -> Result<Vec<Option<i64>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.cmd("PTTL").arg(self.keys.lease(key));
        }
        let ttls: Vec<i64> = pipe.query_async(&mut self.admin.redis.clone()).await?;
        Ok(ttls
            .into_iter()
            .map(|ttl| (ttl != -2).then_some(ttl))
            .collect())
    }

    /// Lets time pass for the leases of `keys`, up to `bound`: a lease that runs out within it
    /// by itself is deleted (whether one was held is returned per key); a lease set to outlive it
    /// (or never to expire) stays, and is returned with what it had left: a crashed holder's job
    /// waits behind it longer than the liveness bound, which the drain does not repair.
    pub async fn expire_leases_within(
        &self,
        keys: &[String],
        bound: Duration,
    ) -> Result<(Vec<bool>, Vec<(String, i64)>)> {
        let ttls = self.lease_ttls(keys).await?;
        let (mut expiring, mut outliving) = (Vec::new(), Vec::new());
        for (key, ttl) in keys.iter().zip(&ttls) {
            match ttl {
                Some(ttl) if *ttl < 0 || *ttl as u128 > bound.as_millis() => {
                    outliving.push((key.clone(), *ttl));
                }
                Some(_) => expiring.push(key.clone()),
                None => {}
            }
        }
        let deleted = self.delete_leases(&expiring).await?;
        let held = keys
            .iter()
            .map(|key| {
                expiring
                    .iter()
                    .position(|k| k == key)
                    .is_some_and(|i| deleted[i])
            })
            .collect();
        Ok((held, outliving))
    }

    /// After a restart or a healed partition the connections have seen their sockets die: the
    /// first command fails and reconnects. Wait until they answer again, so only the workers'
    /// attempts, never the harness's own bookkeeping, feel the fault.
    pub async fn reconnect(&self) -> Result<()> {
        // A worker's connection may carry a request the schedule is holding (a step between
        // statements): a PING waits behind it, up to the bound. Such a worker is woken in the
        // background (its connection manager must still be told to reconnect: one whose last
        // reconnect failed while the server was down answers the next command with that
        // failure), and the case goes on; the others are woken together, each within the bound.
        // (Woken one after another, a held worker cost the case its 2 s at every heal.)
        let mut woken = Vec::new();
        for link in &self.links {
            let Some(infra) = &link.infra else { continue };
            let wake = wake_worker(infra.redis.clone());
            if link.links.holds_redis() {
                tokio::spawn(wake);
            } else {
                woken.push(wake);
            }
        }
        futures::future::join_all(woken).await;
        crate::env::containers::wait_ready(
            "redis (case connections)",
            Duration::from_secs(10),
            ping(&self.admin.redis),
        )
        .await?;
        Ok(())
    }

    /// Cuts (or heals) the workers' links to `target`. A cut link resets every connection the
    /// moment its client sends (a `reset_peer` toxic on the client's direction) rather than
    /// refusing connections: a connection reset ends a worker's query or connection attempt at
    /// once (a refused connection is retried by client pools until their timeout), and a proxy
    /// that keeps its listener keeps its port.
    async fn set_link(&mut self, target: PartitionTarget, cut: bool) -> Result<()> {
        let reset = Toxic::ResetPeer { timeout_ms: 0 };
        for link in &self.links {
            let proxy = match target {
                PartitionTarget::Redis => &link.links.redis,
                PartitionTarget::Postgres => &link.links.postgres,
            };
            if cut && !self.cut.contains(&target) {
                proxy.add_toxic(reset, Direction::Upstream, 1.0).await?;
            } else if !cut && self.cut.contains(&target) {
                proxy.remove_toxic(&reset.name(Direction::Upstream)).await?;
            }
        }
        if cut {
            self.cut.insert(target);
        } else {
            self.cut.remove(&target);
            // Only Redis's connection manager needs waking; Postgres's pool opens fresh
            // connections on its own.
            if target == PartitionTarget::Redis {
                self.reconnect().await?;
            }
        }
        Ok(())
    }

    async fn slow_backend(&mut self, version: &str, delay: Duration) -> Result<()> {
        match self.backend_control {
            BackendControl::Programs => {
                let behaviour = match &self.deadlines {
                    Some(deadlines) => Behaviour::Stall {
                        delay,
                        deadlines: Stalls(deadlines.clone()),
                    },
                    None => Behaviour::Delay(delay),
                };
                let guard = self
                    .bed
                    .backend(version)?
                    .program(self.keys.prefix(), behaviour)
                    .await?;
                if let Some(replaced) = self.programs.insert(version.to_owned(), guard) {
                    replaced.release().await;
                }
            }
            BackendControl::Toxics => {
                self.recover_backend(version).await?;
                let toxic = Toxic::Latency {
                    latency_ms: delay.as_millis() as u32,
                    jitter_ms: 0,
                };
                for proxy in self.backend_links(version)? {
                    proxy.add_toxic(toxic, Direction::Downstream, 1.0).await?;
                }
                self.toxics
                    .insert(version.to_owned(), toxic.name(Direction::Downstream));
            }
        }
        Ok(())
    }

    fn backend_links(&self, version: &str) -> Result<Vec<&crate::env::DedicatedProxy>> {
        self.links
            .iter()
            .map(|link| {
                link.links.backends.get(version).ok_or_else(|| {
                    Error::Config(format!("the case has no backend link for {version}"))
                })
            })
            .collect()
    }

    async fn recover_backend(&mut self, version: &str) -> Result<()> {
        if let Some(program) = self.programs.remove(version) {
            program.release().await;
        }
        if let Some(name) = self.toxics.remove(version) {
            for proxy in self.backend_links(version)? {
                proxy.remove_toxic(&name).await?;
            }
        }
        Ok(())
    }

    async fn fail_backend(&mut self, version: &str, status: u16, calls: u64) -> Result<()> {
        let guard = self
            .bed
            .backend(version)?
            .program(self.keys.prefix(), Behaviour::FailFirst { status, calls })
            .await?;
        if let Some(replaced) = self.programs.insert(version.to_owned(), guard) {
            replaced.release().await;
        }
        Ok(())
    }

    async fn cutover(&mut self, to: &str) -> Result<Option<String>> {
        let mut redis = self.admin.redis.clone();
        // The effect is recorded by the caller; the operator's own log line is not needed.
        let cutover = crate::reference::cutover::cutover(
            &mut redis,
            &self.keys,
            to,
            &self.defects,
            &LogSink::default(),
        )
        .await?;
        let from = cutover.from.clone();
        self.cutover = Some(cutover);
        Ok(from)
    }

    async fn invalidate_cache(&mut self) -> Result<Option<u64>> {
        let Some(cutover) = self.cutover.as_mut() else {
            return Ok(None);
        };
        if !cutover.invalidation_pending {
            return Ok(None);
        }
        let mut redis = self.admin.redis.clone();
        Ok(Some(
            cutover
                .invalidate(&mut redis, &self.keys, &LogSink::default())
                .await?,
        ))
    }

    async fn restart_redis(&mut self) -> Result<()> {
        match self.restart {
            RestartScope::Process => {
                self.bed.restart(Target::Redis).await?;
            }
            RestartScope::Namespace => {
                for link in &self.links {
                    link.links.redis.disable().await?;
                }
                let flushed = self.flush_namespace().await;
                for link in &self.links {
                    link.links.redis.enable_again().await?;
                }
                flushed?;
            }
        }
        self.reconnect().await?;
        self.redis_restarted = true;
        Ok(())
    }

    /// Deletes every Redis key of the case's namespace (what a restart of a Redis without
    /// persistence loses), through the harness's connection: one round trip, the walk of the
    /// keyspace done by the server (every case ends with this, so it is worth a script).
    pub(crate) async fn flush_namespace(&self) -> Result<()> {
        static FLUSH: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
            redis::Script::new(
                r#"
                local cursor, deleted = "0", 0
                repeat
                    local reply = redis.call("SCAN", cursor, "MATCH", ARGV[1], "COUNT", 10000)
                    cursor = reply[1]
                    for _, key in ipairs(reply[2]) do
                        deleted = deleted + redis.call("DEL", key)
                    end
                until cursor == "0"
                return deleted
                "#,
            )
        });
        let pattern = format!("{}*", glob_escape(self.keys.prefix()));
        let _: i64 = FLUSH
            .arg(pattern)
            .invoke_async(&mut self.admin.redis.clone())
            .await?;
        Ok(())
    }

    /// Undoes every lasting fault: links enabled, toxics removed, backend programs dropped.
    pub async fn heal_all(&mut self) -> Result<()> {
        let was_cut = self.is_cut();
        for link in &self.links {
            if was_cut {
                link.links.redis.clear_toxics().await?;
                link.links.postgres.clear_toxics().await?;
            }
            if !self.toxics.is_empty() {
                for proxy in link.links.backends.values() {
                    proxy.clear_toxics().await?;
                }
            }
        }
        self.toxics.clear();
        crate::env::backends::release_all(std::mem::take(&mut self.programs).into_values()).await;
        self.cut.clear();
        if was_cut {
            self.reconnect().await?;
        }
        Ok(())
    }
}

/// A case's plane: its services and the runner's workers.
#[derive(Debug)]
pub struct CasePlane<'b, W> {
    /// The services side.
    pub services: Services<'b>,
    /// The runner's workers.
    pub workers: W,
}

impl<W: Workers> CasePlane<'_, W> {
    /// The server processes of the Postgres connections made through each worker's links, with
    /// the worker: what attributes an audited write to the worker that sent it.
    pub fn connections(&self) -> std::collections::BTreeMap<i32, String> {
        let mut out = std::collections::BTreeMap::new();
        for (index, link) in self.services.links.iter().enumerate() {
            for pid in link.links.backend_pids() {
                out.insert(pid, self.workers.id(index));
            }
        }
        out
    }

    /// The history of a free-running case (chaos, fleet): the journals, the audit trail and
    /// `recorder`'s events of `requests`, on the recorder's clock, the log-based checks given
    /// `lease_ttl`.
    pub async fn history(
        &self,
        recorder: &Recorder,
        requests: Vec<crate::history::SubmittedRequest>,
        lease_ttl: std::time::Duration,
        wire_recorded: bool,
    ) -> Result<crate::history::History> {
        let (bed, keys) = (self.services.bed, &self.services.keys);
        let mut history = crate::history::collect(
            bed.take_journals(keys.prefix()),
            &self.services.admin.pg,
            keys.prefix(),
            recorder.events(),
            requests,
            self.connections(),
        )
        .await?;
        history.epoch_unix_ms = Some(recorder.started_unix_ms());
        history.wire_origin_ms = Some(recorder.offset_of(bed.wire_origin()));
        history.lease_ttl_ms = Some(lease_ttl.as_millis() as u64);
        history.wire_recorded = wire_recorded;
        Ok(history)
    }
}

impl<W: Workers> Plane for CasePlane<'_, W> {
    fn request_key(&self, request: usize) -> Option<String> {
        let requests = &self.services.requests;
        (!requests.is_empty()).then(|| requests[request % requests.len()].clone())
    }

    async fn expire_lease(&mut self, key: &str) -> Result<bool> {
        self.services.delete_lease(key).await
    }

    async fn restart_redis(&mut self) -> Result<()> {
        self.services.restart_redis().await
    }

    async fn set_link(&mut self, target: PartitionTarget, cut: bool) -> Result<()> {
        self.services.set_link(target, cut).await
    }

    async fn cutover(&mut self, to: &str) -> Result<Option<String>> {
        self.services.cutover(to).await
    }

    async fn invalidate_cache(&mut self) -> Result<Option<u64>> {
        self.services.invalidate_cache().await
    }

    fn backend_timeout(&self) -> Duration {
        self.services.backend_timeout
    }

    async fn slow_backend(&mut self, version: &str, delay: Duration) -> Result<()> {
        self.services.slow_backend(version, delay).await
    }

    async fn recover_backend(&mut self, version: &str) -> Result<()> {
        self.services.recover_backend(version).await
    }

    async fn fail_backend(&mut self, version: &str, status: u16, calls: u64) -> Result<()> {
        self.services.fail_backend(version, status, calls).await
    }

    fn worker_id(&self, worker: usize) -> String {
        self.workers.id(worker)
    }

    async fn crash_worker(&mut self, worker: usize) -> Result<Option<Option<String>>> {
        self.workers.crash(worker).await
    }

    async fn pause_worker(&mut self, worker: usize, pause: Duration) -> Result<Option<Duration>> {
        self.workers.pause(worker, pause).await
    }

    async fn heal_all(&mut self) -> Result<()> {
        self.services.heal_all().await
    }
}

/// Pings a worker's Redis connection until it answers, within [`WORKER_RECONNECT`] (it may be
/// held by the schedule, or slow: the worker then reconnects when it next sends).
async fn wake_worker(redis: redis::aio::ConnectionManager) {
    let woken = crate::env::containers::wait_ready(
        "redis (a worker's connection)",
        WORKER_RECONNECT,
        ping(&redis),
    )
    .await;
    if let Err(err) = woken {
        tracing::debug!(%err, "a worker's redis connection stays asleep (held or slow)");
    }
}

/// A PING of `redis`, made again on each call (what `wait_ready` polls).
pub(super) fn ping(
    redis: &redis::aio::ConnectionManager,
) -> impl FnMut() -> futures::future::BoxFuture<'static, redis::RedisResult<String>> + use<> {
    let redis = redis.clone();
    move || {
        let mut redis = redis.clone();
        Box::pin(async move { redis::cmd("PING").query_async::<String>(&mut redis).await })
    }
}

/// `text` as a Redis glob that matches only itself.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::glob_escape;

    #[test]
    fn an_escaped_prefix_is_a_glob_that_matches_only_itself() {
        assert_eq!(glob_escape("r1x0c5:"), "r1x0c5:");
        assert_eq!(glob_escape(r"a*b?c[d]e\f"), r"a\*b\?c\[d\]e\\f");
    }
}
