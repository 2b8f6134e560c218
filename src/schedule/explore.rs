//! Exploration: cases are proptest-generated schedules of a [`ScheduleSpace`] and, alongside
//! them, mutants of the schedules that reached new coverage (coverage-guided, see
//! [`super::corpus`]); the controlled runner runs each, and the first case that breaks an
//! invariant is shrunk to the smallest schedule that still breaks one. An exploration runs a
//! number of cases (`cases`, exact reproduction) or spends a time budget (`time_budget`), or both
//! (whichever ends first). Everything is reproducible from the printed seed: a case's schedule is
//! a function of the seed, its number and the cases at least [`CORPUS_LAG`] before it, never of
//! timing or concurrency. Failing proptest seeds are persisted to a regression file, failing
//! mutants (which no proptest seed regenerates) to a schedule list beside it; later runs (and CI)
//! replay both first.
//!
//! proptest's runner is driven programmatically (not through the `proptest!` macro) so `cargo
//! test`, `racecert certify` and the benchmarks share it. It generates the cases; racecert runs
//! several at once, in case order, and hands the first failure back to proptest to shrink (a
//! mutant is shrunk by removing steps and requests). Blocking: call [`explore`] from a blocking
//! thread (e.g. `tokio::task::spawn_blocking`) with a runtime handle.

use crate::check::Violation;
use crate::check::coverage::Coverage;
use crate::schedule::controlled::{CaseResult, Controller};
use crate::schedule::corpus::{Corpus, Mutator, case_seed, simpler};
use crate::schedule::{Schedule, ScheduleSpace};
use crate::{Error, Result};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use proptest::test_runner::{
    Config, FileFailurePersistence, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner,
};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Called after every case with the number of cases run so far.
#[derive(Clone)]
pub struct Progress(pub std::sync::Arc<dyn Fn(u32) + Send + Sync>);

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Progress")
    }
}

/// Cases in flight at once by default: most of a case's time is round trips to the containers,
/// so a few cases overlap well even on two cores. Six beat four on every shipped suite once a
/// case cost fewer round trips (BENCHMARKS.md, "Six cases at once"); eight did no better than six
/// and opened more Postgres sessions.
pub const DEFAULT_CONCURRENCY: usize = 6;

/// A case draws mutants only from corpus entries of cases at least this many before it, so the
/// schedules do not depend on which cases happen to have finished (concurrency, load): the same
/// seed gives the same cases at any concurrency up to this.
pub const CORPUS_LAG: usize = 16;

/// Share of cases (once the corpus has entries) that are mutants rather than fresh proptest
/// cases: fresh cases keep finding common paths, mutants stay near rare ones.
pub const MUTANT_SHARE: f64 = 0.5;

/// How to explore.
#[derive(Debug, Clone)]
pub struct ExploreConfig {
    /// Cases to run after the replayed regressions (with a time budget: at most this many;
    /// `u32::MAX` runs until the budget is spent).
    pub cases: u32,
    /// Seed of the generator and the mutator: same seed, same schedules.
    pub seed: u64,
    /// Bound on shrinking runs.
    pub max_shrink_iters: u32,
    /// Where failing seeds are persisted and replayed from (None: nowhere); failing mutants go
    /// to [`mutant_regressions`] of it.
    pub regressions: Option<PathBuf>,
    /// Wall-clock budget: no case starts after it (shrinking a failure found within it still
    /// runs).
    pub time_budget: Option<Duration>,
    /// Progress callback.
    pub progress: Option<Progress>,
    /// Cases run at once while screening (shrinking is one at a time). 1 runs them one by one.
    pub concurrency: usize,
    /// Whether mutants of coverage-reaching schedules are run alongside proptest's cases (off:
    /// proptest's cases alone, in its order).
    pub guided: bool,
}

impl Default for ExploreConfig {
    fn default() -> Self {
        ExploreConfig {
            cases: 256,
            seed: 0,
            max_shrink_iters: 256,
            regressions: None,
            time_budget: None,
            progress: None,
            concurrency: DEFAULT_CONCURRENCY,
            guided: true,
        }
    }
}

impl ExploreConfig {
    /// A configuration that spends `budget` (as many cases as fit).
    pub fn budgeted(budget: Duration) -> ExploreConfig {
        ExploreConfig {
            cases: u32::MAX,
            time_budget: Some(budget),
            ..ExploreConfig::default()
        }
    }
}

/// Where a case's schedule came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// proptest generated it: `index` in its order (the regression file's replays first).
    Generated {
        /// 0-based index in proptest's order.
        index: usize,
    },
    /// A mutant of the schedule case `parent` (0-based) ran.
    Mutant {
        /// The case whose schedule was mutated.
        parent: usize,
    },
    /// A failing mutant persisted by an earlier run, replayed.
    Replayed,
}

/// A failure, shrunk.
#[derive(Debug, Clone)]
pub struct Counterexample {
    /// The minimal schedule.
    pub schedule: Schedule,
    /// Its run (history and violations), replayed after shrinking.
    pub result: CaseResult,
    /// Cases before the first failure, counting it (1-based; 0: a replayed regression), and
    /// time to it.
    pub found_after: (u32, Duration),
    /// Where the failing schedule came from.
    pub origin: Origin,
    /// For a proptest case, its number as `racecert run --case` counts (proptest's order, after
    /// the replays); None for a mutant or a replayed regression (their schedule file replays
    /// them).
    pub generated_case: Option<u32>,
}

/// The outcome of an exploration.
#[derive(Debug, Clone)]
pub struct ExploreReport {
    /// Cases run (screening and shrinking).
    pub cases_run: u32,
    /// Of them, mutants.
    pub mutants_run: u32,
    /// Schedules kept in the corpus for reaching something new.
    pub corpus: u32,
    /// The counterexample, if an invariant broke.
    pub counterexample: Option<Counterexample>,
    /// Fault coverage over every case.
    pub coverage: Coverage,
    /// Wall time.
    pub elapsed: Duration,
    /// Whether the time budget ended the exploration (it was spent).
    pub budget_exhausted: bool,
    /// Whether a signal stopped the exploration early.
    pub interrupted: bool,
}

impl ExploreReport {
    /// The violations of the counterexample (empty when everything held).
    pub fn violations(&self) -> &[Violation] {
        self.counterexample
            .as_ref()
            .map_or(&[], |c| c.result.violations.as_slice())
    }
}

fn rng(seed: u64) -> TestRng {
    let mut bytes = [0u8; 32];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&(seed.wrapping_add(i as u64)).to_le_bytes());
    }
    TestRng::from_seed(RngAlgorithm::ChaCha, &bytes)
}

/// How many failures the regression file holds: proptest replays them before generating new
/// cases, so case numbers (as reports and `racecert run --case` count them) start after them.
fn persisted_count(config: &ExploreConfig) -> u32 {
    config
        .regressions
        .as_ref()
        .and_then(|path| std::fs::read_to_string(path).ok())
        .map_or(0, |text| {
            text.lines()
                .filter(|l| l.trim_start().starts_with("cc "))
                .count() as u32
        })
}

/// The file of failing mutants beside a regression file (`suite.txt` -> `suite.mutants.json`):
/// a JSON list of schedules, replayed before anything else.
pub fn mutant_regressions(regressions: &std::path::Path) -> PathBuf {
    regressions.with_extension("mutants.json")
}

fn read_mutants(config: &ExploreConfig) -> Result<Vec<Schedule>> {
    let Some(path) = config.regressions.as_ref().map(|p| mutant_regressions(p)) else {
        return Ok(Vec::new());
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text).map_err(|err| {
            Error::Config(format!(
                "{}:{}:{}: not a list of schedules: {err}",
                path.display(),
                err.line(),
                err.column()
            ))
        }),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(err) => Err(Error::io_at(&path, err)),
    }
}

fn persist_mutant(config: &ExploreConfig, schedule: &Schedule) -> Result<()> {
    let Some(path) = config.regressions.as_ref().map(|p| mutant_regressions(p)) else {
        return Ok(());
    };
    let mut all = read_mutants(config)?;
    if all.contains(schedule) {
        return Ok(());
    }
    all.push(schedule.clone());
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|err| Error::io_at(dir, err))?;
    }
    let text = serde_json::to_string_pretty(&all).map_err(|err| Error::other(err.to_string()))?;
    std::fs::write(&path, text + "\n").map_err(|err| Error::io_at(&path, err))
}

/// Explores `space` with `controller`. Blocking: drives the cases with `runtime.block_on`.
///
/// Cases run `config.concurrency` at a time (they are isolated by namespace, and the controller
/// serialises the few faults that touch every case) and are judged in case order: the first
/// failure is the one a one-at-a-time run would meet first, so seeds, case numbers and the
/// regression files mean the same whatever the concurrency. Shrinking is sequential.
pub fn explore(
    runtime: &tokio::runtime::Handle,
    controller: &Controller<'_>,
    space: &ScheduleSpace,
    config: &ExploreConfig,
) -> Result<ExploreReport> {
    let started = Instant::now();
    let mut plan = Plan::new(config, space)?;
    let screened = runtime.block_on(screen(controller, &mut plan, config, started));
    if let Some(err) = screened.harness_error {
        return Err(Error::other(format!(
            "exploration stopped by a harness error (seed {}): {err}",
            config.seed
        )));
    }
    let mut report = ExploreReport {
        cases_run: screened.cases,
        mutants_run: screened.mutants,
        corpus: plan.corpus.len() as u32,
        counterexample: None,
        coverage: screened.coverage,
        elapsed: Duration::ZERO,
        budget_exhausted: screened.budget_exhausted,
        interrupted: screened.interrupted,
    };
    if let Some(failure) = screened.failure {
        let found_after = (
            (failure.case as u32 + 1).saturating_sub(plan.replays()),
            failure.at,
        );
        let (schedule, result, shrink_runs) = match failure.origin {
            Origin::Generated { index } => shrink(
                runtime,
                controller,
                space,
                config,
                (index, failure.at, failure.violated.clone()),
            )?,
            Origin::Mutant { .. } | Origin::Replayed => {
                let shrunk = shrink_schedule(runtime, controller, config, failure.schedule)?;
                if failure.origin != Origin::Replayed {
                    persist_mutant(config, &shrunk.0)?;
                }
                shrunk
            }
        };
        report.cases_run += shrink_runs;
        report.counterexample = Some(Counterexample {
            schedule,
            result,
            found_after,
            origin: failure.origin,
            generated_case: match failure.origin {
                Origin::Generated { index } => {
                    Some((index as u32 + 1).saturating_sub(plan.proptest_replays))
                }
                _ => None,
            },
        });
    }
    report.elapsed = started.elapsed();
    Ok(report)
}

/// A failing case as the screening met it.
struct Failure {
    /// Its number in case order (0-based, replays first).
    case: usize,
    at: Duration,
    origin: Origin,
    schedule: Schedule,
    /// Its violations' names (proptest's failure message).
    violated: String,
}

/// The broken invariants' names, as proptest's failure message carries them.
fn violated(violations: &[Violation]) -> String {
    let names: Vec<&str> = violations.iter().map(|v| v.invariant.name()).collect();
    names.join(", ")
}

/// The first `count` new schedules of the exploration's proptest runner, after the regression
/// file's replays, in its order. Generation is cheap and deterministic, and a longer run
/// generates the same schedules first, so more are made by generating a longer prefix again.
fn generate(config: &ExploreConfig, space: &ScheduleSpace, count: u32) -> Result<Vec<Schedule>> {
    let mut runner = runner(&ExploreConfig {
        cases: count,
        ..config.clone()
    })?;
    let schedules = Mutex::new(Vec::new());
    // Every case passes here, so proptest only generates.
    let _ = runner.run(&space.strategy(), |schedule| {
        schedules.lock().expect("poisoned").push(schedule);
        Ok(())
    });
    Ok(schedules.into_inner().expect("poisoned"))
}

/// What case `i` of the exploration runs: persisted mutants first, then proptest's replays,
/// then fresh proptest cases and (once the corpus has entries) mutants of them.
struct Plan<'s> {
    config: &'s ExploreConfig,
    space: &'s ScheduleSpace,
    mutants: Vec<Schedule>,
    proptest_replays: u32,
    /// proptest's schedules not yet used, and how many were used.
    generated: VecDeque<Schedule>,
    used: usize,
    corpus: Corpus,
    mutator: Mutator,
}

impl<'s> Plan<'s> {
    fn new(config: &'s ExploreConfig, space: &'s ScheduleSpace) -> Result<Plan<'s>> {
        Ok(Plan {
            config,
            space,
            mutants: read_mutants(config)?,
            proptest_replays: persisted_count(config),
            generated: VecDeque::new(),
            used: 0,
            corpus: Corpus::default(),
            mutator: Mutator::new(space),
        })
    }

    /// Replayed regressions (both kinds): they come first and have no case number.
    fn replays(&self) -> u32 {
        self.mutants.len() as u32 + self.proptest_replays
    }

    /// Cases the exploration may run at most.
    fn cap(&self) -> usize {
        (self.replays() as usize).saturating_add(self.config.cases as usize)
    }

    fn next_generated(&mut self) -> Result<(Schedule, Origin)> {
        if self.generated.is_empty() {
            let have = self.used.saturating_sub(self.proptest_replays as usize) as u32;
            let want = have.saturating_mul(2).max(64);
            let want = if self.config.time_budget.is_none() {
                want.min(self.config.cases.max(1))
            } else {
                want
            };
            let all = generate(self.config, self.space, want)?;
            self.generated = all.into_iter().skip(self.used).collect();
            if self.generated.is_empty() {
                return Err(Error::other("proptest generated no more schedules"));
            }
        }
        let index = self.used;
        self.used += 1;
        let schedule = self.generated.pop_front().expect("refilled above");
        Ok((schedule, Origin::Generated { index }))
    }

    /// The schedule of case `case` (0-based), started once every case up to
    /// `case - CORPUS_LAG` is judged.
    fn case(&mut self, case: usize) -> Result<(Schedule, Origin)> {
        if let Some(schedule) = self.mutants.get(case) {
            return Ok((schedule.clone(), Origin::Replayed));
        }
        if case < self.replays() as usize || !self.config.guided {
            return self.next_generated();
        }
        let eligible = self.corpus.before((case + 1).saturating_sub(CORPUS_LAG));
        let mut decide = StdRng::seed_from_u64(case_seed(self.config.seed, case));
        if !eligible.is_empty() && decide.random_bool(MUTANT_SHARE) {
            let (schedule, parent) = self.mutator.mutate(eligible, decide.random());
            return Ok((schedule, Origin::Mutant { parent }));
        }
        self.next_generated()
    }
}

#[derive(Default)]
struct Screened {
    cases: u32,
    mutants: u32,
    budget_exhausted: bool,
    interrupted: bool,
    coverage: Coverage,
    failure: Option<Failure>,
    harness_error: Option<String>,
}

type Running<'f> =
    std::pin::Pin<Box<dyn std::future::Future<Output = (usize, Result<CaseResult>)> + Send + 'f>>;

/// Runs cases, up to `config.concurrency` at once, started in case order, and judges them in
/// that order: coverage merged, schedules that reached something new kept in the corpus, until
/// the first failure or harness error in that order, the case count or the time budget. Cases
/// finish out of order (one waiting out a timeout holds no one else up); once case `i` fails,
/// no case after `i` starts, and the cases before it, all started already, finish: a failure
/// among them comes first, as it would one at a time.
async fn screen(
    controller: &Controller<'_>,
    plan: &mut Plan<'_>,
    config: &ExploreConfig,
    started: Instant,
) -> Screened {
    let mut screened = Screened::default();
    let mut in_flight: FuturesUnordered<Running<'_>> = FuturesUnordered::new();
    let mut schedules: BTreeMap<usize, (Schedule, Origin)> = BTreeMap::new();
    let mut finished: BTreeMap<usize, (Result<CaseResult>, Duration)> = BTreeMap::new();
    let (mut next, mut judged) = (0usize, 0usize);
    // The earliest case known to fail or error; nothing after it starts.
    let mut stop_at = usize::MAX;
    let mut done = false;
    loop {
        // Judge finished cases in case order.
        while !done && let Some((result, at)) = finished.remove(&judged) {
            let (schedule, origin) = schedules.remove(&judged).expect("started cases are kept");
            match result {
                Ok(result) => {
                    let new = screened.coverage.new_in(&result.coverage);
                    screened.coverage.merge(&result.coverage);
                    if !result.violations.is_empty() {
                        screened.failure = Some(Failure {
                            case: judged,
                            at,
                            origin,
                            violated: violated(&result.violations),
                            schedule,
                        });
                        done = true;
                    } else if new > 0 {
                        plan.corpus.add(schedule, judged, new, &result.coverage);
                    }
                }
                Err(err) => {
                    // A harness error is not a finding: neither shrunk nor persisted as a
                    // regression; the exploration stops and reports it as such.
                    screened.harness_error = Some(err.to_string());
                    done = true;
                }
            }
            judged += 1;
        }
        let may_start = !done
            && next < stop_at
            && next < plan.cap()
            && in_flight.len() < config.concurrency.max(1)
            && next < judged + CORPUS_LAG;
        if may_start {
            if crate::interrupt::requested().is_some() {
                // A signal: start nothing new; what runs finishes and is reported.
                screened.interrupted = true;
                done = true;
                continue;
            }
            if config
                .time_budget
                .is_some_and(|budget| started.elapsed() >= budget)
            {
                // The budget is spent: no case starts after it (the report says so).
                screened.budget_exhausted = true;
                done = true;
                continue;
            }
            let case = next;
            next += 1;
            match plan.case(case) {
                Ok((schedule, origin)) => {
                    if matches!(origin, Origin::Mutant { .. }) {
                        screened.mutants += 1;
                    }
                    let run = schedule.clone();
                    schedules.insert(case, (schedule, origin));
                    in_flight.push(Box::pin(async move { (case, controller.run(&run).await) }));
                }
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
        let stops = result.as_ref().map_or(true, |r| !r.violations.is_empty());
        if stops {
            stop_at = stop_at.min(case);
        }
        finished.insert(case, (result, started.elapsed()));
    }
    screened
}

/// Shrinks a schedule proptest did not generate (a mutant or a replayed one): repeatedly takes
/// the first simpler variant ([`simpler`]) that still breaks an invariant, one run at a time, up
/// to `config.max_shrink_iters` runs; then replays the minimal schedule for its report.
fn shrink_schedule(
    runtime: &tokio::runtime::Handle,
    controller: &Controller<'_>,
    config: &ExploreConfig,
    failing: Schedule,
) -> Result<(Schedule, CaseResult, u32)> {
    let mut current = failing;
    let mut runs = 0u32;
    'smaller: loop {
        for candidate in simpler(&current) {
            if runs >= config.max_shrink_iters || crate::interrupt::requested().is_some() {
                break 'smaller;
            }
            runs += 1;
            let result = runtime.block_on(controller.run(&candidate))?;
            if !result.violations.is_empty() {
                current = candidate;
                continue 'smaller;
            }
        }
        break;
    }
    let result = runtime.block_on(controller.run(&current))?;
    if result.violations.is_empty() {
        return Err(Error::other(format!(
            "a failing schedule held when replayed after shrinking (seed {}): the case is not \
             deterministic\n{current}",
            config.seed
        )));
    }
    Ok((current, result, runs + 1))
}

/// Hands the failure to proptest, which persists it to the regression file and shrinks it (each
/// shrinking step a real case, one at a time), then replays the minimal schedule: its report comes
/// from a fresh run, which also shows the failure reproduces. Returns the minimal schedule, its
/// run, and how many cases shrinking ran.
fn shrink(
    runtime: &tokio::runtime::Handle,
    controller: &Controller<'_>,
    space: &ScheduleSpace,
    config: &ExploreConfig,
    (failing, _, failing_invariants): (usize, Duration, String),
) -> Result<(Schedule, CaseResult, u32)> {
    let mut runner = runner(config)?;
    // (cases proptest has handed us, real runs, first harness error)
    let state = Mutex::new((0usize, 0u32, None::<String>));
    let outcome = runner.run(&space.strategy(), |schedule| {
        let mut state = state.lock().expect("poisoned");
        let index = state.0;
        state.0 += 1;
        if index < failing {
            // Screened: it passed.
            return Ok(());
        }
        if index == failing {
            return Err(TestCaseError::fail(format!(
                "violated: {failing_invariants}"
            )));
        }
        if state.2.is_some() {
            return Err(TestCaseError::reject("stopped by a harness error"));
        }
        if crate::interrupt::requested().is_some() {
            // Interrupted: the smallest schedule so far stands; proptest skips the rest quickly.
            return Err(TestCaseError::reject("interrupted"));
        }
        state.1 += 1;
        match runtime.block_on(controller.run(&schedule)) {
            Ok(result) if result.violations.is_empty() => Ok(()),
            Ok(result) => Err(TestCaseError::fail(format!(
                "violated: {}",
                violated(&result.violations)
            ))),
            Err(err) => {
                state.2.get_or_insert_with(|| err.to_string());
                Err(TestCaseError::reject(format!("harness error: {err}")))
            }
        }
    });
    let (_, shrink_runs, harness_error) = state.into_inner().expect("poisoned");
    if let Some(err) = harness_error {
        return Err(Error::other(format!(
            "shrinking stopped by a harness error (seed {}): {err}",
            config.seed
        )));
    }
    match outcome {
        Err(TestError::Fail(_, schedule)) => {
            let result = runtime.block_on(controller.run(&schedule))?;
            Ok((schedule, result, shrink_runs + 1))
        }
        Err(TestError::Abort(reason)) => {
            Err(Error::other(format!("exploration aborted: {reason}")))
        }
        Ok(()) => Err(Error::other(format!(
            "case {} failed ({failing_invariants}) but proptest did not see it fail when handed back \
             (seed {}): the generated schedules differ between runs",
            failing + 1,
            config.seed
        ))),
    }
}

/// Regenerates proptest case `case` (1-based, as [`Counterexample::generated_case`] counts) of an
/// exploration with this configuration, without running the cases before it, and runs it. This
/// is what `racecert run SUITE --seed S --case N` does. (A mutant depends on the cases before it;
/// its schedule file replays it.)
pub fn replay_case(
    runtime: &tokio::runtime::Handle,
    controller: &Controller<'_>,
    space: &ScheduleSpace,
    config: &ExploreConfig,
    case: u32,
) -> Result<(Schedule, CaseResult)> {
    if case == 0 || case > config.cases {
        return Err(Error::Config(format!(
            "--case {case}: cases are numbered 1..={}",
            config.cases
        )));
    }
    let replays = persisted_count(config) as usize;
    let schedule = generate(config, space, case)?
        .into_iter()
        .nth(replays + case as usize - 1)
        .ok_or_else(|| Error::other(format!("case {case} was not generated")))?;
    let result = runtime.block_on(controller.run(&schedule))?;
    Ok((schedule, result))
}

/// A proptest runner for `config`: seeded, with the regression file if any.
fn runner(config: &ExploreConfig) -> Result<TestRunner> {
    let mut proptest_config = Config {
        cases: config.cases,
        max_shrink_iters: config.max_shrink_iters,
        failure_persistence: None,
        ..Config::default()
    };
    if let Some(path) = &config.regressions {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|err| Error::io_at(dir, err))?;
        }
        // proptest wants a 'static path; one small leak per exploration.
        let leaked: &'static str = Box::leak(path.display().to_string().into_boxed_str());
        proptest_config.failure_persistence =
            Some(Box::new(FileFailurePersistence::Direct(leaked)));
    }
    Ok(TestRunner::new_with_rng(proptest_config, rng(config.seed)))
}
