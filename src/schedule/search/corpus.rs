//! The corpus of coverage-guided exploration: schedules that reached something no earlier case
//! had (a fault landing on its target path, an interleaving of checkpoints of a worker pair, a
//! checkpoint right after a fault), and the mutations that make new cases from them, as
//! coverage-guided fuzzers (AFL, libFuzzer) do. Plain proptest generation finds the common paths;
//! mutating what reached a rare one keeps the exploration near it (a cutover that landed between
//! two workers' cache reads is one step away from an invalidation in its lag window).
//!
//! Everything is seeded: a mutant is a function of the case's seed and the corpus entries it may
//! draw from, so an exploration replays the same mutants from the same seed.

use crate::check::coverage::{Coverage, Reach};
use crate::fault::FaultKind;
use crate::schedule::{RequestSpec, STOP_POINTS, Schedule, ScheduleSpace, Step};
use proptest::strategy::{BoxedStrategy, Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::collections::BTreeSet;

/// One schedule kept for reaching something new.
#[derive(Debug, Clone)]
pub struct Entry<S = Step> {
    /// The schedule.
    pub schedule: Schedule<S>,
    /// The case (0-based, in exploration order) that ran it.
    pub case: usize,
    /// How many features it reached first.
    pub new: usize,
    /// Fault kinds its run applied, and those that landed on their target paths.
    pub applied: BTreeSet<FaultKind>,
    /// (See `applied`.)
    pub landed: BTreeSet<FaultKind>,
    /// Fault kinds whose target path it came near ([`Reach::Near`]).
    pub near: BTreeSet<FaultKind>,
}

/// The corpus, in the order entries were added (by case).
#[derive(Debug, Clone)]
pub struct Corpus<S = Step> {
    entries: Vec<Entry<S>>,
}

impl<S> Default for Corpus<S> {
    fn default() -> Corpus<S> {
        Corpus {
            entries: Vec::new(),
        }
    }
}

impl<S> Corpus<S> {
    /// Adds a schedule that reached something new (`new` features; its run's `coverage`).
    pub fn add(&mut self, schedule: Schedule<S>, case: usize, new: usize, coverage: &Coverage) {
        let kinds = |pick: fn(&Reach) -> Option<FaultKind>| {
            coverage
                .reached
                .iter()
                .filter_map(pick)
                .collect::<BTreeSet<_>>()
        };
        self.entries.push(Entry {
            schedule,
            case,
            new,
            applied: kinds(|r| match r {
                Reach::Applied(kind) => Some(*kind),
                _ => None,
            }),
            landed: kinds(Reach::landed),
            near: kinds(|r| match r {
                Reach::Near(kind) => Some(*kind),
                _ => None,
            }),
        });
    }

    /// Entries added by cases before `case` (entries are added in case order).
    pub fn before(&self, case: usize) -> &[Entry<S>] {
        let end = self.entries.partition_point(|e| e.case < case);
        &self.entries[..end]
    }

    /// How many entries it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Makes mutants of corpus entries within a schedule space.
pub struct Mutator {
    space: ScheduleSpace,
}

/// Fresh steps of a space, drawn by a seeded runner (made per mutant: proptest's strategies are
/// neither `Send` nor `Sync`, and a search's source is sent across threads).
struct Fresh {
    step: BoxedStrategy<Step>,
    runner: TestRunner,
}

impl Fresh {
    fn step(&mut self) -> Step {
        self.step
            .new_tree(&mut self.runner)
            .expect("step strategies never reject")
            .current()
    }
}

impl std::fmt::Debug for Mutator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mutator").finish_non_exhaustive()
    }
}

/// The seed of case `case` of an exploration seeded `seed` (splitmix64 of both): every case's
/// decisions are a function of the two alone.
pub fn case_seed(seed: u64, case: usize) -> u64 {
    let mut z = seed ^ (case as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Mutator {
    /// A mutator for `space`.
    pub fn new(space: &ScheduleSpace) -> Mutator {
        Mutator {
            space: space.clone(),
        }
    }

    /// A mutant of one of `entries` (not empty), seeded by `seed`. Entries that reached more
    /// new features first are picked more often, and much more often those that applied a fault
    /// kind no entry has landed yet (they are nearest to it); one to three mutations are
    /// stacked, one of them possibly a step of such a kind.
    pub fn mutate(&self, entries: &[Entry], seed: u64) -> (Schedule, usize) {
        let mut rng = StdRng::seed_from_u64(seed);
        let landed: BTreeSet<FaultKind> = entries.iter().flat_map(|e| e.landed.clone()).collect();
        let missing: BTreeSet<FaultKind> = self
            .space
            .faults
            .iter()
            .filter(|kind| !landed.contains(kind))
            .copied()
            .collect();
        let weight = |entry: &Entry| {
            entry.new.max(1)
                + 8 * entry.applied.intersection(&missing).count()
                + 32 * entry.near.intersection(&missing).count()
        };
        let total: usize = entries.iter().map(weight).sum();
        let mut pick = rng.random_range(0..total);
        let mut parent = 0;
        for (i, entry) in entries.iter().enumerate() {
            let weight = weight(entry);
            if pick < weight {
                parent = i;
                break;
            }
            pick -= weight;
        }
        let mut schedule = entries[parent].schedule.clone();
        let mut runner = Fresh {
            step: self.space.step_strategy(),
            runner: TestRunner::new_with_rng(
                Config::default(),
                TestRng::from_seed(RngAlgorithm::ChaCha, &rng.random::<[u8; 32]>()),
            ),
        };
        // A parent that came near a kind no entry has landed set up that kind's target path and
        // then ended (its run drained first): the same schedule with that kind's fault as its
        // last step lands it, so half of its mutants are exactly that, unmutated otherwise (a
        // mutation would as likely undo the set-up).
        let near: BTreeSet<FaultKind> = entries[parent]
            .near
            .intersection(&missing)
            .copied()
            .collect();
        if !near.is_empty()
            && rng.random_bool(0.5)
            && let Some(step) = self.step_of(&near, &mut runner)
        {
            if schedule.steps.len() >= self.space.max_steps.max(1) {
                schedule.steps.pop();
            }
            schedule.steps.push(step);
            return (schedule, entries[parent].case);
        }
        let rounds = rng.random_range(1..=3);
        for _ in 0..rounds {
            let other = &entries[rng.random_range(0..entries.len())].schedule;
            self.mutate_once(&mut schedule, other, &mut rng, &mut runner);
        }
        if !missing.is_empty() && rng.random_bool(0.5) {
            self.insert_missing(&mut schedule, &missing, &mut rng, &mut runner);
        }
        (schedule, entries[parent].case)
    }

    /// Puts a step of a fault kind in `missing` somewhere in the schedule (in place of another
    /// if it is full): fresh steps are drawn until one is of such a kind (a few tries; kinds
    /// whose steps the space draws rarely still come up).
    fn insert_missing(
        &self,
        schedule: &mut Schedule,
        missing: &BTreeSet<FaultKind>,
        rng: &mut StdRng,
        runner: &mut Fresh,
    ) {
        if let Some(step) = self.step_of(missing, runner) {
            // In the second half: a fault that lands after what the schedule set up.
            let len = schedule.steps.len();
            if len >= self.space.max_steps.max(1) {
                schedule.steps[rng.random_range(len / 2..len)] = step;
            } else {
                schedule.steps.insert(rng.random_range(len / 2..=len), step);
            }
        }
    }

    /// A fresh step of one of `kinds`: steps are drawn until one is (a few tries; kinds whose
    /// steps the space draws rarely still come up). None if none came up.
    fn step_of(&self, kinds: &BTreeSet<FaultKind>, runner: &mut Fresh) -> Option<Step> {
        (0..64)
            .map(|_| runner.step())
            .find(|step| step.fault_kind().is_some_and(|kind| kinds.contains(&kind)))
    }

    fn mutate_once(
        &self,
        schedule: &mut Schedule,
        other: &Schedule,
        rng: &mut StdRng,
        runner: &mut Fresh,
    ) {
        let max_steps = self.space.max_steps.max(1);
        let workers = self.space.workers.len().max(1);
        let len = schedule.steps.len();
        match rng.random_range(0..8u32) {
            // Insert a fresh step.
            0 | 1 if len < max_steps => {
                let at = rng.random_range(0..=len);
                schedule.steps.insert(at, runner.step());
            }
            // Replace a step with a fresh one.
            2 if len > 0 => {
                let at = rng.random_range(0..len);
                schedule.steps[at] = runner.step();
            }
            // Delete a step.
            3 if len > 1 => {
                schedule.steps.remove(rng.random_range(0..len));
            }
            // Swap two neighbours: the same steps, another interleaving.
            4 if len > 1 => {
                let at = rng.random_range(0..len - 1);
                schedule.steps.swap(at, at + 1);
            }
            // Move a worker to another checkpoint, or hand its step to another worker.
            5 if len > 0 => {
                let at = rng.random_range(0..len);
                if let Step::Run { worker, to } = &mut schedule.steps[at] {
                    if rng.random_bool(0.5) {
                        *to = STOP_POINTS[rng.random_range(0..STOP_POINTS.len())];
                    } else {
                        *worker = rng.random_range(0..workers);
                    }
                } else {
                    schedule.steps[at] = runner.step();
                }
            }
            // Splice: this schedule's head, another one's tail.
            6 if len > 0 && !other.steps.is_empty() => {
                let head = rng.random_range(0..=len);
                let tail = rng.random_range(0..other.steps.len());
                schedule.steps.truncate(head);
                schedule
                    .steps
                    .extend(other.steps[tail..].iter().take(max_steps - head).cloned());
                if schedule.steps.is_empty() {
                    schedule.steps.push(runner.step());
                }
            }
            // Change the requests: another input, or one request more.
            _ => self.mutate_requests(&mut schedule.requests, rng),
        }
        schedule.steps.truncate(max_steps);
    }

    fn mutate_requests(&self, requests: &mut Vec<RequestSpec>, rng: &mut StdRng) {
        let inputs = self.space.inputs.max(1);
        let input = format!("input-{}", rng.random_range(0..inputs));
        if requests.len() < self.space.max_requests.max(1) && rng.random_bool(0.5) {
            requests.push(RequestSpec {
                request_id: format!("req-{}", requests.len()),
                input,
            });
        } else if !requests.is_empty() {
            let at = rng.random_range(0..requests.len());
            requests[at].input = input;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::FaultKind;

    fn space() -> ScheduleSpace {
        ScheduleSpace {
            workers: vec![
                crate::schedule::WorkerSpec {
                    id: "worker-a".into(),
                    version: "v1".into(),
                },
                crate::schedule::WorkerSpec {
                    id: "worker-c".into(),
                    version: "v2".into(),
                },
            ],
            versions: vec!["v1".into(), "v2".into()],
            cutover_targets: vec!["v2".into()],
            max_requests: 2,
            inputs: 2,
            max_steps: 8,
            faults: vec![FaultKind::Cutover, FaultKind::CacheInvalidationLag],
            between_statements: true,
        }
    }

    fn schedule() -> Schedule {
        Schedule {
            requests: vec![RequestSpec {
                request_id: "req-0".into(),
                input: "input-0".into(),
            }],
            steps: vec![
                Step::Run {
                    worker: 0,
                    to: crate::contract::checkpoint::Checkpoint::Done,
                },
                Step::Fault(crate::fault::Fault::InvalidateCache),
            ],
        }
    }

    #[test]
    fn mutants_are_seeded_and_stay_in_their_space() {
        let space = space();
        let mutator = Mutator::new(&space);
        let mut corpus = Corpus::default();
        corpus.add(schedule(), 3, 2, &Coverage::default());
        let mut distinct = std::collections::HashSet::new();
        for seed in 0..200 {
            let (a, parent) = mutator.mutate(corpus.before(4), case_seed(7, seed));
            let (b, _) = mutator.mutate(corpus.before(4), case_seed(7, seed));
            assert_eq!(a, b, "same seed, same mutant");
            assert_eq!(parent, 3);
            assert!(!a.steps.is_empty() && a.steps.len() <= space.max_steps);
            assert!(!a.requests.is_empty() && a.requests.len() <= space.max_requests);
            for step in &a.steps {
                match step {
                    Step::Run { worker, .. } | Step::Trips { worker, .. } => {
                        assert!(*worker < space.workers.len())
                    }
                    Step::Fault(fault) => assert!(space.faults.contains(&fault.kind())),
                    Step::Crash { .. } => panic!("worker-crash is not in the space"),
                }
            }
            distinct.insert(a);
        }
        assert!(
            distinct.len() > 50,
            "only {} distinct mutants",
            distinct.len()
        );
        assert!(
            corpus.before(3).is_empty(),
            "an entry is not drawn from by its own case"
        );
    }

    #[test]
    fn a_parent_near_a_missing_kind_gets_that_fault_as_its_last_step() {
        let space = space();
        let mutator = Mutator::new(&space);
        let mut parent = schedule();
        parent.steps.pop();
        parent.steps.push(Step::Fault(crate::fault::Fault::Cutover {
            to: "v2".into(),
        }));
        let mut near = Coverage::default();
        near.reached
            .insert(Reach::Near(FaultKind::CacheInvalidationLag));
        let mut corpus = Corpus::default();
        corpus.add(parent.clone(), 0, 1, &near);
        let mut completed = parent.clone();
        completed
            .steps
            .push(Step::Fault(crate::fault::Fault::InvalidateCache));
        let hits = (0..200)
            .filter(|seed| mutator.mutate(corpus.before(1), case_seed(3, *seed)).0 == completed)
            .count();
        // Half the mutants take the direct path; a plain mutation rarely makes the same one.
        assert!(
            (70..=140).contains(&hits),
            "{hits} of 200 mutants completed the near miss"
        );

        // Once some entry landed the kind, nothing is steered toward it any more.
        let mut landed = Coverage::default();
        landed
            .reached
            .insert(Reach::Landed(FaultKind::CacheInvalidationLag));
        corpus.add(parent.clone(), 1, 1, &landed);
        let hits = (0..200)
            .filter(|seed| mutator.mutate(corpus.before(2), case_seed(3, *seed)).0 == completed)
            .count();
        assert!(hits < 30, "{hits} of 200 mutants still completed it");
    }
}
