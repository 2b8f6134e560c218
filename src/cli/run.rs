//! `racecert run`: one case exactly, from a schedule file of any runner (the file names its
//! runner: workers in process, worker processes of a command, a team's system) or from a suite's
//! seed and case number; or, with a suite alone, an exploration until a failure.

use super::args::RunArgs;
use super::certify::find_suite;
use super::{DIVERGED, OnSignal, verdict_code, with_bed};
use crate::contract::defect::Defects;
use crate::env::TestBed;
use crate::runner::controlled::{CaseSettings, Controller};
use crate::runner::explore::{ExploreConfig, explore, replay_case};
use crate::runner::system::SystemSettings;
use crate::runner::wire::{WireSettings, run_wire};
use crate::schedule::file::{Found, RunnerSpec, ScheduleFile};
use crate::suite::certify::{DEFAULT_BUDGET, replay_command, schedule_file_name};
use crate::{Error, Result};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Runs `racecert run` with `args`.
pub async fn run(args: RunArgs) -> Result<ExitCode> {
    if let Some(path) = &args.schedule {
        return schedule_file(path, args.worker_cmd.as_deref()).await;
    }
    let name = args
        .suite
        .as_deref()
        .ok_or_else(|| Error::Config("racecert run needs a suite or --schedule FILE".into()))?;
    suite_case(
        name,
        args.seed,
        args.case,
        args.concurrency,
        Defects::of(args.defects),
    )
    .await
}

/// Replays a schedule file on the runner it names.
async fn schedule_file(path: &Path, worker_cmd: Option<&str>) -> Result<ExitCode> {
    let file = ScheduleFile::read(path)?;
    if worker_cmd.is_some() && !matches!(file.runner, RunnerSpec::Wire { .. }) {
        return Err(Error::Config(format!(
            "--worker-cmd replays a wire schedule file; {} is the {} runner's",
            path.display(),
            file.runner_name()
        )));
    }
    if let Some((settings, schedule)) = CaseSettings::of_file(&file) {
        let suite = match &file.runner {
            RunnerSpec::InProcess { suite, .. } => suite.clone(),
            _ => String::new(),
        };
        let held = with_bed(OnSignal::Finish, async |bed: &TestBed| {
            let controller = Controller::new(bed, settings).await?;
            let result = controller.run(schedule).await?;
            print!(
                "{}",
                crate::report::case_text(
                    &format!("schedule {} (suite {suite})", path.display()),
                    schedule,
                    &result
                )
            );
            Ok(result.violations.is_empty())
        })
        .await?;
        return Ok(verdict_code(held));
    }
    if let Some((settings, schedule, trace)) = WireSettings::of_file(&file, worker_cmd) {
        let outcome = with_bed(OnSignal::Finish, async |bed: &TestBed| {
            // A file written by hand carries no trace: nothing to diverge from.
            let expected = (!trace.is_empty()).then_some(trace);
            run_wire(bed, &settings, schedule, expected).await
        })
        .await?;
        print!(
            "{}",
            outcome.text(&format!(
                "wire schedule {} with {:?}",
                path.display(),
                settings.command
            ))
        );
        print!("{}", outcome.case.history.timeline());
        if outcome.divergence.is_some() {
            return Ok(ExitCode::from(DIVERGED));
        }
        return Ok(verdict_code(outcome.case.violations.is_empty()));
    }
    let RunnerSpec::System {
        system,
        seed,
        case,
        schedule,
    } = &file.runner
    else {
        unreachable!("every runner's file is handled above");
    };
    let mut settings = SystemSettings::certify(*seed);
    settings.only_case = Some(*case);
    settings.faults = schedule.steps.clone();
    super::certify::system(system, settings, Path::new("target/racecert")).await
}

/// A suite's case `case` of `seed` (or an exploration until a failure, without `case`).
async fn suite_case(
    name: &str,
    seed: Option<u64>,
    case: Option<u32>,
    concurrency: usize,
    defects: Defects,
) -> Result<ExitCode> {
    let loaded = find_suite(name)?;
    let seed = seed.unwrap_or(loaded.seed);
    let suite = loaded.suite.clone().with_defects(defects.clone());
    let config = ExploreConfig {
        cases: suite.cases.unwrap_or(u32::MAX),
        // Without a case count, explore for the suite's budget (or a whole run's).
        time_budget: match suite.cases {
            Some(_) => None,
            None => Some(loaded.time_budget.unwrap_or(DEFAULT_BUDGET)),
        },
        seed,
        regressions: defects
            .iter()
            .next()
            .is_none()
            .then(|| PathBuf::from("proptest-regressions").join(format!("{}.txt", suite.name))),
        concurrency,
        ..Default::default()
    };
    let held = with_bed(OnSignal::Finish, async |bed: &TestBed| {
        let controller = Controller::new(bed, suite.settings.clone()).await?;
        if let Some(case) = case {
            let (schedule, result) = replay_case(&controller, &suite.space, &config, case).await?;
            print!(
                "{}",
                crate::report::case_text(
                    &format!("suite {} seed {seed} case {case}", suite.name),
                    &schedule,
                    &result
                )
            );
            return Ok(result.violations.is_empty());
        }
        let report = explore(&controller, &suite.space, &config).await?;
        let Some(found) = &report.found else {
            let so_far = if report.interrupted {
                format!("interrupted after {} cases", report.cases_run)
            } else {
                format!("every invariant held over {} cases", report.cases_run)
            };
            println!("suite {}: {so_far} (seed {seed})", suite.name);
            return Ok(true);
        };
        let path = PathBuf::from("target/racecert/schedules")
            .join(schedule_file_name(&suite.name, &defects));
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
        print!(
            "{}",
            crate::report::counterexample_text(
                found,
                seed,
                &format!("racecert run --schedule {}", path.display())
            )
        );
        println!(
            "or: {}",
            replay_command(&loaded, seed, found.case_number, &defects)
        );
        Ok(false)
    })
    .await?;
    Ok(verdict_code(held))
}
