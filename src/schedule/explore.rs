//! Exploration: proptest generates schedules from a [`ScheduleSpace`], the controlled runner runs
//! each as a case, and the first case that breaks an invariant is shrunk to the smallest schedule
//! that still breaks one. Everything is reproducible from the printed seed; failing seeds are
//! persisted to a regression file so later runs (and CI) replay every past failure first.
//!
//! proptest's runner is driven programmatically (not through the `proptest!` macro) so `cargo
//! test`, `racecert certify` and the benchmarks share it. It generates the cases; racecert runs
//! several at once, in generation order, and hands the first failure back to proptest to shrink. Its test closure is synchronous: call
//! [`explore`] from a blocking thread (e.g. `tokio::task::spawn_blocking`) with a runtime handle.

use crate::check::Violation;
use crate::check::coverage::Coverage;
use crate::schedule::controlled::{CaseResult, Controller};
use crate::schedule::{Schedule, ScheduleSpace};
use crate::{Error, Result};
use futures::StreamExt;
use proptest::test_runner::{
    Config, FileFailurePersistence, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner,
};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
/// so a few cases overlap well even on two cores (see BENCHMARKS.md).
pub const DEFAULT_CONCURRENCY: usize = 4;

/// How to explore.
#[derive(Debug, Clone)]
pub struct ExploreConfig {
    /// Cases to generate (proptest's default is 256).
    pub cases: u32,
    /// Seed of the generator: same seed, same schedules.
    pub seed: u64,
    /// Bound on shrinking runs.
    pub max_shrink_iters: u32,
    /// Where failing seeds are persisted and replayed from (None: nowhere).
    pub regressions: Option<PathBuf>,
    /// Wall-clock budget: cases after it are not run (the report says so).
    pub time_budget: Option<Duration>,
    /// Progress callback.
    pub progress: Option<Progress>,
    /// Cases run at once while screening (shrinking is one at a time). 1 runs them one by one.
    pub concurrency: usize,
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
        }
    }
}

/// A failure, shrunk.
#[derive(Debug, Clone)]
pub struct Counterexample {
    /// The minimal schedule.
    pub schedule: Schedule,
    /// Its run (history and violations), replayed after shrinking.
    pub result: CaseResult,
    /// Cases generated before the first failure (1-based), and time to it.
    pub found_after: (u32, Duration),
}

/// The outcome of an exploration.
#[derive(Debug, Clone)]
pub struct ExploreReport {
    /// Cases run (generation and shrinking).
    pub cases_run: u32,
    /// The counterexample, if an invariant broke.
    pub counterexample: Option<Counterexample>,
    /// Fault coverage over every case.
    pub coverage: Coverage,
    /// Wall time.
    pub elapsed: Duration,
    /// Whether the time budget ran out before every case ran.
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

/// Explores `space` with `controller`. Blocking: drives the cases with `runtime.block_on`.
///
/// Cases run `config.concurrency` at a time (they are isolated by namespace, and the controller
/// serialises the few faults that touch every case), in proptest's generation order: the first
/// failure is the one a one-at-a-time run would meet first, so seeds, case numbers and the
/// regression file mean the same whatever the concurrency. Shrinking is sequential.
pub fn explore(
    runtime: &tokio::runtime::Handle,
    controller: &Controller<'_>,
    space: &ScheduleSpace,
    config: &ExploreConfig,
) -> Result<ExploreReport> {
    let started = Instant::now();
    let replays = persisted_count(config);
    let schedules = generate(config, space)?;
    let screened = runtime.block_on(screen(controller, &schedules, config, started));
    if let Some(err) = screened.harness_error {
        return Err(Error::other(format!(
            "exploration stopped by a harness error (seed {}): {err}",
            config.seed
        )));
    }
    let mut report = ExploreReport {
        cases_run: screened.cases,
        counterexample: None,
        coverage: screened.coverage,
        elapsed: Duration::ZERO,
        budget_exhausted: screened.budget_exhausted,
        interrupted: screened.interrupted,
    };
    if let Some(failure) = screened.failure {
        let found_after = (failure_case(failure.0, replays), failure.1);
        let (schedule, result, shrink_runs) = shrink(runtime, controller, space, config, failure)?;
        report.cases_run += shrink_runs;
        report.counterexample = Some(Counterexample {
            schedule,
            result,
            found_after,
        });
    }
    report.elapsed = started.elapsed();
    Ok(report)
}

/// A failing case as the screening met it: its index in generation order (replays first), the
/// time to it, and its violations' names (for proptest's failure message).
type Failure = (usize, Duration, String);

/// The broken invariants' names, as proptest's failure message carries them.
fn violated(violations: &[Violation]) -> String {
    let names: Vec<&str> = violations.iter().map(|v| v.invariant.name()).collect();
    names.join(", ")
}

/// Case number as reports and `racecert run --case` count them; 0 for a replayed regression,
/// which has no generated case number.
fn failure_case(index: usize, replays: u32) -> u32 {
    (index as u32 + 1).saturating_sub(replays)
}

/// Every schedule the exploration's proptest runner generates, in its order: the regression
/// file's replays first, then `config.cases` new ones. Generation is cheap and deterministic.
fn generate(config: &ExploreConfig, space: &ScheduleSpace) -> Result<Vec<Schedule>> {
    let mut runner = runner(config)?;
    let schedules = Mutex::new(Vec::new());
    // Every case passes here, so proptest only generates.
    let _ = runner.run(&space.strategy(), |schedule| {
        schedules.lock().expect("poisoned").push(schedule);
        Ok(())
    });
    Ok(schedules.into_inner().expect("poisoned"))
}

#[derive(Default)]
struct Screened {
    cases: u32,
    budget_exhausted: bool,
    interrupted: bool,
    coverage: Coverage,
    failure: Option<Failure>,
    harness_error: Option<String>,
}

/// What became of one screened case.
enum Screen {
    Ran(Box<Result<CaseResult>>),
    /// Not run: an earlier case failed or errored, or the time budget ran out.
    Skipped,
}

/// Runs the schedules, up to `config.concurrency` at once, started in generation order, until
/// the first failure or harness error in that order. Cases finish out of order (one waiting out a
/// timeout holds no one else up); once case `i` fails, no case after `i` starts, and the cases
/// before it, all started already, finish: a failure among them comes first, as it would one at
/// a time.
async fn screen(
    controller: &Controller<'_>,
    schedules: &[Schedule],
    config: &ExploreConfig,
    started: Instant,
) -> Screened {
    // Index of the earliest failing or erroring case so far; nothing after it starts.
    let stop_at = AtomicUsize::new(usize::MAX);
    let budget_out = AtomicBool::new(false);
    let interrupted = AtomicBool::new(false);
    let mut outcomes = futures::stream::iter(schedules.iter().enumerate())
        .map(|(index, schedule)| {
            let (stop_at, budget_out, interrupted) = (&stop_at, &budget_out, &interrupted);
            async move {
                if index > stop_at.load(Ordering::SeqCst) {
                    return (index, Screen::Skipped);
                }
                if crate::interrupt::requested().is_some() {
                    // A signal: start nothing new; what runs finishes and is reported.
                    interrupted.store(true, Ordering::SeqCst);
                    return (index, Screen::Skipped);
                }
                if config
                    .time_budget
                    .is_some_and(|budget| started.elapsed() > budget)
                {
                    // Out of budget: the remaining cases are not run (the report says so).
                    budget_out.store(true, Ordering::SeqCst);
                    return (index, Screen::Skipped);
                }
                (index, Screen::Ran(Box::new(controller.run(schedule).await)))
            }
        })
        .buffer_unordered(config.concurrency.max(1));
    let mut screened = Screened::default();
    let mut finished: BTreeMap<usize, (Result<CaseResult>, Duration)> = BTreeMap::new();
    while let Some((index, outcome)) = outcomes.next().await {
        let Screen::Ran(result) = outcome else {
            continue;
        };
        let result = *result;
        screened.cases += 1;
        if let Some(progress) = &config.progress {
            (progress.0)(screened.cases);
        }
        let stops = match &result {
            Ok(result) => !result.violations.is_empty(),
            Err(_) => true,
        };
        if stops {
            stop_at.fetch_min(index, Ordering::SeqCst);
        }
        finished.insert(index, (result, started.elapsed()));
    }
    screened.budget_exhausted = budget_out.load(Ordering::SeqCst);
    screened.interrupted = interrupted.load(Ordering::SeqCst);
    // In generation order: what a one-at-a-time run would have met, up to its first stop. Cases
    // after that ran alongside it and are not findings of this exploration.
    for (index, (result, at)) in finished {
        match result {
            Ok(result) => {
                screened.coverage.merge(&result.coverage);
                if !result.violations.is_empty() {
                    screened.failure = Some((index, at, violated(&result.violations)));
                    break;
                }
            }
            Err(err) => {
                // A harness error is not a finding: neither shrunk nor persisted as a regression;
                // the exploration stops and reports it as such.
                screened.harness_error = Some(err.to_string());
                break;
            }
        }
    }
    screened
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
    (failing, _, failing_invariants): Failure,
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

/// Regenerates case `case` (1-based, as `found_after` and reports count) of an exploration with
/// this configuration, without running the cases before it, and runs it. This is what
/// `racecert run SUITE --seed S --case N` does.
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
    let replays = persisted_count(config);
    let mut runner = runner(config)?;
    let strategy = space.strategy();
    let seen = Mutex::new((0u32, None::<Schedule>));
    // Every case passes here, so proptest never shrinks; it only generates, in the same order.
    let _ = runner.run(&strategy, |schedule| {
        let mut seen = seen.lock().expect("poisoned");
        seen.0 += 1;
        if seen.0 == replays + case {
            seen.1 = Some(schedule);
        }
        Ok(())
    });
    let schedule = seen
        .into_inner()
        .expect("poisoned")
        .1
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
