//! `racecert replay`: incident logs become one schedule per diagnosed cause, run on the real test
//! bed against the reference worker with the defect each cause needs (the cause reproduces: the
//! plan's invariant breaks) and safe (every invariant holds: the cause is prevented).

use racecert::check::Invariant;
use racecert::contract::defect::{Defect, Defects};
use racecert::contract::log::Status;
use racecert::env::TestBed;
use racecert::replay::reproduce::run_plan;
use racecert::replay::{
    Cause, Outcome, ReplayReport, ReproduceOptions, Verdict, analyse, plan, reproduce_on, seed_log,
};
use std::collections::BTreeSet;

crate::tests!(
    the_seed_log_reproduces_every_cause_and_only_the_unfenced_worker_overwrites,
    a_logfmt_double_write_reproduces,
    a_json_lease_expiry_with_a_truncated_line_reproduces,
    a_nested_json_stale_cache_after_cutover_reproduces,
    a_celery_visibility_timeout_double_execution_reproduces,
    a_lost_job_reproduces,
    a_retry_under_a_new_job_id_reproduces,
    given_defects_replace_each_causes_own,
    the_cli_reports_every_cause_as_json,
    garbage_logs_end_with_a_clear_report_and_exit_code_2,
);

fn fixture(name: &str) -> anyhow::Result<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/incidents")
        .join(name);
    Ok(std::fs::read_to_string(path)?)
}

/// Reproduces every cause of `log` and checks each one: built, reproduced with its defects
/// (breaking its plan's invariant), prevented by the safe reference; `causes` are the causes
/// expected, in order.
async fn reproduces(bed: &TestBed, log: &str, causes: &[Cause]) -> anyhow::Result<ReplayReport> {
    let _shared = bed.shared().await;
    let analysis = analyse(log.as_bytes(), None);
    let report = reproduce_on(bed, analysis, &ReproduceOptions::default()).await?;
    let found: Vec<Cause> = report.reproductions.iter().map(|r| r.cause).collect();
    anyhow::ensure!(found == causes, "causes {found:?}\n{}", report.text());
    for reproduction in &report.reproductions {
        let Outcome::Ran { plan, runs } = &reproduction.outcome else {
            anyhow::bail!("{} was not built:\n{}", reproduction.cause, report.text());
        };
        let verdicts: Vec<Verdict> = runs.iter().map(|r| r.verdict).collect();
        anyhow::ensure!(
            verdicts == [Verdict::Reproduced, Verdict::Prevented],
            "{} ({}): {verdicts:?}\n{}",
            reproduction.cause,
            plan.shape,
            report.text()
        );
        anyhow::ensure!(runs[0].worker.contains("reference worker"));
        anyhow::ensure!(runs[1].defects.is_empty() && !runs[0].defects.is_empty());
    }
    anyhow::ensure!(report.held(), "{}", report.text());
    Ok(report)
}

/// Which runs' own logs showed their cause again.
fn seen_again(report: &ReplayReport) -> BTreeSet<Cause> {
    report
        .reproductions
        .iter()
        .filter(|r| matches!(&r.outcome, Outcome::Ran { runs, .. } if runs[0].diagnosed_again))
        .map(|r| r.cause)
        .collect()
}

fn broken(report: &ReplayReport, cause: Cause) -> BTreeSet<Invariant> {
    report
        .reproductions
        .iter()
        .filter(|r| r.cause == cause)
        .flat_map(|r| match &r.outcome {
            Outcome::Ran { runs, .. } => runs[0].violations.iter().map(|v| v.invariant).collect(),
            Outcome::CouldNotBeBuilt { .. } => Vec::new(),
        })
        .collect()
}

async fn the_seed_log_reproduces_every_cause_and_only_the_unfenced_worker_overwrites(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let report = reproduces(
        bed,
        seed_log(),
        &[
            Cause::MultipleWorkers,
            Cause::LateWrite,
            Cause::VersionSkew,
            Cause::RetryWhileRunning,
            Cause::MultipleFinalWrites,
            Cause::UnversionedCacheKey,
            Cause::VisibilityTimeoutTooShort,
        ],
    )
    .await?;
    let late = broken(&report, Cause::LateWrite);
    anyhow::ensure!(
        late.contains(&Invariant::AtMostOneFinalWrite)
            && late.contains(&Invariant::GenerationsIncrease),
        "unfenced replay broke {late:?}"
    );
    anyhow::ensure!(
        seen_again(&report).contains(&Cause::LateWrite),
        "{}",
        report.text()
    );
    // The safe reference rejects worker-a's late write.
    let _shared = bed.shared().await;
    let analysis = analyse(seed_log().as_bytes(), None);
    let finding = analysis
        .findings
        .iter()
        .find(|f| f.cause == Cause::LateWrite)
        .expect("a late write in the seed");
    let late_plan =
        plan(&analysis.reconstruction, finding, &bed.versions()).map_err(anyhow::Error::msg)?;
    let safe = run_plan(bed, &late_plan, Defects::none()).await?;
    anyhow::ensure!(
        safe.history
            .with_status(Status::LateWriteRejected)
            .any(|e| e.field("worker_id").as_deref() == Some("worker-a")),
        "worker-a's late write must be rejected:\n{}",
        safe.history.timeline()
    );
    Ok(())
}

async fn a_logfmt_double_write_reproduces(bed: &TestBed) -> anyhow::Result<()> {
    let report = reproduces(
        bed,
        &fixture("double-write.logfmt.log")?,
        &[
            Cause::MultipleWorkers,
            Cause::RetryWhileRunning,
            Cause::MultipleFinalWrites,
            Cause::VisibilityTimeoutTooShort,
        ],
    )
    .await?;
    // Redelivered while the first attempt runs, the second attempt either calls the backend
    // beside the holder or takes the job over and writes as a non-owner: what the search
    // reaches first is what the retry without dedupe is known to break.
    let broke = broken(&report, Cause::VisibilityTimeoutTooShort);
    anyhow::ensure!(
        !broke.is_empty()
            && racecert::suite::catching(Defect::RetryWithoutDedupe)
                .missing(&broke)
                .is_empty(),
        "visibility-timeout-too-short broke {broke:?}"
    );
    anyhow::ensure!(
        seen_again(&report).contains(&Cause::VisibilityTimeoutTooShort),
        "the reproduced run's own timestamps show the redelivery:\n{}",
        report.text()
    );
    Ok(())
}

async fn a_json_lease_expiry_with_a_truncated_line_reproduces(bed: &TestBed) -> anyhow::Result<()> {
    let report = reproduces(
        bed,
        &fixture("lease-expiry.json.log")?,
        &[
            Cause::MultipleWorkers,
            Cause::LateWrite,
            Cause::RetryWhileRunning,
            Cause::MultipleFinalWrites,
            Cause::LeaseTtlTooShort,
        ],
    )
    .await?;
    anyhow::ensure!(report.analysis.malformed.len() == 1);
    anyhow::ensure!(
        broken(&report, Cause::LeaseTtlTooShort).contains(&Invariant::AtMostOneFinalWrite)
    );
    Ok(())
}

async fn a_nested_json_stale_cache_after_cutover_reproduces(bed: &TestBed) -> anyhow::Result<()> {
    let report = reproduces(
        bed,
        &fixture("stale-cache.nested.log")?,
        &[
            Cause::CrossVersionCache,
            Cause::UnversionedCacheKey,
            Cause::CacheHitBeforeInvalidation,
        ],
    )
    .await?;
    for cause in [
        Cause::CrossVersionCache,
        Cause::UnversionedCacheKey,
        Cause::CacheHitBeforeInvalidation,
    ] {
        // The stale answer is also stored under the reader's version.
        anyhow::ensure!(
            broken(&report, cause)
                == BTreeSet::from([
                    Invariant::NoStaleCacheRead,
                    Invariant::ResultNamesItsVersion
                ]),
            "{cause}: {:?}",
            broken(&report, cause)
        );
    }
    anyhow::ensure!(
        seen_again(&report).contains(&Cause::CacheHitBeforeInvalidation),
        "{}",
        report.text()
    );
    Ok(())
}

async fn a_celery_visibility_timeout_double_execution_reproduces(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let report = reproduces(
        bed,
        &fixture("celery-visibility-timeout.log")?,
        &[
            Cause::MultipleWorkers,
            Cause::RetryWhileRunning,
            Cause::MultipleFinalWrites,
            Cause::VisibilityTimeoutTooShort,
        ],
    )
    .await?;
    // Celery has no lease: both writes need the dedupe and the fence switched off.
    let writes = report
        .reproductions
        .iter()
        .find(|r| r.cause == Cause::MultipleFinalWrites)
        .expect("listed");
    let Outcome::Ran { runs, .. } = &writes.outcome else {
        anyhow::bail!("not built");
    };
    anyhow::ensure!(
        runs[0].defects == ["retry-without-dedupe", "unfenced-final-write"],
        "{:?}",
        runs[0].defects
    );
    anyhow::ensure!(
        broken(&report, Cause::MultipleFinalWrites).contains(&Invariant::AtMostOneFinalWrite)
    );
    Ok(())
}

async fn a_lost_job_reproduces(bed: &TestBed) -> anyhow::Result<()> {
    let report = reproduces(
        bed,
        &fixture("lost-job.python.log")?,
        &[Cause::LostJob, Cause::AckBeforeFinalWrite],
    )
    .await?;
    anyhow::ensure!(broken(&report, Cause::LostJob) == BTreeSet::from([Invariant::NoLostJob]));
    anyhow::ensure!(
        seen_again(&report) == BTreeSet::from([Cause::LostJob, Cause::AckBeforeFinalWrite]),
        "{}",
        report.text()
    );
    Ok(())
}

async fn a_retry_under_a_new_job_id_reproduces(bed: &TestBed) -> anyhow::Result<()> {
    let report = reproduces(
        bed,
        &fixture("new-id-retry.camel.json.log")?,
        &[
            Cause::MultipleWorkers,
            Cause::RetryWhileRunning,
            Cause::MultipleFinalWrites,
            Cause::VisibilityTimeoutTooShort,
            Cause::NewJobIdPerRetry,
        ],
    )
    .await?;
    anyhow::ensure!(
        broken(&report, Cause::NewJobIdPerRetry).contains(&Invariant::AtMostOneFinalWrite)
    );
    anyhow::ensure!(
        seen_again(&report).contains(&Cause::NewJobIdPerRetry),
        "{}",
        report.text()
    );
    Ok(())
}

async fn given_defects_replace_each_causes_own(bed: &TestBed) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    // The duplicate execution with only the fence switched off: the held lease still stops the
    // retry, so nothing breaks, and the report says the worker under test held.
    let log = "\
2026-06-26T12:00:00.000Z INFO request_id=req-5 attempt=1 worker_id=worker-a model_version=v1 status=inference_started
2026-06-26T12:00:00.100Z INFO request_id=req-5 attempt=2 worker_id=worker-b model_version=v1 status=retry_dispatched
2026-06-26T12:00:00.150Z INFO request_id=req-5 attempt=2 worker_id=worker-b model_version=v1 status=inference_started
";
    let analysis = analyse(log.as_bytes(), Some("req-5"));
    let options = ReproduceOptions {
        defects: Some(Defects::of([Defect::UnfencedFinalWrite])),
        safe: false,
    };
    let report = reproduce_on(bed, analysis, &options).await?;
    anyhow::ensure!(
        report.defects_given == Some(vec!["unfenced-final-write".to_owned()]),
        "{:?}",
        report.defects_given
    );
    for reproduction in &report.reproductions {
        let Outcome::Ran { runs, .. } = &reproduction.outcome else {
            anyhow::bail!("not built");
        };
        anyhow::ensure!(
            runs.len() == 1 && runs[0].verdict == Verdict::NotReproduced,
            "{}",
            report.text()
        );
    }
    anyhow::ensure!(report.held(), "{}", report.text());
    anyhow::ensure!(
        report
            .text()
            .contains("not reproduced with unfenced-final-write")
    );
    Ok(())
}

async fn the_cli_reports_every_cause_as_json(bed: &TestBed) -> anyhow::Result<()> {
    // The binary starts a test bed of its own; ours only needs to stay out of the way.
    let _shared = bed.shared().await;
    let output = tokio::task::spawn_blocking(|| {
        std::process::Command::new(env!("CARGO_BIN_EXE_racecert"))
            .args([
                "replay",
                "tests/fixtures/incidents/lost-job.python.log",
                "--format",
                "json",
            ])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env_remove("REDIS_URL")
            .env_remove("DATABASE_URL")
            .env_remove("TOXIPROXY_URL")
            .output()
    })
    .await??;
    let stdout = String::from_utf8_lossy(&output.stdout);
    anyhow::ensure!(
        output.status.code() == Some(0),
        "{:?}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let json: serde_json::Value = serde_json::from_str(&stdout)?;
    let statuses: Vec<(String, String, Vec<String>)> = json["reproductions"]
        .as_array()
        .ok_or_else(|| anyhow::anyhow!("no reproductions: {json}"))?
        .iter()
        .map(|r| {
            (
                r["cause"].as_str().unwrap_or_default().to_owned(),
                r["status"].as_str().unwrap_or_default().to_owned(),
                r["runs"]
                    .as_array()
                    .map(|runs| {
                        runs.iter()
                            .map(|run| run["verdict"].as_str().unwrap_or_default().to_owned())
                            .collect()
                    })
                    .unwrap_or_default(),
            )
        })
        .collect();
    let expected = |cause: &str| {
        (
            cause.to_owned(),
            "ran".to_owned(),
            vec!["reproduced".to_owned(), "prevented".to_owned()],
        )
    };
    anyhow::ensure!(
        statuses == vec![expected("lost-job"), expected("ack-before-final-write")],
        "{statuses:?}"
    );
    anyhow::ensure!(
        json["worker"]
            .as_str()
            .is_some_and(|w| w.contains("reference worker"))
    );
    anyhow::ensure!(json["analysis"]["findings"][0]["lines"] == serde_json::json!([1, 3, 5]));
    Ok(())
}

async fn garbage_logs_end_with_a_clear_report_and_exit_code_2(
    _bed: &TestBed,
) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("racecert-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut huge = vec![b'x'; 200_000];
    huge.extend(b"\n2026 INFO request_id=\"trunc");
    let inputs: [(&str, Vec<u8>); 3] = [
        (
            "binary.log",
            (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect(),
        ),
        ("empty.log", Vec::new()),
        ("huge.log", huge),
    ];
    for (name, bytes) in inputs {
        let path = dir.join(name);
        std::fs::write(&path, bytes)?;
        let output = tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_racecert"))
                .arg("replay")
                .arg(&path)
                .output()
        })
        .await??;
        let stderr = String::from_utf8_lossy(&output.stderr);
        anyhow::ensure!(
            output.status.code() == Some(2) && stderr.contains("nothing to replay"),
            "{name}: {:?} {stderr}",
            output.status
        );
        anyhow::ensure!(!stderr.contains("panicked"), "{name} panicked: {stderr}");
    }
    Ok(())
}
