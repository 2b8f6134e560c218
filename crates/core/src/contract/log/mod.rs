//! Worker log lines in the seed's shape: `TIMESTAMP LEVEL key=value ...` (logfmt) or one JSON
//! object per line, always carrying the diagnosis fields ([`super::LOG_FIELDS`]) and a status word
//! from the seed's vocabulary. racecert's reference worker writes them; `racecert replay` reads
//! the same shape back from production logs.
//!
//! - [`Status`]: the status words, one enum for writer, parser and checkers.
//! - [`LogLine`]: one line, written as logfmt or JSON.
//! - the crate `racecert-logs` reads lines back as teams write them (logfmt, JSON, nested JSON,
//!   Celery's worker format; common spellings of each field; free-text messages mapped to
//!   [`Status`]), garbage counted, never a panic.
//! - [`sink`]: where a worker's lines go (kept for the checkers, echoed when asked).

pub mod sink;

pub use sink::{Echo, LogSink};

use serde::{Deserialize, Serialize};
use std::fmt;
use std::fmt::Write as _;
use std::str::FromStr;

/// The status words of the seed's log vocabulary: what a worker says it did. One enum, written by
/// the reference worker, read back by the log parser, the runners and the checkers, so a word is
/// spelled in one place ([`Status::as_str`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The job was received from the queue for the first time.
    JobReceived,
    /// A redelivered job was picked up by a worker (a retry).
    RetryDispatched,
    /// The lease was acquired.
    LeaseAcquired,
    /// Another attempt holds the lease: this delivery is skipped as a duplicate.
    DuplicateSkipped,
    /// The job is already terminal; nothing to do.
    AlreadyCompleted,
    /// The job was moved to IN_PROGRESS with a new generation.
    JobTaken,
    /// The active version is not this worker's: it declines the job and drains.
    VersionDeclined,
    /// Cache hit.
    CacheHit,
    /// Cache miss.
    CacheMiss,
    /// Backend call started.
    InferenceStarted,
    /// The backend has not answered within the soft timeout; still waiting.
    TimeoutWaitingUpstream,
    /// The backend call failed (hard timeout, HTTP error, connection error).
    UpstreamFailed,
    /// The result was written to the cache.
    CacheWritten,
    /// The final write succeeded.
    InferenceSucceeded,
    /// A final write landed on a job that another attempt had already completed.
    LateSuccess,
    /// The final write overwrote a newer result.
    OverwriteDetected,
    /// The fenced final write was rejected: this attempt no longer owns the job.
    LateWriteRejected,
    /// The rejected attempt's result was discarded.
    DiscardedLateResult,
    /// The delivery was acknowledged.
    Acked,
    /// A rejected late writer left the delivery unacknowledged: the job is not finished, so it
    /// must be redelivered to whoever finishes it.
    LeftForRedelivery,
    /// The lease was released (only if still ours).
    LeaseReleased,
    /// The lease had been lost (expired or taken) by the time it was released.
    LeaseLost,
    /// The attempt ended with an infrastructure error (a partition, a restart); its delivery
    /// stays unacknowledged.
    AttemptError,
    /// The active-version pointer was switched.
    Cutover,
    /// Cache entries of the old version were invalidated.
    CacheInvalidated,
    /// A worker process started (some frameworks restore unacknowledged deliveries then).
    WorkerStarted,
    /// A worker process died (killed, crashed) with whatever it held.
    WorkerLost,
    /// The worker was told to stop (a SIGTERM, Celery's warm shutdown, a drain): from here on it
    /// should take no new job, only finish the ones it holds.
    StopRequested,
    /// The attempt failed and the failure was recorded: the job ends FAILED (a framework's
    /// `raised unexpected`), unlike [`Status::UpstreamFailed`], after which it is redelivered.
    JobFailed,
    /// The attempt gave up and scheduled a retry of the same job (a framework's `retry:` line).
    RetryScheduled,
    /// The queue restored deliveries nobody acknowledged in time (a framework's restore sweep):
    /// each will be delivered again.
    DeliveriesRestored,
}

impl Status {
    /// Every status word.
    pub const ALL: [Status; 31] = [
        Status::JobReceived,
        Status::RetryDispatched,
        Status::LeaseAcquired,
        Status::DuplicateSkipped,
        Status::AlreadyCompleted,
        Status::JobTaken,
        Status::VersionDeclined,
        Status::CacheHit,
        Status::CacheMiss,
        Status::InferenceStarted,
        Status::TimeoutWaitingUpstream,
        Status::UpstreamFailed,
        Status::CacheWritten,
        Status::InferenceSucceeded,
        Status::LateSuccess,
        Status::OverwriteDetected,
        Status::LateWriteRejected,
        Status::DiscardedLateResult,
        Status::Acked,
        Status::LeftForRedelivery,
        Status::LeaseReleased,
        Status::LeaseLost,
        Status::AttemptError,
        Status::Cutover,
        Status::CacheInvalidated,
        Status::WorkerStarted,
        Status::WorkerLost,
        Status::StopRequested,
        Status::JobFailed,
        Status::RetryScheduled,
        Status::DeliveriesRestored,
    ];

    /// The word as logs spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::JobReceived => "job_received",
            Status::RetryDispatched => "retry_dispatched",
            Status::LeaseAcquired => "lease_acquired",
            Status::DuplicateSkipped => "duplicate_skipped",
            Status::AlreadyCompleted => "already_completed",
            Status::JobTaken => "job_taken",
            Status::VersionDeclined => "version_declined",
            Status::CacheHit => "cache_hit",
            Status::CacheMiss => "cache_miss",
            Status::InferenceStarted => "inference_started",
            Status::TimeoutWaitingUpstream => "timeout_waiting_upstream",
            Status::UpstreamFailed => "upstream_failed",
            Status::CacheWritten => "cache_written",
            Status::InferenceSucceeded => "inference_succeeded",
            Status::LateSuccess => "late_success",
            Status::OverwriteDetected => "overwrite_detected",
            Status::LateWriteRejected => "late_write_rejected",
            Status::DiscardedLateResult => "discarded_late_result",
            Status::Acked => "acked",
            Status::LeftForRedelivery => "left_for_redelivery",
            Status::LeaseReleased => "lease_released",
            Status::LeaseLost => "lease_lost",
            Status::AttemptError => "attempt_error",
            Status::Cutover => "cutover",
            Status::CacheInvalidated => "cache_invalidated",
            Status::WorkerStarted => "worker_started",
            Status::WorkerLost => "worker_lost",
            Status::StopRequested => "stop_requested",
            Status::JobFailed => "job_failed",
            Status::RetryScheduled => "retry_scheduled",
            Status::DeliveriesRestored => "deliveries_restored",
        }
    }

    /// Whether the attempt logging it wrote a final result.
    pub fn is_final_write(self) -> bool {
        matches!(self, Status::InferenceSucceeded | Status::LateSuccess)
    }

    /// Whether the attempt logging it was executing the job (a dispatch alone is not: the
    /// attempt may yet be skipped as a duplicate).
    pub fn is_working(self) -> bool {
        matches!(
            self,
            Status::JobTaken
                | Status::CacheHit
                | Status::CacheMiss
                | Status::InferenceStarted
                | Status::TimeoutWaitingUpstream
                | Status::CacheWritten
        )
    }

    /// Whether the attempt logging it holds a job mid-flight (taken, not yet written or failed).
    pub fn is_mid_job(self) -> bool {
        matches!(
            self,
            Status::JobTaken
                | Status::CacheMiss
                | Status::InferenceStarted
                | Status::TimeoutWaitingUpstream
        )
    }

    /// Whether the attempt logging it took a delivery from the queue.
    pub fn is_receive(self) -> bool {
        matches!(self, Status::JobReceived | Status::RetryDispatched)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Status {
    type Err = crate::Error;

    fn from_str(s: &str) -> crate::Result<Status> {
        Status::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| crate::Error::Config(format!("unknown status word {s:?}")))
    }
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

    /// The status word as written.
    pub fn status(&self) -> Option<&str> {
        self.get("status")
    }

    /// The status word, if it is one of the vocabulary's.
    pub fn status_word(&self) -> Option<Status> {
        self.status().and_then(|s| s.parse().ok())
    }

    /// Whether the line's status is `status`.
    pub fn is(&self, status: Status) -> bool {
        self.status() == Some(status.as_str())
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
    // Digits by hand, not `write!`: `racecert replay` formats one per line of a log of any size,
    // and the formatting machinery cost a twentieth of a replay.
    let at = jiff::tz::Offset::UTC.to_datetime(ts);
    let Ok(year) = u32::try_from(at.year()) else {
        // Before the common era (jiff's range reaches -9999): signed, by the formatter.
        return formatted(at);
    };
    let mut out = *b"0000-00-00T00:00:00.000Z";
    let mut put = |at: usize, width: usize, mut value: u32| {
        for i in (at..at + width).rev() {
            out[i] = b'0' + (value % 10) as u8;
            value /= 10;
        }
    };
    put(0, 4, year);
    put(5, 2, at.month() as u32);
    put(8, 2, at.day() as u32);
    put(11, 2, at.hour() as u32);
    put(14, 2, at.minute() as u32);
    put(17, 2, at.second() as u32);
    put(20, 3, at.millisecond() as u32);
    String::from_utf8_lossy(&out).into_owned()
}

/// [`format_timestamp`]'s shape written by the formatting machinery.
fn formatted(at: jiff::civil::DateTime) -> String {
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        at.year(),
        at.month(),
        at.day(),
        at.hour(),
        at.minute(),
        at.second(),
        at.millisecond()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_formatted_as_the_formatter_would() {
        for millis in [
            0i64,
            1,
            999,
            1_782_468_921_104,
            -1,
            253_402_207_200_000,
            -62_135_596_800_000,
            -62_135_596_800_001,
            -377_705_023_201_000,
        ] {
            let ts = jiff::Timestamp::from_millisecond(millis).unwrap();
            let expected = formatted(jiff::tz::Offset::UTC.to_datetime(ts));
            assert_eq!(format_timestamp(ts), expected, "{millis}");
        }
    }

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
