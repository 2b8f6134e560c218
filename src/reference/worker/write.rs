//! The reference worker's final write: the fenced compare-and-set, and the unsafe writes its
//! defects put in its place.

use super::*;

impl Worker {
    /// The final write, made the way the defects switched on say (fenced compare-and-set when
    /// none is).
    pub(super) async fn final_write(
        &self,
        redis: &mut ConnectionManager,
        attempt: &Attempt,
        lease: &Lease,
        generation: i64,
        output: &str,
        from_cache: bool,
    ) -> std::result::Result<Outcome, Stop> {
        if self.config.defects.has(Defect::LateWriteWithoutToken) {
            // "Still ours?" asked of the lease, right before the write: true now, stale later.
            let holder: Option<String> = redis.get(&lease.key).await?;
            if holder.as_deref() != Some(lease.token.as_str()) {
                self.log(Level::Warn, attempt, Status::LateWriteRejected, &[]);
                self.release(redis, &lease.key, &lease.token, attempt)
                    .await?;
                return Err(Stop::Early(Outcome::LateWriteRejected));
            }
        }
        self.checkpoint(Checkpoint::BeforeFinalWrite).await?;
        let record_version = self.step_version().await?;
        let token = lease.token.as_str();
        let outcome = if self.config.defects.has(Defect::ReadThenWrite) {
            self.read_then_write(
                attempt,
                token,
                generation,
                &record_version,
                output,
                from_cache,
            )
            .await?
        } else if self.config.defects.has(Defect::LateWriteWithoutToken) {
            self.tokenless_write(attempt, &record_version, output, from_cache)
                .await?
        } else if self.config.defects.has(Defect::UnfencedFinalWrite) {
            self.unfenced_write(
                attempt,
                token,
                generation + 1,
                &record_version,
                output,
                from_cache,
            )
            .await?
        } else {
            self.fenced_write(
                attempt,
                token,
                generation,
                &record_version,
                output,
                from_cache,
            )
            .await?
        };
        Ok(outcome)
    }

    async fn fenced_write(
        &self,
        attempt: &Attempt,
        token: &str,
        generation: i64,
        version: &str,
        output: &str,
        from_cache: bool,
    ) -> Result<Outcome> {
        let written = sqlx::query(
            "UPDATE inference_jobs
             SET status = 'SUCCEEDED', output = $4, model_version = $5, generation = $3,
                 updated_at = clock_timestamp(), completed_at = clock_timestamp()
             WHERE idempotency_key = $1 AND status = 'IN_PROGRESS' AND lease_token = $2
               AND generation < $3",
        )
        .bind(&attempt.key)
        .bind(token)
        .bind(generation + 1)
        .bind(output)
        .bind(version)
        .execute(&self.infra.pg)
        .await?
        .rows_affected();
        if written == 1 {
            Ok(self.succeeded(attempt, generation + 1, from_cache))
        } else {
            self.log(Level::Warn, attempt, Status::LateWriteRejected, &[]);
            self.log(Level::Info, attempt, Status::DiscardedLateResult, &[]);
            Ok(Outcome::LateWriteRejected)
        }
    }

    /// The defect: "still ours?" asked in one statement, the write made in the next, keyed by
    /// the job alone.
    async fn read_then_write(
        &self,
        attempt: &Attempt,
        token: &str,
        generation: i64,
        version: &str,
        output: &str,
        from_cache: bool,
    ) -> Result<Outcome> {
        let row: Option<(String, Option<String>)> = sqlx::query_as(
            "SELECT status, lease_token FROM inference_jobs WHERE idempotency_key = $1",
        )
        .bind(&attempt.key)
        .fetch_optional(&self.infra.pg)
        .await?;
        let ours = row.is_some_and(|(status, holder)| {
            status == "IN_PROGRESS" && holder.as_deref() == Some(token)
        });
        if !ours {
            self.log(Level::Warn, attempt, Status::LateWriteRejected, &[]);
            self.log(Level::Info, attempt, Status::DiscardedLateResult, &[]);
            return Ok(Outcome::LateWriteRejected);
        }
        sqlx::query(
            "UPDATE inference_jobs
             SET status = 'SUCCEEDED', output = $2, model_version = $3, generation = $4,
                 updated_at = clock_timestamp(), completed_at = clock_timestamp()
             WHERE idempotency_key = $1",
        )
        .bind(&attempt.key)
        .bind(output)
        .bind(version)
        .bind(generation + 1)
        .execute(&self.infra.pg)
        .await?;
        Ok(self.succeeded(attempt, generation + 1, from_cache))
    }

    /// The final write of [`Defect::LateWriteWithoutToken`]: by key and status, the token columns
    /// left alone.
    async fn tokenless_write(
        &self,
        attempt: &Attempt,
        version: &str,
        output: &str,
        from_cache: bool,
    ) -> Result<Outcome> {
        let generation: Option<i64> = sqlx::query_scalar(
            "UPDATE inference_jobs
             SET status = 'SUCCEEDED', output = $2, model_version = $3,
                 generation = generation + 1, updated_at = clock_timestamp(),
                 completed_at = clock_timestamp()
             WHERE idempotency_key = $1 AND status = 'IN_PROGRESS'
             RETURNING generation",
        )
        .bind(&attempt.key)
        .bind(output)
        .bind(version)
        .fetch_optional(&self.infra.pg)
        .await?;
        match generation {
            Some(generation) => Ok(self.succeeded(attempt, generation, from_cache)),
            None => {
                self.log(Level::Warn, attempt, Status::LateWriteRejected, &[]);
                Ok(Outcome::LateWriteRejected)
            }
        }
    }

    /// The defect: a plain UPDATE of the attempt's own generation, last writer wins (the seed's
    /// `UPDATE .. SET generation = :generation WHERE request_id = ..` without `generation <`); it
    /// still notices what it overwrote, so the log says `late_success` / `overwrite_detected` like
    /// the seed's.
    async fn unfenced_write(
        &self,
        attempt: &Attempt,
        token: &str,
        generation: i64,
        version: &str,
        output: &str,
        from_cache: bool,
    ) -> Result<Outcome> {
        let previous: Option<(String, Option<String>, i64)> = sqlx::query_as(
            "WITH prev AS (
                 SELECT idempotency_key, status, model_version FROM inference_jobs
                 WHERE idempotency_key = $1 FOR UPDATE)
             UPDATE inference_jobs j
             SET status = 'SUCCEEDED', output = $3, model_version = $4, lease_token = $2,
                 generation = $5, updated_at = clock_timestamp(),
                 completed_at = clock_timestamp()
             FROM prev WHERE j.idempotency_key = prev.idempotency_key
             RETURNING prev.status, prev.model_version, j.generation",
        )
        .bind(&attempt.key)
        .bind(token)
        .bind(output)
        .bind(version)
        .bind(generation)
        .fetch_optional(&self.infra.pg)
        .await?;
        let Some((previous_status, previous_version, generation)) = previous else {
            return Err(Error::other(format!(
                "job {} vanished before its final write",
                attempt.key
            )));
        };
        if previous_status == "SUCCEEDED" {
            self.log(
                Level::Info,
                attempt,
                Status::LateSuccess,
                &[("write", "result_store".to_owned())],
            );
            if previous_version.as_deref() != Some(version) {
                self.log(
                    Level::Warn,
                    attempt,
                    Status::OverwriteDetected,
                    &[
                        (
                            "previous_model_version",
                            previous_version.clone().unwrap_or_default(),
                        ),
                        ("new_model_version", version.to_owned()),
                    ],
                );
            }
            Ok(Outcome::Overwrote { previous_version })
        } else {
            Ok(self.succeeded(attempt, generation, from_cache))
        }
    }

    /// The final write landed: logged with its generation, as the seed's worker does.
    fn succeeded(&self, attempt: &Attempt, generation: i64, from_cache: bool) -> Outcome {
        self.log(
            Level::Info,
            attempt,
            Status::InferenceSucceeded,
            &[
                ("write", "result_store".to_owned()),
                ("generation", generation.to_string()),
                ("from_cache", from_cache.to_string()),
            ],
        );
        Outcome::Succeeded {
            generation,
            from_cache,
        }
    }
}
