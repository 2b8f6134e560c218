//! The contract every worker under test agrees to: the Postgres schema (`inference_jobs` plus the
//! audit trail its trigger fills), the Redis key names (job stream, leases, cache, active-version
//! pointer), the job state machine and the log fields. racecert's checkers rely only on this
//! contract, so a worker written in any language can be certified from the outside.

pub mod checkpoint;
pub mod defect;
pub mod delivery;
pub mod fencing;
pub mod layout;
pub mod log;
pub mod worker;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;
use std::str::FromStr;

/// The contract schema: `inference_jobs`, `inference_jobs_audit` and the audit trigger.
pub const SCHEMA_SQL: &str = include_str!("schema.sql");

/// The Redis Stream that carries jobs from the API side to workers.
pub const JOB_STREAM: &str = "inference:jobs";
/// The consumer group all workers read the job stream through.
pub const CONSUMER_GROUP: &str = "inference-workers";
/// The pointer that names the active model version; cutover switches it.
pub const ACTIVE_VERSION_KEY: &str = "inference:active_model_version";

/// Redis key names, optionally under a namespace so that cases sharing one test bed never see each
/// other's keys (isolation by fresh keys instead of container restarts).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// Keys exactly as the contract names them (no namespace).
    pub fn root() -> Self {
        Keys::default()
    }

    /// Keys under `namespace:`; the namespace must not be empty.
    pub fn namespaced(namespace: &str) -> Self {
        Keys {
            prefix: format!("{namespace}:"),
        }
    }

    /// The namespace prefix (empty for root keys), including its trailing `:`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `inference:lock:{idempotency_key}`: the lease, taken with `SET .. NX PX ttl`.
    pub fn lease(&self, idempotency_key: &str) -> String {
        format!("{}inference:lock:{idempotency_key}", self.prefix)
    }

    /// The job stream.
    pub fn stream(&self) -> String {
        format!("{}{JOB_STREAM}", self.prefix)
    }

    /// The active-version pointer.
    pub fn active_version(&self) -> String {
        format!("{}{ACTIVE_VERSION_KEY}", self.prefix)
    }

    /// The version-aware cache key: `inf:{version}:{sha256(normalized_input + ":" + version)}`.
    pub fn cache(&self, model_version: &str, normalized_input: &str) -> String {
        format!(
            "{}inf:{model_version}:{}",
            self.prefix,
            sha256_hex(&format!("{normalized_input}:{model_version}"))
        )
    }
}

/// Lower-case hex SHA-256 of a string.
pub fn sha256_hex(input: &str) -> String {
    hex::encode(Sha256::digest(input.as_bytes()))
}

/// The job state machine of `inference_jobs.status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobStatus {
    /// Submitted, not yet taken by a worker.
    Pending,
    /// Taken by a worker holding a lease; carries its lease token and generation.
    InProgress,
    /// Final: a result is stored.
    Succeeded,
    /// Final: the job failed for good.
    Failed,
    /// Final: cancelled before completion.
    Cancelled,
}

impl JobStatus {
    /// Every status, in state-machine order.
    pub const ALL: [JobStatus; 5] = [
        JobStatus::Pending,
        JobStatus::InProgress,
        JobStatus::Succeeded,
        JobStatus::Failed,
        JobStatus::Cancelled,
    ];

    /// The spelling stored in Postgres.
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Pending => "PENDING",
            JobStatus::InProgress => "IN_PROGRESS",
            JobStatus::Succeeded => "SUCCEEDED",
            JobStatus::Failed => "FAILED",
            JobStatus::Cancelled => "CANCELLED",
        }
    }

    /// Whether the status is final (a "final write" moves a job into one of these).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobStatus::Succeeded | JobStatus::Failed | JobStatus::Cancelled
        )
    }

    /// Whether the state machine allows `self -> next`. IN_PROGRESS -> IN_PROGRESS is a takeover
    /// by a newer lease (higher generation) after the old one expired.
    pub fn can_move_to(self, next: JobStatus) -> bool {
        use JobStatus::*;
        matches!(
            (self, next),
            (Pending, InProgress)
                | (Pending, Cancelled)
                | (InProgress, InProgress)
                | (InProgress, Succeeded)
                | (InProgress, Failed)
                | (InProgress, Cancelled)
        )
    }
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobStatus {
    type Err = crate::Error;

    fn from_str(s: &str) -> crate::Result<Self> {
        JobStatus::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| {
                crate::Error::Config(format!(
                    "unknown job status {s:?}; expected one of PENDING, IN_PROGRESS, SUCCEEDED, FAILED, CANCELLED"
                ))
            })
    }
}

/// The fields every log line and span of a worker carries (the seed's diagnosis fields).
pub const LOG_FIELDS: [&str; 9] = [
    "request_id",
    "job_id",
    "idempotency_key",
    "worker_id",
    "model_version",
    "backend_endpoint",
    "cache_key",
    "attempt",
    "queue_receive_count",
];

/// The request a model backend receives on `POST /v1/infer`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InferRequest {
    /// The normalized input.
    pub input: String,
    /// The idempotency key of the job (namespaced per case), so journals can be split per case.
    pub idempotency_key: String,
    /// Which attempt of the job sends this call.
    #[serde(default)]
    pub attempt: u32,
    /// The worker sending the call.
    #[serde(default)]
    pub worker_id: String,
}

/// The answer of a model backend: the output names the version that produced it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InferResponse {
    /// The model output, a deterministic function of (input, version).
    pub output: String,
    /// The version that produced it.
    pub model_version: String,
}

/// The output model `version` produces for `input`: deterministic, and it names its version, so
/// a stored result proves which model produced it.
pub fn model_output(input: &str, version: &str) -> String {
    format!(
        "{version}:{}",
        &sha256_hex(&format!("{version}|{input}"))[..16]
    )
}

/// The version named by an output of [`model_output`], if it has that shape.
pub fn output_version(output: &str) -> Option<&str> {
    output.split_once(':').map(|(version, _)| version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_keys_differ_per_version_and_namespace() {
        let keys = Keys::root();
        assert_ne!(keys.cache("v1", "x"), keys.cache("v2", "x"));
        assert!(keys.cache("v1", "x").starts_with("inf:v1:"));
        let ns = Keys::namespaced("case-7");
        assert_eq!(ns.lease("k"), "case-7:inference:lock:k");
        assert_eq!(
            ns.cache("v1", "x"),
            format!("case-7:{}", keys.cache("v1", "x"))
        );
    }

    #[test]
    fn model_output_is_deterministic_and_names_its_version() {
        assert_eq!(model_output("x", "v1"), model_output("x", "v1"));
        assert_ne!(model_output("x", "v1"), model_output("x", "v2"));
        assert_eq!(output_version(&model_output("x", "v2")), Some("v2"));
    }

    #[test]
    fn state_machine_allows_only_forward_moves() {
        use JobStatus::*;
        assert!(Pending.can_move_to(InProgress));
        assert!(InProgress.can_move_to(Succeeded));
        for terminal in [Succeeded, Failed, Cancelled] {
            assert!(terminal.is_terminal());
            for next in JobStatus::ALL {
                assert!(!terminal.can_move_to(next), "{terminal} -> {next}");
            }
        }
        assert_eq!("IN_PROGRESS".parse::<JobStatus>().unwrap(), InProgress);
        assert!("DONE".parse::<JobStatus>().is_err());
    }
}

/// A job row as stored.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow, serde::Deserialize)]
pub struct JobRow {
    /// Idempotency key.
    pub idempotency_key: String,
    /// Request id.
    pub request_id: String,
    /// Status.
    pub status: String,
    /// Generation.
    pub generation: i64,
    /// Version that produced the output.
    pub model_version: Option<String>,
    /// The output.
    pub output: Option<String>,
    /// Lease token of the last writer.
    pub lease_token: Option<String>,
    /// Worker of the last writer.
    pub worker_id: Option<String>,
}

impl JobRow {
    /// The parsed status.
    pub fn status(&self) -> crate::Result<JobStatus> {
        self.status.parse()
    }
}
