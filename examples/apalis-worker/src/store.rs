//! The team's result table `predictions` (schema.sql): row creation, the fenced take, final writes.

use sqlx::PgPool;

use crate::InferenceRequest;

/// Creates the request's row if no attempt did yet, so submitting is only enqueueing the job.
pub async fn ensure_row(pool: &PgPool, job: &InferenceRequest) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO predictions (request_id, input, status, updated_at) \
         VALUES ($1, $2, 'PENDING', now()) ON CONFLICT (request_id) DO NOTHING",
    )
    .bind(&job.request_id)
    .bind(&job.input)
    .execute(pool)
    .await?;
    Ok(())
}

/// The bug: whoever finishes last overwrites the row, whatever happened meanwhile.
pub async fn write_naive(
    pool: &PgPool,
    request_id: &str,
    output: &str,
    version: &str,
    worker: &str,
) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE predictions SET status = 'SUCCEEDED', output = $2, model_version = $3, \
         owner = $4, updated_at = now() WHERE request_id = $1",
    )
    .bind(request_id)
    .bind(output)
    .bind(version)
    .bind(worker)
    .execute(pool)
    .await?;
    Ok(())
}

/// The naive failure path, as unconditional as its success path.
pub async fn fail_naive(pool: &PgPool, request_id: &str, worker: &str) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE predictions SET status = 'FAILED', owner = $2, updated_at = now() \
         WHERE request_id = $1",
    )
    .bind(request_id)
    .bind(worker)
    .execute(pool)
    .await?;
    Ok(())
}

/// Takes the next epoch for this attempt; `None` when the request is already terminal.
pub async fn take(pool: &PgPool, request_id: &str, worker: &str) -> sqlx::Result<Option<i32>> {
    sqlx::query_scalar(
        "UPDATE predictions SET epoch = epoch + 1, owner = $2, status = 'RUNNING', \
         updated_at = now() WHERE request_id = $1 AND status NOT IN ('SUCCEEDED', 'FAILED') \
         RETURNING epoch",
    )
    .bind(request_id)
    .bind(worker)
    .fetch_optional(pool)
    .await
}

/// The final write, accepted only while `epoch` is still the row's; false when fenced out.
pub async fn write_fenced(
    pool: &PgPool,
    request_id: &str,
    epoch: i32,
    output: &str,
    version: &str,
) -> sqlx::Result<bool> {
    let done = sqlx::query(
        "UPDATE predictions SET status = 'SUCCEEDED', output = $3, model_version = $4, \
         updated_at = now() \
         WHERE request_id = $1 AND epoch = $2 AND status NOT IN ('SUCCEEDED', 'FAILED')",
    )
    .bind(request_id)
    .bind(epoch)
    .bind(output)
    .bind(version)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The fenced failure path: only the current owner may declare the request failed.
pub async fn fail_fenced(pool: &PgPool, request_id: &str, epoch: i32) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE predictions SET status = 'FAILED', updated_at = now() \
         WHERE request_id = $1 AND epoch = $2 AND status NOT IN ('SUCCEEDED', 'FAILED')",
    )
    .bind(request_id)
    .bind(epoch)
    .execute(pool)
    .await?;
    Ok(())
}
