//! Certification suites: which workers run, which faults a schedule may contain, how many cases.
//! [`builtin`] lists the suites racecert ships, one per fault of the seed plus a full v1 -> v2
//! rollout; every one of them must pass on the reference worker and report its fault coverage.

use crate::check::Invariant;
use crate::fault::FaultKind;
use crate::reference::defects::Defects;
use crate::schedule::controlled::CaseSettings;
use crate::schedule::{ScheduleSpace, WorkerSpec};
use std::time::Duration;

/// A suite.
#[derive(Debug, Clone)]
pub struct Suite {
    /// Name, e.g. `retry-overlap`.
    pub name: String,
    /// What it certifies.
    pub description: String,
    /// Workers, defects, invariants, timeouts.
    pub settings: CaseSettings,
    /// The schedules it generates.
    pub space: ScheduleSpace,
    /// Cases per run.
    pub cases: u32,
}

impl Suite {
    /// Whether cases restart shared containers (and so need the test bed to themselves).
    pub fn is_exclusive(&self) -> bool {
        self.space.faults.contains(&FaultKind::RedisRestart)
    }

    /// The same suite with `defects` switched on in its workers.
    pub fn with_defects(mut self, defects: Defects) -> Suite {
        self.settings.defects = defects;
        self
    }
}

fn worker(id: &str, version: &str) -> WorkerSpec {
    WorkerSpec {
        id: id.into(),
        version: version.into(),
    }
}

fn suite(name: &str, description: &str, workers: Vec<WorkerSpec>, faults: &[FaultKind]) -> Suite {
    Suite {
        name: name.into(),
        description: description.into(),
        settings: CaseSettings {
            workers: workers.clone(),
            defects: Defects::none(),
            invariants: Invariant::ALL.to_vec(),
            backend_timeout: Duration::from_millis(250),
            factory: std::sync::Arc::new(crate::reference::ReferenceFactory),
        },
        space: ScheduleSpace {
            workers,
            versions: vec!["v1".into(), "v2".into()],
            max_requests: 2,
            inputs: 2,
            max_steps: 8,
            faults: faults.to_vec(),
        },
        cases: 64,
    }
}

/// The suites racecert ships.
pub fn builtin() -> Vec<Suite> {
    use FaultKind::*;
    let mixed = || vec![worker("worker-a", "v1"), worker("worker-c", "v2")];
    let same = || vec![worker("worker-a", "v1"), worker("worker-b", "v1")];
    vec![
        suite(
            "upstream-timeout",
            "slow backends past the worker's timeout, with retries landing on other workers",
            mixed(),
            &[UpstreamTimeout, RetryOverlap, LeaseExpiry],
        ),
        suite(
            "retry-overlap",
            "redeliveries while the first attempt still runs, on workers of one version",
            same(),
            &[RetryOverlap, LeaseExpiry],
        ),
        suite(
            "lease-expiry",
            "leases running out while their holder is paused mid-job",
            mixed(),
            &[LeaseExpiry, RetryOverlap],
        ),
        suite(
            "worker-crash",
            "workers dying at any checkpoint, jobs picked up by others",
            same(),
            &[WorkerCrash, LeaseExpiry, RetryOverlap],
        ),
        suite(
            "redis-restart",
            "Redis restarting mid-job: every lease and the queue lost",
            same(),
            &[RedisRestart, RetryOverlap],
        ),
        suite(
            "partition",
            "Redis or Postgres unreachable for a span of steps",
            same(),
            &[Partition, RetryOverlap, LeaseExpiry],
        ),
        suite(
            "stale-cache-at-cutover",
            "cutover from v1 to v2 with identical inputs before and after",
            mixed(),
            &[Cutover, CacheInvalidationLag],
        ),
        suite(
            "full-rollout",
            "a v1 -> v2 rollout with every fault of the seed",
            mixed(),
            &[
                UpstreamTimeout,
                RetryOverlap,
                LeaseExpiry,
                WorkerCrash,
                Partition,
                Cutover,
                CacheInvalidationLag,
                BackendFailure,
            ],
        ),
    ]
}
