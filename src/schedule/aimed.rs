//! Aimed schedules: one per fault kind in a space, built so the fault meets its target (a job
//! held, a cache entry of the old version read after a cutover), with more for the kinds whose
//! target is several points: a crash after the take, during the call and before the ack; a lease
//! running out in the window between a holder's last check and the write it guards. A search runs them before its
//! random cases, so every kind in scope lands early; a random draw lands a kind that needs an
//! order of several steps (write under the old version, cut over, read under the new one, then
//! invalidate) in about one case of a hundred.

use super::{RequestSpec, Schedule, ScheduleSpace, Step};
use crate::contract::checkpoint::Checkpoint;
use crate::fault::{Fault, FaultKind, PartitionTarget};

/// The aimed schedules of `space`, in the order of its fault kinds (kinds with no aimed form in
/// this space, such as a cutover with no worker of another version, are left to the search).
pub fn aimed(space: &ScheduleSpace) -> Vec<Schedule> {
    space
        .faults
        .iter()
        .flat_map(|kind| {
            let mut aimed: Vec<Schedule> = aimed_at(space, *kind).into_iter().collect();
            match kind {
                FaultKind::LeaseExpiry => {
                    aimed.push(before_the_write(space, None));
                    if space.between_statements {
                        aimed.push(before_the_write(space, Some(1)));
                    }
                }
                // The holder dies at each point a job can be left in: taken and not called,
                // and written but not acknowledged (its redelivery meets a finished job).
                FaultKind::WorkerCrash => {
                    for at in [Checkpoint::AfterTake, Checkpoint::BeforeAck] {
                        aimed.push(Schedule {
                            requests: requests(space, 1),
                            steps: vec![run(0, at), Step::Crash { worker: 0 }],
                        });
                    }
                }
                _ => {}
            }
            aimed
        })
        .filter(|schedule| schedule.steps.len() <= space.max_steps.max(1))
        .collect()
}

fn requests(space: &ScheduleSpace, count: usize) -> Vec<RequestSpec> {
    // One input for all: a second request of the same input reads what the first cached.
    (0..count.min(space.max_requests.max(1)))
        .map(|i| RequestSpec {
            request_id: format!("req-{i}"),
            input: "input-0".into(),
        })
        .collect()
}

fn run(worker: usize, to: Checkpoint) -> Step {
    Step::Run { worker, to }
}

fn aimed_at(space: &ScheduleSpace, kind: FaultKind) -> Option<Schedule> {
    let workers = space.workers.len();
    // A second worker where there is one (the one that takes over), else the first again.
    let other = usize::from(workers > 1);
    let (requests, steps) = match kind {
        // The holder's lease runs out after it took the job; another worker takes it over.
        FaultKind::LeaseExpiry => (
            requests(space, 1),
            vec![
                run(0, Checkpoint::AfterTake),
                Step::Fault(Fault::ExpireLease { request: 0 }),
                run(other, Checkpoint::Done),
                run(0, Checkpoint::Done),
            ],
        ),
        // The holder dies during its model call.
        FaultKind::WorkerCrash => (
            requests(space, 1),
            vec![
                run(0, Checkpoint::BeforeBackendCall),
                Step::Crash { worker: 0 },
            ],
        ),
        FaultKind::RedisRestart => (
            requests(space, 1),
            vec![
                run(0, Checkpoint::BeforeBackendCall),
                Step::Fault(Fault::RestartRedis),
                run(0, Checkpoint::Done),
            ],
        ),
        FaultKind::Partition => (
            requests(space, 1),
            vec![
                run(0, Checkpoint::AfterTake),
                Step::Fault(Fault::Partition {
                    target: PartitionTarget::Postgres,
                }),
                run(0, Checkpoint::Done),
                Step::Fault(Fault::Heal {
                    target: PartitionTarget::Postgres,
                }),
            ],
        ),
        // The switch while a worker of another version holds a job.
        FaultKind::Cutover => {
            let (old, _, to) = versions_apart(space)?;
            (
                requests(space, 1),
                vec![
                    run(old, Checkpoint::AfterTake),
                    Step::Fault(Fault::Cutover { to }),
                    run(old, Checkpoint::Done),
                ],
            )
        }
        // The old version caches an answer, the switch, the new version reads the entry of the
        // same input before the late invalidation runs.
        FaultKind::CacheInvalidationLag => {
            let (old, new, to) = versions_apart(space)?;
            if space.max_requests < 2 || !space.faults.contains(&FaultKind::Cutover) {
                return None;
            }
            (
                requests(space, 2),
                vec![
                    run(old, Checkpoint::Done),
                    Step::Fault(Fault::Cutover { to }),
                    run(new, Checkpoint::BeforeBackendCall),
                    Step::Fault(Fault::InvalidateCache),
                ],
            )
        }
        // The holder's model call outlives its timeout.
        FaultKind::UpstreamTimeout => {
            let version = space.workers.first()?.version.clone();
            (
                requests(space, 1),
                vec![
                    Step::Fault(Fault::UpstreamTimeout { version }),
                    run(0, Checkpoint::Done),
                ],
            )
        }
        // The holder's model call fails once; the worker's own handling of it runs.
        FaultKind::BackendFailure => {
            let version = space.workers.first()?.version.clone();
            (
                requests(space, 1),
                vec![
                    Step::Fault(Fault::BackendFailure {
                        version,
                        status: 503,
                        calls: 1,
                    }),
                    run(0, Checkpoint::Done),
                ],
            )
        }
        _ => return None,
    };
    Some(Schedule { requests, steps })
}

/// The lease runs out in the window every lease-guarded write has, while another worker takes
/// the job over: the holder parked at its last checkpoint before the write (a check made before
/// it is stale now), or `trips` round trips further (a check made after it, in its own
/// statement, and the write held).
fn before_the_write(space: &ScheduleSpace, trips: Option<u32>) -> Schedule {
    let other = usize::from(space.workers.len() > 1);
    let mut steps = vec![run(0, Checkpoint::BeforeFinalWrite)];
    steps.extend(trips.map(|trips| Step::Trips { worker: 0, trips }));
    steps.extend([
        Step::Fault(Fault::ExpireLease { request: 0 }),
        run(other, Checkpoint::AfterTake),
        run(0, Checkpoint::Done),
        run(other, Checkpoint::Done),
    ]);
    Schedule {
        requests: requests(space, 1),
        steps,
    }
}

/// A worker of a version other than a cutover target, a worker of that target, and the target.
fn versions_apart(space: &ScheduleSpace) -> Option<(usize, usize, String)> {
    let targets = if space.cutover_targets.is_empty() {
        &space.versions
    } else {
        &space.cutover_targets
    };
    targets.iter().find_map(|to| {
        let old = space.workers.iter().position(|w| w.version != *to)?;
        let new = space.workers.iter().position(|w| w.version == *to)?;
        Some((old, new, to.clone()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::WorkerSpec;

    fn space(faults: Vec<FaultKind>) -> ScheduleSpace {
        ScheduleSpace {
            workers: vec![
                WorkerSpec {
                    id: "worker-a".into(),
                    version: "v1".into(),
                },
                WorkerSpec {
                    id: "worker-c".into(),
                    version: "v2".into(),
                },
            ],
            versions: vec!["v1".into(), "v2".into()],
            cutover_targets: vec!["v2".into()],
            max_requests: 2,
            inputs: 2,
            max_steps: 8,
            faults,
            between_statements: true,
        }
    }

    #[test]
    fn a_cache_lag_is_aimed_at_an_entry_of_the_old_version_read_by_the_new() {
        let aimed = aimed(&space(vec![
            FaultKind::Cutover,
            FaultKind::CacheInvalidationLag,
        ]));
        assert_eq!(aimed.len(), 2);
        let lag = &aimed[1];
        assert_eq!(lag.requests.len(), 2);
        assert_eq!(lag.requests[0].input, lag.requests[1].input);
        assert_eq!(
            lag.steps,
            vec![
                run(0, Checkpoint::Done),
                Step::Fault(Fault::Cutover { to: "v2".into() }),
                run(1, Checkpoint::BeforeBackendCall),
                Step::Fault(Fault::InvalidateCache),
            ]
        );
    }

    #[test]
    fn kinds_with_no_target_in_the_space_are_left_to_the_search() {
        let mut one_version = space(vec![FaultKind::Cutover, FaultKind::CacheInvalidationLag]);
        one_version.workers[1].version = "v1".into();
        one_version.cutover_targets = vec!["v1".into()];
        assert!(aimed(&one_version).is_empty());
        let mut short = space(vec![FaultKind::LeaseExpiry]);
        short.max_steps = 2;
        assert!(aimed(&short).is_empty(), "an aimed case keeps to max_steps");
    }

    /// A bed whose proxy cannot hold a round trip (in a container, or external) gets no step
    /// between statements, aimed or drawn: such a step would end the search on a harness error.
    #[test]
    fn a_space_that_cannot_hold_between_statements_never_draws_such_a_step() {
        use proptest::strategy::{Strategy, ValueTree};
        use proptest::test_runner::TestRunner;
        let trips = |schedule: &Schedule| {
            schedule
                .steps
                .iter()
                .any(|step| matches!(step, Step::Trips { .. }))
        };
        let mut space = space(vec![FaultKind::LeaseExpiry, FaultKind::WorkerCrash]);
        assert!(
            aimed(&space).iter().any(trips),
            "the holdable space aims between statements"
        );
        space.between_statements = false;
        assert!(!aimed(&space).iter().any(trips));
        let strategy = space.strategy();
        let mut runner = TestRunner::deterministic();
        for _ in 0..500 {
            let schedule = strategy
                .new_tree(&mut runner)
                .expect("a schedule")
                .current();
            assert!(!trips(&schedule), "drawn: {:?}", schedule.steps);
        }
    }
}
