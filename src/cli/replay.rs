//! `racecert replay`: incident log lines turned into a story and a diagnosis, each cause then
//! reproduced against the reference worker (with the defect it needs, then safe) or, with
//! `--system`, on the team's own system with the faults of its framework; or, with `--system`
//! and `--case`, one case of a system run again.

use super::args::{Format, ReplayArgs};
use super::{NOTHING_RECONSTRUCTED, OnSignal, interrupted_code, json, verdict_code, with_bed};
use crate::contract::defect::Defects;
use crate::env::{TestBed, TestBedBuilder};
use crate::logs::FieldMap;
use crate::replay::Analysis;
use crate::runner::system::{SystemSettings, run_system};
use crate::system::System;
use crate::{Error, Result};
use std::path::Path;
use std::process::ExitCode;

/// Runs `racecert replay` with `args`.
pub async fn run(args: ReplayArgs) -> Result<ExitCode> {
    let request = args.request.as_deref();
    let fields = args.fields;
    match (args.system, args.file) {
        (Some(system), Some(file)) => {
            on_system(&file, &fields, &system, args.seed, request, args.format).await
        }
        (Some(system), None) => {
            let Some(case) = args.case else {
                return Err(Error::Config(format!(
                    "replay --system {} needs a log file to reproduce (racecert replay LOG --system FILE) or --case N to rerun one case of a system run",
                    system.display()
                )));
            };
            let mut settings = SystemSettings::certify(args.seed);
            settings.only_case = Some(case);
            settings.faults = args.fault.into_iter().collect();
            super::certify::system(&system, settings, Path::new("target/racecert")).await
        }
        (None, Some(file)) => {
            on_reference(
                &file,
                &fields,
                request,
                Defects::of(args.defects),
                args.format,
            )
            .await
        }
        (None, None) => Err(Error::Config(
            "racecert replay needs a log file, or --system FILE --case N".into(),
        )),
    }
}

/// Streams the log (bounded memory, any size) and diagnoses it.
fn read_log(file: &Path, fields: &[FieldMap], request: Option<&str>) -> Result<Analysis> {
    crate::replay::analyse_file(file, fields, request)
}

fn print(format: Format, text: String, json: String) {
    match format {
        Format::Text => print!("{text}"),
        Format::Json => println!("{json}"),
    }
}

/// `replay LOG --system FILE`: the log's diagnoses, reproduced on the team's system with the
/// faults of its framework that re-create them.
async fn on_system(
    file: &Path,
    fields: &[FieldMap],
    system_file: &Path,
    seed: u64,
    request: Option<&str>,
    format: Format,
) -> Result<ExitCode> {
    // The description first: a file that cannot load is named with its line and column before
    // anything else happens.
    let system = System::load(system_file)?;
    let analysis = read_log(file, fields, request)?;
    if analysis.reconstruction.requests.is_empty() {
        print(format, analysis.text(), json(&analysis)?);
        eprintln!(
            "{}: nothing to replay: no inference request could be reconstructed{}",
            file.display(),
            request.map(|r| format!(" for {r}")).unwrap_or_default()
        );
        return Ok(ExitCode::from(NOTHING_RECONSTRUCTED));
    }
    let faults = crate::replay::system::faults_to_run(&analysis, system.framework, &system.keys);
    let outcome = if faults.is_empty() {
        None
    } else {
        let mut settings = SystemSettings::certify(seed);
        settings.cases = faults.len() as u32;
        settings.faults = faults;
        settings.stop_at_first_failure = false;
        // A fault runs only while a diagnosis it could re-create is not reproduced yet.
        settings.goals = crate::replay::system::goals(&analysis, system.framework, &system.keys);
        // One case per fault, each bounded by its own drain: the budget only guards against a
        // system that never settles.
        settings.budget = std::time::Duration::from_secs(900);
        eprintln!(
            "replaying {} on {} ({}): {} case(s), faults {}; bringing the test bed up",
            file.display(),
            system.name,
            system.framework.name(),
            settings.cases,
            settings
                .faults
                .iter()
                .map(|f| f.name())
                .collect::<Vec<_>>()
                .join(", ")
        );
        let bed = TestBedBuilder::from_env()?.start().await?;
        let outcome = run_system(&bed, &system, &settings).await;
        bed.shutdown().await;
        Some(outcome?)
    };
    let report = crate::replay::system::SystemReplay::judge(
        analysis,
        system_file,
        &system.name,
        system.framework,
        &system.keys,
        outcome,
    );
    print(format, report.text(), json(&report)?);
    Ok(verdict_code(report.held()))
}

/// `replay LOG`: the diagnoses reproduced against the reference worker.
async fn on_reference(
    file: &Path,
    fields: &[FieldMap],
    request: Option<&str>,
    defects: Defects,
    format: Format,
) -> Result<ExitCode> {
    let analysis = read_log(file, fields, request)?;
    if analysis.reconstruction.requests.is_empty() || analysis.findings.is_empty() {
        print(format, analysis.text(), json(&analysis)?);
        if analysis.reconstruction.requests.is_empty() {
            eprintln!(
                "{}: nothing to replay: no inference request could be reconstructed{}",
                file.display(),
                request.map(|r| format!(" for {r}")).unwrap_or_default()
            );
            return Ok(ExitCode::from(NOTHING_RECONSTRUCTED));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let given = defects.iter().next().is_some();
    let options = crate::replay::ReproduceOptions {
        defects: given.then_some(defects),
        ..Default::default()
    };
    // Kept for a partial report: the diagnosis stands even if the reproductions are cut short.
    let diagnosis = analysis.clone();
    let report = match with_bed(OnSignal::Drop, async |bed: &TestBed| {
        crate::replay::reproduce_on(bed, analysis, &options).await
    })
    .await
    {
        Ok(report) => report,
        Err(_) if crate::interrupt::requested().is_some() => {
            let signal = crate::interrupt::name(crate::interrupt::requested().unwrap_or(2));
            print(
                format,
                format!(
                    "{}replay interrupted by {signal}: the diagnosis above stands, no cause was reproduced\n",
                    diagnosis.text()
                ),
                json(&serde_json::json!({
                    "interrupted": signal,
                    "analysis": diagnosis,
                }))?,
            );
            return Ok(interrupted_code());
        }
        Err(err) => return Err(err),
    };
    print(format, report.text(), json(&report)?);
    Ok(verdict_code(report.held()))
}
