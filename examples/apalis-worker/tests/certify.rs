//! Certifying this worker from its own `cargo test`, with racecert as a dev-dependency.
//!
//! The system is described with racecert's builder in the team's terms (apalis' own queue, this
//! crate's `predictions` table, its KServe v2 model API), not racecert's: no racecert queue, table
//! or variable. racecert runs it on its test bed (Redis and Postgres in containers, the models
//! behind wiremock, every connection behind its fault proxy) and injects apalis' real faults: a
//! worker that misses its heartbeats while its model call runs, and a SIGKILL with a restart under
//! the same worker name. Needs a Docker engine; racecert builds its images on first use.
//!
//! `naive_handler_is_caught` is the demonstration a team writes once, to see the harness catch
//! what it should; `fenced_handler_is_certified` is the test that stays in CI.

use racecert::env::TestBed;
use racecert::env::backends::ModelApi;
use racecert::fault::FaultKind;
use racecert::runner::system::{SystemOutcome, SystemSettings, run_system};
use racecert::system::{ApalisOptions, Framework, Results, System};

/// The worker as `naive.toml` / `fenced.toml` describe it, built in Rust.
fn system(fenced: bool) -> racecert::Result<System> {
    // Cargo builds this crate's binary for its integration tests and says where.
    let binary = env!("CARGO_BIN_EXE_apalis-worker");
    let command = if fenced {
        format!("{binary} --fenced")
    } else {
        binary.to_owned()
    };
    let name = if fenced { "apalis-fenced" } else { "apalis-naive" };
    System::builder(name, Framework::Apalis)
        .command(&command, env!("CARGO_MANIFEST_DIR"))
        .ready("status=\"worker_ready\"")
        .env("DATABASE_URL", "{database_url}")
        .env("MODEL_URL", "{model_url}")
        .env("MODEL_NAME", "inference-model")
        .env("MODEL_VERSION", "{model_version}")
        .env("WORKER_NAME", "{worker_id}")
        .env("QUEUE", "inference")
        .env("HEARTBEAT_S", "2")
        .env("MISSED_HEARTBEATS", "3")
        .env("MODEL_TIMEOUT_S", "30")
        .version("v1", "model-backend-A")
        .version("v2", "model-backend-B")
        .submit_task(
            "inference",
            &[("request_id", "{request_id}"), ("input", "{input}")],
            "inference",
        )
        .results(Results {
            table: "predictions".into(),
            key: "request_id".into(),
            status: "status".into(),
            terminal: vec!["SUCCEEDED".into(), "FAILED".into()],
            output: "output".into(),
            version: Some("model_version".into()),
            schema: Some(concat!(env!("CARGO_MANIFEST_DIR"), "/schema.sql").into()),
        })
        .model(ModelApi::KserveV2, "inference-model")
        .apalis(ApalisOptions {
            backend: "postgres".into(),
            queue: "inference".into(),
            heartbeat_s: 2.0,
            missed_heartbeats: 3,
        })
        .model_timeout(std::time::Duration::from_secs(30))
        .build()
}

/// Every apalis fault once, on a bed of its own.
async fn certify(system: &System) -> racecert::Result<SystemOutcome> {
    let mut settings = SystemSettings::certify(1);
    settings.faults = vec![FaultKind::HeartbeatMiss, FaultKind::KillMain];
    settings.cases = settings.faults.len() as u32;
    settings.stop_at_first_failure = false;
    let bed = TestBed::builder().start().await?;
    let outcome = run_system(&bed, system, &settings).await;
    bed.shutdown().await;
    outcome
}

/// Each case's sequence diagram, for failure messages.
fn diagrams(outcome: &SystemOutcome) -> String {
    outcome
        .cases
        .iter()
        .map(|case| {
            format!(
                "case {} {}:\n{}",
                case.number,
                case.fault,
                racecert::runner::system::sequence_text(case)
            )
        })
        .collect()
}

/// What each case broke, for assertions.
fn verdicts(outcome: &SystemOutcome) -> Vec<(String, Vec<String>)> {
    outcome
        .cases
        .iter()
        .map(|case| {
            (
                case.fault.to_string(),
                case.violations
                    .iter()
                    .map(|v| v.invariant.name().to_owned())
                    .collect(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn naive_handler_is_caught() -> racecert::Result<()> {
    let outcome = certify(&system(false)?).await?;
    let verdicts = verdicts(&outcome);
    // Missed heartbeats: the job is requeued and run by the other worker while the paused one
    // still runs; both write. A restart under the same name strands the job: its row stays
    // Running in `apalis.jobs` (lost, and a delivery the broker holds for ever).
    assert_eq!(
        verdicts,
        vec![
            (
                "heartbeat-miss".to_owned(),
                vec!["at-most-one-final-write".to_owned()]
            ),
            (
                "kill-main".to_owned(),
                vec!["no-lost-job".to_owned(), "no-stuck-delivery".to_owned()]
            ),
        ],
        "{}",
        diagrams(&outcome)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn fenced_handler_is_certified() -> racecert::Result<()> {
    let outcome = certify(&system(true)?).await?;
    assert!(outcome.passed(), "{}", diagrams(&outcome));
    // The faults were real: the requeued job ran on both workers, and the fence kept one write.
    let missed = &outcome.cases[0];
    assert_eq!(
        (missed.model_calls, missed.final_writes),
        (2, 1),
        "{}",
        diagrams(&outcome)
    );
    Ok(())
}
