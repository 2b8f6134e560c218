//! Schedules: the order in which workers advance and faults land, for every runner. A
//! [`Schedule`] is requests plus steps, and the steps are what its runner can do: [`Step`]s move
//! workers in process from checkpoint to checkpoint ([`crate::runner::controlled`]), [`WireStep`]s
//! release worker processes' round trips ([`crate::runner::wire`]), a [`FaultKind`] is a team's
//! framework fault ([`crate::runner::system`]). [`search`] makes the cases of every runner,
//! [`shrink`] makes a failure minimal, [`file`] writes any of them as one kind of file, and
//! [`previous`] reads the previous release's files into it.
//!
//! A checkpoint step moves one worker to a checkpoint, lets it complete N round trips and holds
//! it between two statements, crashes it, or applies a fault. An idle worker told to run first
//! takes a delivery: a new job if there is one, else a redelivery of an unacknowledged one, as if
//! its visibility timeout had expired (that is how retry overlaps happen without a clock). After
//! the last step the case heals every fault, lets parked and held workers finish, lets leases run
//! out only within the liveness bound and redelivers only what the queue would, so "no lost job"
//! and "no stuck delivery" are judged, not repaired. [`aimed`] builds the schedules every search
//! starts with, one per fault kind in scope.

pub mod aimed;
pub mod file;
pub mod previous;
pub mod search;
pub mod shrink;

use crate::contract::checkpoint::Checkpoint;
pub use crate::contract::worker::WorkerSpec;
use crate::fault::{Fault, FaultKind, PartitionTarget};
use proptest::prelude::*;
use serde::{Deserialize, Serialize};
use std::fmt;

/// One step of a schedule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Step {
    /// Let worker `worker` run until it parks at `to` (taking a delivery first if idle);
    /// `to = done` finishes its delivery.
    Run {
        /// Index of the worker.
        worker: usize,
        /// Where it stops.
        to: Checkpoint,
    },
    /// Let worker `worker` complete `trips` round trips that change something (to Redis,
    /// Postgres, a backend; through its own links, whatever checkpoints it passes), then hold it
    /// before its next one: between two statements, where no checkpoint is (taking a delivery
    /// first if idle). Needs recorded links; a later `run` step lets the held request go.
    Trips {
        /// Index of the worker.
        worker: usize,
        /// Round trips to complete.
        trips: u32,
    },
    /// Crash worker `worker` where it is parked (nothing is cleaned up).
    Crash {
        /// Index of the worker.
        worker: usize,
    },
    /// Apply a fault.
    Fault(Fault),
}

impl Step {
    /// The fault kind this step applies, if it applies one.
    pub fn fault_kind(&self) -> Option<FaultKind> {
        match self {
            Step::Fault(fault) => Some(fault.kind()),
            Step::Crash { .. } => Some(FaultKind::WorkerCrash),
            Step::Run { .. } | Step::Trips { .. } => None,
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Run { worker, to } => write!(f, "run worker #{worker} to {to}"),
            Step::Trips { worker, trips } => {
                write!(f, "let worker #{worker} complete {trips} round trip(s)")
            }
            Step::Crash { worker } => write!(f, "crash worker #{worker}"),
            Step::Fault(fault) => write!(f, "fault: {fault}"),
        }
    }
}

/// A request of a case: its id and input.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RequestSpec {
    /// Client request id.
    pub request_id: String,
    /// Input (a small pool of inputs makes identical requests, hence cache hits, likely).
    pub input: String,
}

/// One step of a wire schedule: what a runner that holds worker *processes* at their round trips
/// can do (any language; the [`crate::runner::wire`] runner).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum WireStep {
    /// Let worker `worker` complete `trips` effectful round trips (uncounted ones, such as an
    /// empty queue poll, go through meanwhile); it is then held before its next one.
    Run {
        /// Index of the worker.
        worker: usize,
        /// Round trips to complete.
        trips: u32,
    },
    /// Let worker `worker` run until its next request's fingerprint contains `before` (a
    /// statement on a table: `UPDATE inference_jobs`; a command on a key: `SET {ns}inference:lock`)
    /// and hold it there.
    Until {
        /// Index of the worker.
        worker: usize,
        /// Part of the fingerprint to stop before.
        before: String,
    },
    /// Let worker `worker` run until it has nothing left to do (it polls an empty queue), is
    /// blocked, or stops coming back.
    Finish {
        /// Index of the worker.
        worker: usize,
    },
    /// Apply a fault. On processes, a lease expiry also makes the request's delivery idle past
    /// the visibility timeout (what a pause longer than both would do), a crash is a SIGKILL of
    /// the process group followed by a restart, a pause is SIGSTOP then SIGCONT.
    Fault(Fault),
}

impl fmt::Display for WireStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireStep::Run { worker, trips } => {
                write!(f, "let worker #{worker} complete {trips} round trip(s)")
            }
            WireStep::Until { worker, before } => {
                write!(f, "run worker #{worker}, hold it before `{before}`")
            }
            WireStep::Finish { worker } => write!(f, "let worker #{worker} finish"),
            WireStep::Fault(fault) => write!(f, "fault: {fault}"),
        }
    }
}

/// A full case: requests submitted up front, then the steps. The steps are what a runner can do:
/// [`Step`] for workers held at checkpoints in process, [`WireStep`] for worker processes held at
/// their round trips, a [`FaultKind`] for a team's system (its framework's fault, aimed at the
/// worker that takes the request).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Schedule<S = Step> {
    /// Requests submitted before the first step.
    pub requests: Vec<RequestSpec>,
    /// The steps, in order.
    pub steps: Vec<S>,
}

impl<S: fmt::Display> fmt::Display for Schedule<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, request) in self.requests.iter().enumerate() {
            writeln!(
                f,
                "  request #{i}: {} input={:?}",
                request.request_id, request.input
            )?;
        }
        for (i, step) in self.steps.iter().enumerate() {
            writeln!(f, "  step {:>2}: {step}", i + 1)?;
        }
        Ok(())
    }
}

/// Checkpoints a `Run` step may stop at: those where interleavings matter.
pub const STOP_POINTS: [Checkpoint; 7] = [
    Checkpoint::AfterLease,
    Checkpoint::AfterTake,
    Checkpoint::BeforeBackendCall,
    Checkpoint::AfterBackendCall,
    Checkpoint::BeforeFinalWrite,
    Checkpoint::BeforeAck,
    Checkpoint::Done,
];

/// What schedules a suite generates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleSpace {
    /// Workers of every case.
    pub workers: Vec<WorkerSpec>,
    /// Versions served (targets of backend faults, and of cutovers unless `cutover_targets`).
    pub versions: Vec<String>,
    /// Versions a cutover may switch to (empty: any of `versions`).
    #[serde(default)]
    pub cutover_targets: Vec<String>,
    /// Requests per case (at least one).
    pub max_requests: usize,
    /// Distinct inputs requests draw from.
    pub inputs: usize,
    /// Most steps per case.
    pub max_steps: usize,
    /// Fault kinds the schedules may contain.
    pub faults: Vec<FaultKind>,
    /// Whether a worker can be held between two statements ([`Step::Trips`]): that needs its
    /// links recorded by racecert's own proxy. On a bed with a proxy in a container or an
    /// external one, schedules hold workers at checkpoints only.
    #[serde(default = "holdable")]
    pub between_statements: bool,
}

fn holdable() -> bool {
    true
}

impl ScheduleSpace {
    fn allows(&self, kind: FaultKind) -> bool {
        self.faults.contains(&kind)
    }

    /// The proptest strategy of this space.
    pub fn strategy(&self) -> BoxedStrategy<Schedule> {
        let max_requests = self.max_requests.max(1);
        let inputs = self.inputs.max(1);
        let requests = proptest::collection::vec(0..inputs, 1..=max_requests).prop_map(|picks| {
            picks
                .into_iter()
                .enumerate()
                .map(|(i, input)| RequestSpec {
                    request_id: format!("req-{i}"),
                    input: format!("input-{input}"),
                })
                .collect::<Vec<_>>()
        });
        let step = self.step_strategy();
        let max_steps = self.max_steps.max(1);
        (requests, proptest::collection::vec(step, 1..=max_steps))
            .prop_map(|(requests, steps)| Schedule { requests, steps })
            .boxed()
    }

    /// The strategy of one step of this space (also what mutation inserts).
    pub fn step_strategy(&self) -> BoxedStrategy<Step> {
        let workers = self.workers.len().max(1);
        let max_requests = self.max_requests.max(1);
        let mut steps: Vec<(u32, BoxedStrategy<Step>)> = vec![(
            6,
            (0..workers, proptest::sample::select(STOP_POINTS.to_vec()))
                .prop_map(|(worker, to)| Step::Run { worker, to })
                .boxed(),
        )];
        // Between statements: a worker held where no checkpoint is (a check and the write it
        // guards, two statements of one transition).
        if self.between_statements {
            steps.push((
                2,
                (0..workers, 1u32..=3)
                    .prop_map(|(worker, trips)| Step::Trips { worker, trips })
                    .boxed(),
            ));
        }
        if self.allows(FaultKind::WorkerCrash) {
            steps.push((
                1,
                (0..workers)
                    .prop_map(|worker| Step::Crash { worker })
                    .boxed(),
            ));
        }
        if self.allows(FaultKind::LeaseExpiry) {
            steps.push((
                2,
                (0..max_requests)
                    .prop_map(|request| Step::Fault(Fault::ExpireLease { request }))
                    .boxed(),
            ));
        }
        if self.allows(FaultKind::RedisRestart) {
            steps.push((1, Just(Step::Fault(Fault::RestartRedis)).boxed()));
        }
        if self.allows(FaultKind::Partition) {
            let target = prop_oneof![
                Just(PartitionTarget::Redis),
                Just(PartitionTarget::Postgres)
            ];
            steps.push((
                1,
                (target, any::<bool>())
                    .prop_map(|(target, heal)| {
                        Step::Fault(if heal {
                            Fault::Heal { target }
                        } else {
                            Fault::Partition { target }
                        })
                    })
                    .boxed(),
            ));
        }
        let targets = if self.cutover_targets.is_empty() {
            self.versions.clone()
        } else {
            self.cutover_targets.clone()
        };
        if self.allows(FaultKind::Cutover) && !targets.is_empty() {
            steps.push((
                2,
                proptest::sample::select(targets)
                    .prop_map(|to| Step::Fault(Fault::Cutover { to }))
                    .boxed(),
            ));
        }
        if self.allows(FaultKind::CacheInvalidationLag) {
            steps.push((1, Just(Step::Fault(Fault::InvalidateCache)).boxed()));
        }
        if self.allows(FaultKind::UpstreamTimeout) && !self.versions.is_empty() {
            steps.push((
                1,
                proptest::sample::select(self.versions.clone())
                    .prop_map(|version| Step::Fault(Fault::UpstreamTimeout { version }))
                    .boxed(),
            ));
        }
        if self.allows(FaultKind::BackendFailure) && !self.versions.is_empty() {
            let status = prop_oneof![Just(500u16), Just(503u16), Just(429u16)];
            steps.push((
                1,
                (
                    proptest::sample::select(self.versions.clone()),
                    status,
                    1u64..3,
                )
                    .prop_map(|(version, status, calls)| {
                        Step::Fault(Fault::BackendFailure {
                            version,
                            status,
                            calls,
                        })
                    })
                    .boxed(),
            ));
        }
        proptest::strategy::Union::new_weighted(steps).boxed()
    }
}
