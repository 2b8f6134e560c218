//! Reading incident logs as teams write them, one line at a time, in any of:
//! - logfmt in the seed's shape (`TIMESTAMP LEVEL key=value ...`), bare words kept as the message,
//!   Python's `YYYY-MM-DD HH:MM:SS,mmm` accepted as the leading timestamp;
//! - one JSON object per line, nested objects flattened with dotted keys (`{"request":{"id":..}}`
//!   is `request.id`);
//! - Celery's worker format (`[2026-06-26 10:15:21,104: INFO/MainProcess] Task tasks.infer[ID]
//!   received`, `succeeded in 12.3s: ..`, `raised unexpected: ..`, `retry: Retry in 5s`,
//!   `Restoring N unacknowledged message(s)`, `celery@host ready.`, task-logger lines), with its
//!   start banner and tracebacks skipped; in a stream that has shown Celery's or Python's
//!   format (per prefix), a line that is no record is the continuation of a multi-line message
//!   (Python `warnings` output, Celery's connection-loss notices) and is skipped, not malformed;
//!
//! Why one file of ~1,000 lines: one reader per line shape (logfmt, JSON, Celery's formats) and the
//! field-spelling table they share; a line is tried against each in turn, in one place.
//!
//! each optionally behind a `docker compose logs` (`NAME | `) or `kubectl logs --prefix`
//! (`[pod/NAME/CONTAINER] `) prefix, which names the worker when the line does not.
//!
//! Every line becomes a [`LogLine`] in the seed's vocabulary: common spellings of a field take the
//! seed's name ([`canonical_field`]: `requestId`, `req_id` and `request.id` are `request_id`,
//! `task_id` is `job_id`, `retries` is `attempt` minus one, ...), timestamps become RFC 3339 UTC
//! with milliseconds, and a status or free-text message becomes a [`Status`] word when exactly one
//! known phrasing names it ([`status_of`]); otherwise the raw text stays. A Celery task id is the
//! job id and the worker is Celery's hostname (from the start line or the prefix) with the pool
//! process kept under `process`. Timestamps without a zone (Python's `asctime`) are read as UTC.
//!
//! A line that is none of these is counted as malformed with its number and the reason; the parser
//! never panics, whatever the bytes.

use super::{Level, LogLine, Status, format_timestamp};
use regex::Regex;
use std::collections::HashMap;
use std::sync::LazyLock;

/// Lines longer than this are refused (a log line is not a data dump).
pub const MAX_LINE: usize = 64 * 1024;

/// One parsed line and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedLine {
    /// 1-based line number in the input.
    pub line_no: usize,
    /// The line, in the seed's vocabulary.
    pub line: LogLine,
    /// When it was logged, in milliseconds since the Unix epoch, if its timestamp could be read.
    pub millis: Option<i64>,
}

/// A line that could not be read, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Malformed {
    /// 1-based line number.
    #[serde(rename = "line")]
    pub line_no: usize,
    /// Why.
    pub reason: String,
}

/// What a log file held.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    /// Lines with a status, a request id, a job id or an idempotency key.
    pub lines: Vec<ParsedLine>,
    /// Lines that could not be read.
    pub malformed: Vec<Malformed>,
    /// Well-formed lines unrelated to inference requests (no id and no status), and the lines of
    /// a Celery banner or traceback.
    pub unrelated: usize,
    /// Blank lines.
    pub blank: usize,
}

/// Parses a whole log (any bytes).
pub fn parse(bytes: &[u8]) -> Parsed {
    let mut parsed = Parsed::default();
    let mut reader = Reader::default();
    let segments: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    let last = segments.len().saturating_sub(1);
    for (index, raw) in segments.into_iter().enumerate() {
        let line_no = index + 1;
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        if raw.iter().all(u8::is_ascii_whitespace) {
            // What follows the final newline is not a line.
            if index != last || !raw.is_empty() {
                parsed.blank += 1;
            }
            continue;
        }
        if raw.len() > MAX_LINE {
            parsed.malformed.push(Malformed {
                line_no,
                reason: format!("line of {} bytes exceeds {MAX_LINE}", raw.len()),
            });
            continue;
        }
        let Ok(text) = std::str::from_utf8(raw) else {
            parsed.malformed.push(Malformed {
                line_no,
                reason: "not UTF-8 text".into(),
            });
            continue;
        };
        match reader.read(text) {
            Ok(Read::Line(line, millis)) => {
                let relevant = ["request_id", "job_id", "idempotency_key", "status"]
                    .iter()
                    .any(|k| line.get(k).is_some());
                if relevant {
                    parsed.lines.push(ParsedLine {
                        line_no,
                        line,
                        millis,
                    });
                } else {
                    parsed.unrelated += 1;
                }
            }
            Ok(Read::Skip) => parsed.unrelated += 1,
            Err(reason) => parsed.malformed.push(Malformed { line_no, reason }),
        }
    }
    parsed
}

/// Parses one line on its own (JSON, logfmt or Celery), with no knowledge of the lines before it.
pub fn parse_line(text: &str) -> Result<LogLine, String> {
    match Reader::default().read(text)? {
        Read::Line(line, _) => Ok(line),
        Read::Skip => Err("a Celery banner or traceback line, not a log record".into()),
    }
}

/// The status word a status or message names, if exactly one does: the word itself in any
/// spelling (`cache_hit`, `cache-hit`, `CacheHit`, `cache hit`), else a known phrasing
/// (`served from cache`, `calling model backend`, `message acknowledged`, ...). Of several
/// phrasings that match, the most specific (most words) wins; a tie between two statuses is
/// ambiguous and gives `None`.
pub fn status_of(text: &str) -> Option<Status> {
    let words = words(text);
    if words.is_empty() {
        return None;
    }
    if words.len() <= 4 {
        let joined = words.join("_");
        if let Some(status) = Status::ALL.into_iter().find(|s| s.as_str() == joined) {
            return Some(status);
        }
    }
    let mut best: Option<(usize, Status)> = None;
    let mut tied = false;
    for (status, phrasings) in PHRASINGS {
        for phrasing in *phrasings {
            if !phrasing.iter().all(|w| words.iter().any(|x| x == w)) {
                continue;
            }
            match best {
                Some((len, other)) if len == phrasing.len() && other != *status => tied = true,
                Some((len, _)) if len >= phrasing.len() => {}
                _ => {
                    best = Some((phrasing.len(), *status));
                    tied = false;
                }
            }
        }
    }
    if tied { None } else { best.map(|(_, s)| s) }
}

/// Known phrasings of each status word: every word of one phrasing must appear in the text (in
/// any order). Words are lower case; `words` splits camelCase and punctuation.
const PHRASINGS: &[(Status, &[&[&str]])] = &[
    (
        Status::JobReceived,
        &[&["received"], &["dequeued"], &["picked", "up"]],
    ),
    (
        Status::RetryDispatched,
        &[
            &["retry", "dispatched"],
            &["redelivered"],
            &["redelivery"],
            &["retry", "started"],
            &["retry", "received"],
        ],
    ),
    (
        Status::LeaseAcquired,
        &[
            &["lease", "acquired"],
            &["lock", "acquired"],
            &["acquired", "lease"],
            &["acquired", "lock"],
        ],
    ),
    (
        Status::DuplicateSkipped,
        &[
            &["duplicate"],
            &["already", "running"],
            &["already", "in", "progress"],
        ],
    ),
    (
        Status::AlreadyCompleted,
        &[
            &["already", "completed"],
            &["already", "succeeded"],
            &["already", "done"],
        ],
    ),
    (
        Status::JobTaken,
        &[&["job", "taken"], &["marked", "in", "progress"]],
    ),
    (Status::VersionDeclined, &[&["declined"]]),
    (
        Status::CacheHit,
        &[&["cache", "hit"], &["served", "from", "cache"]],
    ),
    (Status::CacheMiss, &[&["cache", "miss"]]),
    (
        Status::InferenceStarted,
        &[
            &["inference", "started"],
            &["started", "inference"],
            &["calling", "model"],
            &["calling", "backend"],
            &["model", "call", "started"],
        ],
    ),
    (
        Status::TimeoutWaitingUpstream,
        &[
            &["timeout", "waiting"],
            &["timed", "out", "waiting"],
            &["upstream", "timeout"],
            &["still", "waiting"],
        ],
    ),
    (
        Status::UpstreamFailed,
        &[
            &["upstream", "failed"],
            &["backend", "failed"],
            &["backend", "error"],
            &["inference", "failed"],
            &["model", "call", "failed"],
        ],
    ),
    (
        Status::CacheWritten,
        &[
            &["cache", "written"],
            &["cache", "set"],
            &["cached", "result"],
            &["wrote", "cache"],
        ],
    ),
    (
        Status::InferenceSucceeded,
        &[
            &["inference", "succeeded"],
            &["succeeded"],
            &["result", "stored"],
            &["result", "written"],
            &["wrote", "result"],
            &["completed", "successfully"],
        ],
    ),
    (
        Status::LateSuccess,
        &[&["late", "success"], &["late", "result", "written"]],
    ),
    (
        Status::OverwriteDetected,
        &[&["overwrite"], &["overwrote"], &["overwritten"]],
    ),
    (
        Status::LateWriteRejected,
        &[
            &["late", "write", "rejected"],
            &["write", "rejected"],
            &["stale", "write", "rejected"],
        ],
    ),
    (Status::DiscardedLateResult, &[&["discarded"]]),
    (
        Status::Acked,
        &[
            &["acked"],
            &["acknowledged"],
            &["ack", "sent"],
            &["message", "deleted"],
        ],
    ),
    (Status::LeftForRedelivery, &[&["left", "for", "redelivery"]]),
    (
        Status::LeaseReleased,
        &[&["lease", "released"], &["lock", "released"]],
    ),
    (
        Status::LeaseLost,
        &[
            &["lease", "lost"],
            &["lock", "lost"],
            &["lease", "expired"],
            &["lock", "expired"],
        ],
    ),
    (Status::AttemptError, &[&["attempt", "error"]]),
    (
        Status::Cutover,
        &[
            &["cutover"],
            &["rollout", "started"],
            &["switched", "active"],
            &["active", "version", "switched"],
            &["traffic", "switched"],
        ],
    ),
    (
        Status::CacheInvalidated,
        &[
            &["cache", "invalidated"],
            &["cache", "invalidation", "finished"],
            &["cache", "invalidation", "done"],
            &["cache", "invalidation", "complete"],
            &["cache", "invalidation", "completed"],
            &["cache", "flushed"],
            &["cache", "purged"],
        ],
    ),
    (
        Status::WorkerStarted,
        &[
            &["worker", "started"],
            &["worker", "ready"],
            &["worker", "online"],
            &["starting", "worker"],
        ],
    ),
    (
        Status::WorkerLost,
        &[
            &["worker", "lost"],
            &["worker", "crashed"],
            &["worker", "killed"],
            &["exited", "prematurely"],
            &["exited", "with", "signal"],
        ],
    ),
    (
        Status::JobFailed,
        &[
            &["job", "failed"],
            &["task", "failed"],
            &["raised", "unexpected"],
        ],
    ),
    (
        Status::RetryScheduled,
        &[
            &["retry", "scheduled"],
            &["scheduling", "retry"],
            &["will", "retry"],
            &["retry", "in"],
        ],
    ),
    (
        Status::DeliveriesRestored,
        &[
            &["restoring", "unacknowledged"],
            &["restored", "unacknowledged"],
        ],
    ),
];

/// Lower-case words of a text: split at anything not alphanumeric and at camelCase humps. At
/// most 64 words: a status is said in the first few.
fn words(text: &str) -> Vec<String> {
    let mut words: Vec<String> = Vec::new();
    let mut current = String::new();
    let mut previous_lower = false;
    for c in text.chars() {
        if !c.is_alphanumeric() {
            if !current.is_empty() {
                words.push(std::mem::take(&mut current));
            }
            previous_lower = false;
        } else {
            if c.is_uppercase() && previous_lower && !current.is_empty() {
                words.push(std::mem::take(&mut current));
            }
            previous_lower = c.is_lowercase() || c.is_ascii_digit();
            current.extend(c.to_lowercase());
        }
        if words.len() >= 64 {
            return words;
        }
    }
    if !current.is_empty() {
        words.push(current);
    }
    words
}

/// What a field name means once spellings are folded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Meaning {
    /// The line's timestamp.
    Ts,
    /// The line's level.
    Level,
    /// A status or a message that may name one; lower ranks are tried first.
    Message(u8),
    /// A seed field.
    Field(&'static str),
    /// `model` or `version`: the model version only when nothing else names it and the value
    /// looks like one (`v2`, `v2.1`).
    MaybeVersion,
    /// A retry count: the attempt is one more.
    Retries,
}

/// The seed's name for a field spelled `key` (case, `_`, `-`, `.` and `@` ignored), if it is one
/// of the diagnosis fields.
pub fn canonical_field(key: &str) -> Option<&'static str> {
    match meaning(key)? {
        Meaning::Field(name) => Some(name),
        Meaning::Retries => Some("attempt"),
        Meaning::MaybeVersion => Some("model_version"),
        Meaning::Ts => Some("ts"),
        Meaning::Level => Some("level"),
        Meaning::Message(_) => Some("status"),
    }
}

fn meaning(key: &str) -> Option<Meaning> {
    let folded: String = key
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    Some(match folded.as_str() {
        "ts" | "time" | "timestamp" | "asctime" | "datetime" => Meaning::Ts,
        "level" | "severity" | "lvl" | "levelname" | "loglevel" => Meaning::Level,
        "status" => Meaning::Message(0),
        "event" => Meaning::Message(1),
        "msg" => Meaning::Message(2),
        "message" => Meaning::Message(3),
        "requestid" | "reqid" | "xrequestid" => Meaning::Field("request_id"),
        "jobid" | "taskid" => Meaning::Field("job_id"),
        "idempotencykey" | "idempotencyid" | "dedupekey" | "dedupkey" | "dedupeid" => {
            Meaning::Field("idempotency_key")
        }
        "workerid" | "worker" | "workername" | "hostname" => Meaning::Field("worker_id"),
        "modelversion" => Meaning::Field("model_version"),
        "model" | "version" => Meaning::MaybeVersion,
        "attempt" | "attemptnumber" | "attemptno" => Meaning::Field("attempt"),
        "retries" | "retrycount" | "retrynumber" => Meaning::Retries,
        "queuereceivecount" | "receivecount" | "deliverycount" | "approximatereceivecount" => {
            Meaning::Field("queue_receive_count")
        }
        "backendendpoint" | "backend" | "endpoint" | "backendurl" | "modelendpoint" => {
            Meaning::Field("backend_endpoint")
        }
        "cachekey" => Meaning::Field("cache_key"),
        "servedmodelversion" | "servedversion" => Meaning::Field("served_model_version"),
        "cachedmodelversion" | "cachedversion" => Meaning::Field("cached_model_version"),
        "previousmodelversion"
        | "previousversion"
        | "fromversion"
        | "oldversion"
        | "frommodelversion" => Meaning::Field("previous_model_version"),
        "newmodelversion" | "newversion" | "toversion" | "targetversion" | "tomodelversion" => {
            Meaning::Field("new_model_version")
        }
        _ => return None,
    })
}

/// `v2`, `v2.1`, `v10-canary`: a value that can only be a model version.
fn looks_like_version(value: &str) -> bool {
    let mut chars = value.chars();
    matches!(chars.next(), Some('v' | 'V')) && chars.next().is_some_and(|c| c.is_ascii_digit())
}

/// Reads a timestamp: RFC 3339 (`Z` or an offset), `YYYY-MM-DD HH:MM:SS,mmm` or with `.`/`T`
/// (no zone: UTC), or epoch seconds, milliseconds, microseconds or nanoseconds.
pub fn read_timestamp(raw: &str) -> Option<jiff::Timestamp> {
    let text = raw.trim().trim_matches(|c| c == '[' || c == ']');
    if text.is_empty() || text.len() > 64 {
        return None;
    }
    if text.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        let value: f64 = text.parse().ok()?;
        let seconds = match value {
            v if v < 1e11 => v,
            v if v < 1e14 => v / 1e3,
            v if v < 1e17 => v / 1e6,
            v => v / 1e9,
        };
        if !seconds.is_finite() {
            return None;
        }
        let millis = (seconds * 1000.0).round();
        if millis.abs() > 2.5e14 {
            return None;
        }
        return jiff::Timestamp::from_millisecond(millis as i64).ok();
    }
    let bytes = text.as_bytes();
    if bytes.len() < 19 || !bytes[0].is_ascii_digit() || bytes[4] != b'-' {
        return None;
    }
    let mut normal = text.replace(',', ".");
    if normal.as_bytes().get(10) == Some(&b' ') {
        normal.replace_range(10..11, "T");
    }
    if let Ok(ts) = normal.parse::<jiff::Timestamp>() {
        return Some(ts);
    }
    let civil: jiff::civil::DateTime = normal.parse().ok()?;
    civil
        .to_zoned(jiff::tz::TimeZone::UTC)
        .ok()
        .map(|z| z.timestamp())
}

fn level_of(word: &str) -> Option<Level> {
    let word = word.trim_matches(|c: char| c == '[' || c == ']' || c == ':');
    match word.to_ascii_uppercase().as_str() {
        "INFO" | "DEBUG" | "TRACE" | "NOTICE" | "I" | "D" | "10" | "20" | "30" => Some(Level::Info),
        "WARN" | "WARNING" | "W" | "40" => Some(Level::Warn),
        "ERROR" | "ERR" | "FATAL" | "CRITICAL" | "CRIT" | "E" | "50" | "60" => Some(Level::Error),
        _ => None,
    }
}

/// A line before canonicalisation.
#[derive(Debug, Default)]
struct Raw {
    ts: Option<String>,
    level: Option<String>,
    fields: Vec<(String, String)>,
    /// The worker the line came from when it does not say (prefix or Celery hostname).
    worker: Option<String>,
}

/// What one line was.
enum Read {
    Line(LogLine, Option<i64>),
    /// A line that belongs to something else (Celery's banner, a traceback).
    Skip,
}

/// Reads lines in order, remembering what spans lines: Celery hostnames from start lines (per
/// prefix), whether a banner or a traceback is running, and which streams (per prefix) are a
/// Python process's, whose lines that are no record continue a multi-line message.
#[derive(Debug, Default)]
struct Reader {
    hostnames: HashMap<String, String>,
    banner: bool,
    traceback: bool,
    python: std::collections::HashSet<String>,
}

static COMPOSE_PREFIX: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^([A-Za-z0-9][\w.@-]*)\s+\|\s?(.*)$").expect("valid regex"));
static KUBECTL_PREFIX: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\[pod/([^/\]\s]+)/[^\]\s]*\]\s?(.*)$").expect("valid regex"));
static CELERY_LINE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^\[(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[,.]\d+)?): ([A-Za-z]+)/([^\]]+)\]\s?(.*)$",
    )
    .expect("valid regex")
});
static CELERY_BANNER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"-+ (\S+@\S+) v\d").expect("valid regex"));
static CELERY_READY: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^(\S+@\S+) ready\.?$").expect("valid regex"));
static CELERY_TASK: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^(?:Task ([^\s\[]+)\[([^\]\s]+)\] (.*)|Received task: ([^\s\[]+)\[([^\]\s]+)\].*)$",
    )
    .expect("valid regex")
});
static CELERY_SUCCEEDED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^succeeded in ([0-9.eE+-]+)s(?::\s?(.*))?$").expect("valid regex")
});
static CELERY_RETRY_IN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"Retry in ([0-9.]+)s").expect("valid regex"));
static CELERY_RESTORING: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^Restoring (\d+) unacknowledged message").expect("valid regex"));
/// Python's `warnings` output: `path/to/module.py:893: SecurityWarning: message`.
static PYTHON_WARNING: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\S+\.py:\d+: [A-Za-z_]*(?:Warning|Error): ").expect("valid regex")
});
static CELERY_TASK_LOGGER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^([^\s\[]+)\[([^\]\s]+)\]: (.*)$").expect("valid regex"));

impl Reader {
    fn read(&mut self, text: &str) -> Result<Read, String> {
        let (source, rest) = split_source(text);
        let body = rest.trim();
        let stream = source.unwrap_or("");
        if body.is_empty() {
            // A blank line behind a `compose logs` prefix.
            return Ok(Read::Skip);
        }
        if PYTHON_WARNING.is_match(body) {
            self.python.insert(stream.to_owned());
            return Ok(Read::Skip);
        }
        if self.traceback {
            if rest.starts_with(char::is_whitespace) {
                return Ok(Read::Skip);
            }
            self.traceback = false;
            // The line that closes a traceback names the exception; a record after it is read.
            if !looks_like_a_record(body) {
                return Ok(Read::Skip);
            }
        }
        if body.starts_with('{') {
            self.banner = false;
            let mut raw = json_fields(body)?;
            raw.worker = source.map(str::to_owned);
            return Ok(finish(raw));
        }
        if let Some(captures) = CELERY_LINE.captures(body) {
            self.banner = false;
            self.python.insert(stream.to_owned());
            let group = |i| captures.get(i).map_or("", |m| m.as_str());
            return Ok(self.celery(source, group(1), group(2), group(3).trim(), group(4).trim()));
        }
        if body.starts_with("--")
            && let Some(captures) = CELERY_BANNER.captures(body)
        {
            self.banner = true;
            self.python.insert(stream.to_owned());
            self.hostnames
                .insert(source.unwrap_or("").to_owned(), captures[1].to_owned());
            return Ok(Read::Skip);
        }
        if body.starts_with("Traceback (most recent call last)") {
            self.traceback = true;
            return Ok(Read::Skip);
        }
        if self.banner {
            if !looks_like_a_record(body) {
                return Ok(Read::Skip);
            }
            self.banner = false;
        }
        let mut raw = match logfmt(body) {
            Ok(raw) => raw,
            // A multi-line message of a Python process continues on lines of free text.
            Err(_) if self.python.contains(stream) && !looks_like_a_record(body) => {
                return Ok(Read::Skip);
            }
            // A framework's own free-text record (`TIMESTAMP LEVEL message`, as tracing's and
            // logging's default formats write "Worker w-1 started"): well formed, about nothing
            // a request did.
            Err(_) if free_text_record(body) => return Ok(Read::Skip),
            Err(err) => return Err(err),
        };
        raw.worker = source.map(str::to_owned);
        Ok(finish(raw))
    }

    /// A Celery worker line: timestamp, level, process, message.
    fn celery(
        &mut self,
        source: Option<&str>,
        ts: &str,
        level: &str,
        process: &str,
        message: &str,
    ) -> Read {
        let key = source.unwrap_or("").to_owned();
        if let Some(captures) = CELERY_READY.captures(message) {
            self.hostnames.insert(key.clone(), captures[1].to_owned());
        }
        let known = self
            .hostnames
            .get(&key)
            .cloned()
            .or_else(|| source.map(str::to_owned));
        let mut fields = vec![("process".to_owned(), process.to_owned())];
        if CELERY_READY.is_match(message) {
            fields.push((
                "status".to_owned(),
                Status::WorkerStarted.as_str().to_owned(),
            ));
        } else if !celery_message(message, &mut fields) {
            fields.push(("msg".to_owned(), message.to_owned()));
        }
        // The process that logged the line is Celery's worker, whatever name the task's own
        // message gives it (`worker_id=pod-7` of an app setting): Celery's own lines of the same
        // attempt (`received`, `succeeded in`) carry the hostname, and one attempt must have one
        // worker. The task's name for it stays, as `logged_worker_id`.
        if known.is_some() {
            for (key, _) in fields.iter_mut() {
                if matches!(meaning(key), Some(Meaning::Field("worker_id"))) {
                    *key = "logged_worker_id".to_owned();
                }
            }
        }
        let worker = known
            .or_else(|| field_value(&fields, "worker_id"))
            .unwrap_or_else(|| "celery".to_owned());
        let raw = Raw {
            ts: Some(ts.to_owned()),
            level: Some(level.to_owned()),
            fields,
            worker: Some(worker),
        };
        finish(raw)
    }
}

/// The value of the first field meaning `seed_name`, whatever its spelling.
fn field_value(fields: &[(String, String)], seed_name: &str) -> Option<String> {
    fields
        .iter()
        .find(|(k, _)| matches!(meaning(k), Some(Meaning::Field(name)) if name == seed_name))
        .map(|(_, v)| v.clone())
}

fn finish(raw: Raw) -> Read {
    let (line, millis) = canonical(raw);
    Read::Line(line, millis)
}

/// Reads a Celery message (from a Celery line, or the `message` of a JSON-formatted Celery log)
/// into fields; false if it is none of Celery's known messages.
fn celery_message(message: &str, fields: &mut Vec<(String, String)>) -> bool {
    let mut push = |k: &str, v: &str| fields.push((k.to_owned(), v.to_owned()));
    if let Some(captures) = CELERY_TASK.captures(message) {
        let (name, id, rest) = match (captures.get(1), captures.get(2), captures.get(4)) {
            (Some(name), Some(id), _) => (
                name.as_str(),
                id.as_str(),
                captures.get(3).map_or("", |m| m.as_str()),
            ),
            (_, _, Some(name)) => (
                name.as_str(),
                captures.get(5).map_or("", |m| m.as_str()),
                "received",
            ),
            _ => return false,
        };
        push("task_name", name);
        push("job_id", id);
        if rest == "received" {
            push("status", Status::JobReceived.as_str());
        } else if let Some(succeeded) = CELERY_SUCCEEDED.captures(rest) {
            push("status", Status::InferenceSucceeded.as_str());
            push("write", "result_store");
            push("runtime_s", &succeeded[1]);
            if let Some(result) = succeeded.get(2) {
                push("result", result.as_str());
            }
        } else if let Some(error) = rest.strip_prefix("raised unexpected:") {
            push("status", Status::JobFailed.as_str());
            push("error", error.trim());
        } else if let Some(reason) = rest.strip_prefix("retry:") {
            push("status", Status::RetryScheduled.as_str());
            if let Some(countdown) = CELERY_RETRY_IN.captures(reason) {
                push("countdown_s", &countdown[1]);
            }
            push("reason", reason.trim());
        } else {
            push("status", rest);
        }
        return true;
    }
    if let Some(captures) = CELERY_RESTORING.captures(message) {
        push("status", Status::DeliveriesRestored.as_str());
        push("restored", &captures[1]);
        return true;
    }
    if let Some(captures) = CELERY_TASK_LOGGER.captures(message) {
        push("task_name", &captures[1]);
        push("job_id", &captures[2]);
        // A task's own message may carry key=value pairs; bare words are its message.
        match logfmt_fields(&captures[3]) {
            Ok((pairs, bare)) => {
                fields.extend(pairs);
                if !bare.is_empty() {
                    let words: Vec<String> = bare.into_iter().map(|(_, w)| w).collect();
                    fields.push(("msg".to_owned(), words.join(" ")));
                }
            }
            Err(_) => fields.push(("msg".to_owned(), captures[3].to_owned())),
        }
        return true;
    }
    false
}

/// Splits a `docker compose logs` or `kubectl logs --prefix` prefix off a line.
fn split_source(text: &str) -> (Option<&str>, &str) {
    if text.starts_with("[pod/")
        && let Some(captures) = KUBECTL_PREFIX.captures(text)
        && let (Some(name), Some(rest)) = (captures.get(1), captures.get(2))
    {
        return (Some(name.as_str()), rest.as_str());
    }
    if text.contains('|')
        && let Some(captures) = COMPOSE_PREFIX.captures(text)
        && let (Some(name), Some(rest)) = (captures.get(1), captures.get(2))
    {
        return (Some(name.as_str()), rest.as_str());
    }
    (None, text)
}

/// Whether a line starts like a log record (a JSON object, a timestamp, a Celery bracket).
/// A timestamp (one word, or a date and a time), a level, then words: a record with a message
/// and no fields.
fn free_text_record(body: &str) -> bool {
    let words: Vec<&str> = body.split_whitespace().take(4).collect();
    let level_at = match words.as_slice() {
        [first, ..] if read_timestamp(first).is_some() => 1,
        [date, time, ..] if read_timestamp(&format!("{date} {time}")).is_some() => 2,
        _ => return false,
    };
    words.len() > level_at + 1 && level_of(words[level_at]).is_some()
}

fn looks_like_a_record(body: &str) -> bool {
    let bytes = body.as_bytes();
    match bytes.first() {
        Some(b'{') => true,
        Some(b'[') => bytes.get(1).is_some_and(u8::is_ascii_digit),
        Some(b) => b.is_ascii_digit(),
        None => false,
    }
}

/// Flattens a JSON object into dotted keys (arrays stay JSON text).
fn json_fields(text: &str) -> Result<Raw, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|err| format!("invalid JSON: {err}"))?;
    let serde_json::Value::Object(object) = value else {
        return Err("JSON line is not an object".to_owned());
    };
    let mut fields = Vec::new();
    flatten("", object, &mut fields);
    let mut raw = Raw {
        fields,
        ..Raw::default()
    };
    // A Celery log through a JSON formatter: its message is one of Celery's.
    let message = raw
        .fields
        .iter()
        .find(|(k, _)| matches!(meaning(k), Some(Meaning::Message(2 | 3))))
        .map(|(_, v)| v.clone());
    if let Some(message) = message {
        let mut extra = Vec::new();
        if celery_message(&message, &mut extra) {
            raw.fields.extend(
                extra
                    .into_iter()
                    .filter(|(k, _)| k != "status" || status_of(&message).is_none()),
            );
        }
    }
    Ok(raw)
}

fn flatten(
    prefix: &str,
    object: serde_json::Map<String, serde_json::Value>,
    out: &mut Vec<(String, String)>,
) {
    for (key, value) in object {
        let key = if prefix.is_empty() {
            key
        } else {
            format!("{prefix}.{key}")
        };
        match value {
            serde_json::Value::Object(inner) => flatten(&key, inner, out),
            serde_json::Value::String(s) => out.push((key, s)),
            serde_json::Value::Null => {}
            other => out.push((key, other.to_string())),
        }
    }
}

/// A logfmt line: leading timestamp (one word, or Python's date and time) and level, then
/// key=value pairs; bare words are the message.
fn logfmt(text: &str) -> Result<Raw, String> {
    let (pairs, bare) = logfmt_fields(text)?;
    if pairs.is_empty() {
        return Err("no key=value fields".into());
    }
    let mut raw = Raw::default();
    let mut bare = bare.into_iter().peekable();
    // Only words before the first pair can be the head; logfmt_fields keeps their order.
    if let Some(first) = bare.peek()
        && first.0 == 0
        && first.1.starts_with(|c: char| c.is_ascii_digit())
    {
        let (_, word) = bare.next().unwrap_or_default();
        raw.ts = Some(word);
        if let Some(next) = bare.peek()
            && next.0 == 1
            && next.1.len() >= 8
            && next.1.as_bytes()[2] == b':'
            && next.1.starts_with(|c: char| c.is_ascii_digit())
            && let Some(ts) = raw.ts.as_mut()
        {
            ts.push(' ');
            ts.push_str(&next.1);
            bare.next();
        }
    }
    if let Some(next) = bare.peek()
        && next.0 <= 2
        && level_of(&next.1).is_some()
    {
        raw.level = bare.next().map(|(_, w)| w);
    }
    let message: Vec<String> = bare.map(|(_, w)| w).collect();
    raw.fields = pairs;
    if !message.is_empty() {
        raw.fields.push(("msg".to_owned(), message.join(" ")));
    }
    Ok(raw)
}

/// key=value pairs (values quoted with `"` and `\` escapes, or bare) and bare words with their
/// position among the tokens.
#[allow(clippy::type_complexity)]
fn logfmt_fields(text: &str) -> Result<(Vec<(String, String)>, Vec<(usize, String)>), String> {
    let mut fields = Vec::new();
    let mut bare = Vec::new();
    let mut token = 0;
    let mut chars = text.char_indices().peekable();
    while let Some(&(start, c)) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        let mut key_end = start;
        while let Some(&(i, c)) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key_end = i + c.len_utf8();
            chars.next();
        }
        let key = &text[start..key_end];
        if !matches!(chars.peek(), Some(&(_, '='))) {
            bare.push((token, key.to_owned()));
            token += 1;
            continue;
        }
        chars.next();
        if key.is_empty() {
            return Err("empty key before '='".into());
        }
        let value = match chars.peek() {
            Some(&(_, '"')) => {
                chars.next();
                let mut value = String::new();
                let mut closed = false;
                while let Some((_, c)) = chars.next() {
                    match c {
                        '\\' => match chars.next() {
                            Some((_, escaped)) => value.push(escaped),
                            None => break,
                        },
                        '"' => {
                            closed = true;
                            break;
                        }
                        other => value.push(other),
                    }
                }
                if !closed {
                    return Err(format!("unterminated quoted value of {key}"));
                }
                value
            }
            _ => {
                let mut value = String::new();
                while let Some(&(_, c)) = chars.peek() {
                    if c.is_whitespace() {
                        break;
                    }
                    value.push(c);
                    chars.next();
                }
                value
            }
        };
        fields.push((key.to_owned(), value));
        token += 1;
    }
    Ok((fields, bare))
}

/// Folds a raw line into the seed's vocabulary.
fn canonical(raw: Raw) -> (LogLine, Option<i64>) {
    let mut ts = raw.ts;
    let mut level = raw.level.as_deref().and_then(level_of);
    let mut fields: Vec<(String, String)> = Vec::with_capacity(raw.fields.len() + 2);
    // (rank, value, index in `fields`): messages stay where they were written.
    let mut messages: Vec<(u8, String, usize)> = Vec::new();
    let mut maybe_version: Option<String> = None;
    let mut retries: Option<String> = None;
    let has = |fields: &[(String, String)], name: &str| fields.iter().any(|(k, _)| k == name);
    for (key, value) in raw.fields {
        match meaning(&key) {
            Some(Meaning::Ts) if ts.is_none() => ts = Some(value),
            Some(Meaning::Level) if level.is_none() && level_of(&value).is_some() => {
                level = level_of(&value);
            }
            Some(Meaning::Message(rank)) => {
                messages.push((rank, value.clone(), fields.len()));
                fields.push((key, value));
            }
            Some(Meaning::Field(name)) if !has(&fields, name) => {
                fields.push((name.to_owned(), value));
            }
            Some(Meaning::MaybeVersion) if looks_like_version(&value) => {
                maybe_version.get_or_insert(value.clone());
                fields.push((key, value));
            }
            Some(Meaning::Retries) => {
                retries.get_or_insert(value.clone());
                fields.push((key, value));
            }
            _ => fields.push((key, value)),
        }
    }
    if !has(&fields, "model_version")
        && let Some(version) = maybe_version
    {
        fields.push(("model_version".to_owned(), version));
    }
    if !has(&fields, "attempt")
        && let Some(retries) = retries.and_then(|r| r.trim().parse::<u32>().ok())
    {
        fields.push((
            "attempt".to_owned(),
            (retries.saturating_add(1)).to_string(),
        ));
    }
    if !has(&fields, "worker_id")
        && let Some(worker) = raw.worker
    {
        fields.push(("worker_id".to_owned(), worker));
    }
    // The status: the first candidate (status, event, msg, message) that names a status word;
    // else an explicit status or event, raw. It takes the place of an explicit `status` (whose
    // raw text, if different, stays as `status_text`); messages stay as they were written.
    messages.sort_by_key(|(rank, _, _)| *rank);
    let status = messages
        .iter()
        .find_map(|(_, value, _)| status_of(value).map(|w| w.as_str().to_owned()))
        .or_else(|| {
            messages
                .iter()
                .find(|(rank, _, _)| *rank <= 1)
                .map(|(_, value, _)| value.clone())
        });
    if let Some(status) = status {
        match messages.iter().find(|(rank, _, _)| *rank == 0) {
            Some((_, raw, index)) => {
                if *raw != status {
                    fields.push(("status_text".to_owned(), raw.clone()));
                }
                fields[*index] = ("status".to_owned(), status);
            }
            None => fields.push(("status".to_owned(), status)),
        }
    }
    let at = ts.as_deref().and_then(read_timestamp);
    let line = LogLine {
        ts: match at {
            Some(at) => format_timestamp(at),
            None => ts.unwrap_or_default(),
        },
        level: level.unwrap_or(Level::Info),
        fields,
    };
    (line, at.map(|at| at.as_millisecond()))
}

#[cfg(test)]
pub(crate) mod tests;
