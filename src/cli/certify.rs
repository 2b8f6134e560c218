//! `racecert certify`: the shipped or given suites against the reference worker; a worker
//! command (wire schedules, then the chaos fleet); or a team's own system from its description.
//! Reports go to `--out`; the exit code is the verdict.

use super::args::CertifyArgs;
use super::{OnSignal, json, progress_bars, verdict_exit, with_bed, write_file};
use crate::contract::defect::Defects;
use crate::env::{TestBed, TestBedBuilder};
use crate::report::Report;
use crate::runner::system::{SystemSettings, run_system};
use crate::suite::certify::{CertifyOptions, certify, shard_of};
use crate::suite::file::{self as suite_file, LoadedSuite};
use crate::system::System;
use crate::{Error, Result};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Runs `racecert certify` with `args`; `color`: whether stdout takes colour.
pub async fn run(args: CertifyArgs, color: bool) -> Result<ExitCode> {
    if let Some(file) = args.system {
        let mut settings = SystemSettings::certify(args.seed.unwrap_or(1));
        if let Some(budget) = args.budget {
            settings.budget = budget;
            settings.budget_per_kind = None;
        }
        settings.faults = args.faults;
        settings.stop_at_first_failure = !args.keep_going;
        if let Some(cases) = args.cases {
            settings.cases = cases;
            // Cases asked for without a budget: the count decides (the budget only guards
            // against a hang), so `--cases 20` runs 20 cases, not what 165 s holds.
            if args.budget.is_none() {
                settings.budget_per_case = Some(crate::runner::system::BUDGET_PER_CASE);
            }
        }
        return system(&file, settings, &args.out).await;
    }
    // A suite run is either a fixed number of cases or a time budget; a system run takes both
    // (cases at most, within the budget).
    if args.cases.is_some() && args.budget.is_some() {
        return Err(Error::Config(
            "the argument '--cases <CASES>' cannot be used with '--budget <SECONDS>' (except with --system)".into(),
        ));
    }
    let defects = Defects::of(args.defects);
    if let Some(command) = args.worker_cmd {
        return external(
            &command,
            args.rounds,
            args.wire_budget,
            args.seed.unwrap_or(1),
            defects,
            &args.out,
            color,
        )
        .await;
    }
    let options = CertifyOptions {
        defects,
        cases: args.cases,
        budget: args.budget,
        seed: args.seed,
        shard: args.shard,
        regressions: Some(PathBuf::from("proptest-regressions")),
        concurrency: args.concurrency,
        schedules: Some(args.out.join("schedules")),
    };
    // Every suite file is validated before anything runs.
    let suites = shard_of(load_suites(&args.suites)?, args.shard);
    suites_command(suites, options, &args.out, color).await
}

/// Suite files given, else every `suites/*.toml` here, else the shipped suites.
pub fn load_suites(paths: &[PathBuf]) -> Result<Vec<LoadedSuite>> {
    if !paths.is_empty() {
        return paths.iter().map(|path| suite_file::load(path)).collect();
    }
    let dir = Path::new("suites");
    if dir.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|err| Error::io_at(dir, err))?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
            .collect();
        files.sort();
        if !files.is_empty() {
            return files.iter().map(|path| suite_file::load(path)).collect();
        }
    }
    Ok(crate::suite::shipped())
}

/// A suite by file path or by name.
pub fn find_suite(name_or_path: &str) -> Result<LoadedSuite> {
    let path = Path::new(name_or_path);
    if path.is_file() {
        return suite_file::load(path);
    }
    let all = load_suites(&[])?;
    let names: Vec<String> = all.iter().map(|s| s.suite.name.clone()).collect();
    all.into_iter()
        .find(|s| s.suite.name == name_or_path)
        .ok_or_else(|| {
            Error::Config(format!(
                "no suite file or suite named {name_or_path:?}; suites: {}",
                names.join(", ")
            ))
        })
}

async fn suites_command(
    suites: Vec<LoadedSuite>,
    options: CertifyOptions,
    out: &Path,
    color: bool,
) -> Result<ExitCode> {
    println!(
        "racecert certify: {} suite(s){}; bringing the test bed up (images are built on first use)",
        suites.len(),
        options
            .shard
            .map(|(i, n)| format!(", shard {i}/{n}"))
            .unwrap_or_default()
    );
    let report = with_bed(OnSignal::Finish, async |bed: &TestBed| {
        println!("test bed up in {:.1?}", bed.startup_time());
        let bars = progress_bars(
            suites.iter().map(|s| {
                (
                    s.suite.name.clone(),
                    options.cases.or(s.suite.cases).map(u64::from),
                )
            }),
            "cases",
        );
        let progress = {
            let bars = bars.clone();
            move |suite: &str, done: u32| {
                if let Some(bar) = bars.get(suite) {
                    bar.set_position(u64::from(done));
                }
            }
        };
        let report = certify(bed, &suites, &options, progress).await;
        for bar in bars.values() {
            bar.finish();
        }
        report
    })
    .await?;
    report.write_all(out)?;
    print!("{}", report.terminal_with(color));
    println!(
        "reports: {0}/report.html, {0}/report.json, {0}/junit.xml",
        out.display()
    );
    Ok(verdict_exit(report.verdict()))
}

async fn external(
    command: &str,
    rounds: u32,
    wire_budget: u64,
    seed: u64,
    defects: Defects,
    out: &Path,
    color: bool,
) -> Result<ExitCode> {
    println!(
        "racecert certify --worker-cmd {command:?}: wire schedules for up to {wire_budget} s, then \
         up to {rounds} fleet run(s); bringing the test bed up"
    );
    let (wire, outcome) = with_bed(OnSignal::Finish, async |bed: &TestBed| {
        let mut wire = None;
        if wire_budget > 0 {
            let mut search = crate::runner::wire::WireSearch::default_for(seed);
            search.budget = std::time::Duration::from_secs(wire_budget);
            let bars = progress_bars([("external-wire".to_owned(), None)], "cases");
            let bar = bars["external-wire"].clone();
            let schedules = out.join("schedules");
            let searched = crate::suite::certify::certify_external_wire(
                bed,
                command,
                &search,
                &defects,
                Some(&schedules),
                {
                    let bar = bar.clone();
                    move |done| bar.set_position(u64::from(done))
                },
            )
            .await;
            bar.finish();
            // Stopped by a signal before a case ended: the partial report says so, with no
            // verdict of the wire search.
            let (outcome, report) = match searched {
                Err(Error::Interrupted(_)) => return Ok((None, None)),
                other => other?,
            };
            println!(
                "wire schedules: {} case(s) in {:.1} s ({:.1}/s), {} with a held worker that timed \
                 out; {}",
                report.cases_run,
                report.elapsed.as_secs_f64(),
                f64::from(report.cases_run) / report.elapsed.as_secs_f64().max(1e-3),
                report.timeouts,
                match &report.found {
                    Some(found) => format!(
                        "failure at case {} after {:.1} s, shrunk from {} to {} step(s) in {} run(s)",
                        found.found_after.0,
                        found.found_after.1.as_secs_f64(),
                        found.original.steps.len(),
                        found.shrunk.schedule.steps.len(),
                        found.shrink_runs
                    ),
                    None => "no failure".to_owned(),
                }
            );
            wire = Some(outcome);
        }
        if crate::interrupt::requested().is_some() {
            return Ok((wire, None));
        }
        let bars = progress_bars([("external-fleet".to_owned(), Some(u64::from(rounds)))], "runs");
        let bar = &bars["external-fleet"];
        let outcome = crate::suite::certify::certify_external(
            bed,
            command,
            rounds,
            seed,
            &defects,
            |done| bar.set_position(u64::from(done)),
        )
        .await;
        bar.finish();
        match outcome {
            Err(Error::Interrupted(_)) => Ok((wire, None)),
            other => Ok((wire, Some(other?))),
        }
    })
    .await?;
    let mut report = Report::new(None);
    // Which runner found what: one suite each.
    report.suites.extend(wire);
    report.suites.extend(outcome);
    report.interrupted = crate::interrupt::requested().map(crate::interrupt::name);
    report.write_all(out)?;
    print!("{}", report.terminal_with(color));
    println!(
        "reports: {0}/report.html, {0}/report.json, {0}/junit.xml (worker stdout/stderr in the HTML and JSON)",
        out.display()
    );
    Ok(verdict_exit(report.verdict()))
}

/// `certify --system` and `replay --system --case`: a test bed, the system run, its reports.
pub async fn system(file: &Path, settings: SystemSettings, out: &Path) -> Result<ExitCode> {
    let system = System::load(file)?;
    // A fault the system does not have is said before the test bed comes up.
    settings.faults_of(&system)?;
    println!(
        "racecert certify --system {}: {} ({}), up to {} case(s) in {:?}; bringing the test bed up",
        file.display(),
        system.name,
        system.framework.name(),
        settings.only_case.map_or(settings.cases, |_| 1),
        settings.budget_for(settings.kinds_in_scope(&system))
    );
    let bed = TestBedBuilder::from_env()?.start().await?;
    let outcome = run_system(&bed, &system, &settings).await;
    bed.shutdown().await;
    let outcome = outcome?;
    let json_path = out.join("system-report.json");
    write_file(&json_path, json(&outcome)?)?;
    let html = out.join("system-report.html");
    write_file(&html, crate::report::system::system_html(&outcome, file))?;
    let log = out.join("workers.log");
    write_file(&log, crate::report::system::workers_log(&outcome))?;
    print!("{}", crate::report::system::system_text(&outcome, file));
    println!(
        "reports: {}, {}; the workers' log: {}",
        json_path.display(),
        html.display(),
        log.display()
    );
    Ok(verdict_exit(outcome.verdict()))
}
