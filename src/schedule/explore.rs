//! Exploration: proptest generates schedules from a [`ScheduleSpace`], the controlled runner runs
//! each as a case, and the first case that breaks an invariant is shrunk to the smallest schedule
//! that still breaks one. Everything is reproducible from the printed seed; failing seeds are
//! persisted to a regression file so later runs (and CI) replay every past failure first.
//!
//! proptest's runner is driven programmatically (not through the `proptest!` macro) so `cargo
//! test`, `racecert certify` and the benchmarks share it. Its test closure is synchronous: call
//! [`explore`] from a blocking thread (e.g. `tokio::task::spawn_blocking`) with a runtime handle.

use crate::check::Violation;
use crate::schedule::controlled::{CaseResult, Controller, Coverage};
use crate::schedule::{Schedule, ScheduleSpace};
use crate::{Error, Result};
use proptest::test_runner::{
    Config, FileFailurePersistence, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner,
};
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

impl Counterexample {
    /// A report a person can act on: what broke, the minimal schedule, the timeline in the seed's
    /// log format, and how to replay it.
    pub fn report(&self, seed: u64, replay_hint: &str) -> String {
        let mut out = String::new();
        for violation in &self.result.violations {
            out.push_str(&violation.to_string());
        }
        out.push_str(&format!(
            "minimal schedule ({} steps):\n{}",
            self.schedule.steps.len(),
            self.schedule
        ));
        out.push_str("timeline:\n");
        out.push_str(&self.result.history.timeline());
        out.push_str(&format!(
            "found after {} case(s) in {:.2?}; seed {seed}\nreplay: {replay_hint}\n",
            self.found_after.0, self.found_after.1
        ));
        out
    }
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

/// Explores `space` with `controller`. Blocking: runs each case with `runtime.block_on`.
pub fn explore(
    runtime: &tokio::runtime::Handle,
    controller: &Controller<'_>,
    space: &ScheduleSpace,
    config: &ExploreConfig,
) -> Result<ExploreReport> {
    let started = Instant::now();
    let replays = persisted_count(config);
    let mut runner = runner(config)?;
    let strategy = space.strategy();
    let state = Mutex::new(State::default());
    let outcome = runner.run(&strategy, |schedule| {
        {
            let mut state = state.lock().expect("poisoned");
            if state.harness_error.is_some() {
                return Err(TestCaseError::reject("stopped by a harness error"));
            }
            if state.first_failure.is_none()
                && config
                    .time_budget
                    .is_some_and(|budget| started.elapsed() > budget)
            {
                // Out of budget: the remaining cases are generated (cheap) but not run.
                state.budget_exhausted = true;
                return Ok(());
            }
        }
        let result = runtime.block_on(controller.run(&schedule));
        let mut state = state.lock().expect("poisoned");
        state.cases += 1;
        if let Some(progress) = &config.progress {
            (progress.0)(state.cases);
        }
        match result {
            Ok(result) => {
                state.coverage.merge(&result.coverage);
                if result.violations.is_empty() {
                    Ok(())
                } else {
                    if state.first_failure.is_none() {
                        // 0: a replayed regression (it has no generated case number).
                        let case = state.cases.saturating_sub(replays);
                        state.first_failure = Some((case, started.elapsed()));
                    }
                    let names: Vec<&str> = result
                        .violations
                        .iter()
                        .map(|v| v.invariant.name())
                        .collect();
                    Err(TestCaseError::fail(format!(
                        "violated: {}",
                        names.join(", ")
                    )))
                }
            }
            Err(err) => {
                // A harness error is not a finding: neither shrunk nor persisted as a regression
                // (a rejection is neither); the exploration stops and reports it as such.
                state.harness_error.get_or_insert_with(|| err.to_string());
                Err(TestCaseError::reject(format!("harness error: {err}")))
            }
        }
    });
    let state = state.into_inner().expect("poisoned");
    if let Some(err) = state.harness_error {
        return Err(Error::other(format!(
            "exploration stopped by a harness error (seed {}): {err}",
            config.seed
        )));
    }
    let counterexample = match outcome {
        Ok(()) => None,
        Err(TestError::Fail(_, schedule)) => {
            // Replay the minimal schedule: its report comes from a fresh run, which also shows
            // the failure reproduces.
            let result = runtime.block_on(controller.run(&schedule))?;
            Some(Counterexample {
                schedule,
                result,
                found_after: state
                    .first_failure
                    .unwrap_or((state.cases, started.elapsed())),
            })
        }
        Err(TestError::Abort(reason)) => {
            return Err(Error::other(format!("exploration aborted: {reason}")));
        }
    };
    Ok(ExploreReport {
        cases_run: state.cases,
        counterexample,
        coverage: state.coverage,
        elapsed: started.elapsed(),
        budget_exhausted: state.budget_exhausted,
    })
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

#[derive(Default)]
struct State {
    cases: u32,
    budget_exhausted: bool,
    coverage: Coverage,
    first_failure: Option<(u32, Duration)>,
    harness_error: Option<String>,
}
