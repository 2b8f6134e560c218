//! The fault vocabulary of a schedule, and how each fault is applied to a running case. Every
//! fault acts on the real services (a lease key, the Redis container, a proxy, a backend program)
//! and is recorded in the history; faults that last (partitions, backend programs) are undone by
//! the guards the case keeps, at the latest when its drain phase heals everything.

use serde::{Deserialize, Serialize};
use std::fmt;

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
            Fault::ExpireLease { .. } => FaultKind::LeaseExpiry,
            Fault::RestartRedis => FaultKind::RedisRestart,
            Fault::Partition { .. } | Fault::Heal { .. } => FaultKind::Partition,
            Fault::Cutover { .. } => FaultKind::Cutover,
            Fault::InvalidateCache => FaultKind::CacheInvalidationLag,
            Fault::UpstreamTimeout { .. } => FaultKind::UpstreamTimeout,
            Fault::BackendFailure { .. } => FaultKind::BackendFailure,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::ExpireLease { request } => write!(f, "lease of request {request} expires"),
            Fault::RestartRedis => write!(f, "redis restarts"),
            Fault::Partition { target } => write!(f, "partition: {target:?} unreachable"),
            Fault::Heal { target } => write!(f, "heal: {target:?} reachable"),
            Fault::Cutover { to } => write!(f, "cutover to {to}"),
            Fault::InvalidateCache => write!(f, "late cache invalidation runs"),
            Fault::UpstreamTimeout { version } => write!(f, "backend {version} times out"),
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

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
