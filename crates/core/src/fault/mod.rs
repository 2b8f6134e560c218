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

mod plane;

pub use plane::Plane;

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
    /// A fault of a team's system, aimed at worker `worker`: the one holding the case's request.
    /// Its kind is one of the framework's own machinery or the API's
    /// ([`FaultKind::is_framework`]), or an upstream timeout of that worker's model call.
    Framework {
        /// Which one.
        kind: FaultKind,
        /// Index of the worker it aims at.
        worker: usize,
    },
}

impl Fault {
    /// The worker this fault aims at, if it aims at one (to rename workers in a schedule).
    pub fn worker_mut(&mut self) -> Option<&mut usize> {
        match self {
            Fault::CrashWorker { worker }
            | Fault::PauseWorker { worker, .. }
            | Fault::Framework { worker, .. } => Some(worker),
            _ => None,
        }
    }

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
            Fault::Framework { kind, .. } => *kind,
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
            Fault::Framework { kind, worker } => write!(f, "{kind} at worker #{worker}"),
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
    /// Celery: the model call outlives the broker's `visibility_timeout`; a restore sweep hands
    /// the delivery to a worker again while the first attempt still runs.
    VisibilityOutlived,
    /// Celery: the delivery's score in kombu's `unacked_index` is aged, so the next restore sweep
    /// pushes it back onto the queue while its first attempt still runs.
    ForcedRestore,
    /// Celery: SIGKILL of the pool child running the task.
    KillPoolChild,
    /// Any system: SIGKILL of the process that holds the job, found from the wire: the one whose
    /// connection carries the job's model call (a pool child, a child forked per job into a
    /// session of its own, or the main process), whatever the process groups are.
    KillHolder,
    /// SIGKILL of the worker's main process mid-call, then a restart under the same worker name
    /// (apalis: the same-name restart whose orphans are never recovered).
    KillMain,
    /// Celery: SIGTERM (warm shutdown) mid-task, then a restart.
    WarmShutdown,
    /// apalis: the worker stops (SIGSTOP) mid-call past its heartbeat deadline, so another
    /// worker requeues its job; it resumes after the requeued job ran.
    HeartbeatMiss,
    /// Celery: a worker with a prefetch multiplier above 1 reserves the request behind a slow
    /// task; the reserved delivery outlives `visibility_timeout` and a sweep restores it.
    PrefetchRestore,
    /// A team's system: the same request submitted again, with the same key, while its first
    /// attempt runs, as an API does after its own client timed out.
    ApiResubmission,
    /// A team's system: the worker holding the request is replaced as an orchestrator does it
    /// (its stop signal, a grace period, SIGKILL, then the replacement) while a new job arrives.
    Drain,
    /// A team's system whose workers share one model URL: the backend behind it switches to the
    /// next version while a worker of the old one runs (a load balancer's target, a DNS name).
    BackendSwitch,
    /// Dramatiq: the actor's time limit passes during its model call; the `TimeLimit`
    /// middleware's exception reaches the thread once the call returns, so the attempt drops
    /// the model's answer and the `Retries` middleware runs the message again (or dead-letters
    /// it).
    TimeLimit,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [FaultKind; 21] = [
        FaultKind::UpstreamTimeout,
        FaultKind::RetryOverlap,
        FaultKind::LeaseExpiry,
        FaultKind::WorkerCrash,
        FaultKind::RedisRestart,
        FaultKind::Partition,
        FaultKind::Cutover,
        FaultKind::CacheInvalidationLag,
        FaultKind::BackendFailure,
        FaultKind::VisibilityOutlived,
        FaultKind::ForcedRestore,
        FaultKind::KillPoolChild,
        FaultKind::KillHolder,
        FaultKind::KillMain,
        FaultKind::WarmShutdown,
        FaultKind::HeartbeatMiss,
        FaultKind::PrefetchRestore,
        FaultKind::ApiResubmission,
        FaultKind::Drain,
        FaultKind::BackendSwitch,
        FaultKind::TimeLimit,
    ];

    /// The kinds only a team's system has (`certify --system`): its framework's own machinery,
    /// and its API submitting again; which of them a framework has is its preset's business
    /// (`system::preset`).
    pub const FRAMEWORK: [FaultKind; 12] = [
        FaultKind::VisibilityOutlived,
        FaultKind::ForcedRestore,
        FaultKind::KillPoolChild,
        FaultKind::KillHolder,
        FaultKind::KillMain,
        FaultKind::WarmShutdown,
        FaultKind::HeartbeatMiss,
        FaultKind::PrefetchRestore,
        FaultKind::ApiResubmission,
        FaultKind::Drain,
        FaultKind::BackendSwitch,
        FaultKind::TimeLimit,
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
            FaultKind::VisibilityOutlived => "visibility-outlived",
            FaultKind::ForcedRestore => "forced-restore",
            FaultKind::KillPoolChild => "kill-pool-child",
            FaultKind::KillHolder => "kill-holder",
            FaultKind::KillMain => "kill-main",
            FaultKind::WarmShutdown => "warm-shutdown",
            FaultKind::HeartbeatMiss => "heartbeat-miss",
            FaultKind::PrefetchRestore => "prefetch-restore",
            FaultKind::ApiResubmission => "api-resubmission",
            FaultKind::Drain => "drain",
            FaultKind::BackendSwitch => "backend-switch",
            FaultKind::TimeLimit => "time-limit",
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
            FaultKind::VisibilityOutlived => {
                "the framework redelivered the job while its first attempt still ran"
            }
            FaultKind::ForcedRestore => {
                "the restore sweep pushed the delivery back while its first attempt still ran"
            }
            FaultKind::KillPoolChild => "the pool child running the job was killed mid-job",
            FaultKind::KillHolder => {
                "the process whose connection held the job's model call died holding it"
            }
            FaultKind::KillMain => {
                "the worker's main process (its process group) was killed while it held the job"
            }
            FaultKind::WarmShutdown => "the worker holding the job was told to stop mid-job",
            FaultKind::HeartbeatMiss => {
                "another worker took the job of a worker that stopped heartbeating mid-job"
            }
            FaultKind::PrefetchRestore => {
                "a delivery reserved behind a slow task was restored and delivered again"
            }
            FaultKind::ApiResubmission => {
                "the request, submitted again while its first attempt ran, reached a worker"
            }
            FaultKind::Drain => {
                "the worker holding the job was told to stop while a new job waited"
            }
            FaultKind::BackendSwitch => {
                "the model behind a running worker's URL changed version and the worker called it"
            }
            FaultKind::TimeLimit => {
                "the time limit interrupted the attempt after its model call answered: the answer was dropped"
            }
        }
    }

    /// What a kind that was applied but never landed most often means, where a user can act on
    /// it.
    pub fn miss_hint(self) -> Option<&'static str> {
        match self {
            FaultKind::UpstreamTimeout => Some(
                "the model's late answer still reached the worker: is the declared model timeout ([timeouts] model_ms) the worker's own?",
            ),
            FaultKind::ApiResubmission => {
                Some("nothing acted on the request submitted again while its first attempt ran")
            }
            FaultKind::BackendSwitch => Some(
                "the worker made no model call after the switch: did the request submitted after it reach the same worker?",
            ),
            FaultKind::Cutover => Some(
                "the old worker did not hold the request at the switch, or no worker of the new version took the request after it",
            ),
            FaultKind::CacheInvalidationLag => Some(
                "the new version took no request before the late invalidation: does the new worker start ([rollout] surge, grace_s)?",
            ),
            FaultKind::Partition => Some(
                "the worker sent nothing on its cut link before the heal: its write came later, or it keeps no connection of its own",
            ),
            FaultKind::TimeLimit => Some(
                "the attempt still wrote its result after the late answer: does the actor's time_limit come from [dramatiq] time_limit_ms ({time_limit_ms})?",
            ),
            _ => None,
        }
    }

    /// Whether the kind is a framework's own machinery (a team's system only).
    pub fn is_framework(self) -> bool {
        FaultKind::FRAMEWORK.contains(&self)
    }
}

impl std::str::FromStr for FaultKind {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<FaultKind, String> {
        FaultKind::ALL
            .into_iter()
            .find(|kind| kind.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown fault {s:?} (one of: {})",
                    FaultKind::ALL.map(FaultKind::name).join(", ")
                )
            })
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
    /// A worker was paused, then resumed (the effect is recorded when it resumes).
    WorkerPaused {
        /// Its id.
        worker: String,
        /// How long it really stayed paused, ms.
        ms: u64,
    },
    /// A backend answers normally again.
    BackendRecovered {
        /// Its version.
        version: String,
    },
    /// A framework fault did what it does.
    FrameworkFault {
        /// Its kind.
        kind: FaultKind,
        /// The worker it aimed at.
        worker: String,
        /// What was done, in a phrase (for timelines and diagrams).
        detail: String,
    },
    /// The fault cannot apply here (this runner, or this system as described): it is never
    /// counted as applied, and reports say why.
    NotApplicable {
        /// The kind of the fault.
        kind: FaultKind,
        /// Why.
        why: String,
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
            Effect::FrameworkFault { .. } => "framework_fault",
            Effect::NotApplicable { .. } => "fault_not_applicable",
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
            Effect::Missed { kind, .. } | Effect::FrameworkFault { kind, .. } => *kind,
            Effect::Healed { .. }
            | Effect::BackendRecovered { .. }
            | Effect::NotApplicable { .. } => return None,
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
            Effect::FrameworkFault {
                kind,
                worker,
                detail,
            } => vec![
                ("fault", kind.to_string()),
                ("worker_id", worker.clone()),
                ("detail", detail.clone()),
            ],
            Effect::Missed { kind, why } | Effect::NotApplicable { kind, why } => {
                vec![("fault", kind.to_string()), ("why", why.clone())]
            }
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

/// How much slower than the workers' timeout an upstream-timeout fault makes a backend: enough
/// that the call times out, not so much that the case waits long for it.
pub const UPSTREAM_TIMEOUT_MARGIN: Duration = Duration::from_millis(150);

/// Applies `fault` to the case behind `plane` and returns what it did. The one place a fault is
/// applied, whatever the runner.
pub async fn apply<P: Plane>(fault: &Fault, plane: &mut P) -> Result<Effect> {
    if let Err(why) = plane.can_apply(fault.kind()) {
        return Ok(Effect::NotApplicable {
            kind: fault.kind(),
            why,
        });
    }
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
        Fault::Framework { kind, worker } => apply_framework(plane, *kind, *worker).await?,
        Fault::PauseWorker { worker, ms } => {
            let id = plane.worker_id(*worker);
            match plane
                .pause_worker(*worker, Duration::from_millis(*ms))
                .await?
            {
                Some(paused) => Effect::WorkerPaused {
                    worker: id,
                    ms: paused.as_millis() as u64,
                },
                None => Effect::Missed {
                    kind: FaultKind::LeaseExpiry,
                    why: format!("{id} cannot be paused by this runner"),
                },
            }
        }
    })
}

/// Applies a framework fault of `kind` to worker `worker`, by the plane's way of causing it.
async fn apply_framework<P: Plane>(
    plane: &mut P,
    kind: FaultKind,
    worker: usize,
) -> Result<Effect> {
    let id = plane.worker_id(worker);
    let done = match kind {
        FaultKind::VisibilityOutlived => plane.outlive_visibility(worker).await?,
        FaultKind::ForcedRestore => plane.force_restore(worker).await?,
        FaultKind::KillPoolChild => plane.kill_pool_child(worker).await?,
        FaultKind::KillHolder => plane.kill_holder(worker).await?,
        FaultKind::KillMain => plane.kill_main(worker).await?,
        FaultKind::WarmShutdown => plane.warm_shutdown(worker).await?,
        FaultKind::HeartbeatMiss => plane.miss_heartbeats(worker).await?,
        FaultKind::PrefetchRestore => plane.restore_prefetched(worker).await?,
        FaultKind::ApiResubmission => plane.resubmit(worker).await?,
        FaultKind::UpstreamTimeout => plane.outlast_model_timeout(worker).await?,
        FaultKind::TimeLimit => plane.exceed_time_limit(worker).await?,
        FaultKind::Partition => plane.partition_worker(worker).await?,
        FaultKind::Drain => plane.drain(worker).await?,
        FaultKind::Cutover => plane.roll_out(worker, false).await?,
        FaultKind::CacheInvalidationLag => plane.roll_out(worker, true).await?,
        FaultKind::BackendSwitch => plane.switch_backend(worker).await?,
        other => {
            return Ok(Effect::NotApplicable {
                kind: other,
                why: format!("{other} is not a framework fault"),
            });
        }
    };
    Ok(match done {
        Some(detail) => Effect::FrameworkFault {
            kind,
            worker: id,
            detail,
        },
        None => Effect::Missed {
            kind,
            why: format!("{id} had nothing in hand for {kind}"),
        },
    })
}
