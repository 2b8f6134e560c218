//! Model backends behind their proxies: deterministic, version-naming answers; per-case programs;
//! the journal the checkers read.

use racecert::contract::{InferRequest, InferResponse, model_output, output_version};
use racecert::env::TestBed;
use racecert::env::backends::Behaviour;
use std::time::{Duration, Instant};

crate::tests!(each_version_answers_through_its_proxy_and_the_journal_records_every_call);

async fn each_version_answers_through_its_proxy_and_the_journal_records_every_call(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let namespace = crate::namespace("backends");
    let case_prefix = format!("{namespace}:");
    let http = reqwest::Client::new();
    let call = |version: &str| {
        let url = format!(
            "{}/v1/infer",
            bed.backend_url(version).expect("version served")
        );
        let http = http.clone();
        let body = InferRequest {
            input: "the same input".into(),
            idempotency_key: format!("{namespace}:job-1"),
            attempt: 1,
            worker_id: "test".into(),
        };
        async move { http.post(url).json(&body).send().await }
    };
    let v1: InferResponse = call("v1").await?.error_for_status()?.json().await?;
    let v2: InferResponse = call("v2").await?.error_for_status()?.json().await?;
    anyhow::ensure!(v1.output == model_output("the same input", "v1"));
    anyhow::ensure!(v2.output == model_output("the same input", "v2"));
    anyhow::ensure!(
        v1.output != v2.output,
        "identical input, different versions, same output"
    );
    anyhow::ensure!(output_version(&v2.output) == Some("v2") && v2.model_version == "v2");

    // Program this case only: v1 fails twice with 503, then is slow.
    let backend = bed.backend("v1")?;
    let fail = backend
        .program(
            &namespace,
            Behaviour::FailFirst {
                status: 503,
                calls: 2,
            },
        )
        .await?;
    anyhow::ensure!(call("v1").await?.status() == 503);
    anyhow::ensure!(call("v1").await?.status() == 503);
    anyhow::ensure!(call("v1").await?.status() == 200);
    fail.release().await;
    let _slow = backend
        .program(&case_prefix, Behaviour::Delay(Duration::from_millis(250)))
        .await?;
    let started = Instant::now();
    anyhow::ensure!(call("v1").await?.status() == 200);
    anyhow::ensure!(started.elapsed() >= Duration::from_millis(250));

    let journal = backend.journal(Some(&case_prefix)).await;
    anyhow::ensure!(
        journal.len() == 5,
        "v1 journal for this case has {} calls, expected 5",
        journal.len()
    );
    anyhow::ensure!(journal.iter().all(|e| {
        e.model_version == "v1"
            && e.request
                .as_ref()
                .is_some_and(|r| r.idempotency_key.starts_with(&case_prefix))
    }));
    anyhow::ensure!(bed.backend("v2")?.journal(Some(&case_prefix)).await.len() == 1);
    Ok(())
}
