//! The smoke scenario: proves on a live test bed that each building block does what the harness
//! relies on (leases are exclusive, fenced writes reject stale generations and are audited, the
//! proxy really delays and partitions), and says what it did. `racecert smoke` runs it until the
//! `certify` command exists; the integration tests check the same facts one by one.

use crate::contract::{InferRequest, InferResponse, Keys, model_output};
use crate::env::proxy::{Direction, Proxy, Toxic};
use crate::env::{Target, TestBed};
use crate::{Error, Result};
use sqlx::Connection;
use std::time::{Duration, Instant};

/// One step of the scenario and what it observed.
#[derive(Debug, Clone)]
pub struct Step {
    /// What was checked.
    pub name: &'static str,
    /// What was observed.
    pub observed: String,
    /// How long it took.
    pub elapsed: Duration,
}

/// Runs the scenario on `bed`, calling `on_step` after each step. Fails on the first step whose
/// observation contradicts what the harness relies on.
pub async fn run(bed: &TestBed, mut on_step: impl FnMut(&Step)) -> Result<Vec<Step>> {
    let namespace = format!("smoke-{}", std::process::id());
    let keys = Keys::namespaced(&namespace);
    let mut steps = Vec::new();
    let mut record = |name, observed: String, started: Instant| {
        let step = Step {
            name,
            observed,
            elapsed: started.elapsed(),
        };
        on_step(&step);
        steps.push(step);
    };

    lease_is_exclusive(bed, &keys, &mut record).await?;
    let key = format!("{namespace}:job-1");
    fenced_write(bed, &key, &mut record).await?;
    // The backend's proxy is the run's: it is removed when the scenario ends.
    let version = bed.versions()[0].to_owned();
    let backend = bed.dedicated_proxy(Target::Backend(0)).await?;
    backend_behind_the_proxy(&backend, &version, &key, &mut record).await?;
    partition(bed, &mut record).await?;
    Ok(steps)
}

/// 1. Lease: two contenders, one winner.
async fn lease_is_exclusive(
    bed: &TestBed,
    keys: &Keys,
    record: &mut impl FnMut(&'static str, String, Instant),
) -> Result<()> {
    let started = Instant::now();
    let client = redis::Client::open(bed.redis_url())?;
    let mut redis = client.get_multiplexed_async_connection().await?;
    let lease = keys.lease("job-1");
    let mut winners = Vec::new();
    for token in ["token-a", "token-b"] {
        let won: Option<String> = redis::cmd("SET")
            .arg(&lease)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut redis)
            .await?;
        if won.is_some() {
            winners.push(token);
        }
    }
    if winners != ["token-a"] {
        return Err(Error::other(format!(
            "lease: expected exactly the first contender to win, winners were {winners:?}"
        )));
    }
    record(
        "lease is exclusive",
        format!("SET {lease} NX PX 30000: token-a won, token-b denied"),
        started,
    );
    Ok(())
}

/// 2. Fenced final write of job `key`: newer generation accepted, stale rejected, both audited.
async fn fenced_write(
    bed: &TestBed,
    key: &str,
    record: &mut impl FnMut(&'static str, String, Instant),
) -> Result<()> {
    let started = Instant::now();
    let mut pg = sqlx::PgConnection::connect(&bed.database_url()).await?;
    sqlx::query(
        "INSERT INTO inference_jobs (idempotency_key, request_id, job_id, status, lease_token, generation, attempt)
         VALUES ($1, 'req-smoke', 'job-smoke', 'IN_PROGRESS', 'token-a', 1, 1) ON CONFLICT DO NOTHING",
    )
    .bind(key)
    .execute(&mut pg)
    .await?;
    let cas = "UPDATE inference_jobs SET status = 'SUCCEEDED', generation = $3, model_version = $4, output = $5, completed_at = clock_timestamp()
               WHERE idempotency_key = $1 AND lease_token = $2 AND generation < $3";
    let newer = sqlx::query(cas)
        .bind(key)
        .bind("token-a")
        .bind(2_i64)
        .bind("v2")
        .bind(model_output("smoke", "v2"))
        .execute(&mut pg)
        .await?
        .rows_affected();
    let stale = sqlx::query(cas)
        .bind(key)
        .bind("token-a")
        .bind(1_i64)
        .bind("v1")
        .bind(model_output("smoke", "v1"))
        .execute(&mut pg)
        .await?
        .rows_affected();
    let audit: Vec<(Option<i64>, i64)> = sqlx::query_as(
        "SELECT old_generation, new_generation FROM inference_jobs_audit WHERE idempotency_key = $1 ORDER BY audit_id",
    )
    .bind(key)
    .fetch_all(&mut pg)
    .await?;
    if newer != 1 || stale != 0 || audit.len() != 2 {
        return Err(Error::other(format!(
            "fenced write: expected newer accepted, stale rejected, 2 audit rows; got {newer}, {stale}, {audit:?}"
        )));
    }
    record(
        "fenced write",
        format!(
            "generation 2 accepted, stale generation 1 rejected; audit: {}",
            audit
                .iter()
                .map(|(old, new)| format!(
                    "{}->{new}",
                    old.map_or("none".into(), |o| o.to_string())
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        started,
    );
    Ok(())
}

/// 3. Model backend `version` through its proxy, then with 300 ms of latency.
async fn backend_behind_the_proxy(
    backend: &Proxy,
    version: &str,
    key: &str,
    record: &mut impl FnMut(&'static str, String, Instant),
) -> Result<()> {
    let http = reqwest::Client::new();
    let started = Instant::now();
    let (answer, plain) = infer(&http, backend, key).await?;
    if answer.output != model_output("smoke", version) {
        return Err(Error::other(format!(
            "backend {version} answered {answer:?}, expected {}",
            model_output("smoke", version)
        )));
    }
    backend
        .add_toxic(
            Toxic::Latency {
                latency_ms: 300,
                jitter_ms: 0,
            },
            Direction::Downstream,
            1.0,
        )
        .await?;
    let (_, delayed) = infer(&http, backend, key).await?;
    backend.clear_toxics().await?;
    if delayed < Duration::from_millis(300) {
        return Err(Error::other(format!(
            "latency toxic: call took {delayed:?}, expected at least 300 ms"
        )));
    }
    record(
        "backend behind the proxy",
        format!(
            "{version} answered {} in {plain:.1?}; with a 300 ms latency toxic in {delayed:.1?}",
            answer.output
        ),
        started,
    );
    Ok(())
}

/// One inference call for job `key` through `backend`, with how long it took.
async fn infer(
    http: &reqwest::Client,
    backend: &Proxy,
    key: &str,
) -> Result<(InferResponse, Duration)> {
    let started = Instant::now();
    let answer: InferResponse = http
        .post(format!("http://{}/v1/infer", backend.listen()))
        .json(&InferRequest {
            input: "smoke".into(),
            idempotency_key: key.to_owned(),
            attempt: 1,
            worker_id: "smoke".into(),
        })
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .map_err(|e| Error::Backend(e.to_string()))?
        .json()
        .await
        .map_err(|e| Error::Backend(e.to_string()))?;
    Ok((answer, started.elapsed()))
}

/// 4. Partition: a disabled Postgres proxy fails fast, enabling it restores service.
async fn partition(
    bed: &TestBed,
    record: &mut impl FnMut(&'static str, String, Instant),
) -> Result<()> {
    let started = Instant::now();
    let pg_proxy = bed.dedicated_proxy(Target::Postgres).await?;
    let url = bed.database_url().replace(
        &bed.postgres_proxy().listen().to_string(),
        &pg_proxy.listen().to_string(),
    );
    pg_proxy.disable().await?;
    let attempt = Instant::now();
    let refused = sqlx::PgConnection::connect(&url).await;
    let failed_in = attempt.elapsed();
    if refused.is_ok() {
        return Err(Error::other(
            "partition: a connection through a disabled proxy succeeded",
        ));
    }
    pg_proxy.enable().await?;
    let mut conn = sqlx::PgConnection::connect(&url).await?;
    let one: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&mut conn).await?;
    record(
        "partition",
        format!(
            "disabled postgres proxy: connect failed in {failed_in:.1?}; enabled again: SELECT 1 = {one}"
        ),
        started,
    );
    Ok(())
}
