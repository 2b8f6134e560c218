//! The one shrinker: a failing schedule of any runner becomes the smallest one that still fails.
//! Candidates are single changes, smallest first (a step dropped, a request dropped, two steps of
//! one worker merged, a step made simpler); the first candidate that still breaks one of the
//! invariants the original broke replaces it, until none does or the run budget is spent. A step
//! type says how it simplifies ([`Shrink`]); everything else is the same for every runner.

use super::{RequestSpec, STOP_POINTS, Schedule, Step, WireStep};
use crate::Result;
use crate::check::Invariant;
use crate::fault::FaultKind;
use std::collections::BTreeSet;
use std::future::Future;

/// How a step simplifies.
pub trait Shrink: Clone {
    /// Simpler variants of this step, each one change, simplest first.
    fn simpler(&self) -> Vec<Self> {
        Vec::new()
    }

    /// This step and the one after it as one step, when they can be one.
    fn merge(&self, next: &Self) -> Option<Self> {
        let _ = next;
        None
    }

    /// The worker this step names, if any (a fault aimed at one names it too).
    fn worker_mut(&mut self) -> Option<&mut usize> {
        None
    }
}

/// Swaps two workers' roles wherever a step names one of them.
fn swap_workers<S: Shrink>(steps: &mut [S], a: usize, b: usize) {
    for step in steps {
        if let Some(worker) = step.worker_mut() {
            if *worker == a {
                *worker = b;
            } else if *worker == b {
                *worker = a;
            }
        }
    }
}

impl Shrink for Step {
    /// A `Run` stops one checkpoint earlier.
    fn simpler(&self) -> Vec<Step> {
        match self {
            Step::Run { worker, to } => STOP_POINTS
                .iter()
                .position(|p| p == to)
                .filter(|index| *index > 0)
                .map(|index| Step::Run {
                    worker: *worker,
                    to: STOP_POINTS[index - 1],
                })
                .into_iter()
                .collect(),
            _ => Vec::new(),
        }
    }

    fn worker_mut(&mut self) -> Option<&mut usize> {
        match self {
            Step::Run { worker, .. } | Step::Trips { worker, .. } | Step::Crash { worker } => {
                Some(worker)
            }
            Step::Fault(fault) => fault.worker_mut(),
        }
    }
}

impl Shrink for WireStep {
    /// A run completes half its round trips, or one fewer (halving first: a long run shrinks in
    /// a few runs, not one per round trip).
    fn simpler(&self) -> Vec<WireStep> {
        match self {
            WireStep::Run { worker, trips } if *trips > 1 => {
                let mut fewer = vec![trips / 2, trips - 1];
                fewer.dedup();
                fewer
                    .into_iter()
                    .map(|trips| WireStep::Run {
                        worker: *worker,
                        trips,
                    })
                    .collect()
            }
            _ => Vec::new(),
        }
    }

    /// Two runs of one worker are one run.
    fn merge(&self, next: &WireStep) -> Option<WireStep> {
        match (self, next) {
            (
                WireStep::Run {
                    worker: a,
                    trips: x,
                },
                WireStep::Run {
                    worker: b,
                    trips: y,
                },
            ) if a == b => Some(WireStep::Run {
                worker: *a,
                trips: x + y,
            }),
            _ => None,
        }
    }

    fn worker_mut(&mut self) -> Option<&mut usize> {
        match self {
            WireStep::Run { worker, .. }
            | WireStep::Until { worker, .. }
            | WireStep::Finish { worker } => Some(worker),
            WireStep::Fault(fault) => fault.worker_mut(),
        }
    }
}

/// A system case's one step (its framework fault) has nothing simpler.
impl Shrink for FaultKind {}

/// Smaller variants of `schedule`, smallest first: a step dropped (the last first; never the only
/// one), a request dropped (ids renumbered), two adjacent steps merged, a step made simpler.
/// After the drops, when the first worker the steps name is not worker 0, the same schedule with
/// that worker and worker 0 trading roles: no smaller, but what follows a schedule (the drain
/// finishes the workers in index order) differs, so a mirror image that needed an extra step to
/// put its workers in order may then lose it. It only ever moves worker 0 first, so shrinking
/// still ends.
pub fn candidates<S: Shrink>(schedule: &Schedule<S>) -> Vec<Schedule<S>> {
    let steps = &schedule.steps;
    let mut out = Vec::new();
    if steps.len() > 1 {
        for at in (0..steps.len()).rev() {
            let mut smaller = schedule.clone();
            smaller.steps.remove(at);
            out.push(smaller);
        }
    }
    if schedule.requests.len() > 1 {
        for at in (0..schedule.requests.len()).rev() {
            let mut smaller = schedule.clone();
            smaller.requests.remove(at);
            renumber(&mut smaller.requests);
            out.push(smaller);
        }
    }
    let first = steps
        .iter()
        .find_map(|step| step.clone().worker_mut().map(|worker| *worker));
    if let Some(first) = first.filter(|first| *first != 0) {
        let mut mirrored = schedule.clone();
        swap_workers(&mut mirrored.steps, 0, first);
        out.push(mirrored);
    }
    for at in 0..steps.len().saturating_sub(1) {
        if let Some(merged) = steps[at].merge(&steps[at + 1]) {
            let mut smaller = schedule.clone();
            smaller.steps[at] = merged;
            smaller.steps.remove(at + 1);
            out.push(smaller);
        }
    }
    for (at, step) in steps.iter().enumerate() {
        for simpler in step.simpler() {
            let mut smaller = schedule.clone();
            smaller.steps[at] = simpler;
            out.push(smaller);
        }
    }
    out
}

fn renumber(requests: &mut [RequestSpec]) {
    for (i, request) in requests.iter_mut().enumerate() {
        request.request_id = format!("req-{i}");
    }
}

/// What a shrink ended with: the smallest failing schedule found, its run, and the runs made.
#[derive(Debug, Clone)]
pub struct Shrunk<S, O> {
    /// The smallest schedule that still failed.
    pub schedule: Schedule<S>,
    /// Its run (the last failing one; the original's when no candidate failed).
    pub outcome: O,
    /// Candidate runs made.
    pub runs: u32,
}

/// Shrinks a failing schedule: `run` runs a candidate and says which invariants it broke; a
/// candidate that breaks one of `target` replaces the current schedule. Stops when no candidate
/// fails, after `budget` runs, or on a signal. Candidates run one at a time: shrinking is a
/// sequence of decisions, each on the last.
pub async fn shrink<S, O, F, Fut>(
    failing: Schedule<S>,
    outcome: O,
    target: &BTreeSet<Invariant>,
    budget: u32,
    mut run: F,
) -> Result<Shrunk<S, O>>
where
    S: Shrink,
    F: FnMut(Schedule<S>) -> Fut,
    Fut: Future<Output = Result<(O, BTreeSet<Invariant>)>>,
{
    let mut best = Shrunk {
        schedule: failing,
        outcome,
        runs: 0,
    };
    'smaller: while best.runs < budget {
        for candidate in candidates(&best.schedule) {
            if best.runs >= budget || crate::interrupt::requested().is_some() {
                break 'smaller;
            }
            best.runs += 1;
            let (outcome, broke) = run(candidate.clone()).await?;
            if broke.iter().any(|invariant| target.contains(invariant)) {
                best.schedule = candidate;
                best.outcome = outcome;
                continue 'smaller;
            }
        }
        break;
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::checkpoint::Checkpoint;
    use crate::fault::Fault;

    fn request(i: usize) -> RequestSpec {
        RequestSpec {
            request_id: format!("req-{i}"),
            input: format!("input-{i}"),
        }
    }

    /// Shrinks `failing` with a stand-in runner: a candidate breaks `invariant` when `breaks`.
    async fn shrink_while(
        failing: Schedule<WireStep>,
        invariant: Invariant,
        breaks: impl Fn(&Schedule<WireStep>) -> bool,
    ) -> Shrunk<WireStep, ()> {
        let breaks = &breaks;
        shrink(
            failing,
            (),
            &BTreeSet::from([invariant]),
            100,
            |candidate| async move {
                let broke = if breaks(&candidate) {
                    BTreeSet::from([invariant])
                } else {
                    BTreeSet::new()
                };
                Ok(((), broke))
            },
        )
        .await
        .unwrap()
    }

    #[test]
    fn candidates_drop_merge_and_simplify_one_change_at_a_time() {
        let schedule = Schedule {
            requests: vec![request(0), request(1)],
            steps: vec![
                WireStep::Run {
                    worker: 0,
                    trips: 2,
                },
                WireStep::Run {
                    worker: 0,
                    trips: 1,
                },
                WireStep::Fault(Fault::ExpireLease { request: 0 }),
            ],
        };
        let all = candidates(&schedule);
        // 3 steps dropped, 2 requests dropped, 1 merge, 1 shorter run.
        assert_eq!(all.len(), 7);
        assert_eq!(all[0].steps.len(), 2);
        assert_eq!(all[3].requests, vec![request(0)]);
        assert_eq!(
            all[4].requests,
            vec![RequestSpec {
                request_id: "req-0".into(),
                input: "input-1".into()
            }],
            "ids are renumbered"
        );
        assert_eq!(
            all[5].steps[0],
            WireStep::Run {
                worker: 0,
                trips: 3
            }
        );
        assert_eq!(
            all[6].steps[0],
            WireStep::Run {
                worker: 0,
                trips: 1
            }
        );
    }

    #[tokio::test]
    async fn a_mirror_image_trades_worker_roles_and_shrinks_to_the_shortest_schedule() {
        // The race: the worker that took the job (x) is preempted by an expiry, the other (y)
        // runs, and x acts again before y does. After the schedule, the drain finishes worker 0
        // then worker 1.
        let breaks = |s: &Schedule<WireStep>| {
            let mut steps = s.steps.clone();
            steps.extend([
                WireStep::Finish { worker: 0 },
                WireStep::Finish { worker: 1 },
            ]);
            let worker = |st: &WireStep| st.clone().worker_mut().map(|w| *w);
            let Some(x) = steps.first().and_then(worker) else {
                return false;
            };
            let Some(expiry) = steps.iter().position(|st| matches!(st, WireStep::Fault(_))) else {
                return false;
            };
            let Some(y_run) = steps[expiry..]
                .iter()
                .position(|st| matches!(st, WireStep::Run { worker, .. } if *worker != x))
            else {
                return false;
            };
            let after: Vec<usize> = steps[expiry + y_run + 1..]
                .iter()
                .filter_map(worker)
                .collect();
            after.first() == Some(&x)
        };
        let mirror = Schedule {
            requests: vec![request(0)],
            steps: vec![
                WireStep::Run {
                    worker: 1,
                    trips: 1,
                },
                WireStep::Fault(Fault::ExpireLease { request: 0 }),
                WireStep::Run {
                    worker: 0,
                    trips: 1,
                },
                WireStep::Finish { worker: 1 },
            ],
        };
        assert!(breaks(&mirror));
        let shrunk = shrink_while(mirror, Invariant::GenerationsIncrease, breaks).await;
        assert_eq!(
            shrunk.schedule.steps,
            vec![
                WireStep::Run {
                    worker: 0,
                    trips: 1
                },
                WireStep::Fault(Fault::ExpireLease { request: 0 }),
                WireStep::Run {
                    worker: 1,
                    trips: 1
                },
            ]
        );
        // A crash names its worker too, and trades with it.
        let mut steps = vec![WireStep::Fault(Fault::CrashWorker { worker: 1 })];
        swap_workers(&mut steps, 0, 1);
        assert_eq!(
            steps,
            vec![WireStep::Fault(Fault::CrashWorker { worker: 0 })]
        );
    }

    #[test]
    fn a_checkpoint_step_stops_one_checkpoint_earlier() {
        let step = Step::Run {
            worker: 1,
            to: Checkpoint::BeforeFinalWrite,
        };
        assert_eq!(
            step.simpler(),
            vec![Step::Run {
                worker: 1,
                to: Checkpoint::AfterBackendCall
            }]
        );
        assert!(
            Step::Run {
                worker: 0,
                to: STOP_POINTS[0]
            }
            .simpler()
            .is_empty()
        );
    }

    #[tokio::test]
    async fn shrinking_keeps_the_smallest_schedule_that_still_breaks_the_target() {
        // Fails while it has an expiry and at least two round trips of worker 0.
        let breaks = |s: &Schedule<WireStep>| {
            let trips: u32 = s
                .steps
                .iter()
                .map(|st| match st {
                    WireStep::Run { worker: 0, trips } => *trips,
                    _ => 0,
                })
                .sum();
            trips >= 2 && s.steps.iter().any(|st| matches!(st, WireStep::Fault(_)))
        };
        let failing = Schedule {
            requests: vec![request(0)],
            steps: vec![
                WireStep::Run {
                    worker: 0,
                    trips: 3,
                },
                WireStep::Finish { worker: 1 },
                WireStep::Fault(Fault::ExpireLease { request: 0 }),
                WireStep::Finish { worker: 0 },
            ],
        };
        let shrunk = shrink_while(failing, Invariant::AtMostOneFinalWrite, breaks).await;
        assert_eq!(
            shrunk.schedule.steps,
            vec![
                WireStep::Run {
                    worker: 0,
                    trips: 2
                },
                WireStep::Fault(Fault::ExpireLease { request: 0 }),
            ]
        );
    }
}
