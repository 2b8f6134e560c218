//! The fault plane of one case: the operations [`crate::fault::apply`] needs, on the case's real
//! services and workers. The services side ([`Services`]) is the same for every runner: it expires
//! leases through the harness's own connection, restarts the Redis container, cuts the case's own
//! links, switches the active-version pointer, and slows or fails the case's backend calls. The
//! workers side ([`Workers`]) is each runner's: a worker parked at a checkpoint, a free-running
//! task, or a process.

use crate::contract::Keys;
use crate::contract::defect::Defects;
use crate::contract::log::LogSink;
use crate::contract::worker::Infra;
use crate::env::backends::{Behaviour, ProgramGuard};
use crate::env::proxy::{Direction, Toxic};
use crate::env::{CaseLinks, Target, TestBed};
use crate::fault::{PartitionTarget, Plane};
use crate::reference::cutover::Cutover;
use crate::{Error, Result};
use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::time::Duration;

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
    /// Pauses the worker for `pause` and resumes it; false if this runner cannot pause workers.
    fn pause(
        &mut self,
        worker: usize,
        pause: Duration,
    ) -> impl Future<Output = Result<bool>> + Send;
}

/// How a case's backend faults are made: per-case programs of the shared wiremock backends (the
/// calls carry the case's key prefix), or toxics on backend proxies of the case's own.
#[derive(Debug)]
enum BackendFaults {
    Programs,
    Toxics,
}

/// The services side of a case's plane.
pub struct Services<'b> {
    bed: &'b TestBed,
    keys: Keys,
    /// The harness's own connections (through the shared proxies): a case's partition cuts off
    /// its workers, not the harness.
    admin: Infra,
    /// The connections the case's workers use (woken up after a restart or a heal).
    workers_infra: Infra,
    /// The case's own proxies, when it has them.
    links: Option<CaseLinks>,
    cut: HashSet<PartitionTarget>,
    backend_faults: BackendFaults,
    programs: BTreeMap<String, ProgramGuard>,
    toxics: BTreeMap<String, String>,
    cutover: Option<Cutover>,
    defects: Defects,
    backend_timeout: Duration,
    /// Idempotency keys of the case's requests, in submission order.
    pub requests: Vec<String>,
    redis_restarted: bool,
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
    /// The services of a case under `keys` on `bed`. `links` are the case's own proxies (needed
    /// for partitions; with backends, backend faults become toxics on them).
    pub fn new(
        bed: &'b TestBed,
        keys: Keys,
        admin: Infra,
        workers_infra: Infra,
        links: Option<CaseLinks>,
        defects: Defects,
        backend_timeout: Duration,
    ) -> Services<'b> {
        let backend_faults = match &links {
            Some(links) if !links.backends.is_empty() => BackendFaults::Toxics,
            _ => BackendFaults::Programs,
        };
        Services {
            bed,
            keys,
            admin,
            workers_infra,
            links,
            cut: HashSet::new(),
            backend_faults,
            programs: BTreeMap::new(),
            toxics: BTreeMap::new(),
            cutover: None,
            defects,
            backend_timeout,
            requests: Vec::new(),
            redis_restarted: false,
        }
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
        let mut redis = self.admin.redis.clone();
        let deleted: i64 = redis::cmd("DEL")
            .arg(self.keys.lease(key))
            .query_async(&mut redis)
            .await?;
        Ok(deleted == 1)
    }

    /// After a restart or a healed partition the connections have seen their sockets die: the
    /// first command fails and reconnects. Wait until they answer again, so only the workers'
    /// attempts, never the harness's own bookkeeping, feel the fault.
    pub async fn reconnect(&self) -> Result<()> {
        for redis in [self.workers_infra.redis.clone(), self.admin.redis.clone()] {
            crate::env::containers::wait_ready(
                "redis (case connections)",
                Duration::from_secs(10),
                || {
                    let mut redis = redis.clone();
                    async move { redis::cmd("PING").query_async::<String>(&mut redis).await }
                },
            )
            .await?;
        }
        Ok(())
    }

    fn link(&self, target: PartitionTarget) -> Result<&crate::env::DedicatedProxy> {
        let links = self
            .links
            .as_ref()
            .ok_or_else(|| Error::other("a partition needs the case's own proxies (CaseLinks)"))?;
        Ok(match target {
            PartitionTarget::Redis => &links.redis,
            PartitionTarget::Postgres => &links.postgres,
        })
    }

    async fn set_link(&mut self, target: PartitionTarget, cut: bool) -> Result<()> {
        let proxy = self.link(target)?;
        if cut {
            proxy.disable().await?;
            self.cut.insert(target);
        } else {
            proxy.enable().await?;
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
        match self.backend_faults {
            BackendFaults::Programs => {
                let guard = self
                    .bed
                    .backend(version)?
                    .program(self.keys.prefix(), Behaviour::Delay(delay))
                    .await?;
                self.programs.insert(version.to_owned(), guard);
            }
            BackendFaults::Toxics => {
                self.recover_backend(version).await?;
                let toxic = Toxic::Latency {
                    latency_ms: delay.as_millis() as u32,
                    jitter_ms: 0,
                };
                let proxy = self.backend_link(version)?;
                proxy.add_toxic(toxic, Direction::Downstream, 1.0).await?;
                self.toxics
                    .insert(version.to_owned(), toxic.name(Direction::Downstream));
            }
        }
        Ok(())
    }

    fn backend_link(&self, version: &str) -> Result<&crate::env::DedicatedProxy> {
        self.links
            .as_ref()
            .and_then(|links| links.backends.get(version))
            .ok_or_else(|| Error::Config(format!("the case has no backend link for {version}")))
    }

    async fn recover_backend(&mut self, version: &str) -> Result<()> {
        self.programs.remove(version);
        if let Some(name) = self.toxics.remove(version) {
            self.backend_link(version)?.remove_toxic(&name).await?;
        }
        Ok(())
    }

    async fn fail_backend(&mut self, version: &str, status: u16, calls: u64) -> Result<()> {
        let guard = self
            .bed
            .backend(version)?
            .program(self.keys.prefix(), Behaviour::FailFirst { status, calls })
            .await?;
        self.programs.insert(version.to_owned(), guard);
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
        self.bed.restart(Target::Redis).await?;
        self.reconnect().await?;
        self.redis_restarted = true;
        Ok(())
    }

    /// Undoes every lasting fault: links enabled, toxics removed, backend programs dropped.
    pub async fn heal_all(&mut self) -> Result<()> {
        let was_cut = self.is_cut();
        if let Some(links) = &self.links {
            links.redis.enable().await?;
            links.postgres.enable().await?;
            for proxy in links.backends.values() {
                proxy.clear_toxics().await?;
            }
        }
        self.toxics.clear();
        self.programs.clear();
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

    async fn pause_worker(&mut self, worker: usize, pause: Duration) -> Result<bool> {
        self.workers.pause(worker, pause).await
    }

    async fn heal_all(&mut self) -> Result<()> {
        self.services.heal_all().await
    }
}
