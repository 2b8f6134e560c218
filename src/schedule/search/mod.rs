//! The one search: every runner's cases come from here and every failure is shrunk here.
//!
//! A [`Runner`] runs one [`Case`] (a fixed schedule, or a PCT plan it follows release by release)
//! and hands back an [`Outcome`] whose history the judge has read. A [`Source`] says what case
//! `i` is: [`checkpoints`] for workers held at checkpoints (persisted failures, proptest's
//! generation, mutants of the coverage [`corpus`]); [`rounds`] for processes held at their
//! round trips (depth-bounded enumeration, then PCT). [`explore`] runs cases, several at once
//! when the runner allows it, judges them *in case order* (coverage merged, schedules that
//! reached something new kept in the corpus), stops at the first failure, the case count, the
//! time budget or a signal, and shrinks the failure with the one shrinker
//! ([`crate::schedule::shrink`]).
//!
//! Everything is reproducible from the seed: a case's schedule is a function of the seed, its
//! number and the cases at least [`CORPUS_LAG`] before it, never of timing or concurrency, so the
//! first failure met is the one a one-at-a-time run meets first.

pub mod checkpoints;
pub mod corpus;
pub mod rounds;

use super::shrink::{Shrink, shrink};
use super::{RequestSpec, Schedule};
use crate::check::coverage::Coverage;
use crate::check::{CaseResult, Invariant, Violation, broken};
use crate::{Error, Result};
use corpus::Corpus;
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::{Duration, Instant};

/// Cases in flight at once by default: most of a case's time is round trips to the containers,
/// so a few cases overlap well even on two cores. Six beat four on every shipped suite once a
/// case cost fewer round trips (BENCHMARKS.md, "Six cases at once"); eight did no better than six
/// and opened more Postgres sessions.
pub const DEFAULT_CONCURRENCY: usize = 6;

/// A case draws mutants only from corpus entries of cases at least this many before it, so the
/// schedules do not depend on which cases happen to have finished (concurrency, load): the same
/// seed gives the same cases at any concurrency up to this.
pub const CORPUS_LAG: usize = 16;

/// A PCT plan (probabilistic concurrency testing, Burckhardt et al. 2010): random worker
/// priorities and `depth - 1` priority change points over `steps` counted round trips; at a
/// change point a fault may land ([`rounds::PctPlan`] is the drawn plan).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pct {
    /// The bug depth `d` searched for.
    pub depth: usize,
    /// Expected counted round trips of a case (`k`).
    pub steps: u32,
}

impl Default for Pct {
    fn default() -> Pct {
        Pct {
            depth: 2,
            steps: 24,
        }
    }
}

/// A case a search hands a runner.
#[derive(Debug, Clone)]
pub enum Case<S> {
    /// Run these steps.
    Fixed(Schedule<S>),
    /// Follow a PCT plan over these requests, release by release; the outcome's schedule is the
    /// steps it took (replayable as a fixed case).
    Pct {
        /// The case's requests.
        requests: Vec<RequestSpec>,
        /// The drawn plan.
        plan: rounds::PctPlan,
    },
}

/// Where a replay first saw other round trips than its file recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Divergence {
    /// The step (from 1).
    pub step: usize,
    /// The fingerprints the file recorded for it.
    pub expected: Vec<String>,
    /// The fingerprints seen.
    pub got: Vec<String>,
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "DIVERGED at step {}: the worker sent something else than recorded",
            self.step
        )?;
        writeln!(f, "  expected: {}", self.expected.join(" ; "))?;
        write!(f, "  got:      {}", self.got.join(" ; "))
    }
}

/// What a runner did with one case: the steps it ran and the judged history, plus what runners
/// of processes also know (round-trip fingerprints per step, holds that timed out, the
/// processes' output).
#[derive(Debug, Clone)]
pub struct Outcome<S> {
    /// The steps run (for a PCT case: the steps it took).
    pub schedule: Schedule<S>,
    /// History, violations, coverage.
    pub case: CaseResult,
    /// Per step, the fingerprints of the round trips it released (runners that hold round
    /// trips; empty otherwise).
    pub trace: Vec<Vec<String>>,
    /// On replay: where the run left the recorded trace.
    pub divergence: Option<Divergence>,
    /// Holds that ended without the schedule (a held worker's own timeout, the longest hold).
    pub timeouts: Vec<String>,
    /// What the scheduler saw (a worker blocked, not coming back, idle).
    pub notes: Vec<String>,
    /// Per process: stdout and stderr.
    pub outputs: BTreeMap<String, (String, String)>,
    /// Wall time of the case.
    pub elapsed: Duration,
}

impl<S> Outcome<S> {
    /// The outcome of a runner that records no trace: the schedule and its judged history.
    pub fn of(schedule: Schedule<S>, case: CaseResult, elapsed: Duration) -> Outcome<S> {
        Outcome {
            schedule,
            case,
            trace: Vec::new(),
            divergence: None,
            timeouts: Vec::new(),
            notes: Vec::new(),
            outputs: BTreeMap::new(),
            elapsed,
        }
    }

    /// The verdict in a word: `diverged`, `failed` or `passed`.
    pub fn verdict(&self) -> &'static str {
        if self.divergence.is_some() {
            "diverged"
        } else if !self.case.violations.is_empty() {
            "failed"
        } else {
            "passed"
        }
    }
}

impl<S: fmt::Display> Outcome<S> {
    /// The case in text: schedule, trace, timeouts, divergence, violations.
    pub fn text(&self, title: &str) -> String {
        let mut out = format!("{title}: {}\n{}", self.verdict(), self.schedule);
        for (i, trips) in self.trace.iter().enumerate() {
            if !trips.is_empty() {
                out.push_str(&format!(
                    "  trips of step {}: {}\n",
                    i + 1,
                    trips.join(" ; ")
                ));
            }
        }
        for timeout in &self.timeouts {
            out.push_str(&format!("  held worker timed out: {timeout}\n"));
        }
        if let Some(divergence) = &self.divergence {
            out.push_str(&format!("{divergence}\n"));
        }
        for violation in &self.case.violations {
            out.push_str(&format!("  VIOLATION {violation}\n"));
        }
        out
    }
}

/// A runner the search drives.
pub trait Runner: Sync {
    /// What its schedules' steps are.
    type Step: Shrink + fmt::Debug + Send + Sync + 'static;

    /// Runs one case. A runner whose cases share processes serialises them itself.
    fn run(&self, case: Case<Self::Step>) -> BoxFuture<'_, Result<Outcome<Self::Step>>>;
}

/// Where a case's schedule came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Generated: `index` in the generator's order (proptest's, after its replays; the
    /// enumeration's).
    Generated {
        /// 0-based index in the generator's order.
        index: usize,
    },
    /// A mutant of the schedule case `parent` (0-based) ran.
    Mutant {
        /// The case whose schedule was mutated.
        parent: usize,
    },
    /// A PCT plan, drawn from the case's seed.
    Pct,
    /// A schedule aimed at a fault kind's target, built from the space.
    Aimed,
    /// A failure persisted by an earlier run, replayed.
    Replayed,
}

/// What case `i` of a search runs.
pub trait Source<S>: Send {
    /// Cases replayed before any other (persisted failures): they have no case number.
    fn replays(&self) -> u32;

    /// Cases the search may run at most (replays included); `usize::MAX` for no bound.
    fn cap(&self) -> usize;

    /// The case numbered `case` (0-based, in search order), given the corpus entries of cases
    /// judged so far (a source draws only from those at least [`CORPUS_LAG`] before `case`).
    /// None when the source has nothing more.
    fn case(&mut self, case: usize, corpus: &Corpus<S>) -> Result<Option<(Case<S>, Origin)>>;

    /// Learns from a case that held, once it is judged (a source that plans its next cases from
    /// what earlier ones did: the round trips a worker makes, for one). Searches that use it run
    /// one case at a time, so what it learns is the same whatever the timing.
    fn observe(&mut self, case: usize, outcome: &Outcome<S>) {
        let _ = (case, outcome);
    }

    /// Keeps a failing schedule (already shrunk) so later searches replay it first; the
    /// original case is given as well (a generated one persists by its own seed).
    fn persist(&mut self, original: (usize, Origin), shrunk: &Schedule<S>) -> Result<()> {
        let _ = (original, shrunk);
        Ok(())
    }

    /// Whether the source is inside a systematic enumeration the time budget should not cut
    /// short: while it is, the search goes on past its budget, up to [`BUDGET_STRETCH`] times
    /// it. A PASS then means every schedule of the enumerated depth ran, however long the
    /// worker's jobs are, not only those that fitted in the budget.
    fn owes(&self) -> bool {
        false
    }

    /// For a generated case, its number as `racecert run --case` counts it (None: it has no
    /// number, and its schedule file replays it).
    fn case_number(&self, origin: Origin) -> Option<u32> {
        let _ = origin;
        None
    }
}

/// How far past its time budget a search runs while its source [owes](Source::owes) the rest of
/// an enumeration.
pub const BUDGET_STRETCH: u32 = 2;

/// Called after every case with the number of cases run so far.
#[derive(Clone)]
pub struct Progress(pub std::sync::Arc<dyn Fn(u32) + Send + Sync>);

impl fmt::Debug for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Progress")
    }
}

/// How a search goes.
#[derive(Debug, Clone)]
pub struct SearchConfig {
    /// Seed of every choice the search makes.
    pub seed: u64,
    /// Wall-clock budget: no case starts after it (shrinking a failure found within it still
    /// runs).
    pub time_budget: Option<Duration>,
    /// Cases run at once while screening (shrinking is one at a time). 1 runs them one by one.
    pub concurrency: usize,
    /// Most shrink runs.
    pub max_shrink_iters: u32,
    /// Progress callback.
    pub progress: Option<Progress>,
}

/// A failure a search found, shrunk.
#[derive(Debug, Clone)]
pub struct Found<S> {
    /// The case as found.
    pub original: Schedule<S>,
    /// The minimal case's run (its schedule is the minimal one).
    pub shrunk: Outcome<S>,
    /// Cases before the first failure, counting it (1-based; 0: a replayed failure), and the
    /// time to it.
    pub found_after: (u32, Duration),
    /// Where the failing schedule came from.
    pub origin: Origin,
    /// Its number as `racecert run --case` counts it, when it has one.
    pub case_number: Option<u32>,
    /// Shrink runs made.
    pub shrink_runs: u32,
}

impl<S> Found<S> {
    /// The violations of the minimal case.
    pub fn violations(&self) -> &[Violation] {
        &self.shrunk.case.violations
    }
}

/// What a search did.
#[derive(Debug, Clone)]
pub struct SearchReport<S> {
    /// Cases run (screening and shrinking).
    pub cases_run: u32,
    /// Of them, mutants.
    pub mutants_run: u32,
    /// Schedules kept in the corpus for reaching something new.
    pub corpus: u32,
    /// The failure, if an invariant broke.
    pub found: Option<Found<S>>,
    /// Fault coverage over every screened case.
    pub coverage: Coverage,
    /// Cases in which a held worker timed out (a hold ended without the schedule).
    pub timeouts: u32,
    /// The last case screened that held (for a report when nothing failed).
    pub last: Option<Outcome<S>>,
    /// Wall time, shrinking included.
    pub elapsed: Duration,
    /// Whether the time budget ended the search.
    pub budget_exhausted: bool,
    /// Whether a signal stopped it early.
    pub interrupted: bool,
}

impl<S> SearchReport<S> {
    /// The violations of the failure (empty when everything held).
    pub fn violations(&self) -> &[Violation] {
        self.found.as_ref().map_or(&[], Found::violations)
    }
}

/// A failing case as the screening met it.
struct Failure<S> {
    case: usize,
    at: Duration,
    origin: Origin,
    outcome: Outcome<S>,
}

struct Screened<S> {
    cases: u32,
    mutants: u32,
    timeouts: u32,
    budget_exhausted: bool,
    interrupted: bool,
    coverage: Coverage,
    failure: Option<Failure<S>>,
    harness_error: Option<String>,
    last: Option<Outcome<S>>,
}

impl<S> Default for Screened<S> {
    fn default() -> Screened<S> {
        Screened {
            cases: 0,
            mutants: 0,
            timeouts: 0,
            budget_exhausted: false,
            interrupted: false,
            coverage: Coverage::default(),
            failure: None,
            harness_error: None,
            last: None,
        }
    }
}

/// A case's run, and when it finished.
type Finished<S> = (Result<Outcome<S>>, Duration);

type Running<'f, S> = BoxFuture<'f, (usize, Result<Outcome<S>>)>;

/// Searches the cases of `source` with `runner`, then shrinks the first failure (in case order).
pub async fn explore<R: Runner>(
    runner: &R,
    source: &mut dyn Source<R::Step>,
    config: &SearchConfig,
) -> Result<SearchReport<R::Step>> {
    let started = Instant::now();
    let mut corpus = Corpus::default();
    let screened = screen(runner, source, &mut corpus, config, started).await;
    if let Some(err) = screened.harness_error {
        return Err(Error::other(format!(
            "the search stopped on a harness error (seed {}): {err}",
            config.seed
        )));
    }
    let mut report = SearchReport {
        cases_run: screened.cases,
        mutants_run: screened.mutants,
        corpus: corpus.len() as u32,
        found: None,
        coverage: screened.coverage,
        timeouts: screened.timeouts,
        last: screened.last,
        elapsed: Duration::ZERO,
        budget_exhausted: screened.budget_exhausted,
        interrupted: screened.interrupted,
    };
    if let Some(failure) = screened.failure {
        let found_after = (
            (failure.case as u32 + 1).saturating_sub(source.replays()),
            failure.at,
        );
        let target: BTreeSet<Invariant> = broken(&failure.outcome.case.violations);
        let original = failure.outcome.schedule.clone();
        let shrunk = shrink(
            original.clone(),
            failure.outcome,
            &target,
            config.max_shrink_iters,
            |candidate| async move {
                let outcome = runner.run(Case::Fixed(candidate)).await?;
                let broke = broken(&outcome.case.violations);
                Ok((outcome, broke))
            },
        )
        .await?;
        report.cases_run += shrunk.runs;
        if failure.origin != Origin::Replayed {
            source.persist((failure.case, failure.origin), &shrunk.schedule)?;
        }
        report.found = Some(Found {
            original,
            found_after,
            origin: failure.origin,
            case_number: source.case_number(failure.origin),
            shrink_runs: shrunk.runs,
            shrunk: shrunk.outcome,
        });
    }
    report.elapsed = started.elapsed();
    Ok(report)
}

/// Runs cases, up to `config.concurrency` at once, started in case order, and judges them in
/// that order: coverage merged, schedules that reached something new kept in the corpus, until
/// the first failure or harness error in that order, the case cap or the time budget. Cases
/// finish out of order (one waiting out a timeout holds no one else up); once case `i` fails, no
/// case after `i` starts, and the cases before it, all started already, finish: a failure among
/// them comes first, as it would one at a time.
async fn screen<R: Runner>(
    runner: &R,
    source: &mut dyn Source<R::Step>,
    corpus: &mut Corpus<R::Step>,
    config: &SearchConfig,
    started: Instant,
) -> Screened<R::Step> {
    let mut screened = Screened::default();
    let mut in_flight: FuturesUnordered<Running<'_, R::Step>> = FuturesUnordered::new();
    let mut origins: BTreeMap<usize, Origin> = BTreeMap::new();
    let mut finished: BTreeMap<usize, Finished<R::Step>> = BTreeMap::new();
    let (mut next, mut judged) = (0usize, 0usize);
    // The earliest case known to fail or error; nothing after it starts.
    let mut stop_at = usize::MAX;
    let mut done = false;
    let mut exhausted = false;
    loop {
        // Judge finished cases in case order.
        while !done && let Some((result, at)) = finished.remove(&judged) {
            let origin = origins.remove(&judged).expect("started cases are kept");
            match result {
                Ok(outcome) => {
                    let new = screened.coverage.new_in(&outcome.case.coverage);
                    screened.coverage.merge(&outcome.case.coverage);
                    screened.timeouts += u32::from(!outcome.timeouts.is_empty());
                    if !outcome.case.violations.is_empty() {
                        screened.failure = Some(Failure {
                            case: judged,
                            at,
                            origin,
                            outcome,
                        });
                        done = true;
                    } else {
                        source.observe(judged, &outcome);
                        if new > 0 {
                            corpus.add(
                                outcome.schedule.clone(),
                                judged,
                                new,
                                &outcome.case.coverage,
                            );
                        }
                        screened.last = Some(outcome);
                    }
                }
                Err(err) => {
                    // A harness error is not a finding: neither shrunk nor persisted; the search
                    // stops and reports it as such.
                    screened.harness_error = Some(err.to_string());
                    done = true;
                }
            }
            judged += 1;
        }
        let may_start = !done
            && !exhausted
            && next < stop_at
            && next < source.cap()
            && in_flight.len() < config.concurrency.max(1)
            && next < judged + CORPUS_LAG;
        if may_start {
            if crate::interrupt::requested().is_some() {
                // A signal: start nothing new; what runs finishes and is reported.
                screened.interrupted = true;
                done = true;
                continue;
            }
            if config.time_budget.is_some_and(|budget| {
                let elapsed = started.elapsed();
                elapsed >= budget && !(source.owes() && elapsed < budget * BUDGET_STRETCH)
            }) {
                screened.budget_exhausted = true;
                done = true;
                continue;
            }
            let case = next;
            match source.case(case, corpus) {
                Ok(Some((planned, origin))) => {
                    next += 1;
                    if matches!(origin, Origin::Mutant { .. }) {
                        screened.mutants += 1;
                    }
                    origins.insert(case, origin);
                    in_flight.push(Box::pin(async move { (case, runner.run(planned).await) }));
                }
                Ok(None) => exhausted = true,
                Err(err) => {
                    screened.harness_error = Some(err.to_string());
                    done = true;
                }
            }
            continue;
        }
        let Some((case, result)) = in_flight.next().await else {
            break;
        };
        screened.cases += 1;
        if let Some(progress) = &config.progress {
            (progress.0)(screened.cases);
        }
        if result
            .as_ref()
            .map_or(true, |o| !o.case.violations.is_empty())
        {
            stop_at = stop_at.min(case);
        }
        finished.insert(case, (result, started.elapsed()));
    }
    screened
}
