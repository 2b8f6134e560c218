//! Exploring a suite with the controlled runner: the one search ([`crate::schedule::search`])
//! over the suite's [`ScheduleSpace`] (persisted failures first, then proptest's cases and mutants
//! of the coverage corpus), the first failure shrunk by the one shrinker. An exploration runs a
//! number of cases (`cases`, exact reproduction) or spends a time budget (`time_budget`), or
//! both (whichever ends first); everything is reproducible from the printed seed.

use crate::Result;
use crate::runner::controlled::Controller;
use crate::schedule::search::checkpoints::{Checkpoints, Generation};
use crate::schedule::search::{Found, Progress, SearchConfig, SearchReport, explore as search};
use crate::schedule::{Schedule, ScheduleSpace, Step};
use std::path::PathBuf;
use std::time::Duration;

pub use crate::schedule::search::DEFAULT_CONCURRENCY;
pub use crate::schedule::search::checkpoints::mutant_regressions;

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

    fn generation(&self) -> Generation {
        Generation {
            cases: self.cases,
            seed: self.seed,
            regressions: self.regressions.clone(),
            guided: self.guided,
            budgeted: self.time_budget.is_some(),
        }
    }

    fn search(&self) -> SearchConfig {
        SearchConfig {
            seed: self.seed,
            time_budget: self.time_budget,
            concurrency: self.concurrency,
            max_shrink_iters: self.max_shrink_iters,
            progress: self.progress.clone(),
        }
    }
}

/// A failure of a checkpoint exploration, shrunk.
pub type Counterexample = Found<Step>;

/// What an exploration did.
pub type ExploreReport = SearchReport<Step>;

/// Explores `space` with `controller`. Cases run `config.concurrency` at a time (they are
/// isolated by namespace, and the controller serialises the few faults that touch every case)
/// and are judged in case order; shrinking is sequential.
pub async fn explore(
    controller: &Controller<'_>,
    space: &ScheduleSpace,
    config: &ExploreConfig,
) -> Result<ExploreReport> {
    let space = controller.fit(space);
    let mut source = Checkpoints::new(&space, config.generation())?;
    search(controller, &mut source, &config.search()).await
}

/// Regenerates proptest case `case` (1-based, as a report numbers it) of an exploration with
/// this configuration, without running the cases before it, and runs it. This is what `racecert
/// run SUITE --seed S --case N` does. (A mutant depends on the cases before it; its schedule
/// file replays it.)
pub async fn replay_case(
    controller: &Controller<'_>,
    space: &ScheduleSpace,
    config: &ExploreConfig,
    case: u32,
) -> Result<(Schedule, crate::check::CaseResult)> {
    let schedule =
        Checkpoints::new(&controller.fit(space), config.generation())?.generated_case(case)?;
    let result = controller.run(&schedule).await?;
    Ok((schedule, result))
}
