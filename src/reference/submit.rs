//! The API side: normalise the input, derive a stable idempotency key from the business request
//! (never random per attempt), insert the job PENDING exactly once, enqueue it.

use crate::Result;
use crate::contract::delivery::JobMessage;
use crate::contract::{Keys, sha256_hex};
use crate::reference::queue::Queue;
use sqlx::PgPool;

/// A client's inference request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InferenceRequest {
    /// The client's request id (the business operation).
    pub request_id: String,
    /// The raw input.
    pub input: String,
}

/// What the API answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    /// The stable idempotency key.
    pub idempotency_key: String,
    /// The job id.
    pub job_id: String,
    /// Whether this call created the job (false: a duplicate submission of the same request).
    pub created: bool,
    /// The queue entry, when the job was enqueued by this call.
    pub entry_id: Option<String>,
}

/// Trims and collapses whitespace: identical requests that differ only in spacing share a cache
/// entry.
pub fn normalize_input(input: &str) -> String {
    input.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The idempotency key of a business request: a function of the namespace, the request id and
/// the normalized input only, so every retry of the same request maps to the same job.
pub fn idempotency_key(keys: &Keys, request_id: &str, normalized_input: &str) -> String {
    format!(
        "{}idem-{}",
        keys.prefix(),
        &sha256_hex(&format!("{request_id}\n{normalized_input}"))[..24]
    )
}

/// The API of one namespace.
#[derive(Debug, Clone)]
pub struct Api {
    pg: PgPool,
    queue: Queue,
    keys: Keys,
}

impl Api {
    /// An API writing jobs to `pg` and the queue of `keys`.
    pub fn new(pg: PgPool, queue: Queue, keys: Keys) -> Api {
        Api { pg, queue, keys }
    }

    /// Submits a request: insert PENDING (`ON CONFLICT DO NOTHING`), then enqueue if this call
    /// created the job. A duplicate submission finds the job and enqueues nothing.
    pub async fn submit(&mut self, request: &InferenceRequest) -> Result<Submitted> {
        let input = normalize_input(&request.input);
        let key = idempotency_key(&self.keys, &request.request_id, &input);
        let job_id = format!("job-{}", &sha256_hex(&key)[..12]);
        let created = sqlx::query(
            "INSERT INTO inference_jobs (idempotency_key, request_id, job_id, status)
             VALUES ($1, $2, $3, 'PENDING') ON CONFLICT (idempotency_key) DO NOTHING",
        )
        .bind(&key)
        .bind(&request.request_id)
        .bind(&job_id)
        .execute(&self.pg)
        .await?
        .rows_affected()
            == 1;
        let entry_id = if created {
            Some(
                self.queue
                    .enqueue(&JobMessage {
                        idempotency_key: key.clone(),
                        job_id: job_id.clone(),
                        request_id: request.request_id.clone(),
                        input,
                    })
                    .await?,
            )
        } else {
            None
        };
        Ok(Submitted {
            idempotency_key: key,
            job_id,
            created,
            entry_id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_per_request_and_ignore_spacing() {
        let keys = Keys::namespaced("ns");
        let a = idempotency_key(&keys, "req-1", &normalize_input("  hello   world "));
        let b = idempotency_key(&keys, "req-1", &normalize_input("hello world"));
        let c = idempotency_key(&keys, "req-2", &normalize_input("hello world"));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.starts_with("ns:idem-"));
    }
}
