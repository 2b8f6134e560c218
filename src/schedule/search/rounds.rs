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
    /// What a job writes (keys, tables; see [`conflict_points`]): when known, change points
    /// count only the round trips that touch one of them, the points where an order can matter,
    /// so `k` is the case's conflict points, not all its round trips. Empty: every round trip
    /// counts.
    pub aim: Vec<String>,
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
            aim: Vec::new(),
        }
    }

    /// The plan aimed at the round trips that touch `written` (a job's written resources).
    pub fn aimed(mut self, written: Vec<String>) -> PctPlan {
        self.aim = written;
        self
    }

    /// Whether the round trip of fingerprint `print` counts toward a change point.
    pub fn counts(&self, print: &str) -> bool {
        self.aim.is_empty() || touches_any(print, &self.aim)
    }

    /// Round trips the plan runs at most (the free run after it finishes the jobs).
    pub fn bound(&self) -> u32 {
        (self.pct.steps.max(2) * 3).max(120)
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

/// What lands at the preemption point of a depth-2 schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AtPreemption {
    /// Request 0's lease expires (and its delivery outlives the visibility timeout).
    Expire,
    /// The preempted worker is killed (and restarted).
    Crash,
    /// Nothing: a plain preemption.
    Nothing,
}

/// Every depth-2 schedule of a small case: worker `a` runs `c` round trips (c = 1..=`steps`) and
/// is preempted, with request 0's lease expiring then, with `a` killed then, or with nothing;
/// worker `b` finishes, then `a`.
pub fn depth_two(workers: usize, steps: u32, requests: &[RequestSpec]) -> Vec<Schedule<WireStep>> {
    let mut out = Vec::new();
    for at in [
        AtPreemption::Expire,
        AtPreemption::Crash,
        AtPreemption::Nothing,
    ] {
        for c in 1..=steps {
            for a in 0..workers {
                for b in (0..workers).filter(|b| *b != a) {
                    let mut list = vec![WireStep::Run {
                        worker: a,
                        trips: c,
                    }];
                    match at {
                        AtPreemption::Expire => {
                            list.push(WireStep::Fault(Fault::ExpireLease { request: 0 }))
                        }
                        AtPreemption::Crash => {
                            list.push(WireStep::Fault(Fault::CrashWorker { worker: a }))
                        }
                        AtPreemption::Nothing => {}
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

/// A schedule that starts by running one worker: how many round trips, and the schedule with that
/// count taken out (its shape: the same preemption at another point).
fn run_shape(schedule: &Schedule<WireStep>) -> Option<(u32, Schedule<WireStep>)> {
    let Some(WireStep::Run { worker, trips }) = schedule.steps.first() else {
        return None;
    };
    let mut shape = schedule.clone();
    shape.steps[0] = WireStep::Run {
        worker: *worker,
        trips: 0,
    };
    Some((*trips, shape))
}

/// The longest job one worker did in `outcome`: per worker, the round trips of its steps in
/// order, in a case where no fault broke a job in two (a worker preempted and resumed still does
/// one job). A job's round trips past the first run are where its late writes are, so the
/// depth-3 points come from the whole job, not from the depth-2 enumeration's first runs.
fn longest_job(outcome: &super::Outcome<WireStep>) -> Option<Vec<String>> {
    let steps = &outcome.schedule.steps;
    if steps.iter().any(|s| matches!(s, WireStep::Fault(_))) {
        return None;
    }
    let worker_of = |step: &WireStep| match step {
        WireStep::Run { worker, .. }
        | WireStep::Until { worker, .. }
        | WireStep::Finish { worker } => Some(*worker),
        WireStep::Fault(_) => None,
    };
    let mut jobs: std::collections::BTreeMap<usize, Vec<String>> = Default::default();
    for (step, trips) in steps.iter().zip(&outcome.trace) {
        if let Some(worker) = worker_of(step) {
            jobs.entry(worker)
                .or_default()
                .extend(trips.iter().cloned());
        }
    }
    jobs.into_values().max_by_key(Vec::len)
}

/// The fault a depth-bounded schedule applies, if any (what round-robin ordering groups by).
fn fault_of(schedule: &Schedule<WireStep>) -> Option<crate::fault::FaultKind> {
    schedule.steps.iter().find_map(|step| match step {
        WireStep::Fault(fault) => Some(fault.kind()),
        _ => None,
    })
}

/// The points of a job's round trips where preempting its worker can matter (partial-order
/// reduction): before a round trip on a key or table that some round trip of a job writes.
/// Round trips on anything else commute with the other worker's, so stopping before them gives
/// no order that stopping elsewhere does not; skipping them keeps depth 3 affordable.
pub fn conflict_points(prints: &[String]) -> Vec<u32> {
    let written = written(prints);
    prints
        .iter()
        .enumerate()
        .filter(|(i, print)| *i > 0 && touches_any(print, &written))
        .map(|(i, _)| i as u32)
        .collect()
}

/// Whether the round trip of fingerprint `print` touches one of `written` (a conflict point).
fn touches_any(print: &str, written: &[String]) -> bool {
    crate::wire::touches(print)
        .iter()
        .any(|t| written.contains(&t.resource))
}

/// What some round trip of a job writes (keys, tables, transaction commits), in name order.
pub fn written(prints: &[String]) -> Vec<String> {
    let set: std::collections::BTreeSet<String> = prints
        .iter()
        .flat_map(|p| crate::wire::touches(p))
        .filter(|t| t.write)
        .map(|t| t.resource)
        .collect();
    set.into_iter().collect()
}

/// Every depth-3 schedule over `points`: worker `a` runs to point `p`, its lease expires (and its
/// delivery outlives the visibility timeout), worker `b` takes the job and runs to point `q`,
/// then `a` finishes, then `b`: two preemptions, the shape of a late writer meeting the live
/// holder of a job it lost (a lease overwritten, a status-only fence passed).
pub fn depth_three(
    workers: usize,
    points: &[u32],
    requests: &[RequestSpec],
) -> Vec<Schedule<WireStep>> {
    let mut out = Vec::new();
    for p in points {
        for q in points {
            for a in 0..workers {
                for b in (0..workers).filter(|b| *b != a) {
                    out.push(Schedule {
                        requests: requests.to_vec(),
                        steps: vec![
                            WireStep::Run {
                                worker: a,
                                trips: *p,
                            },
                            WireStep::Fault(Fault::ExpireLease { request: 0 }),
                            WireStep::Run {
                                worker: b,
                                trips: *q,
                            },
                            WireStep::Finish { worker: a },
                            WireStep::Finish { worker: b },
                        ],
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
    /// After the depth-2 enumeration, enumerate depth-3 schedules at the conflict points of the
    /// round trips a job made there.
    pub depth_three: bool,
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

/// The source of round-trip cases: the enumeration, then PCT plans. The enumeration runs in a
/// seeded order, round-robin over the faults at the preemption point (a lease expiry, a kill of
/// the preempted worker, then nothing: with nothing expired, the other worker has no delivery to
/// take and a plain preemption changes little), so every fault kind lands early in the budget.
/// A schedule that would repeat a case already run is skipped: its first worker told to run past
/// where it stops (its job done), in a shape that already came short.
#[derive(Debug)]
pub struct RoundSource {
    rounds: Rounds,
    requests: Vec<RequestSpec>,
    enumerated: std::vec::IntoIter<Schedule<WireStep>>,
    /// The longest run of one worker's round trips seen (their fingerprints), from which the
    /// depth-3 enumeration takes its points.
    job: Vec<String>,
    /// The depth-3 enumeration, once planned.
    third: Option<std::vec::IntoIter<Schedule<WireStep>>>,
    /// Shapes of schedules whose first run came short: the worker stopped (its job done, idle at
    /// its poll) before its count. Every count past the longest run seen stops there too, so
    /// those schedules repeat one already run and are skipped.
    ran_short: std::collections::HashSet<Schedule<WireStep>>,
    /// Schedules skipped so far.
    skipped: u32,
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
        // Round-robin over the faults: the i-th schedule of each group, in the groups' order.
        let order = [
            Some(crate::fault::FaultKind::LeaseExpiry),
            Some(crate::fault::FaultKind::WorkerCrash),
            None,
        ];
        let mut seen = [0usize; 3];
        let mut keyed: Vec<(usize, usize, Schedule<WireStep>)> = enumerated
            .into_iter()
            .map(|schedule| {
                let group = order
                    .iter()
                    .position(|kind| *kind == fault_of(&schedule))
                    .unwrap_or(2);
                seen[group] += 1;
                (seen[group], group, schedule)
            })
            .collect();
        keyed.sort_by_key(|(rank, group, _)| (*rank, *group));
        let enumerated: Vec<Schedule<WireStep>> =
            keyed.into_iter().map(|(_, _, schedule)| schedule).collect();
        RoundSource {
            enumerated: enumerated.into_iter(),
            requests,
            rounds,
            job: Vec::new(),
            third: None,
            ran_short: std::collections::HashSet::new(),
            skipped: 0,
            rng,
        }
    }

    /// Whether `schedule` runs its first worker past where that worker stops: a count beyond the
    /// longest run seen, in a shape that has already come short (partial-order reduction: the
    /// same interleaving, the same fault at the same point, as a case already run).
    fn repeats_a_short_run(&self, schedule: &Schedule<WireStep>) -> bool {
        run_shape(schedule).is_some_and(|(trips, shape)| {
            trips as usize > self.job.len() && self.ran_short.contains(&shape)
        })
    }

    /// Whether enumerated schedules are left: the depth-2 ones, or the depth-3 ones (planned
    /// once the depth-2 ones are done).
    fn enumerating(&self) -> bool {
        self.enumerated.len() > 0
            || (self.rounds.depth_three && self.third.as_ref().is_none_or(|third| third.len() > 0))
    }

    /// Enumerated schedules skipped as repeats of cases already run.
    pub fn skipped(&self) -> u32 {
        self.skipped
    }
}

impl Source<WireStep> for RoundSource {
    fn replays(&self) -> u32 {
        0
    }

    fn cap(&self) -> usize {
        self.rounds.cases as usize
    }

    fn owes(&self) -> bool {
        self.enumerating()
    }

    /// Learns the round trips of a job (the longest one worker's steps made in a case without a
    /// fault, or the longest first run of a worker), and which shapes' first runs came short of
    /// their count.
    fn observe(&mut self, _case: usize, outcome: &super::Outcome<WireStep>) {
        if let Some(job) = longest_job(outcome)
            && job.len() > self.job.len()
        {
            self.job = job;
        }
        let (Some((trips, shape)), Some(first)) =
            (run_shape(&outcome.schedule), outcome.trace.first())
        else {
            return;
        };
        if first.len() > self.job.len() {
            self.job = first.clone();
        }
        // Fewer fingerprints than releases asked for: fewer releases ran (one release is one
        // round trip or more).
        if (first.len() as u32) < trips {
            self.ran_short.insert(shape);
        }
    }

    fn case(
        &mut self,
        case: usize,
        _corpus: &Corpus<WireStep>,
    ) -> Result<Option<(Case<WireStep>, Origin)>> {
        while let Some(schedule) = self.enumerated.next() {
            if self.repeats_a_short_run(&schedule) {
                self.skipped += 1;
                tracing::debug!(%schedule, "skipped: repeats a case already run");
                continue;
            }
            return Ok(Some((
                Case::Fixed(schedule),
                Origin::Generated { index: case },
            )));
        }
        if self.rounds.depth_three && self.third.is_none() {
            let mut third = depth_three(
                self.rounds.workers,
                &conflict_points(&self.job),
                &self.requests,
            );
            third.shuffle(&mut self.rng);
            self.third = Some(third.into_iter());
        }
        if let Some(schedule) = self.third.as_mut().and_then(Iterator::next) {
            return Ok(Some((
                Case::Fixed(schedule),
                Origin::Generated { index: case },
            )));
        }
        // Aimed at a job's conflict points once a job is known: `k` is then the conflict round
        // trips of a case (each worker's job, one after another at worst), and PCT's bound,
        // 1 / (n k^(d-1)), is over those, not over every poll and backend call.
        let points = conflict_points(&self.job).len() as u32;
        let mut pct = self.rounds.pct;
        if points > 0 {
            pct.steps = (points * self.rounds.workers as u32).max(2);
        }
        let plan = PctPlan::draw(
            pct,
            self.rounds.workers,
            self.requests.len(),
            self.rng.random(),
        )
        .aimed(written(&self.job));
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
        // 2 ordered pairs x 5 preemption points x {expiry, kill, nothing}.
        assert_eq!(all.len(), 30);
        let unique: std::collections::HashSet<_> = all.iter().collect();
        assert_eq!(unique.len(), all.len());
        assert!(all.iter().all(|s| s.steps.len() <= 4));
    }

    #[test]
    fn counts_past_where_a_worker_stopped_are_skipped_once_their_shape_came_short() {
        let rounds = Rounds {
            seed: 7,
            cases: u32::MAX,
            requests: 1,
            depth_two_steps: 6,
            pct: Pct::default(),
            workers: 2,
            depth_three: false,
        };
        let corpus = super::super::corpus::Corpus::default();
        // Every case's first run does at most 3 round trips (the job's length), as a worker
        // whose job ends after 3 does.
        let job = |trips: u32| -> Vec<String> {
            (0..trips.min(3))
                .map(|i| format!("redis SET k{i}"))
                .collect()
        };
        let mut source = RoundSource::new(rounds.clone());
        let mut run = Vec::new();
        let mut case = 0;
        while let Some((Case::Fixed(schedule), _)) = source.case(case, &corpus).unwrap() {
            let Some((trips, _)) = run_shape(&schedule) else {
                break;
            };
            let outcome = super::super::Outcome::of(
                schedule.clone(),
                crate::check::CaseResult::judge(crate::history::History::default(), &[]),
                std::time::Duration::ZERO,
            );
            source.observe(
                case,
                &super::super::Outcome {
                    trace: vec![job(trips)],
                    ..outcome
                },
            );
            run.push(schedule);
            case += 1;
        }
        let all = depth_two(2, 6, &rounds.request_specs());
        // Per shape (3 faults x 2 ordered pairs), counts 1-3 run, and of 4-6 only those met
        // before a count past 3 came short; the rest are skipped.
        assert_eq!(run.len() as u32 + source.skipped(), all.len() as u32);
        assert!(source.skipped() > 0);
        let shapes: std::collections::HashSet<Schedule<WireStep>> = all
            .iter()
            .filter_map(|s| run_shape(s).map(|(_, shape)| shape))
            .collect();
        for shape in shapes {
            let counts: Vec<u32> = run
                .iter()
                .filter_map(run_shape)
                .filter(|(_, s)| *s == shape)
                .map(|(trips, _)| trips)
                .collect();
            for trips in 1..=3 {
                assert!(counts.contains(&trips), "{shape}: count {trips} must run");
            }
            assert_eq!(
                counts.iter().filter(|trips| **trips > 3).count(),
                1,
                "{shape}: one count past the job's end runs, the others repeat it: {counts:?}"
            );
        }
    }

    #[test]
    fn conflict_points_are_the_round_trips_on_what_a_job_writes() {
        let job: Vec<String> = [
            "redis XAUTOCLAIM {ns}inference:jobs",
            "redis GET {ns}inference:active_version",
            "redis SET {ns}inference:lock:{req#0}",
            "postgres [UPDATE inference_jobs | UPDATE inference_jobs SET status = $1]",
            "redis GET {ns}inf:v1:abc",
            "http POST /v1/infer",
            "redis SETEX {ns}inf:v1:abc",
            "postgres [UPDATE inference_jobs | UPDATE inference_jobs SET status = $1]",
            "redis XACK {ns}inference:jobs",
            "redis EVALSHA {ns}inference:lock:{req#0}",
        ]
        .map(str::to_owned)
        .to_vec();
        // Not the poll, not the version pointer nobody writes, not the backend call.
        assert_eq!(conflict_points(&job), vec![2, 3, 4, 6, 7, 8, 9]);
        let all = depth_three(2, &[2, 3], &[]);
        // 2 x 2 points x 2 ordered pairs, each two preemptions around an expiry.
        assert_eq!(all.len(), 8);
        assert!(all.iter().all(|s| s.steps.len() == 5));
    }

    #[test]
    fn a_job_is_learned_whole_from_a_case_without_a_fault_and_aims_the_plans() {
        let print = |p: &str| p.to_owned();
        let schedule = Schedule {
            requests: Vec::new(),
            steps: vec![
                WireStep::Run {
                    worker: 0,
                    trips: 2,
                },
                WireStep::Finish { worker: 1 },
                WireStep::Finish { worker: 0 },
            ],
        };
        let outcome = super::super::Outcome {
            trace: vec![
                vec![print("redis XREADGROUP q"), print("redis SET lock")],
                Vec::new(),
                vec![print("redis HINCRBY stats k"), print("redis GET lock")],
            ],
            ..super::super::Outcome::of(
                schedule,
                crate::check::CaseResult::judge(crate::history::History::default(), &[]),
                std::time::Duration::ZERO,
            )
        };
        let job = longest_job(&outcome).expect("a job");
        // Worker 0's two steps, in order: the late round trips are the job's too.
        assert_eq!(job.len(), 4);
        assert_eq!(conflict_points(&job), vec![1, 2, 3]);
        let plan = PctPlan::draw(Pct::default(), 2, 1, 1).aimed(written(&job));
        assert!(
            plan.counts("redis GET lock"),
            "a read of what a job writes counts"
        );
        assert!(!plan.counts("redis XREADGROUP q") && !plan.counts("http POST /v1/infer"));
        assert!(PctPlan::draw(Pct::default(), 2, 1, 1).counts("http POST /v1/infer"));
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
    fn the_enumeration_comes_first_round_robin_over_its_faults() {
        let mut source = RoundSource::new(Rounds {
            seed: 1,
            cases: u32::MAX,
            requests: 1,
            depth_two_steps: 3,
            pct: Pct::default(),
            workers: 2,
            depth_three: false,
        });
        let corpus = Corpus::default();
        let kind = |case: &Case<WireStep>| match case {
            Case::Fixed(s) => fault_of(s),
            Case::Pct { .. } => panic!("enumerated first"),
        };
        // 3 settings at the preemption x 3 trip counts x 2 ordered pairs.
        let kinds: Vec<Option<crate::fault::FaultKind>> = (0..18)
            .map(|i| kind(&source.case(i, &corpus).unwrap().unwrap().0))
            .collect();
        for round in kinds.chunks(3) {
            assert_eq!(
                round,
                [
                    Some(crate::fault::FaultKind::LeaseExpiry),
                    Some(crate::fault::FaultKind::WorkerCrash),
                    None
                ]
            );
        }
        assert!(matches!(
            source.case(18, &corpus).unwrap().unwrap(),
            (Case::Pct { .. }, Origin::Pct)
        ));
    }
}
