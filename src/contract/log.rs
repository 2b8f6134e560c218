//! Worker log lines in the seed's shape: `TIMESTAMP LEVEL key=value ...` (logfmt) or one JSON
//! object per line, always carrying the diagnosis fields ([`super::LOG_FIELDS`]) and a status word
//! from the seed's vocabulary. racecert's reference worker writes them; `racecert replay` reads
//! the same shape back from production logs.

use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// Status words, as the seed's log uses them.
pub mod status {
    /// The job was received from the queue for the first time.
    pub const JOB_RECEIVED: &str = "job_received";
    /// A redelivered job was picked up by a worker (a retry).
    pub const RETRY_DISPATCHED: &str = "retry_dispatched";
    /// The lease was acquired.
    pub const LEASE_ACQUIRED: &str = "lease_acquired";
    /// Another attempt holds the lease: this delivery is skipped as a duplicate.
    pub const DUPLICATE_SKIPPED: &str = "duplicate_skipped";
    /// The job is already terminal; nothing to do.
    pub const ALREADY_COMPLETED: &str = "already_completed";
    /// The job was moved to IN_PROGRESS with a new generation.
    pub const JOB_TAKEN: &str = "job_taken";
    /// The active version is not this worker's: it declines the job and drains.
    pub const VERSION_DECLINED: &str = "version_declined";
    /// Cache hit.
    pub const CACHE_HIT: &str = "cache_hit";
    /// Cache miss.
    pub const CACHE_MISS: &str = "cache_miss";
    /// Backend call started.
    pub const INFERENCE_STARTED: &str = "inference_started";
    /// The backend has not answered within the soft timeout; still waiting.
    pub const TIMEOUT_WAITING_UPSTREAM: &str = "timeout_waiting_upstream";
    /// The backend call failed (hard timeout, HTTP error, connection error).
    pub const UPSTREAM_FAILED: &str = "upstream_failed";
    /// The result was written to the cache.
    pub const CACHE_WRITTEN: &str = "cache_written";
    /// The final write succeeded.
    pub const INFERENCE_SUCCEEDED: &str = "inference_succeeded";
    /// A final write landed on a job that another attempt had already completed.
    pub const LATE_SUCCESS: &str = "late_success";
    /// The final write overwrote a newer result.
    pub const OVERWRITE_DETECTED: &str = "overwrite_detected";
    /// The fenced final write was rejected: this attempt no longer owns the job.
    pub const LATE_WRITE_REJECTED: &str = "late_write_rejected";
    /// The rejected attempt's result was discarded.
    pub const DISCARDED_LATE_RESULT: &str = "discarded_late_result";
    /// The delivery was acknowledged.
    pub const ACKED: &str = "acked";
    /// A rejected late writer left the delivery unacknowledged: the job is not finished, so it
    /// must be redelivered to whoever finishes it.
    pub const LEFT_FOR_REDELIVERY: &str = "left_for_redelivery";
    /// The lease was released (only if still ours).
    pub const LEASE_RELEASED: &str = "lease_released";
    /// The lease had been lost (expired or taken) by the time it was released.
    pub const LEASE_LOST: &str = "lease_lost";
    /// The worker crashed (injected) at a checkpoint.
    pub const CRASHED: &str = "crashed";
    /// The active-version pointer was switched.
    pub const CUTOVER: &str = "cutover";
    /// Cache entries of the old version were invalidated.
    pub const CACHE_INVALIDATED: &str = "cache_invalidated";
}

/// Log level of a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Level {
    /// Normal progress.
    Info,
    /// Something a person should look at.
    Warn,
    /// A failure.
    Error,
}

impl Level {
    /// The spelling in log lines.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Info => "INFO",
            Level::Warn => "WARN",
            Level::Error => "ERROR",
        }
    }
}

/// One log line: timestamp, level, ordered key=value fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogLine {
    /// RFC 3339 timestamp with milliseconds, UTC (`2026-06-26T10:15:21.104Z`).
    pub ts: String,
    /// Level.
    pub level: Level,
    /// Fields in order; the status word is under `status`.
    pub fields: Vec<(String, String)>,
}

impl LogLine {
    /// The value of a field.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The status word.
    pub fn status(&self) -> Option<&str> {
        self.get("status")
    }

    /// logfmt, as in the seed: values with spaces, quotes or `=` are quoted.
    pub fn to_logfmt(&self) -> String {
        let mut out = format!("{} {}", self.ts, self.level.as_str());
        for (key, value) in &self.fields {
            let needs_quotes = value.is_empty()
                || value
                    .chars()
                    .any(|c| c.is_whitespace() || c == '"' || c == '=' || c == '\\');
            if needs_quotes {
                let escaped = value.replace('\\', "\\\\").replace('"', "\\\"");
                let _ = write!(out, " {key}=\"{escaped}\"");
            } else {
                let _ = write!(out, " {key}={value}");
            }
        }
        out
    }

    /// One JSON object: `ts`, `level`, then the fields.
    pub fn to_json(&self) -> String {
        let mut map = serde_json::Map::new();
        map.insert("ts".into(), self.ts.clone().into());
        map.insert("level".into(), self.level.as_str().into());
        for (key, value) in &self.fields {
            map.insert(key.clone(), value.clone().into());
        }
        serde_json::Value::Object(map).to_string()
    }
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn timestamp_now() -> String {
    format_timestamp(jiff::Timestamp::now())
}

/// Formats a timestamp as the seed's logs do: UTC, milliseconds, `Z`.
pub fn format_timestamp(ts: jiff::Timestamp) -> String {
    ts.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logfmt_matches_the_seed_shape_and_quotes_when_needed() {
        let line = LogLine {
            ts: "2026-06-26T10:15:21.104Z".into(),
            level: Level::Info,
            fields: vec![
                ("request_id".into(), "req-91".into()),
                ("status".into(), "cache_miss".into()),
                ("note".into(), "two words".into()),
            ],
        };
        assert_eq!(
            line.to_logfmt(),
            "2026-06-26T10:15:21.104Z INFO request_id=req-91 status=cache_miss note=\"two words\""
        );
        let json: serde_json::Value = serde_json::from_str(&line.to_json()).unwrap();
        assert_eq!(json["status"], "cache_miss");
        assert_eq!(json["level"], "INFO");
    }

    #[test]
    fn timestamps_are_utc_with_millis() {
        let at = |s: i64, ms: i32| jiff::Timestamp::new(s, ms * 1_000_000).unwrap();
        assert_eq!(format_timestamp(at(0, 0)), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            format_timestamp(at(1_782_468_921, 104)),
            "2026-06-26T10:15:21.104Z"
        );
        assert_eq!(
            format_timestamp(at(951_782_400, 5)),
            "2000-02-29T00:00:00.005Z"
        );
    }
}
