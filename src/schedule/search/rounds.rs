//! Cases of worker processes held at their round trips: first the enumeration of every
//! depth-bounded schedule of a small case (in a seeded order), then PCT plans (probabilistic
//! concurrency testing, Burckhardt et al. 2010), each drawn from its own seed.

use super::corpus::Corpus;
use super::{Case, Origin, Pct, Source};
use crate::Result;
use crate::fault::Fault;
use crate::schedule::{RequestSpec, Schedule, WireStep};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};

/// What lands at a PCT change point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AtChange {
    /// Request `request`'s lease expires (and its delivery outlives the visibility timeout).
    Expire {
        /// Index of the request.
        request: usize,
    },
    /// The worker that just ran is killed (and restarted).
    CrashRunning,
}

/// A drawn PCT plan: `n` workers get distinct priorities `depth..depth + n`; at each change point
/// (a count of round trips), the running worker's priority drops below every other, and a fault
/// may land.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PctPlan {
    /// The parameters it was drawn with.
    pub pct: Pct,
    /// Per worker, its priority (the highest runnable worker runs).
    pub priority: Vec<usize>,
    /// Change points, ascending: counted round trips after which the priority changes.
    pub changes: Vec<u32>,
    /// What lands at each change point.
    pub faults: Vec<Option<AtChange>>,
}

impl PctPlan {
    /// The plan of seed `seed` for `workers` workers and `requests` requests.
    pub fn draw(pct: Pct, workers: usize, requests: usize, seed: u64) -> PctPlan {
        let mut rng = StdRng::seed_from_u64(seed);
        let d = pct.depth.max(1);
        let k = pct.steps.max(2);
        let mut order: Vec<usize> = (0..workers).collect();
        order.shuffle(&mut rng);
        let mut priority = vec![0usize; workers];
        for (rank, worker) in order.iter().enumerate() {
            priority[*worker] = d + rank;
        }
        let mut changes: Vec<u32> = Vec::new();
        while changes.len() < d - 1 {
            let at = rng.random_range(1..=k);
            if !changes.contains(&at) {
                changes.push(at);
            }
        }
        changes.sort_unstable();
        let faults = changes
            .iter()
            .map(|_| match rng.random_range(0..8) {
                0..=4 => Some(AtChange::Expire {
                    request: rng.random_range(0..requests.max(1)),
                }),
                5 => Some(AtChange::CrashRunning),
                _ => None,
            })
            .collect();
        PctPlan {
            pct,
            priority,
            changes,
            faults,
        }
    }

    /// Counted round trips the plan runs at most.
    pub fn bound(&self) -> u32 {
        self.pct.steps.max(2) * 3
    }

    /// The change point reached after `counted` round trips, if one is: its index.
    pub fn change_at(&self, counted: u32) -> Option<usize> {
        self.changes.iter().position(|c| *c == counted)
    }

    /// The priority a worker drops to at change point `index`: below every worker's start.
    pub fn lowered(&self, index: usize) -> usize {
        self.pct.depth.max(1) - 1 - index
    }

    /// The step a change point's fault is, given the worker that just ran.
    pub fn step_at(&self, index: usize, running: usize) -> Option<WireStep> {
        self.faults[index].map(|fault| {
            WireStep::Fault(match fault {
                AtChange::Expire { request } => Fault::ExpireLease { request },
                AtChange::CrashRunning => Fault::CrashWorker { worker: running },
            })
        })
    }
}

/// Every depth-2 schedule of a small case: worker `a` runs `c` round trips (c = 1..=`steps`) and
/// is preempted, with or without request 0's lease expiring then; worker `b` finishes, then `a`.
pub fn depth_two(workers: usize, steps: u32, requests: &[RequestSpec]) -> Vec<Schedule<WireStep>> {
    let mut out = Vec::new();
    for expire in [true, false] {
        for c in 1..=steps {
            for a in 0..workers {
                for b in (0..workers).filter(|b| *b != a) {
                    let mut list = vec![WireStep::Run {
                        worker: a,
                        trips: c,
                    }];
                    if expire {
                        list.push(WireStep::Fault(Fault::ExpireLease { request: 0 }));
                    }
                    list.push(WireStep::Finish { worker: b });
                    list.push(WireStep::Finish { worker: a });
                    out.push(Schedule {
                        requests: requests.to_vec(),
                        steps: list,
                    });
                }
            }
        }
    }
    out
}

/// How a search of round-trip schedules goes.
#[derive(Debug, Clone)]
pub struct Rounds {
    /// Seed (PCT plans, the order of the enumeration).
    pub seed: u64,
    /// Most cases (`u32::MAX`: the budget ends the search).
    pub cases: u32,
    /// Requests per case.
    pub requests: usize,
    /// Enumerate depth-2 schedules up to this many round trips of the preempted worker first
    /// (0: PCT only).
    pub depth_two_steps: u32,
    /// The PCT plan's parameters.
    pub pct: Pct,
    /// Workers of a case.
    pub workers: usize,
}

impl Rounds {
    /// The requests of every case.
    pub fn request_specs(&self) -> Vec<RequestSpec> {
        (0..self.requests.max(1))
            .map(|i| RequestSpec {
                request_id: format!("req-{i}"),
                input: format!("input-{i}"),
            })
            .collect()
    }
}

/// The source of round-trip cases: the enumeration (seeded order, preemptions with a lease
/// expiry first: with nothing expired, the other worker has no delivery to take and the
/// preemption changes nothing), then PCT plans.
#[derive(Debug)]
pub struct RoundSource {
    rounds: Rounds,
    requests: Vec<RequestSpec>,
    enumerated: std::vec::IntoIter<Schedule<WireStep>>,
    rng: StdRng,
}

impl RoundSource {
    /// The source of `rounds`' cases.
    pub fn new(rounds: Rounds) -> RoundSource {
        let requests = rounds.request_specs();
        let mut rng = StdRng::seed_from_u64(rounds.seed);
        let mut enumerated = if rounds.depth_two_steps > 0 {
            depth_two(rounds.workers, rounds.depth_two_steps, &requests)
        } else {
            Vec::new()
        };
        enumerated.shuffle(&mut rng);
        enumerated.sort_by_key(|s| {
            !s.steps
                .iter()
                .any(|st| matches!(st, WireStep::Fault(Fault::ExpireLease { .. })))
        });
        RoundSource {
            enumerated: enumerated.into_iter(),
            requests,
            rounds,
            rng,
        }
    }
}

impl Source<WireStep> for RoundSource {
    fn replays(&self) -> u32 {
        0
    }

    fn cap(&self) -> usize {
        self.rounds.cases as usize
    }

    fn case(
        &mut self,
        case: usize,
        _corpus: &Corpus<WireStep>,
    ) -> Result<Option<(Case<WireStep>, Origin)>> {
        if let Some(schedule) = self.enumerated.next() {
            return Ok(Some((
                Case::Fixed(schedule),
                Origin::Generated { index: case },
            )));
        }
        let plan = PctPlan::draw(
            self.rounds.pct,
            self.rounds.workers,
            self.requests.len(),
            self.rng.random(),
        );
        Ok(Some((
            Case::Pct {
                requests: self.requests.clone(),
                plan,
            },
            Origin::Pct,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_two_enumerates_every_preemption_with_and_without_expiry() {
        let requests = vec![RequestSpec {
            request_id: "req-0".into(),
            input: "input-0".into(),
        }];
        let all = depth_two(2, 5, &requests);
        // 2 ordered pairs x 5 preemption points x {expiry, none}.
        assert_eq!(all.len(), 20);
        let unique: std::collections::HashSet<_> = all.iter().collect();
        assert_eq!(unique.len(), all.len());
        assert!(all.iter().all(|s| s.steps.len() <= 4));
    }

    #[test]
    fn a_plan_is_a_function_of_its_seed_and_lowers_below_every_start() {
        let pct = Pct {
            depth: 3,
            steps: 20,
        };
        let a = PctPlan::draw(pct, 2, 1, 42);
        assert_eq!(a, PctPlan::draw(pct, 2, 1, 42));
        assert_eq!(a.changes.len(), 2);
        assert!(a.changes.windows(2).all(|w| w[0] < w[1]));
        let mut starts = a.priority.clone();
        starts.sort_unstable();
        assert_eq!(starts, vec![3, 4]);
        assert!(a.lowered(0) < 3 && a.lowered(1) < a.lowered(0));
    }

    #[test]
    fn the_enumeration_comes_first_with_expiries_before_plain_preemptions() {
        let mut source = RoundSource::new(Rounds {
            seed: 1,
            cases: u32::MAX,
            requests: 1,
            depth_two_steps: 3,
            pct: Pct::default(),
            workers: 2,
        });
        let corpus = Corpus::default();
        let expires = |case: &Case<WireStep>| match case {
            Case::Fixed(s) => s
                .steps
                .iter()
                .any(|st| matches!(st, WireStep::Fault(Fault::ExpireLease { .. }))),
            Case::Pct { .. } => panic!("enumerated first"),
        };
        // 2 expiry settings x 3 trip counts x 2 ordered pairs.
        let cases: Vec<Case<WireStep>> = (0..12)
            .map(|i| source.case(i, &corpus).unwrap().unwrap().0)
            .collect();
        assert!(cases[..6].iter().all(expires));
        assert!(!cases[6..].iter().any(expires));
        assert!(matches!(
            source.case(12, &corpus).unwrap().unwrap(),
            (Case::Pct { .. }, Origin::Pct)
        ));
    }
}
