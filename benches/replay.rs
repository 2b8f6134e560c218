//! Replay benchmark: how fast and in how much memory `racecert replay` reads a log of any size.
//! A 1 GB log (by default) is generated in the shapes teams export (seed logfmt, tracing's
//! nested JSON, `kubectl --prefix` over zap JSON, `stern` over Celery, journald JSON, OTLP
//! batches, logcli lines, unrelated noise), every request with its own ids, written to a
//! temporary file and read from it as `racecert replay FILE` reads one (from the page cache: the
//! generator and the disk are not timed); then the kept lines are reconstructed and diagnosed.
//! Then as many bytes of seeded random garbage (invalid UTF-8, lines of any length, no newline
//! for megabytes) are streamed through the parser the same way. Prints throughput and
//! the process's peak resident memory after each; asserts only that the garbage ends.
//!
//! `cargo bench --bench replay` (1 GB each), `cargo bench --bench replay -- --mb 200` for a
//! smaller run, `-- --shape N` for the stories of one shape only (0-5, in the order above; 6
//! Docker json-file lines over tracing JSON, 7 a pretty-printed `gcloud logging read` array, 8 an
//! `aws logs filter-log-events` object: these three are not in the default mix), `-- --log-only`
//! to skip the random bytes (to profile the log's reading alone). Numbers go to BENCHMARKS.md by hand, with this command.

use racecert::logs::{self as parse, Options};
use racecert::replay::analyse_parsed;
use std::io::{BufReader, Read};
use std::time::Instant;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Stories with `#` where each request's number goes: one per shape.
const STORIES: &[&str] = &[
    "2026-06-26T10:15:21.104Z INFO request_id=req-# job_id=job-# attempt=1 worker_id=worker-a model_version=v1 backend_endpoint=model-a cache_key=inf:# status=cache_miss
2026-06-26T10:15:21.892Z INFO request_id=req-# job_id=job-# attempt=1 worker_id=worker-a model_version=v1 status=inference_started
2026-06-26T10:15:24.031Z WARN request_id=req-# job_id=job-# attempt=1 worker_id=worker-a model_version=v1 status=timeout_waiting_upstream
2026-06-26T10:15:24.207Z INFO request_id=req-# job_id=job-# attempt=2 worker_id=worker-c model_version=v2 backend_endpoint=model-b cache_key=inf:# status=retry_dispatched
2026-06-26T10:15:25.445Z INFO request_id=req-# job_id=job-# attempt=2 worker_id=worker-c model_version=v2 status=inference_succeeded write=result_store
2026-06-26T10:15:25.991Z INFO request_id=req-# job_id=job-# attempt=1 worker_id=worker-a model_version=v1 status=late_success write=result_store
",
    r#"{"timestamp":"2026-08-11T07:40:02.100733Z","level":"INFO","fields":{"message":"job received","requestId":"inv-#","jobId":"j-#","workerId":"w-3","modelVersion":"v2","attempt":1},"target":"inference_worker::queue"}
{"timestamp":"2026-08-11T07:40:02.101950Z","level":"INFO","fields":{"message":"job acked","requestId":"inv-#","jobId":"j-#","workerId":"w-3","modelVersion":"v2","attempt":1},"target":"inference_worker::queue"}
{"timestamp":"2026-08-11T07:40:03.951000Z","level":"INFO","fields":{"message":"result stored","requestId":"inv-#","jobId":"j-#","workerId":"w-3","modelVersion":"v2","attempt":1},"target":"inference_worker::store"}
"#,
    r#"[pod/infer-v1-7c9d8f6b5-kq2xz/worker] {"level":"info","ts":1786434013.105,"caller":"worker/queue.go:88","msg":"job received","request_id":"r-#","job_id":"j-#","attempt":1,"model_version":"v1"}
[pod/infer-v1-7c9d8f6b5-kq2xz/worker] {"level":"info","ts":1786434013.140,"caller":"worker/infer.go:52","msg":"calling model backend","request_id":"r-#","job_id":"j-#","attempt":1,"model_version":"v1"}
[pod/infer-v1-7c9d8f6b5-kq2xz/worker] {"level":"info","ts":1786434015.730,"caller":"worker/store.go:31","msg":"result stored","request_id":"r-#","job_id":"j-#","attempt":1,"model_version":"v1"}
"#,
    "infer-celery-7f9c6d5b8-h2kzt worker [2026-08-12 09:00:05,002: INFO/MainProcess] Task tasks.infer[c-#] received
infer-celery-7f9c6d5b8-h2kzt worker [2026-08-12 09:00:05,010: INFO/ForkPoolWorker-1] tasks.infer[c-#]: calling model backend request_id=creq-# model_version=v2
infer-celery-7f9c6d5b8-h2kzt worker [2026-08-12 09:00:07,870: INFO/ForkPoolWorker-1] Task tasks.infer[c-#] succeeded in 2.86s: {'label': 'cat'}
",
    r#"{"__CURSOR":"s=6f1c;i=1a01","__REALTIME_TIMESTAMP":"1786441200000512","PRIORITY":"6","SYSLOG_IDENTIFIER":"infer-worker","_PID":"2211","_SYSTEMD_UNIT":"infer-worker.service","_HOSTNAME":"gpu-a","MESSAGE":"request_id=jr-# job_id=jj-# attempt=1 model_version=v1 status=job_received"}
{"__CURSOR":"s=6f1c;i=1a02","__REALTIME_TIMESTAMP":"1786441200650107","PRIORITY":"6","SYSLOG_IDENTIFIER":"infer-worker","_PID":"2211","_SYSTEMD_UNIT":"infer-worker.service","_HOSTNAME":"gpu-a","MESSAGE":"request_id=jr-# job_id=jj-# attempt=1 model_version=v1 status=inference_succeeded write=result_store"}
"#,
    r#"{"resourceLogs":[{"resource":{"attributes":[{"key":"k8s.pod.name","value":{"stringValue":"infer-v2-6d8c7b9f4-m4n8w"}},{"key":"host.name","value":{"stringValue":"node-b"}}]},"scopeLogs":[{"scope":{"name":"inference.worker"},"logRecords":[{"timeUnixNano":"1786437603000000000","severityText":"INFO","body":{"stringValue":"cache miss"},"attributes":[{"key":"request.id","value":{"stringValue":"q-#"}},{"key":"model.version","value":{"stringValue":"v2"}},{"key":"cache.key","value":{"stringValue":"inf:v2:#"}}]},{"timeUnixNano":"1786437603800000000","severityText":"INFO","body":{"stringValue":"result stored"},"attributes":[{"key":"request.id","value":{"stringValue":"q-#"}},{"key":"model.version","value":{"stringValue":"v2"}}]}]}]}]}
{"labels":{"container":"worker","pod":"p-3"},"line":"request_id=l-# status=job_received","timestamp":"2026-08-13T12:00:00.5+02:00"}
ts=2026-07-01T09:00:07.000Z level=info msg="healthcheck ok" path=/healthz
"#,
    // 6: Docker's json-file driver over tracing JSON (the program's line inside `log`).
    r#"{"log":"{\"timestamp\":\"2026-08-11T07:40:02.100733Z\",\"level\":\"INFO\",\"fields\":{\"message\":\"job received\",\"requestId\":\"inv-#\",\"jobId\":\"j-#\",\"workerId\":\"w-3\",\"modelVersion\":\"v2\",\"attempt\":1},\"target\":\"inference_worker::queue\"}\n","stream":"stdout","time":"2026-08-11T07:40:02.100733123Z"}
{"log":"{\"timestamp\":\"2026-08-11T07:40:02.101950Z\",\"level\":\"INFO\",\"fields\":{\"message\":\"job acked\",\"requestId\":\"inv-#\",\"jobId\":\"j-#\",\"workerId\":\"w-3\",\"modelVersion\":\"v2\",\"attempt\":1},\"target\":\"inference_worker::queue\"}\n","stream":"stdout","time":"2026-08-11T07:40:02.101950123Z"}
{"log":"{\"timestamp\":\"2026-08-11T07:40:03.951000Z\",\"level\":\"INFO\",\"fields\":{\"message\":\"result stored\",\"requestId\":\"inv-#\",\"jobId\":\"j-#\",\"workerId\":\"w-3\",\"modelVersion\":\"v2\",\"attempt\":1},\"target\":\"inference_worker::store\"}\n","stream":"stdout","time":"2026-08-11T07:40:03.951000123Z"}
"#,
    // 7: `gcloud logging read --format=json`: ONE pretty-printed array of LogEntry objects.
    r#"  {
    "insertId": "1x#abf3k9q",
    "jsonPayload": {
      "message": "job received",
      "request_id": "g-#",
      "job_id": "j-#a",
      "model_version": "v1",
      "attempt": 1
    },
    "logName": "projects/acme-ml/logs/stdout",
    "receiveTimestamp": "2026-09-14T08:30:01.912345678Z",
    "resource": {
      "labels": {
        "cluster_name": "ml-prod",
        "container_name": "worker",
        "namespace_name": "ml",
        "pod_name": "infer-v1-5f7d9c8b6-h2k4p",
        "project_id": "acme-ml"
      },
      "type": "k8s_container"
    },
    "severity": "INFO",
    "timestamp": "2026-09-14T08:30:01.880006Z"
  },
  {
    "insertId": "1y#abf3k9q",
    "jsonPayload": {
      "message": "result stored",
      "request_id": "g-#",
      "job_id": "j-#a",
      "model_version": "v1",
      "attempt": 1,
      "write": "result_store"
    },
    "logName": "projects/acme-ml/logs/stdout",
    "receiveTimestamp": "2026-09-14T08:30:09.912345678Z",
    "resource": {
      "labels": {
        "cluster_name": "ml-prod",
        "container_name": "worker",
        "namespace_name": "ml",
        "pod_name": "infer-v1-5f7d9c8b6-h2k4p",
        "project_id": "acme-ml"
      },
      "type": "k8s_container"
    },
    "severity": "INFO",
    "timestamp": "2026-09-14T08:30:09.880006Z"
  },
"#,
    // 8: `aws logs filter-log-events`: ONE object, `events` of the program's JSON in `message`.
    r#"        {
            "logStreamName": "inference/worker/3f0c1a9e",
            "timestamp": 1782896405000,
            "message": "{\"time\":\"2026-07-01T09:00:05.000Z\",\"level\":\"info\",\"req_id\":\"r-#\",\"task_id\":\"t-#\",\"model\":\"v2\",\"retries\":0,\"event\":\"job received\"}",
            "ingestionTime": 1782896405412,
            "eventId": "3780019117828964#"
        },
        {
            "logStreamName": "inference/worker/3f0c1a9e",
            "timestamp": 1782896407000,
            "message": "{\"time\":\"2026-07-01T09:00:07.000Z\",\"level\":\"info\",\"req_id\":\"r-#\",\"task_id\":\"t-#\",\"model\":\"v2\",\"retries\":0,\"write\":\"result_store\",\"event\":\"result stored\"}",
            "ingestionTime": 1782896407412,
            "eventId": "3780029117828964#"
        },
"#,
];

/// Shapes that are one document: what opens it before the first story and closes it after the
/// last (a last record without the stories' trailing comma, then the closing brackets). The
/// log then ends on a whole story, never cut inside a record.
const DOCUMENTS: &[(usize, &str, &str)] = &[
    (
        7,
        "[\n",
        "  {\n    \"severity\": \"DEBUG\",\n    \"textPayload\": \"end of export\",\n    \"timestamp\": \"2026-09-14T08:31:00Z\"\n  }\n]\n",
    ),
    (
        8,
        "{\n    \"events\": [\n",
        "        {\n            \"logStreamName\": \"inference/worker/3f0c1a9e\",\n            \"timestamp\": 1782896409000,\n            \"message\": \"end of export\"\n        }\n    ],\n    \"searchedLogStreams\": []\n}\n",
    ),
];

/// Stories of the default mix: the line shapes of the first bench (0-5), so its numbers stay
/// comparable; the others are read one at a time with `--shape`.
const MIX: usize = 6;

/// A log generated on the fly, about `remaining` bytes long: whole stories, every one with its
/// own number, so no two requests share an id. Line shapes are cut at exactly `remaining` bytes
/// (as a download cut mid-line); a document ends on a whole story and is closed.
struct Synthetic {
    parts: Vec<Vec<&'static str>>,
    remaining: u64,
    story: usize,
    number: u64,
    buffer: Vec<u8>,
    at: usize,
    /// The document's closing text, still to write (a document shape only).
    close: Option<&'static str>,
    /// The closing text is in the buffer: nothing comes after it.
    closed: bool,
}

impl Synthetic {
    /// `shape`: only the stories of that index in [`STORIES`] (to see what each shape costs);
    /// none: the line shapes of the default mix.
    fn new(bytes: u64, shape: Option<usize>) -> Synthetic {
        let document = shape.and_then(|s| DOCUMENTS.iter().find(|(i, _, _)| *i == s));
        let mut buffer = Vec::with_capacity(4096);
        if let Some((_, open, _)) = document {
            buffer.extend_from_slice(open.as_bytes());
        }
        Synthetic {
            parts: STORIES
                .iter()
                .enumerate()
                .filter(|(i, _)| shape.map_or(*i < MIX, |s| s == *i))
                .map(|(_, s)| s.split('#').collect())
                .collect(),
            remaining: bytes,
            story: 0,
            number: 0,
            buffer,
            at: 0,
            close: document.map(|(_, _, close)| *close),
            closed: false,
        }
    }

    fn refill(&mut self) {
        self.buffer.clear();
        self.at = 0;
        if self.close.is_some() && self.remaining == 0 {
            if let Some(close) = self.close.take() {
                self.buffer.extend_from_slice(close.as_bytes());
            }
            self.closed = true;
            return;
        }
        let parts = &self.parts[self.story % self.parts.len()];
        let number = self.number.to_string();
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                self.buffer.extend_from_slice(number.as_bytes());
            }
            self.buffer.extend_from_slice(part.as_bytes());
        }
        self.story += 1;
        self.number += 1;
        if self.close.is_some() {
            // A document counts whole stories: the last one may go past the size asked for.
            self.remaining = self.remaining.saturating_sub(self.buffer.len() as u64);
        }
    }
}

impl Read for Synthetic {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let document = self.close.is_some() || self.closed;
        if self.at == self.buffer.len() {
            if self.closed || (!document && self.remaining == 0) {
                return Ok(0);
            }
            self.refill();
        }
        let mut n = out.len().min(self.buffer.len() - self.at);
        if !document {
            n = n.min(self.remaining as usize);
            self.remaining -= n as u64;
        }
        out[..n].copy_from_slice(&self.buffer[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// Seeded random bytes, newlines rare and bunched: lines from empty to megabytes.
struct Garbage {
    remaining: u64,
    state: u64,
}

impl Read for Garbage {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = out.len().min(self.remaining as usize);
        for byte in &mut out[..n] {
            // xorshift64*: fast and seeded, enough to be garbage.
            self.state ^= self.state >> 12;
            self.state ^= self.state << 25;
            self.state ^= self.state >> 27;
            let value = self.state.wrapping_mul(0x2545_F491_4F6C_DD1D);
            *byte = (value >> 56) as u8;
            // Roughly one newline per 20 KB on average, some lines far longer than the limit.
            if value & 0x7FFF == 0 {
                *byte = b'\n';
            }
        }
        self.remaining -= n as u64;
        Ok(n)
    }
}

/// Peak resident memory of this process, from the kernel.
fn peak_rss_mb() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or_else(|| "?".to_owned(), |kb| format!("{} MB", kb / 1024))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mb: u64 = args
        .iter()
        .position(|a| a == "--mb")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let bytes = mb * 1_000_000;
    let shape: Option<usize> = args
        .iter()
        .position(|a| a == "--shape")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok());

    // The log is written to a file first, as an incident log arrives, and read as `racecert
    // replay FILE` reads it (`parse_file`: a 1 MB buffered reader), from the page cache: what is
    // timed is racecert's reading, not the disk's or the generator's.
    let path =
        std::env::temp_dir().join(format!("racecert-replay-bench-{}.log", std::process::id()));
    let started = Instant::now();
    {
        let mut file = std::io::BufWriter::with_capacity(
            1 << 20,
            std::fs::File::create(&path).expect("creating the bench log"),
        );
        std::io::copy(&mut Synthetic::new(bytes, shape), &mut file).expect("writing the bench log");
        std::io::Write::flush(&mut file).expect("writing the bench log");
    }
    let writing = started.elapsed().as_secs_f64();

    // As `racecert replay` reads a file: only the fields a story is told from are kept.
    let options = Options {
        compact: true,
        ..Options::default()
    };
    let started = Instant::now();
    let parsed = parse::parse_file(&path, &options);
    let parsing = started.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&path);
    let parsed = parsed.expect("reading the bench log");
    let lines_read = parsed.lines_read;
    let (kept, not_kept, malformed) = (parsed.lines.len(), parsed.not_kept, parsed.malformed_count);
    // As `racecert replay` goes on: the kept lines reconstructed and diagnosed.
    let started = Instant::now();
    let analysis = analyse_parsed(parsed, None);
    let analysing = started.elapsed().as_secs_f64();
    let (requests, findings) = (
        analysis.reconstruction.requests.len(),
        analysis.findings.len(),
    );
    let text = analysis.text();
    println!(
        "replay bench, log: {} MB (written in {:.1} s), {} lines read in {:.1} s = {:.0} MB/s; kept {} relevant lines, {} read and counted but not kept, {} malformed; reconstruct + diagnose of the kept lines {:.1} s ({} requests, {} findings); read + diagnose {:.0} MB/s; peak RSS {}",
        mb,
        writing,
        lines_read,
        parsing,
        mb as f64 / parsing,
        kept,
        not_kept,
        malformed,
        analysing,
        requests,
        findings,
        mb as f64 / (parsing + analysing),
        peak_rss_mb()
    );
    println!(
        "  report's first line: {}",
        text.lines().next().unwrap_or("")
    );
    drop(analysis);
    if args.iter().any(|a| a == "--log-only") {
        return;
    }

    let started = Instant::now();
    let garbage = Garbage {
        remaining: bytes,
        state: 0x9E37_79B9_7F4A_7C15,
    };
    let parsed = parse::parse_reader(BufReader::with_capacity(1 << 20, garbage), &options)
        .expect("reading garbage");
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "replay bench, random bytes: {} MB, {} lines in {:.1} s = {:.0} MB/s: {} malformed (first: line {}: {}), {} relevant; peak RSS {}",
        mb,
        parsed.lines_read,
        seconds,
        mb as f64 / seconds,
        parsed.malformed_count,
        parsed.malformed.first().map_or(0, |m| m.line_no),
        parsed.malformed.first().map_or("-", |m| m.reason.as_str()),
        parsed.lines.len(),
        peak_rss_mb()
    );
    assert_eq!(parsed.bytes, bytes, "every byte of the garbage was read");
}
