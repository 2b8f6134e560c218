//! Certification: runs suites on one test bed, each as a coverage-guided exploration of
//! controlled schedules against the worker under test, and collects a [`Report`]. A run has a
//! total time budget ([`DEFAULT_BUDGET`], or `--budget`) that it spends: each suite gets its own
//! `time_budget_s` if its file sets one, the others share what is left, and time a suite does not
//! use (it found its failure early) goes to the suites after it. A fixed case count (`--cases`,
//! or `cases` in a suite file) replaces the budget, for exact reproduction.

use crate::contract::defect::Defects;
use crate::env::TestBed;
use crate::report::{Report, SuiteOutcome};
use crate::runner::controlled::Controller;
use crate::runner::explore::{ExploreConfig, explore};
use crate::schedule::WireStep;
use crate::schedule::file::Found;
use crate::schedule::search::Progress;
use crate::schedule::search::SearchReport;
use crate::suite::file::LoadedSuite;
use crate::{Error, Result};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The time budget of a certification run unless `--budget` says otherwise: what a team gives a
/// check before a rollout, spent across the suites.
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(60);

/// What to certify and how.
#[derive(Debug, Clone)]
pub struct CertifyOptions {
    /// Defects to switch on in the reference worker.
    pub defects: Defects,
    /// A fixed case count for every suite (exact reproduction; no time budget).
    pub cases: Option<u32>,
    /// The run's total time budget (None: [`DEFAULT_BUDGET`]).
    pub budget: Option<Duration>,
    /// Overrides every suite's seed.
    pub seed: Option<u64>,
    /// Run only shard `i` of `n` (1-based): suites whose index in name order is `i-1` mod `n`.
    pub shard: Option<(u32, u32)>,
    /// Directory of proptest regression files (one per suite, reference runs only).
    pub regressions: Option<PathBuf>,
    /// Cases run at once in each suite.
    pub concurrency: usize,
    /// Where counterexamples are written as schedule files (None: not written).
    pub schedules: Option<PathBuf>,
}

impl Default for CertifyOptions {
    fn default() -> Self {
        CertifyOptions {
            defects: Defects::default(),
            cases: None,
            budget: None,
            seed: None,
            shard: None,
            regressions: None,
            concurrency: crate::runner::explore::DEFAULT_CONCURRENCY,
            schedules: None,
        }
    }
}

/// Parses `i/n` (1 <= i <= n).
pub fn parse_shard(text: &str) -> Result<(u32, u32)> {
    let bad = || {
        Error::Config(format!(
            "--shard {text:?}: expected i/n with 1 <= i <= n, e.g. 2/4"
        ))
    };
    let (i, n) = text.split_once('/').ok_or_else(bad)?;
    let (i, n): (u32, u32) = (
        i.trim().parse().map_err(|_| bad())?,
        n.trim().parse().map_err(|_| bad())?,
    );
    if n == 0 || i == 0 || i > n {
        return Err(bad());
    }
    Ok((i, n))
}

/// The suites a shard runs, in name order.
pub fn shard_of(mut suites: Vec<LoadedSuite>, shard: Option<(u32, u32)>) -> Vec<LoadedSuite> {
    suites.sort_by(|a, b| a.suite.name.cmp(&b.suite.name));
    match shard {
        None => suites,
        Some((i, n)) => suites
            .into_iter()
            .enumerate()
            .filter(|(index, _)| *index as u32 % n == i - 1)
            .map(|(_, suite)| suite)
            .collect(),
    }
}

/// The command that regenerates proptest case `case` of a suite (None: a replayed regression or
/// a mutant; exploring again with the seed replays the regressions first).
pub fn replay_command(
    suite: &LoadedSuite,
    seed: u64,
    case: Option<u32>,
    defects: &Defects,
) -> String {
    let mut command = match case {
        Some(case) if case > 0 => {
            format!("racecert run {} --seed {seed} --case {case}", suite.path)
        }
        _ => format!("racecert run {} --seed {seed}", suite.path),
    };
    for defect in defects.iter() {
        command.push_str(&format!(" --defect {defect}"));
    }
    command
}

/// The schedule file name of a suite's counterexample: the suite and its defects.
pub fn schedule_file_name(suite: &str, defects: &Defects) -> String {
    let mut name = suite.to_owned();
    for defect in defects.iter() {
        name.push('+');
        name.push_str(defect.name());
    }
    name + ".json"
}

/// The invariants of `invariants` that need recorded round trips, when there are none.
fn not_judged(invariants: &[crate::check::Invariant], recorded: bool) -> Vec<String> {
    invariants
        .iter()
        .filter(|i| !recorded && i.needs_wire())
        .map(|i| i.name().to_owned())
        .collect()
}

/// The time budget of suite `index` of `suites` when the run has `left` of its budget: its own
/// if its file sets one, else an equal share of what the later suites do not reserve for their
/// own. None for a fixed case count.
pub fn suite_budget(
    suites: &[LoadedSuite],
    index: usize,
    left: Duration,
    options: &CertifyOptions,
) -> Option<Duration> {
    let fixed = |s: &LoadedSuite| options.cases.or(s.suite.cases).is_some();
    let loaded = &suites[index];
    if fixed(loaded) {
        return None;
    }
    if let Some(own) = loaded.time_budget {
        return Some(own);
    }
    let later = &suites[index..];
    let reserved: Duration = later.iter().filter_map(|s| s.time_budget).sum();
    let sharing = later
        .iter()
        .filter(|s| !fixed(s) && s.time_budget.is_none())
        .count()
        .max(1);
    Some(left.saturating_sub(reserved) / sharing as u32)
}

/// Runs `suites` (already sharded) and returns the report. `progress(suite, cases_done)` is
/// called after every case.
pub async fn certify(
    bed: &TestBed,
    suites: &[LoadedSuite],
    options: &CertifyOptions,
    progress: impl Fn(&str, u32) + Send + Sync + Clone + 'static,
) -> Result<Report> {
    let mut report = Report::new(options.shard);
    let started = Instant::now();
    let total = options.budget.unwrap_or(DEFAULT_BUDGET);
    for (index, loaded) in suites.iter().enumerate() {
        if let Some(signal) = crate::interrupt::requested() {
            report.interrupted = Some(crate::interrupt::name(signal));
            break;
        }
        let suite = loaded.suite.clone().with_defects(options.defects.clone());
        let seed = options.seed.unwrap_or(loaded.seed);
        let budget = suite_budget(
            suites,
            index,
            total.saturating_sub(started.elapsed()),
            options,
        );
        let cases = options.cases.or(suite.cases).unwrap_or(u32::MAX);
        let regressions = match (&options.regressions, options.defects.iter().next()) {
            // Past failures of the worker under test are replayed first; runs with defects
            // would only record the defects' expected failures.
            (Some(dir), None) => Some(dir.join(format!("{}.txt", suite.name))),
            _ => None,
        };
        let name = suite.name.clone();
        let callback = progress.clone();
        let config = ExploreConfig {
            cases,
            seed,
            regressions,
            time_budget: budget,
            concurrency: options.concurrency,
            progress: Some(Progress(std::sync::Arc::new(move |done| {
                callback(&name, done)
            }))),
            ..ExploreConfig::default()
        };
        let defect_names: Vec<String> = options
            .defects
            .iter()
            .map(|d| d.name().to_owned())
            .collect();
        let controller = Controller::new(bed, suite.settings.clone()).await?;
        let outcome = match explore(&controller, &suite.space, &config).await {
            Ok(explored) => {
                let case = explored.found.as_ref().and_then(|c| c.case_number);
                let mut outcome = SuiteOutcome::from_exploration(
                    &suite.name,
                    &loaded.path,
                    defect_names,
                    seed,
                    loaded.expect_pass,
                    &suite.scope,
                    &explored,
                    replay_command(loaded, seed, case, &options.defects),
                );
                outcome.not_judged = not_judged(
                    &suite.settings.invariants,
                    bed.records_wire() && suite.settings.wire,
                );
                outcome.budget_ms = budget.map(|b| b.as_millis() as u64);
                if let (Some(dir), Some(found), Some(report)) = (
                    &options.schedules,
                    &explored.found,
                    outcome.counterexample.as_mut(),
                ) {
                    let path = dir.join(schedule_file_name(&suite.name, &options.defects));
                    let mut file = suite
                        .settings
                        .file(&suite.name, found.shrunk.schedule.clone());
                    file.found = Some(Found {
                        seed,
                        case: found.found_after.0,
                    });
                    file.violated = crate::check::broken(found.violations())
                        .into_iter()
                        .collect();
                    file.write(&path)?;
                    report.replay = format!("racecert run --schedule {}", path.display());
                    report.schedule_file = Some(path.display().to_string());
                }
                outcome
            }
            Err(err) => SuiteOutcome {
                name: suite.name.clone(),
                path: loaded.path.clone(),
                defects: defect_names,
                seed,
                cases_run: 0,
                elapsed_ms: 0,
                budget_ms: budget.map(|b| b.as_millis() as u64),
                mutants_run: 0,
                corpus: 0,
                interleavings: 0,
                held: false,
                expect_pass: loaded.expect_pass,
                coverage: Vec::new(),
                not_covered: Vec::new(),
                not_judged: Vec::new(),
                counterexample: None,
                error: Some(err.to_string()),
                worker_outputs: Default::default(),
            },
        };
        report.suites.push(outcome);
    }
    if let Some(signal) = crate::interrupt::requested() {
        report.interrupted = Some(crate::interrupt::name(signal));
    }
    Ok(report)
}

/// Certifies an external worker command: `rounds` runs of a mixed fleet of its processes under
/// process, network and backend faults (seeds `seed..seed+rounds`), stopping at the first round
/// that breaks an invariant. Async: call it on the runtime.
pub async fn certify_external(
    bed: &TestBed,
    command: &str,
    rounds: u32,
    seed: u64,
    defects: &Defects,
    progress: impl Fn(u32),
) -> Result<SuiteOutcome> {
    let mut settings = crate::runner::fleet::FleetSettings::mixed_fleet(command, seed);
    settings.defects = defects.clone();
    certify_fleet(bed, &settings, rounds, progress).await
}

/// [`certify_external`] with fleet settings of the caller's: `rounds` runs of `settings`, seeds
/// `settings.seed..`, stopping at the first round that breaks an invariant.
pub async fn certify_fleet(
    bed: &TestBed,
    base: &crate::runner::fleet::FleetSettings,
    rounds: u32,
    progress: impl Fn(u32),
) -> Result<SuiteOutcome> {
    use crate::runner::fleet::run_fleet;
    if rounds == 0 {
        return Err(Error::Config("--rounds must be at least 1".into()));
    }
    let (command, seed, defects) = (base.command.as_str(), base.seed, &base.defects);
    let started = std::time::Instant::now();
    let mut coverage = crate::check::coverage::Coverage::default();
    let mut outcome = None;
    let mut ran = 0;
    let mut settings = base.clone();
    for round in 0..rounds {
        if crate::interrupt::requested().is_some() {
            break;
        }
        settings = crate::runner::fleet::FleetSettings {
            seed: seed + u64::from(round),
            ..base.clone()
        };
        let result = run_fleet(bed, &settings).await?;
        ran += 1;
        progress(ran);
        coverage.merge(&result.case.coverage);
        let failed = !result.case.violations.is_empty();
        outcome = Some((result, round));
        if failed {
            break;
        }
    }
    let Some((result, round)) = outcome else {
        let signal = crate::interrupt::requested().unwrap_or(2);
        return Err(Error::Interrupted(crate::interrupt::name(signal)));
    };
    let scope = crate::check::coverage::Scope::of(&settings.faults);
    let coverage_rows = crate::report::coverage_rows(&scope, &coverage);
    let held = result.case.violations.is_empty();
    let counterexample = (!held).then(|| {
        crate::report::CounterexampleReport::of_case(
            &result.case,
            crate::schedule::Schedule {
                requests: Vec::new(),
                steps: Vec::new(),
            },
            (round + 1, started.elapsed()),
            format!(
                "racecert certify --worker-cmd {command:?} --seed {} --rounds 1{}",
                seed + u64::from(round),
                defects
                    .iter()
                    .map(|d| format!(" --defect {d}"))
                    .collect::<String>()
            ),
        )
    });
    Ok(SuiteOutcome {
        name: "external-fleet".into(),
        path: command.to_owned(),
        defects: defects.iter().map(|d| d.name().to_owned()).collect(),
        seed,
        cases_run: ran,
        elapsed_ms: started.elapsed().as_millis() as u64,
        budget_ms: None,
        mutants_run: 0,
        interleavings: coverage
            .reached
            .iter()
            .filter(|r| r.is_interleaving())
            .count() as u32,
        corpus: 0,
        held,
        expect_pass: true,
        not_covered: crate::report::not_covered(&coverage_rows),
        coverage: coverage_rows,
        not_judged: not_judged(&settings.invariants, bed.records_wire()),
        counterexample,
        error: None,
        worker_outputs: result.outputs,
    })
}

/// Certifies an external worker command with wire schedules: two processes of `command`, every
/// effectful round trip held and released as the schedule says (the depth-2 enumeration, then
/// PCT), until a case breaks an invariant or the search's budget ends. A failure is shrunk and,
/// with `schedules`, written as a wire schedule file there. Async: call it on the runtime.
pub async fn certify_external_wire(
    bed: &TestBed,
    command: &str,
    search: &crate::runner::wire::WireSearch,
    defects: &Defects,
    schedules: Option<&std::path::Path>,
    progress: impl Fn(u32) + Send + Sync + 'static,
) -> Result<(SuiteOutcome, SearchReport<WireStep>)> {
    use crate::runner::wire::WireSettings;
    let mut settings = WireSettings::pair(command);
    settings.defects = defects.clone();
    let report = crate::runner::wire::search(bed, &settings, search, progress).await?;
    let found = report.found.clone();
    let counterexample = match &found {
        None => None,
        Some(found) => {
            let mut file_path = None;
            if let Some(dir) = schedules {
                let name = format!(
                    "wire-{}.json",
                    &crate::contract::sha256_hex(&format!(
                        "{command}\n{:?}",
                        found.shrunk.schedule
                    ))[..12]
                );
                let path = dir.join(name);
                settings.file(&found.shrunk).write(&path)?;
                file_path = Some(path.display().to_string());
            }
            let replay = match &file_path {
                Some(path) => format!("racecert run --schedule {path} --worker-cmd {command:?}"),
                None => format!(
                    "racecert certify --worker-cmd {command:?} --seed {}",
                    search.seed
                ),
            };
            let mut report = crate::report::CounterexampleReport::of_case(
                &found.shrunk.case,
                crate::schedule::Schedule {
                    requests: found.shrunk.schedule.requests.clone(),
                    steps: Vec::new(),
                },
                found.found_after,
                replay,
            );
            // The wire steps, as the timeline shows them, lead the story.
            report.timeline = format!(
                "wire schedule ({} steps, shrunk from {}):\n{}{}",
                found.shrunk.schedule.steps.len(),
                found.original.steps.len(),
                found.shrunk.schedule,
                report.timeline
            );
            report.wire_schedule = Some(crate::report::WireScheduleText {
                steps: found.shrunk.schedule.steps.len(),
                shrunk_from: found.original.steps.len(),
                text: found.shrunk.schedule.to_string(),
            });
            report.seed_replay = format!(
                "racecert certify --worker-cmd {command:?} --seed {}",
                search.seed
            );
            report.schedule_file = file_path;
            for timeout in &found.shrunk.timeouts {
                report
                    .timeline
                    .push_str(&format!("held worker timed out: {timeout}\n"));
            }
            Some(report)
        }
    };
    let last = found
        .as_ref()
        .map(|f| f.shrunk.clone())
        .or(report.last.clone());
    let outputs = last.map(|o| o.outputs).unwrap_or_default();
    let held = found.is_none();
    // What wire schedules apply: a lease expiry and a kill of the preempted worker at the
    // preemption point (the enumeration's, round-robin; PCT's change points).
    let scope = crate::check::coverage::Scope::of(&[
        crate::fault::FaultKind::LeaseExpiry,
        crate::fault::FaultKind::WorkerCrash,
    ]);
    let coverage = crate::report::coverage_rows(&scope, &report.coverage);
    if report.cases_run == 0 {
        let signal = crate::interrupt::requested().unwrap_or(2);
        return Err(Error::Interrupted(crate::interrupt::name(signal)));
    }
    Ok((
        SuiteOutcome {
            name: "external-wire".into(),
            path: command.to_owned(),
            defects: defects.iter().map(|d| d.name().to_owned()).collect(),
            seed: search.seed,
            cases_run: report.cases_run,
            elapsed_ms: report.elapsed.as_millis() as u64,
            budget_ms: Some(search.budget.as_millis() as u64),
            mutants_run: 0,
            corpus: 0,
            interleavings: 0,
            held,
            expect_pass: true,
            not_covered: crate::report::not_covered(&coverage),
            // Wire schedules hold round trips at racecert's own proxy: always recorded.
            not_judged: Vec::new(),
            coverage,
            counterexample,
            error: None,
            worker_outputs: outputs,
        },
        report,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_split_suites_without_overlap() {
        assert_eq!(parse_shard("2/4").unwrap(), (2, 4));
        for bad in ["0/2", "3/2", "x/2", "2", "1/0"] {
            assert!(parse_shard(bad).is_err(), "{bad}");
        }
        let all = crate::suite::shipped();
        let total = all.len();
        let mut seen = Vec::new();
        for i in 1..=3 {
            seen.extend(
                shard_of(all.clone(), Some((i, 3)))
                    .into_iter()
                    .map(|s| s.suite.name),
            );
        }
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), total);
    }
}
