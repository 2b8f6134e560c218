//! The fault vocabulary, and the one place a fault is applied.
//!
//! A [`Fault`] names what goes wrong (a lease runs out, Redis restarts, a link is cut, the model
//! version switches, a backend slows down or fails, a worker crashes or pauses). [`apply`] is the
//! only `match` over faults in racecert: every runner (controlled, chaos, fleet, wire) hands it
//! its case's [`Plane`], the handful of primitive operations a fault needs on real services and
//! real workers, and records the [`Effect`] it returns. A fault that lasts (a partition, a slow
//! backend, a paused worker) is undone by [`Plane::heal_all`] when the case drains.
//!
//! This module is the bottom layer with the contract: it knows no test bed, runner or recorder.

use crate::Result;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::future::Future;
use std::time::Duration;

/// Which service a partition cuts off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PartitionTarget {
    /// The workers' Redis.
    Redis,
    /// The workers' Postgres.
    Postgres,
}

/// A fault a schedule can inject between steps.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "fault", rename_all = "snake_case")]
pub enum Fault {
    /// Worker `worker` dies where it is (nothing is cleaned up); runners that restart processes
    /// start it again.
    CrashWorker {
        /// Index of the worker.
        worker: usize,
    },
    /// Worker `worker` stops running (SIGSTOP) for `ms` milliseconds, then resumes as if nothing
    /// happened: the seed's "slow, not dead" attempt whose lease runs out meanwhile.
    PauseWorker {
        /// Index of the worker.
        worker: usize,
        /// How long it stays paused.
        ms: u64,
    },
    /// The lease of a request runs out (its TTL passes while the holder may still be working).
    ExpireLease {
        /// Index of the request in the case.
        request: usize,
    },
    /// The Redis container restarts: every lease (and the queue) is lost.
    RestartRedis,
    /// The workers lose their connection to a service (its proxy is disabled) until healed.
    Partition {
        /// The service cut off.
        target: PartitionTarget,
    },
    /// A partition ends.
    Heal {
        /// The service reachable again.
        target: PartitionTarget,
    },
    /// The active model version switches.
    Cutover {
        /// The new version.
        to: String,
    },
    /// The (late) cache invalidation of the last cutover runs now.
    InvalidateCache,
    /// The backend of `version` answers slower than the workers' timeout: upstream timeout.
    UpstreamTimeout {
        /// The backend's version.
        version: String,
    },
    /// The backend of `version` answers normally again (undoes a slow or failing backend).
    RecoverBackend {
        /// The backend's version.
        version: String,
    },
    /// The backend of `version` fails its next `calls` calls with HTTP `status`.
    BackendFailure {
        /// The backend's version.
        version: String,
        /// HTTP status (5xx, 429).
        status: u16,
        /// How many calls fail.
        calls: u64,
    },
}

impl Fault {
    /// The kind, for coverage and suite files.
    pub fn kind(&self) -> FaultKind {
        match self {
            Fault::CrashWorker { .. } => FaultKind::WorkerCrash,
            // A pause outlives the lease: its target path is the lease-expiry one.
            Fault::PauseWorker { .. } => FaultKind::LeaseExpiry,
            Fault::ExpireLease { .. } => FaultKind::LeaseExpiry,
            Fault::RestartRedis => FaultKind::RedisRestart,
            Fault::Partition { .. } | Fault::Heal { .. } => FaultKind::Partition,
            Fault::Cutover { .. } => FaultKind::Cutover,
            Fault::InvalidateCache => FaultKind::CacheInvalidationLag,
            Fault::UpstreamTimeout { .. } => FaultKind::UpstreamTimeout,
            Fault::BackendFailure { .. } | Fault::RecoverBackend { .. } => {
                FaultKind::BackendFailure
            }
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::CrashWorker { worker } => write!(f, "worker #{worker} crashes"),
            Fault::PauseWorker { worker, ms } => write!(f, "worker #{worker} pauses for {ms} ms"),
            Fault::ExpireLease { request } => write!(f, "lease of request {request} expires"),
            Fault::RestartRedis => write!(f, "redis restarts"),
            Fault::Partition { target } => write!(f, "partition: {target} unreachable"),
            Fault::Heal { target } => write!(f, "heal: {target} reachable"),
            Fault::Cutover { to } => write!(f, "cutover to {to}"),
            Fault::InvalidateCache => write!(f, "late cache invalidation runs"),
            Fault::UpstreamTimeout { version } => write!(f, "backend {version} times out"),
            Fault::RecoverBackend { version } => write!(f, "backend {version} recovers"),
            Fault::BackendFailure {
                version,
                status,
                calls,
            } => write!(f, "backend {version} fails {calls} call(s) with {status}"),
        }
    }
}

/// Kinds of faults: what a suite enables and what coverage is reported on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// Upstream timeout.
    UpstreamTimeout,
    /// Retry overlap: a redelivery while an attempt still runs.
    RetryOverlap,
    /// Lease expiry while a worker holds it.
    LeaseExpiry,
    /// Worker crash at a checkpoint.
    WorkerCrash,
    /// Redis restart.
    RedisRestart,
    /// Partition of Redis or Postgres.
    Partition,
    /// Model version cutover.
    Cutover,
    /// Late cache invalidation.
    CacheInvalidationLag,
    /// Backend HTTP failures.
    BackendFailure,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [FaultKind; 9] = [
        FaultKind::UpstreamTimeout,
        FaultKind::RetryOverlap,
        FaultKind::LeaseExpiry,
        FaultKind::WorkerCrash,
        FaultKind::RedisRestart,
        FaultKind::Partition,
        FaultKind::Cutover,
        FaultKind::CacheInvalidationLag,
        FaultKind::BackendFailure,
    ];

    /// kebab-case name.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::UpstreamTimeout => "upstream-timeout",
            FaultKind::RetryOverlap => "retry-overlap",
            FaultKind::LeaseExpiry => "lease-expiry",
            FaultKind::WorkerCrash => "worker-crash",
            FaultKind::RedisRestart => "redis-restart",
            FaultKind::Partition => "partition",
            FaultKind::Cutover => "cutover",
            FaultKind::CacheInvalidationLag => "cache-invalidation-lag",
            FaultKind::BackendFailure => "backend-failure",
        }
    }

    /// What "landed" means for this kind: the path the fault targets.
    pub fn target_path(self) -> &'static str {
        match self {
            FaultKind::UpstreamTimeout => "a backend call timed out",
            FaultKind::RetryOverlap => "a redelivery reached a worker while another attempt ran",
            FaultKind::LeaseExpiry => "a lease expired while its holder was still working",
            FaultKind::WorkerCrash => "a worker crashed while holding a job",
            FaultKind::RedisRestart => "redis restarted while a lease was held",
            FaultKind::Partition => "a worker operation failed during a partition",
            FaultKind::Cutover => "the version switched while a job was in flight",
            FaultKind::CacheInvalidationLag => "a stale cache entry was read before invalidation",
            FaultKind::BackendFailure => "a backend call failed with an HTTP error",
        }
    }
}

impl fmt::Display for PartitionTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PartitionTarget::Redis => "redis",
            PartitionTarget::Postgres => "postgres",
        })
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What applying a fault did, as the history records it: the fault's own facts (which key, which
/// version, whether a lease was held), so coverage and reports read them without guessing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "effect", rename_all = "snake_case")]
pub enum Effect {
    /// A lease was made to run out.
    LeaseExpired {
        /// The job's idempotency key.
        key: String,
        /// Whether a lease was held when it ran out.
        held: bool,
    },
    /// Redis restarted; every lease and the queue were lost.
    RedisRestarted,
    /// A service became unreachable to the case's workers.
    Partitioned {
        /// The service.
        target: PartitionTarget,
    },
    /// A service became reachable again.
    Healed {
        /// The service.
        target: PartitionTarget,
    },
    /// The active-version pointer switched.
    CutOver {
        /// The version active before, if any.
        from: Option<String>,
        /// The version active now.
        to: String,
    },
    /// The (late) cache invalidation of the last cutover ran.
    CacheInvalidated {
        /// Entries deleted.
        deleted: u64,
    },
    /// A backend became slower than the workers' timeout.
    UpstreamSlow {
        /// Its version.
        version: String,
        /// Added delay, ms.
        delay_ms: u64,
    },
    /// A backend started failing calls.
    BackendFailing {
        /// Its version.
        version: String,
        /// HTTP status it answers.
        status: u16,
        /// How many calls fail.
        calls: u64,
    },
    /// A worker crashed.
    WorkerCrashed {
        /// Its id.
        worker: String,
        /// Where it was when it died (a checkpoint name), when the runner knows.
        at: Option<String>,
    },
    /// A worker was paused, then resumed.
    WorkerPaused {
        /// Its id.
        worker: String,
        /// For how long, ms.
        ms: u64,
    },
    /// A backend answers normally again.
    BackendRecovered {
        /// Its version.
        version: String,
    },
    /// Nothing happened: the fault had no target (no such request yet, no cutover to invalidate,
    /// a worker with nothing in hand), and the history says so.
    Missed {
        /// The kind of the fault that missed.
        kind: FaultKind,
        /// Why.
        why: String,
    },
}

impl Effect {
    /// The effect's name, as timelines print it.
    pub fn name(&self) -> &'static str {
        match self {
            Effect::LeaseExpired { .. } => "lease_expired",
            Effect::RedisRestarted => "redis_restarted",
            Effect::Partitioned { .. } => "partition",
            Effect::Healed { .. } => "heal",
            Effect::CutOver { .. } => "cutover",
            Effect::CacheInvalidated { .. } => "cache_invalidated",
            Effect::UpstreamSlow { .. } => "upstream_slow",
            Effect::BackendFailing { .. } => "backend_failing",
            Effect::WorkerCrashed { .. } => "worker_crashed",
            Effect::WorkerPaused { .. } => "worker_paused",
            Effect::BackendRecovered { .. } => "backend_recovered",
            Effect::Missed { .. } => "fault_missed",
        }
    }

    /// The fault kind this effect is an application of (None for an undo: a heal, a recovery).
    pub fn kind(&self) -> Option<FaultKind> {
        Some(match self {
            Effect::LeaseExpired { .. } | Effect::WorkerPaused { .. } => FaultKind::LeaseExpiry,
            Effect::RedisRestarted => FaultKind::RedisRestart,
            Effect::Partitioned { .. } => FaultKind::Partition,
            Effect::CutOver { .. } => FaultKind::Cutover,
            Effect::CacheInvalidated { .. } => FaultKind::CacheInvalidationLag,
            Effect::UpstreamSlow { .. } => FaultKind::UpstreamTimeout,
            Effect::BackendFailing { .. } => FaultKind::BackendFailure,
            Effect::WorkerCrashed { .. } => FaultKind::WorkerCrash,
            Effect::Missed { kind, .. } => *kind,
            Effect::Healed { .. } | Effect::BackendRecovered { .. } => return None,
        })
    }

    /// `key=value` pairs of the effect, for timelines and diagrams.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        match self {
            Effect::LeaseExpired { key, held } => {
                vec![("idempotency_key", key.clone()), ("held", held.to_string())]
            }
            Effect::RedisRestarted => Vec::new(),
            Effect::Partitioned { target } | Effect::Healed { target } => {
                vec![("target", target.to_string())]
            }
            Effect::CutOver { from, to } => vec![
                (
                    "previous_model_version",
                    from.clone().unwrap_or_else(|| "-".into()),
                ),
                ("new_model_version", to.clone()),
            ],
            Effect::CacheInvalidated { deleted } => vec![("deleted", deleted.to_string())],
            Effect::UpstreamSlow { version, delay_ms } => vec![
                ("model_version", version.clone()),
                ("delay_ms", delay_ms.to_string()),
            ],
            Effect::BackendFailing {
                version,
                status,
                calls,
            } => vec![
                ("model_version", version.clone()),
                ("http_status", status.to_string()),
                ("calls", calls.to_string()),
            ],
            Effect::WorkerCrashed { worker, at } => {
                let mut fields = vec![("worker_id", worker.clone())];
                if let Some(at) = at {
                    fields.push(("at", at.clone()));
                }
                fields
            }
            Effect::WorkerPaused { worker, ms } => {
                vec![("worker_id", worker.clone()), ("ms", ms.to_string())]
            }
            Effect::BackendRecovered { version } => vec![("model_version", version.clone())],
            Effect::Missed { kind, why } => vec![("fault", kind.to_string()), ("why", why.clone())],
        }
    }
}

impl fmt::Display for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())?;
        for (key, value) in self.fields() {
            write!(f, " {key}={value}")?;
        }
        Ok(())
    }
}

/// What a fault needs from the case it lands in: primitive operations on the case's services and
/// workers. Each runner gives its own (workers parked at checkpoints, free-running tasks, worker
/// processes); [`apply`] decides what to do with them.
pub trait Plane: Send {
    /// The idempotency key of the case's request `request` (None: no such request).
    fn request_key(&self, request: usize) -> Option<String>;
    /// Deletes the lease of `key` now; whether one was held.
    fn expire_lease(&mut self, key: &str) -> impl Future<Output = Result<bool>> + Send;
    /// Restarts Redis and waits until it answers again.
    fn restart_redis(&mut self) -> impl Future<Output = Result<()>> + Send;
    /// Cuts (`cut`) or heals the case's link to `target`.
    fn set_link(
        &mut self,
        target: PartitionTarget,
        cut: bool,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Switches the active model version; returns the previous one.
    fn cutover(&mut self, to: &str) -> impl Future<Output = Result<Option<String>>> + Send;
    /// Runs the last cutover's late cache invalidation; how many entries it deleted (None: there
    /// was nothing to invalidate).
    fn invalidate_cache(&mut self) -> impl Future<Output = Result<Option<u64>>> + Send;
    /// The workers' backend timeout: an upstream timeout delays the backend past it.
    fn backend_timeout(&self) -> Duration;
    /// Delays `version`'s backend answers by `delay` for the case (until healed).
    fn slow_backend(
        &mut self,
        version: &str,
        delay: Duration,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Makes `version`'s backend answer the case normally again.
    fn recover_backend(&mut self, version: &str) -> impl Future<Output = Result<()>> + Send;
    /// Fails `version`'s next `calls` backend calls of the case with HTTP `status`.
    fn fail_backend(
        &mut self,
        version: &str,
        status: u16,
        calls: u64,
    ) -> impl Future<Output = Result<()>> + Send;
    /// The id of worker `worker` (indices wrap around the case's workers).
    fn worker_id(&self, worker: usize) -> String;
    /// Crashes worker `worker` where it is; returns where it was (a checkpoint, if known), or
    /// None when it had nothing in hand to crash.
    fn crash_worker(
        &mut self,
        worker: usize,
    ) -> impl Future<Output = Result<Option<Option<String>>>> + Send;
    /// Pauses worker `worker` for `pause`, then resumes it; false when the runner cannot pause.
    fn pause_worker(
        &mut self,
        worker: usize,
        pause: Duration,
    ) -> impl Future<Output = Result<bool>> + Send;
    /// Undoes every lasting fault: links healed, backends answering normally.
    fn heal_all(&mut self) -> impl Future<Output = Result<()>> + Send;
}

/// How much slower than the workers' timeout an upstream-timeout fault makes a backend: enough
/// that the call times out, not so much that the case waits long for it.
pub const UPSTREAM_TIMEOUT_MARGIN: Duration = Duration::from_millis(150);

/// Applies `fault` to the case behind `plane` and returns what it did. The one place a fault is
/// applied, whatever the runner.
pub async fn apply<P: Plane>(fault: &Fault, plane: &mut P) -> Result<Effect> {
    Ok(match fault {
        Fault::ExpireLease { request } => match plane.request_key(*request) {
            Some(key) => {
                let held = plane.expire_lease(&key).await?;
                Effect::LeaseExpired { key, held }
            }
            None => Effect::Missed {
                kind: FaultKind::LeaseExpiry,
                why: format!("no request #{request}"),
            },
        },
        Fault::RestartRedis => {
            plane.restart_redis().await?;
            Effect::RedisRestarted
        }
        Fault::Partition { target } => {
            plane.set_link(*target, true).await?;
            Effect::Partitioned { target: *target }
        }
        Fault::Heal { target } => {
            plane.set_link(*target, false).await?;
            Effect::Healed { target: *target }
        }
        Fault::Cutover { to } => {
            let from = plane.cutover(to).await?;
            Effect::CutOver {
                from,
                to: to.clone(),
            }
        }
        Fault::InvalidateCache => match plane.invalidate_cache().await? {
            Some(deleted) => Effect::CacheInvalidated { deleted },
            None => Effect::Missed {
                kind: FaultKind::CacheInvalidationLag,
                why: "no cutover waits for an invalidation".into(),
            },
        },
        Fault::UpstreamTimeout { version } => {
            let delay = plane.backend_timeout() + UPSTREAM_TIMEOUT_MARGIN;
            plane.slow_backend(version, delay).await?;
            Effect::UpstreamSlow {
                version: version.clone(),
                delay_ms: delay.as_millis() as u64,
            }
        }
        Fault::BackendFailure {
            version,
            status,
            calls,
        } => {
            plane.fail_backend(version, *status, *calls).await?;
            Effect::BackendFailing {
                version: version.clone(),
                status: *status,
                calls: *calls,
            }
        }
        Fault::RecoverBackend { version } => {
            plane.recover_backend(version).await?;
            Effect::BackendRecovered {
                version: version.clone(),
            }
        }
        Fault::CrashWorker { worker } => {
            let id = plane.worker_id(*worker);
            match plane.crash_worker(*worker).await? {
                Some(at) => Effect::WorkerCrashed { worker: id, at },
                None => Effect::Missed {
                    kind: FaultKind::WorkerCrash,
                    why: format!("{id} had nothing in hand to crash"),
                },
            }
        }
        Fault::PauseWorker { worker, ms } => {
            let id = plane.worker_id(*worker);
            if plane
                .pause_worker(*worker, Duration::from_millis(*ms))
                .await?
            {
                Effect::WorkerPaused {
                    worker: id,
                    ms: *ms,
                }
            } else {
                Effect::Missed {
                    kind: FaultKind::LeaseExpiry,
                    why: format!("{id} cannot be paused by this runner"),
                }
            }
        }
    })
}
