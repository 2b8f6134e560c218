//! The parser on lines as teams write them, and fuzzed.

use super::*;
use proptest::prelude::*;

fn one(text: &str) -> LogLine {
    parse_line(text).unwrap_or_else(|err| panic!("{text}: {err}"))
}

#[test]
fn reads_the_seed_shape_json_and_shuffled_fields() {
    let line = one(
        "2026-06-26T10:15:24.031Z WARN request_id=req-91 attempt=1 status=timeout_waiting_upstream",
    );
    assert_eq!(line.ts, "2026-06-26T10:15:24.031Z");
    assert_eq!(line.level, Level::Warn);
    assert_eq!(line.status_word(), Some(Status::TimeoutWaitingUpstream));
    let shuffled =
        one("status=cache_miss note=\"two words \\\"quoted\\\"\" request_id=req-9 path=C:\\\\x");
    assert_eq!(shuffled.get("request_id"), Some("req-9"));
    assert_eq!(shuffled.get("note"), Some("two words \"quoted\""));
    assert_eq!(shuffled.get("path"), Some("C:\\\\x"));
    let json =
        one(r#"{"level":"info","ts":"t","request_id":"r","attempt":2,"status":"late_success"}"#);
    assert_eq!(json.get("attempt"), Some("2"));
    assert_eq!(json.status_word(), Some(Status::LateSuccess));
    assert!(parse_line("just some words").is_err());
    assert!(parse_line("key=\"unterminated").is_err());
    assert!(parse_line("=value").is_err());
}

#[test]
fn common_spellings_take_the_seed_names() {
    let line = one(
        "ts=2026-06-26T10:15:21.104Z severity=warning requestId=req-1 jobId=job-1 \
         dedupe_key=k-1 workerId=w-1 modelVersion=v2 retries=2 delivery_count=3 \
         backend=model-b cacheKey=inf:v2:x event=CacheHit",
    );
    let get = |k| line.get(k);
    assert_eq!(line.ts, "2026-06-26T10:15:21.104Z");
    assert_eq!(line.level, Level::Warn);
    assert_eq!(get("request_id"), Some("req-1"));
    assert_eq!(get("job_id"), Some("job-1"));
    assert_eq!(get("idempotency_key"), Some("k-1"));
    assert_eq!(get("worker_id"), Some("w-1"));
    assert_eq!(get("model_version"), Some("v2"));
    assert_eq!(get("attempt"), Some("3"), "retries=2 is the third attempt");
    assert_eq!(get("queue_receive_count"), Some("3"));
    assert_eq!(get("backend_endpoint"), Some("model-b"));
    assert_eq!(get("cache_key"), Some("inf:v2:x"));
    assert_eq!(line.status_word(), Some(Status::CacheHit));
    for (spelling, field) in [
        ("req_id", "request_id"),
        ("request-id", "request_id"),
        ("task_id", "job_id"),
        ("taskId", "job_id"),
        ("idempotencyKey", "idempotency_key"),
        ("hostname", "worker_id"),
        ("worker", "worker_id"),
        ("receive_count", "queue_receive_count"),
        ("retry_count", "attempt"),
    ] {
        let line = one(&format!("{spelling}=1 status=cache_miss"));
        let expected = if field == "attempt" { "2" } else { "1" };
        assert_eq!(line.get(field), Some(expected), "{spelling}");
    }
    assert_eq!(canonical_field("x-request-id"), Some("request_id"));
    assert_eq!(canonical_field("@timestamp"), Some("ts"));
    assert_eq!(
        canonical_field("queue.receive_count"),
        Some("queue_receive_count")
    );
    assert_eq!(canonical_field("colour"), None);
    // `version` and `model` name the model version only when the value can be nothing else.
    assert_eq!(
        one("request_id=r version=1.2 status=cache_miss").get("model_version"),
        None
    );
    assert_eq!(
        one("request_id=r model=resnet status=cache_miss").get("model_version"),
        None
    );
    assert_eq!(
        one("request_id=r model=v2 status=cache_miss").get("model_version"),
        Some("v2")
    );
    assert_eq!(
        one("request_id=r model_version=v1 version=v2 status=cache_miss").get("model_version"),
        Some("v1")
    );
}

#[test]
fn nested_json_is_flattened_then_folded() {
    let line = one(
        r#"{"@timestamp":"2026-06-26T12:15:21.104+02:00","log":{"level":"warning"},"request":{"id":"req-1"},"model":{"version":"v2"},"worker":{"id":"w-1"},"event":"CacheHit","cache":{"key":"inf:v1:x","hit":true},"tags":["a","b"],"span":null}"#,
    );
    assert_eq!(line.ts, "2026-06-26T10:15:21.104Z");
    assert_eq!(line.level, Level::Warn);
    assert_eq!(line.get("request_id"), Some("req-1"));
    assert_eq!(line.get("model_version"), Some("v2"));
    assert_eq!(line.get("worker_id"), Some("w-1"));
    assert_eq!(line.get("cache_key"), Some("inf:v1:x"));
    assert_eq!(line.get("cache.hit"), Some("true"));
    assert_eq!(line.get("tags"), Some(r#"["a","b"]"#));
    assert_eq!(line.get("span"), None);
    assert_eq!(line.status_word(), Some(Status::CacheHit));
    assert!(parse_line("[1, 2]").is_err());
    assert!(
        parse_line(r#"{"request_id":"r","#)
            .unwrap_err()
            .starts_with("invalid JSON")
    );
}

#[test]
fn timestamps_in_every_common_shape() {
    let at = |s: &str| read_timestamp(s).map(format_timestamp);
    let expected = Some("2026-06-26T10:15:21.104Z".to_owned());
    for shape in [
        "2026-06-26T10:15:21.104Z",
        "2026-06-26T12:15:21.104+02:00",
        "2026-06-26 10:15:21,104",
        "2026-06-26 10:15:21.104",
        "2026-06-26T10:15:21.104",
        "[2026-06-26T10:15:21.104Z]",
        "1782468921.104",
        "1782468921104",
        "1782468921104000",
        "1782468921104000000",
    ] {
        assert_eq!(at(shape), expected, "{shape}");
    }
    for bad in [
        "",
        "yesterday",
        "2026-13-45T99:99:99Z",
        "9".repeat(80).as_str(),
    ] {
        assert_eq!(at(bad), None, "{bad}");
    }
    let python = one("2026-06-26 10:15:21,104 WARNING worker request_id=r status=cache_miss");
    assert_eq!(python.ts, "2026-06-26T10:15:21.104Z");
    assert_eq!(python.level, Level::Warn);
    assert_eq!(python.get("msg"), Some("worker"));
    let epoch = one(r#"{"time":1782468921104,"req_id":"r","msg":"cache miss"}"#);
    assert_eq!(epoch.ts, "2026-06-26T10:15:21.104Z");
    assert_eq!(epoch.status_word(), Some(Status::CacheMiss));
}

#[test]
fn free_text_maps_to_a_status_only_when_unambiguous() {
    for (text, expected) in [
        ("cache hit", Some(Status::CacheHit)),
        ("Cache-Miss", Some(Status::CacheMiss)),
        ("inferenceStarted", Some(Status::InferenceStarted)),
        ("served from cache", Some(Status::CacheHit)),
        (
            "calling model backend model-b",
            Some(Status::InferenceStarted),
        ),
        (
            "still waiting for upstream",
            Some(Status::TimeoutWaitingUpstream),
        ),
        ("result stored", Some(Status::InferenceSucceeded)),
        ("message acknowledged", Some(Status::Acked)),
        ("3 unacknowledged", None),
        (
            "late write rejected: fenced",
            Some(Status::LateWriteRejected),
        ),
        (
            "already succeeded, skipping",
            Some(Status::AlreadyCompleted),
        ),
        (
            "cache invalidation finished",
            Some(Status::CacheInvalidated),
        ),
        ("rollout started: v1 -> v2", Some(Status::Cutover)),
        (
            "Worker exited prematurely: signal 9 (SIGKILL)",
            Some(Status::WorkerLost),
        ),
        // Two statuses with equally specific phrasings: kept raw.
        ("cache hit cache miss", None),
        ("warming up", None),
        ("", None),
    ] {
        assert_eq!(status_of(text), expected, "{text:?}");
    }
    let raw = one("request_id=r msg=\"something odd happened\" status=weird");
    assert_eq!(raw.status(), Some("weird"));
    assert_eq!(raw.get("msg"), Some("something odd happened"));
    let mapped = one("request_id=r status=\"Cache Hit\"");
    assert_eq!(mapped.status_word(), Some(Status::CacheHit));
    assert_eq!(mapped.get("status_text"), Some("Cache Hit"));
    let from_message = one(r#"{"req_id":"r","message":"served from cache"}"#);
    assert_eq!(from_message.status_word(), Some(Status::CacheHit));
    assert_eq!(from_message.get("message"), Some("served from cache"));
}

const CELERY: &str = "\
 -------------- celery@host-a v5.7.0 (recovery)
--- ***** -----
-- ******* ---- Linux-6.1.0-x86_64-with-glibc2.36 2026-06-26 10:15:14
- ** ---------- [config]
- ** ---------- .> app:         tasks:0x7f3c
 -------------- [queues]
                .> celery           exchange=celery(direct) key=celery

[tasks]
  . tasks.infer

[2026-06-26 10:15:15,001: INFO/MainProcess] Connected to redis://redis:6379/0
[2026-06-26 10:15:15,210: INFO/MainProcess] celery@host-a ready.
[2026-06-26 10:15:21,104: INFO/MainProcess] Task tasks.infer[3f2a9c1e-0b6d-4c55-9f8e-1d2c3b4a5f60] received
[2026-06-26 10:15:21,300: INFO/ForkPoolWorker-1] tasks.infer[3f2a9c1e-0b6d-4c55-9f8e-1d2c3b4a5f60]: cache miss model_version=v1 cache_key=inf:abc
[2026-06-26 10:15:33,104: INFO/ForkPoolWorker-1] Task tasks.infer[3f2a9c1e-0b6d-4c55-9f8e-1d2c3b4a5f60] succeeded in 12.00s: {'output': 'x'}
[2026-06-26 10:15:34,000: ERROR/ForkPoolWorker-1] Task tasks.infer[aa] raised unexpected: ValueError('boom')
Traceback (most recent call last):
  File \"/app/tasks.py\", line 12, in infer
    raise ValueError('boom')
ValueError: boom
[2026-06-26 10:15:35,000: INFO/ForkPoolWorker-1] Task tasks.infer[bb] retry: Retry in 5s: TimeoutError()
[2026-06-26 10:15:36,000: WARNING/MainProcess] Restoring 2 unacknowledged message(s)
host-b  | [2026-06-26 10:15:36,500: INFO/MainProcess] Task tasks.infer[3f2a9c1e-0b6d-4c55-9f8e-1d2c3b4a5f60] received
[pod/worker-7d9/celery] [2026-06-26 10:15:37,000: INFO/MainProcess] Received task: tasks.infer[cc]
";

#[test]
fn celery_worker_logs_name_the_job_the_worker_and_what_happened() {
    let parsed = parse(CELERY.as_bytes());
    assert!(parsed.malformed.is_empty(), "{:?}", parsed.malformed);
    let by_line = |n: usize| {
        &parsed
            .lines
            .iter()
            .find(|l| l.line_no == n)
            .unwrap_or_else(|| panic!("line {n} not read: {parsed:?}"))
            .line
    };
    let ready = by_line(13);
    assert_eq!(ready.status_word(), Some(Status::WorkerStarted));
    assert_eq!(ready.get("worker_id"), Some("celery@host-a"));
    let received = by_line(14);
    assert_eq!(received.ts, "2026-06-26T10:15:21.104Z");
    assert_eq!(received.status_word(), Some(Status::JobReceived));
    assert_eq!(
        received.get("job_id"),
        Some("3f2a9c1e-0b6d-4c55-9f8e-1d2c3b4a5f60")
    );
    assert_eq!(received.get("worker_id"), Some("celery@host-a"));
    assert_eq!(received.get("process"), Some("MainProcess"));
    let task_log = by_line(15);
    assert_eq!(task_log.status_word(), Some(Status::CacheMiss));
    assert_eq!(task_log.get("model_version"), Some("v1"));
    assert_eq!(task_log.get("cache_key"), Some("inf:abc"));
    assert_eq!(task_log.get("process"), Some("ForkPoolWorker-1"));
    let succeeded = by_line(16);
    assert_eq!(succeeded.status_word(), Some(Status::InferenceSucceeded));
    assert_eq!(succeeded.get("runtime_s"), Some("12.00"));
    assert_eq!(succeeded.get("write"), Some("result_store"));
    let failed = by_line(17);
    assert_eq!(failed.status_word(), Some(Status::JobFailed));
    assert_eq!(failed.level, Level::Error);
    let retry = by_line(22);
    assert_eq!(retry.status_word(), Some(Status::RetryScheduled));
    assert_eq!(retry.get("countdown_s"), Some("5"));
    let restoring = by_line(23);
    assert_eq!(restoring.status_word(), Some(Status::DeliveriesRestored));
    assert_eq!(restoring.get("restored"), Some("2"));
    assert_eq!(restoring.level, Level::Warn);
    let prefixed = by_line(24);
    assert_eq!(prefixed.get("worker_id"), Some("host-b"));
    assert_eq!(prefixed.status_word(), Some(Status::JobReceived));
    let kubectl = by_line(25);
    assert_eq!(kubectl.get("worker_id"), Some("worker-7d9"));
    assert_eq!(kubectl.get("job_id"), Some("cc"));
    // The banner (9 lines), `Connected to`, and the traceback (4 lines).
    assert_eq!(parsed.unrelated, 9 + 1 + 4, "{parsed:?}");
    assert_eq!(parsed.blank, 2);
}

/// Two Celery workers' output as `docker compose logs` interleaves it (captured from the Celery
/// example under racecert, shortened): Python `warnings` output and Celery's multi-line notices,
/// blank lines behind the prefix, the task's own key=value lines naming the worker its own way.
pub(crate) const CELERY_COMPOSE: &str = include_str!("../fixtures/celery-compose.log");

#[test]
fn a_celery_workers_own_output_behind_compose_prefixes_reads_without_malformed_lines() {
    let parsed = parse(CELERY_COMPOSE.as_bytes());
    assert!(parsed.malformed.is_empty(), "{:?}", parsed.malformed);
    let by_line = |n: usize| {
        &parsed
            .lines
            .iter()
            .find(|l| l.line_no == n)
            .unwrap_or_else(|| panic!("line {n} not read: {parsed:?}"))
            .line
    };
    // Celery's hostname names the worker on Celery's lines and on the task's own, which keeps
    // its name for it.
    assert_eq!(by_line(13).get("worker_id"), Some("worker-a@racecert"));
    let own = by_line(14);
    assert_eq!(own.get("worker_id"), Some("worker-a@racecert"));
    assert_eq!(own.get("logged_worker_id"), Some("worker-a"));
    assert_eq!(own.get("request_id"), Some("req-1"));
    assert_eq!(by_line(20).get("worker_id"), Some("worker-b@racecert"));
    // The warning, its continuation lines, the banner and the notices are not records.
    assert_eq!(parsed.lines.len(), 10, "{parsed:?}");
}

#[test]
fn a_celery_log_through_a_json_formatter() {
    let line = one(
        r#"{"asctime": "2026-06-26 10:15:21,104", "levelname": "INFO", "processName": "MainProcess", "message": "Task tasks.infer[abc] succeeded in 1.5s: None"}"#,
    );
    assert_eq!(line.get("job_id"), Some("abc"));
    assert_eq!(line.status_word(), Some(Status::InferenceSucceeded));
    assert_eq!(line.get("runtime_s"), Some("1.5"));
}

#[test]
fn a_frameworks_free_text_records_are_unrelated_not_malformed() {
    // tracing's default format (apalis), Python logging's: a timestamp, a level, a message.
    let input = b"2026-11-30T03:02:11.909673Z  INFO Worker worker-a started\n\
2026-11-30 03:02:18,317 WARNING Re-enqueued 1 orphaned tasks\n\
2026-11-30T03:02:12Z INFO request_id=r status=job_received\n\
2026-11-30T03:02:12Z no level, free text\n";
    let parsed = parse(input);
    assert_eq!((parsed.lines.len(), parsed.unrelated), (1, 2));
    let numbers: Vec<usize> = parsed.malformed.iter().map(|m| m.line_no).collect();
    assert_eq!(numbers, vec![4]);
}

#[test]
fn garbage_is_counted_with_line_numbers() {
    let mut input = b"2026 INFO request_id=r status=cache_miss\n\xff\xfe\x00binary\n".to_vec();
    input.extend(vec![b'a'; MAX_LINE + 1]);
    input.extend(b"\nno fields here\nservice started port=80\n");
    let parsed = parse(&input);
    assert_eq!(parsed.lines.len(), 1);
    assert_eq!(parsed.unrelated, 1);
    let numbers: Vec<usize> = parsed.malformed.iter().map(|m| m.line_no).collect();
    assert_eq!(numbers, vec![2, 3, 4]);
    assert_eq!(parse(b""), Parsed::default());
    assert_eq!(parse(b"\n\n").blank, 2);
}

#[test]
fn a_truncated_last_json_line_is_one_malformed_line() {
    let input = b"{\"request_id\":\"r\",\"status\":\"cache_miss\"}\n{\"request_id\":\"r\",\"sta";
    let parsed = parse(input);
    assert_eq!(parsed.lines.len(), 1);
    assert_eq!(parsed.malformed.len(), 1);
    assert_eq!(parsed.malformed[0].line_no, 2);
    assert!(
        parsed.malformed[0].reason.contains("EOF"),
        "{}",
        parsed.malformed[0].reason
    );
}

/// Valid lines of every shape, for mutation.
const VALID: [&str; 9] = [
    "2026-06-26T10:15:21.104Z INFO request_id=req-91 job_id=job-441 attempt=1 worker_id=worker-a model_version=v1 status=cache_miss",
    r#"{"@timestamp":"2026-06-26T10:15:21.104Z","request":{"id":"r"},"model":{"version":"v2"},"event":"cache hit"}"#,
    "[2026-06-26 10:15:21,104: INFO/MainProcess] Task tasks.infer[3f2a] received",
    "host-b  | [2026-06-26 10:15:33,104: INFO/ForkPoolWorker-1] Task tasks.infer[3f2a] succeeded in 12.00s: None",
    "2026-06-26 10:15:21,104 WARNING requestId=r msg=\"two \\\"words\\\"\" retries=1",
    " -------------- celery@host-a v5.7.0 (recovery)",
    "worker-a | /venv/lib/python3.11/site-packages/celery/platforms.py:893: SecurityWarning: root",
    "worker-a | absolutely not recommended!",
    "worker-b | [2026-11-29 23:45:56,888: INFO/ForkPoolWorker-1] tasks.infer[c96a]: request_id=r attempt=1 worker_id=worker-b status=retry_dispatched",
];

fn mutated() -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::sample::select(VALID.to_vec()),
        proptest::collection::vec((any::<u16>(), 0u8..4, any::<u8>()), 0..6),
    )
        .prop_map(|(line, edits)| {
            let mut bytes = line.as_bytes().to_vec();
            for (at, kind, byte) in edits {
                let at = usize::from(at) % (bytes.len() + 1);
                match kind {
                    0 => bytes.insert(at, byte),
                    1 if at < bytes.len() => {
                        bytes.remove(at);
                    }
                    2 => bytes.truncate(at),
                    _ if at < bytes.len() => bytes[at] = byte,
                    _ => {}
                }
            }
            bytes
        })
}

proptest! {
    #[test]
    fn never_panics_on_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let parsed = parse(&bytes);
        let lines = bytes.split(|b| *b == b'\n').count();
        let accounted = parsed.lines.len() + parsed.malformed.len() + parsed.unrelated + parsed.blank;
        prop_assert!(accounted <= lines);
        prop_assert!(accounted + 1 >= lines);
    }

    #[test]
    fn never_panics_on_mutated_valid_lines(lines in proptest::collection::vec(mutated(), 1..12)) {
        let input = lines.join(&b'\n');
        let parsed = parse(&input);
        let count = input.split(|b| *b == b'\n').count();
        for line in &parsed.lines {
            prop_assert!(line.line_no >= 1 && line.line_no <= count);
        }
        let accounted = parsed.lines.len() + parsed.malformed.len() + parsed.unrelated + parsed.blank;
        // Nothing is lost; a document's records may share a line (`[2, 3` is two records and a
        // document cut short), so only a file of lines is held to one entry per line.
        prop_assert!(accounted + 1 >= count);
        prop_assert!(accounted <= count + parsed.document_records + 1);
        for line in &lines {
            if let Ok(text) = std::str::from_utf8(line) {
                let _ = parse_line(text);
            }
        }
    }

    #[test]
    fn round_trips_what_racecert_writes(
        fields in proptest::collection::vec(
            (
                prop_oneof![
                    "x_[a-z_]{1,10}",
                    proptest::sample::select(vec![
                        "request_id", "job_id", "idempotency_key", "worker_id", "model_version",
                        "backend_endpoint", "cache_key", "queue_receive_count", "write",
                    ]).prop_map(str::to_owned),
                ],
                "[ -~]{0,20}",
            ),
            1..8,
        ),
        status in proptest::option::of(proptest::sample::select(Status::ALL.to_vec())),
        at in 0usize..8,
    ) {
        let mut fields = fields;
        if let Some(status) = status {
            fields.insert(at.min(fields.len()), ("status".to_owned(), status.as_str().to_owned()));
        }
        let line = LogLine { ts: "2026-01-01T00:00:00.000Z".into(), level: Level::Warn, fields };
        prop_assert_eq!(parse_line(&line.to_logfmt()).unwrap(), line.clone());
        let json = parse_line(&line.to_json()).unwrap();
        prop_assert_eq!(json.level, Level::Warn);
        for (key, _) in &line.fields {
            // A JSON object keeps the last of duplicate keys.
            let last = line.fields.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
            prop_assert_eq!(json.get(key), last);
        }
    }
}

mod readers;
