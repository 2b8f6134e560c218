//! The fenced final write: compare-and-set on lease token and generation, audited by the trigger.

use racecert::env::TestBed;
use sqlx::Connection;

crate::tests!(compare_and_set_accepts_the_newer_write_rejects_the_stale_one_and_audits_all);

/// operation, old_status, new_status, old_generation, new_generation
type AuditRow = (String, Option<String>, String, Option<i64>, i64);

const CAS: &str = "UPDATE inference_jobs
    SET status = 'SUCCEEDED', generation = $3, model_version = $4, output = $5, completed_at = clock_timestamp()
    WHERE idempotency_key = $1 AND lease_token = $2 AND generation < $3";

async fn compare_and_set_accepts_the_newer_write_rejects_the_stale_one_and_audits_all(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let key = format!("{}:job-1", crate::namespace("cas"));
    let mut pg = sqlx::PgConnection::connect(&bed.database_url()).await?;
    sqlx::query(
        "INSERT INTO inference_jobs (idempotency_key, request_id, job_id) VALUES ($1, 'req-91', 'job-441')
         ON CONFLICT DO NOTHING",
    )
    .bind(&key)
    .execute(&mut pg)
    .await?;
    // Worker takes the job: IN_PROGRESS with its lease token and generation 1.
    let taken = sqlx::query(
        "UPDATE inference_jobs SET status = 'IN_PROGRESS', lease_token = $2, generation = 1, attempt = 1
         WHERE idempotency_key = $1 AND status = 'PENDING'",
    )
    .bind(&key)
    .bind("lease-t")
    .execute(&mut pg)
    .await?
    .rows_affected();
    anyhow::ensure!(taken == 1, "taking the job updated {taken} rows");

    let write = |generation: i64, version: &'static str| {
        sqlx::query(CAS)
            .bind(key.clone())
            .bind("lease-t")
            .bind(generation)
            .bind(version)
            .bind(racecert::contract::model_output("x", version))
    };
    let newer = write(2, "v2").execute(&mut pg).await?.rows_affected();
    let stale = write(1, "v1").execute(&mut pg).await?.rows_affected();
    let replay = write(2, "v1").execute(&mut pg).await?.rows_affected();
    anyhow::ensure!(
        newer == 1,
        "the newer write (generation 2) must be accepted"
    );
    anyhow::ensure!(
        stale == 0,
        "the stale write (generation 1) must be rejected"
    );
    anyhow::ensure!(replay == 0, "an equal generation must be rejected too");
    let wrong_token = sqlx::query(CAS)
        .bind(&key)
        .bind("someone-else")
        .bind(9_i64)
        .bind("v1")
        .bind("v1:x")
        .execute(&mut pg)
        .await?
        .rows_affected();
    anyhow::ensure!(
        wrong_token == 0,
        "a write with another lease token must be rejected"
    );

    let (version, output): (String, String) = sqlx::query_as(
        "SELECT model_version, output FROM inference_jobs WHERE idempotency_key = $1",
    )
    .bind(&key)
    .fetch_one(&mut pg)
    .await?;
    anyhow::ensure!(version == "v2", "stored version {version}, expected v2");
    anyhow::ensure!(
        racecert::contract::output_version(&output) == Some("v2"),
        "stored output {output} was not produced by v2"
    );

    let audit: Vec<AuditRow> = sqlx::query_as(
        "SELECT operation, old_status, new_status, old_generation, new_generation
         FROM inference_jobs_audit WHERE idempotency_key = $1 ORDER BY audit_id",
    )
    .bind(&key)
    .fetch_all(&mut pg)
    .await?;
    let expected = vec![
        ("INSERT".to_owned(), None, "PENDING".to_owned(), None, 0),
        (
            "UPDATE".to_owned(),
            Some("PENDING".to_owned()),
            "IN_PROGRESS".to_owned(),
            Some(0),
            1,
        ),
        (
            "UPDATE".to_owned(),
            Some("IN_PROGRESS".to_owned()),
            "SUCCEEDED".to_owned(),
            Some(1),
            2,
        ),
    ];
    anyhow::ensure!(
        audit == expected,
        "audit trail\n  observed {audit:?}\n  expected {expected:?}"
    );
    Ok(())
}
