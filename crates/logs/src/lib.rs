//! Reading incident logs as teams' platforms export them, streamed line by line in bounded
//! memory, the shape detected per file and per line:
//! - lines: logfmt in the seed's shape ([`logfmt`]), JSON objects ([`records`]: nested objects,
//!   camelCase, snake_case and dotted names), Celery's worker format ([`celery`]), each
//!   optionally behind an orchestrator's prefix ([`prefix`]: `kubectl logs --prefix`, `stern`,
//!   `docker compose logs`);
//! - platform exports whose records carry the program's line inside ([`records`]): journald
//!   JSON, OTLP JSON from the OpenTelemetry collector, Loki's API responses and `logcli` lines,
//!   Grafana data frames (one JSON object per line, or one pretty-printed document);
//! - records whose program line is inside a string ([`records`]): Docker's json-file `log`,
//!   Fluent Bit's and Vector's `log`, a CloudWatch event's `message`, read as the record's
//!   fields keyed under that field (`message.request_id`);
//! - whole JSON documents ([`document`]): an array of records (`gcloud logging read
//!   --format=json`), CloudWatch's `{"events": [...]}`, an Elasticsearch `_search` response,
//!   streamed record by record, each numbered by the line it starts on;
//! - CSV exports with a header row ([`table`]).
//!
//! Every record becomes a [`LogLine`] in the seed's vocabulary ([`fields`]: spellings folded,
//! `--field NAME=PATH` maps applied, timestamps as RFC 3339 UTC with milliseconds; [`words`]:
//! free text mapped to a [`Status`] word when exactly one known phrasing names it). A record is
//! numbered by its line; the records of a container line (an OTLP batch, a Loki response) are
//! numbered one after another from it, and the lines after it move up by as many, which
//! [`Parsed::containers`] lists so a report can say so.
//!
//! A line that is none of these is counted as malformed with its number, the reason and what it
//! looked like; bytes that are not UTF-8, lines over [`MAX_LINE`], truncated records and random
//! bytes are malformed lines, never a panic or a hang.

#![deny(missing_docs)]

mod celery;
mod document;
mod fields;
mod logfmt;
mod prefix;
mod records;
mod stream;
mod table;
mod words;

pub use fields::{FieldMap, canonical_field, read_timestamp};
pub use words::{status_of, words};

use celery::{CELERY_BANNER, celery_line, celery_message};
use fields::{Meaning, Meanings, Raw, canonical, level_of, top_meaning};
use logfmt::logfmt;
#[cfg(test)]
use racecert_core::contract::log::{Level, format_timestamp};
use racecert_core::contract::log::{LogLine, Status};
use records::{Entry, Json, Origin};
use regex::Regex;
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::io::BufRead;
use std::sync::LazyLock;
use stream::{Lines, Next};
use table::Table;

/// Lines longer than this are refused (a log line is not a data dump).
pub const MAX_LINE: usize = 64 * 1024;
/// Relevant lines kept for the stories by default; later ones are counted, not kept, so a log of
/// any size is read in bounded memory (`--request` narrows what is kept instead).
pub const MAX_KEPT: usize = 100_000;
/// Malformed lines listed (every one is counted).
pub const MAX_MALFORMED: usize = 1_000;
/// A value of a JSON document held whole (one record, or a document racecert knows no wrapper
/// of) larger than this is refused; the records of an array or a known wrapper are streamed.
pub const MAX_DOCUMENT: usize = 256 << 20;
/// Unrelated lines shown as samples.
const UNRELATED_SAMPLES: usize = 3;
/// Characters of a line shown in a sample.
const EXCERPT: usize = 120;

/// One parsed line and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedLine {
    /// 1-based line number in the input (records of a container numbered on from their line).
    pub line_no: usize,
    /// The line, in the seed's vocabulary.
    pub line: LogLine,
    /// When it was logged, in milliseconds since the Unix epoch, if its timestamp could be read.
    pub millis: Option<i64>,
}

/// A line that could not be used, why, and what it looked like.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Malformed {
    /// 1-based line number.
    #[serde(rename = "line")]
    pub line_no: usize,
    /// Why.
    pub reason: String,
    /// Its first characters, escaped (control characters and invalid bytes visible).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub text: String,
}

/// Where a seed field was found: under which key, on how many records, first on which line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Found {
    /// The seed's name (`request_id`, `status`, `ts`, ...).
    pub field: &'static str,
    /// The key as the log spells it (`fields.requestId`, `MESSAGE`, `k8s.pod.name`).
    pub key: String,
    /// Records it was read from.
    pub records: usize,
    /// The first line it was read on.
    pub first_line: usize,
}

/// A line (or a document) holding several records, numbered from `first`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Container {
    /// The line it starts on.
    pub line: usize,
    /// The number of its first record.
    pub first: usize,
    /// Its records.
    pub records: usize,
    /// What it is (`OTLP JSON`, `Loki query response`, ...).
    pub shape: &'static str,
}

/// What a log file held.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    /// Lines with a status, a request id, a job id or an idempotency key.
    pub lines: Vec<ParsedLine>,
    /// Lines that could not be read (the first [`MAX_MALFORMED`]).
    pub malformed: Vec<Malformed>,
    /// Lines that could not be read, all counted.
    pub malformed_count: usize,
    /// Well-formed lines unrelated to inference requests (no id and no status), and the lines of
    /// a Celery banner or traceback.
    pub unrelated: usize,
    /// A few unrelated records, as samples of what the log says that racecert did not use.
    pub unrelated_samples: Vec<Malformed>,
    /// Blank lines.
    pub blank: usize,
    /// Where each seed field was found.
    pub found: Vec<Found>,
    /// The shapes read, with their line counts, most lines first (`stern › Celery`, `OTLP JSON`).
    pub shapes: Vec<(String, usize)>,
    /// Lines holding several records.
    pub containers: Vec<Container>,
    /// Records whose worker could not be told apart (two workers' output interleaved).
    pub ambiguous: Vec<(usize, String)>,
    /// Relevant records read but not kept (over the limit of kept lines).
    pub not_kept: usize,
    /// Records read from whole JSON documents (several may share a line, so records, not lines,
    /// are what such a file counts).
    pub document_records: usize,
    /// Physical lines read.
    pub lines_read: usize,
    /// Bytes read.
    pub bytes: u64,
}

impl Parsed {
    fn malformed(&mut self, line_no: usize, reason: String, text: &[u8]) {
        self.malformed_count += 1;
        if self.malformed.len() < MAX_MALFORMED {
            self.malformed.push(Malformed {
                line_no,
                reason,
                text: excerpt(text),
            });
        }
    }
}

/// The first characters of a line, escaped so that control characters and invalid bytes show.
fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(EXCERPT * 4)]);
    let mut out: String = text
        .chars()
        .take(EXCERPT)
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect();
    if text.chars().count() > EXCERPT {
        out.push('…');
    }
    out
}

/// How to read: the team's own field names, and how many relevant lines to keep.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--field NAME=PATH` maps.
    pub fields: Vec<FieldMap>,
    /// Relevant lines kept at most.
    pub keep: usize,
    /// Keep only the lines of this request (by request id, job id or idempotency key), the
    /// lines naming no request (cutovers, worker starts and losses) and cache lines (a cache
    /// entry read by this request may have been filled by another).
    pub only: Option<String>,
    /// Keep of each line only the fields a story is told from ([`STORY_FIELDS`]): a kept line
    /// then costs a few hundred bytes, whatever the record carried.
    pub compact: bool,
}

/// The fields the stories and diagnoses read; the rest of a line is its own business.
pub const STORY_FIELDS: &[&str] = &[
    "request_id",
    "job_id",
    "idempotency_key",
    "worker_id",
    "process",
    "model_version",
    "backend_endpoint",
    "cache_key",
    "attempt",
    "status",
    "write",
    "runtime_s",
    "served_model_version",
    "cached_model_version",
    "previous_model_version",
    "new_model_version",
    "attribution",
];

impl Default for Options {
    fn default() -> Options {
        Options {
            fields: Vec::new(),
            keep: MAX_KEPT,
            only: None,
            compact: false,
        }
    }
}

/// Parses a whole log held in memory (any bytes).
pub fn parse(bytes: &[u8]) -> Parsed {
    parse_reader(bytes, &Options::default())
        .unwrap_or_else(|err| unreachable!("reading a byte slice cannot fail: {err}"))
}

/// Parses a log from a reader, line by line: memory is bounded by the lines kept, not by the
/// log's size. Fails only when the reader does.
pub fn parse_reader<R: BufRead>(input: R, options: &Options) -> std::io::Result<Parsed> {
    let mut parsed = Parsed::default();
    let mut reader = Reader::new(options);
    let mut lines = Lines::new(input);
    let mut state = State::default();
    loop {
        let next = lines.next_line()?;
        parsed.lines_read = lines.number;
        parsed.bytes = lines.bytes;
        let mut line_no = lines.number;
        if line_no == 1 && lines.line.starts_with(b"\xEF\xBB\xBF") {
            // A byte-order mark (spreadsheet exports write one) is not part of the first line.
            lines.line.drain(..3);
        }
        match next {
            Next::End => break,
            Next::TooLong(length) => {
                parsed.malformed(
                    line_no,
                    format!("line of {length} bytes exceeds {MAX_LINE}"),
                    b"",
                );
                continue;
            }
            Next::Line => {}
        }
        if state.mode.is_none() && !lines.line.iter().all(u8::is_ascii_whitespace) {
            state.mode = Some(decide(&lines.line));
            if state.mode == Some(Mode::Document) {
                let broken = document::read(&mut lines, &mut reader, &mut parsed, options)?;
                parsed.lines_read = lines.number;
                parsed.bytes = lines.bytes;
                if !broken {
                    break;
                }
                // No document after all: the line it broke on, and the rest, as lines.
                state.mode = Some(Mode::Lines);
                line_no = lines.number;
            }
        }
        let raw = std::mem::take(&mut lines.line);
        one_line(&raw, line_no, &mut state, &mut reader, &mut parsed, options);
        lines.line = raw;
    }
    if let Some(Mode::Table(table)) = &state.mode
        && let Some((_, start)) = &table.pending
    {
        parsed.malformed(
            *start,
            "a CSV row whose quoted field is never closed".into(),
            b"",
        );
    }
    finish(&mut parsed, reader);
    Ok(parsed)
}

/// Parses one line on its own (JSON, logfmt or Celery), with no knowledge of the lines before it.
pub fn parse_line(text: &str) -> Result<LogLine, String> {
    let options = Options::default();
    let mut reader = Reader::new(&options);
    match reader.line(text)?.into_iter().next() {
        Some(Read::Line(line, _)) => Ok(line),
        _ => Err("a Celery banner or traceback line, not a log record".into()),
    }
}

/// How the file is read, decided on its first line that is not blank.
#[derive(Debug, Clone)]
enum Mode {
    /// One record (or one container) per line.
    Lines,
    /// A CSV export with this header.
    Table(Table),
    /// One JSON document over many lines.
    Document,
}

impl PartialEq for Mode {
    fn eq(&self, other: &Mode) -> bool {
        matches!(
            (self, other),
            (Mode::Lines, Mode::Lines) | (Mode::Document, Mode::Document)
        )
    }
}

#[derive(Debug, Default)]
struct State {
    mode: Option<Mode>,
    /// Records beyond line numbers so far (a container line of k records adds k - 1).
    shift: usize,
    /// Lines seen per request id, job id or key linked to `only` (see [`Options::only`]).
    linked: HashSet<String>,
    /// Whether a CSV export's header row has gone by.
    header_done: bool,
}

fn decide(first: &[u8]) -> Mode {
    let Ok(text) = std::str::from_utf8(first) else {
        return Mode::Lines;
    };
    let text = text.trim();
    if text.starts_with('{') || text.starts_with('[') {
        // A JSON value that the line does not close: a document over many lines.
        if let Err(err) = serde_json::from_str::<serde::de::IgnoredAny>(text)
            && err.is_eof()
            && !text.starts_with("[pod/")
        {
            return Mode::Document;
        }
        return Mode::Lines;
    }
    match Table::header(text) {
        Some(table) => Mode::Table(table),
        None => Mode::Lines,
    }
}

fn one_line(
    raw: &[u8],
    line_no: usize,
    state: &mut State,
    reader: &mut Reader,
    parsed: &mut Parsed,
    options: &Options,
) {
    reader.line_no = line_no;
    let open_row = matches!(&state.mode, Some(Mode::Table(t)) if t.pending.is_some());
    if raw.iter().all(u8::is_ascii_whitespace) && !open_row {
        parsed.blank += 1;
        return;
    }
    let text = match std::str::from_utf8(raw) {
        Ok(text) => text,
        Err(err) => {
            parsed.malformed(
                line_no,
                format!(
                    "not UTF-8 text (an invalid byte at column {})",
                    err.valid_up_to() + 1
                ),
                raw,
            );
            return;
        }
    };
    // A CSV row is numbered by the line it starts on.
    let mut number = line_no;
    let result = match &mut state.mode {
        Some(Mode::Table(table)) => {
            let (row, start) = match table.pending.take() {
                Some((mut pending, start)) => {
                    pending.push('\n');
                    pending.push_str(text);
                    (pending, start)
                }
                None => (text.to_owned(), line_no),
            };
            if Table::open_quote(&row) {
                if row.len() > MAX_LINE {
                    parsed.malformed(
                        start,
                        format!("a CSV row over {MAX_LINE} bytes (a quoted field never closed?)"),
                        row.as_bytes(),
                    );
                } else {
                    table.pending = Some((row, start));
                }
                return;
            }
            if !state.header_done {
                // The header row itself.
                state.header_done = true;
                parsed.unrelated += 1;
                return;
            }
            reader.tally("", "CSV export");
            number = start;
            table.row(&row).map(|(origin, message)| {
                let entry = Entry {
                    origin,
                    text: Some(message),
                    carrier: None,
                };
                vec![reader.entry(entry, None)]
            })
        }
        _ => reader.line(text),
    };
    match result {
        Ok(reads) => take(reads, number, raw, state, reader, parsed, options),
        Err(reason) => parsed.malformed(number, reason, raw),
    }
}

/// Files the reads of one line: numbers them, keeps the relevant ones.
fn take(
    reads: Vec<Read>,
    line_no: usize,
    raw: &[u8],
    state: &mut State,
    reader: &Reader,
    parsed: &mut Parsed,
    options: &Options,
) {
    let base = line_no + state.shift;
    if reads.len() > 1 {
        parsed.containers.push(Container {
            line: line_no,
            first: base,
            records: reads.len(),
            shape: reader.kind,
        });
        state.shift += reads.len() - 1;
    }
    if reads.is_empty() {
        parsed.unrelated += 1;
    }
    for (i, read) in reads.into_iter().enumerate() {
        let number = base + i;
        let Read::Line(line, millis) = read else {
            parsed.unrelated += 1;
            continue;
        };
        let relevant = ["request_id", "job_id", "idempotency_key", "status"]
            .iter()
            .any(|k| line.get(k).is_some());
        if !relevant {
            parsed.unrelated += 1;
            if parsed.unrelated_samples.len() < UNRELATED_SAMPLES {
                parsed.unrelated_samples.push(Malformed {
                    line_no: number,
                    reason: "no request id, job id, idempotency key or status word".into(),
                    text: excerpt(raw),
                });
            }
            continue;
        }
        if line.get("attribution") == Some("ambiguous") {
            let worker = line.get("worker_id").unwrap_or("?").to_owned();
            parsed.ambiguous.push((number, worker));
        }
        if let Some(only) = &options.only
            && !concerns(&line, only, &mut state.linked)
        {
            continue;
        }
        if parsed.lines.len() >= options.keep {
            parsed.not_kept += 1;
            continue;
        }
        let mut line = line;
        if options.compact {
            line.fields
                .retain(|(k, _)| STORY_FIELDS.contains(&k.as_str()));
            line.fields.shrink_to_fit();
        }
        parsed.lines.push(ParsedLine {
            line_no: number,
            line,
            millis,
        });
    }
}

/// Whether a line may concern the request `only`: it names it (or an id a line linked to it),
/// it names no request id (a cutover, a worker's start or loss; or a job id that a later line
/// may link to it, as Celery's `received` comes before the task's own line), or it is about the
/// cache (an entry this request read may have been filled by another). Only lines of other
/// requests, named by their request id, are left out.
fn concerns(line: &LogLine, only: &str, linked: &mut HashSet<String>) -> bool {
    let ids = ["request_id", "job_id", "idempotency_key"].map(|k| line.get(k));
    if ids[0].is_none() {
        return true;
    }
    let mine = ids
        .iter()
        .flatten()
        .any(|id| *id == only || linked.contains(*id));
    if mine {
        for id in ids.into_iter().flatten() {
            if id != only && !linked.contains(id) {
                linked.insert(id.to_owned());
            }
        }
        return true;
    }
    line.get("cache_key").is_some()
        || line.status_word().is_some_and(|s| {
            matches!(
                s,
                Status::CacheHit
                    | Status::CacheMiss
                    | Status::CacheWritten
                    | Status::Cutover
                    | Status::CacheInvalidated
            )
        })
}

fn finish(parsed: &mut Parsed, reader: Reader) {
    let mut found: Vec<Found> = reader
        .found
        .into_iter()
        .flat_map(|(field, keys)| {
            keys.into_iter()
                .map(move |(key, records, first_line)| Found {
                    field,
                    key,
                    records,
                    first_line,
                })
        })
        .collect();
    found.sort_by(|a, b| {
        (a.field, std::cmp::Reverse(a.records), &a.key).cmp(&(
            b.field,
            std::cmp::Reverse(b.records),
            &b.key,
        ))
    });
    parsed.found = found;
    let mut shapes: Vec<(String, usize)> = reader
        .shapes
        .into_iter()
        .map(|(prefix, kind, n)| {
            let name = if prefix.is_empty() {
                kind.to_owned()
            } else {
                format!("{prefix} › {kind}")
            };
            (name, n)
        })
        .collect();
    shapes.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    parsed.shapes = shapes;
}

/// What one record was.
enum Read {
    Line(LogLine, Option<i64>),
    /// A line that belongs to something else (Celery's banner, a traceback).
    Skip,
}

/// Reads lines in order, remembering what spans lines: Celery hostnames from start lines (per
/// stream: a prefix or a container's host), whether a banner or a traceback is running, which
/// streams are a Python process's (whose lines that are no record continue a multi-line
/// message), where each field was found, and which shapes were read.
struct Reader<'o> {
    maps: &'o [FieldMap],
    hostnames: HashMap<String, String>,
    /// Streams in which two Celery workers' output is interleaved, with their hostnames.
    ambiguous: HashMap<String, Vec<String>>,
    /// The hostname the last banner named, until its `ready` line.
    banner_names: Option<String>,
    banner: bool,
    traceback: bool,
    python: HashSet<String>,
    /// seed field -> (key, records, first line): a few fields, a few keys each, scanned
    /// without hashing or allocating, since every field of every line is noted.
    found: Vec<(&'static str, Vec<KeySeen>)>,
    /// What each key means, remembered: a log repeats the same keys on every line.
    meanings: Meanings,
    /// The line being read.
    line_no: usize,
    /// What the last line was, for the tally.
    kind: &'static str,
    /// (prefix, kind, lines).
    shapes: Vec<(&'static str, &'static str, usize)>,
}

/// A key a seed field was read from: the key, on how many records, first on which line.
type KeySeen = (String, usize, usize);

/// Python's `warnings` output: `path/to/module.py:893: SecurityWarning: message`.
static PYTHON_WARNING: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\S+\.py:\d+: [A-Za-z_]*(?:Warning|Error): ").expect("valid regex")
});

impl<'o> Reader<'o> {
    fn new(options: &'o Options) -> Reader<'o> {
        Reader {
            maps: &options.fields,
            hostnames: HashMap::new(),
            ambiguous: HashMap::new(),
            banner_names: None,
            banner: false,
            traceback: false,
            python: HashSet::new(),
            found: Vec::new(),
            meanings: Meanings::default(),
            line_no: 0,
            kind: "",
            shapes: Vec::new(),
        }
    }

    fn tally(&mut self, prefix: &'static str, kind: &'static str) {
        match self
            .shapes
            .iter_mut()
            .find(|(p, k, _)| *p == prefix && *k == kind)
        {
            Some(entry) => entry.2 += 1,
            None => self.shapes.push((prefix, kind, 1)),
        }
    }

    fn finish(&mut self, raw: Raw) -> Read {
        let line_no = self.line_no;
        let found = &mut self.found;
        let (line, millis) = canonical(raw, self.maps, &mut self.meanings, &mut |field, key| {
            let at = match found.iter().position(|(f, _)| *f == field) {
                Some(at) => at,
                None => {
                    found.push((field, Vec::new()));
                    found.len() - 1
                }
            };
            let keys = &mut found[at].1;
            match keys.iter_mut().find(|(k, _, _)| k == key) {
                Some(entry) => entry.1 += 1,
                None => keys.push((key.to_owned(), 1, line_no)),
            }
        });
        Read::Line(line, millis)
    }

    /// One line: an orchestrator's prefix, then a record (or a container of records).
    fn line(&mut self, text: &str) -> Result<Vec<Read>, String> {
        let text = prefix::strip_colours(text);
        let (source, rest) = prefix::split_source(&text);
        self.kind = "";
        let reads = self.body(source.as_ref().map(|s| s.name), rest);
        if !self.kind.is_empty() {
            self.tally(source.map_or("", |s| s.prefix.shape()), self.kind);
        }
        reads
    }

    fn body(&mut self, source: Option<&str>, rest: &str) -> Result<Vec<Read>, String> {
        let body = rest.trim();
        let stream = source.unwrap_or("");
        if body.is_empty() {
            // A blank line behind a `compose logs` prefix.
            return Ok(vec![Read::Skip]);
        }
        if body.contains(".py:") && PYTHON_WARNING.is_match(body) {
            self.python.insert(stream.to_owned());
            return Ok(vec![Read::Skip]);
        }
        if self.traceback {
            if rest.starts_with(char::is_whitespace) {
                return Ok(vec![Read::Skip]);
            }
            self.traceback = false;
            // The line that closes a traceback names the exception; a record after it is read.
            if !looks_like_a_record(body) {
                return Ok(vec![Read::Skip]);
            }
        }
        let (stamp, json) = prefix::split_timestamp(body).unwrap_or(("", body));
        if json.starts_with('{') {
            let value: serde_json::Value =
                serde_json::from_str(json).map_err(|err| format!("invalid JSON: {err}"))?;
            return self.json(value, source, stamp);
        }
        if let Some(line) = celery_line(body) {
            self.banner = false;
            self.kind = "Celery";
            if !self.python.contains(stream) {
                self.python.insert(stream.to_owned());
            }
            let raw = self.celery(
                source,
                line.ts,
                line.level,
                line.process.trim(),
                line.message.trim(),
            );
            return Ok(vec![self.finish(raw)]);
        }
        if body.starts_with("--")
            && let Some(captures) = CELERY_BANNER.captures(body)
        {
            self.banner = true;
            self.kind = "Celery";
            self.python.insert(stream.to_owned());
            self.celery_banner(stream, &captures[1]);
            return Ok(vec![Read::Skip]);
        }
        if body.starts_with("Traceback (most recent call last)") {
            self.traceback = true;
            return Ok(vec![Read::Skip]);
        }
        if self.banner {
            if !looks_like_a_record(body) {
                return Ok(vec![Read::Skip]);
            }
            self.banner = false;
        }
        let mut raw = match logfmt(body) {
            Ok(raw) => raw,
            // A multi-line message of a Python process continues on lines of free text.
            Err(_) if self.python.contains(stream) && !looks_like_a_record(body) => {
                return Ok(vec![Read::Skip]);
            }
            // A framework's own free-text record (`TIMESTAMP LEVEL message`, as tracing's and
            // logging's default formats write "Worker w-1 started"): well formed, about nothing
            // a request did.
            Err(_) if free_text_record(body) => return Ok(vec![Read::Skip]),
            Err(err) => return Err(err),
        };
        self.kind = "logfmt";
        raw.worker = source.map(str::to_owned);
        Ok(vec![self.finish(raw)])
    }

    /// A JSON record (or a platform's container of records), from a line or a document.
    fn json(
        &mut self,
        value: serde_json::Value,
        source: Option<&str>,
        stamp: &str,
    ) -> Result<Vec<Read>, String> {
        self.banner = false;
        match records::read(value)? {
            Json::Plain(mut raw) => {
                self.kind = "JSON";
                celery_in_json(&mut raw);
                raw.worker = source.map(str::to_owned);
                if raw.ts.is_none() && !stamp.is_empty() {
                    raw.ts = Some(stamp.to_owned());
                }
                Ok(vec![self.finish(raw)])
            }
            Json::Entries(shape, entries) => {
                self.kind = shape;
                Ok(entries
                    .into_iter()
                    .map(|entry| self.entry(entry, source))
                    .collect())
            }
        }
    }

    /// A container's record: its own line read like any line, then completed by the container.
    fn entry(&mut self, entry: Entry, source: Option<&str>) -> Read {
        let mut origin = entry.origin;
        if origin.worker.is_none() {
            origin.worker = source.map(str::to_owned);
        }
        let text = entry.text.unwrap_or_default();
        let body = text.trim();
        let mut raw = self.inner(body, &origin);
        if let Some(carrier) = entry.carrier {
            for (key, _) in &mut raw.fields {
                key.insert(0, '.');
                key.insert_str(0, carrier);
            }
        }
        origin.fill(&mut raw);
        self.finish(raw)
    }

    /// The program's own line inside a container: JSON, Celery's, logfmt, or free text (then
    /// the whole text is the message).
    fn inner(&mut self, body: &str, origin: &Origin) -> Raw {
        if body.is_empty() {
            return Raw::default();
        }
        if body.starts_with('{')
            && let Ok(serde_json::Value::Object(object)) = serde_json::from_str(body)
        {
            let mut raw = records::plain(object);
            celery_in_json(&mut raw);
            return raw;
        }
        if let Some(line) = celery_line(body) {
            let stream = origin.worker.as_deref();
            if let Some(stream) = stream
                && !self.python.contains(stream)
            {
                self.python.insert(stream.to_owned());
            }
            return self.celery(
                stream,
                line.ts,
                line.level,
                line.process.trim(),
                line.message.trim(),
            );
        }
        if let Ok(raw) = logfmt(body) {
            return raw;
        }
        Raw {
            fields: vec![("msg".to_owned(), body.to_owned())],
            ..Raw::default()
        }
    }
}

/// A Celery log through a JSON formatter: its message is one of Celery's.
fn celery_in_json(raw: &mut Raw) {
    let message = raw
        .fields
        .iter()
        .find(|(k, _)| matches!(top_meaning(k), Some(Meaning::Message(2 | 3))))
        .map(|(_, v)| v.clone());
    // Celery's messages name a task in brackets or restore deliveries; others are not tried.
    if let Some(message) = message.filter(|m| m.contains('[') || m.starts_with("Restoring")) {
        let mut extra = Vec::new();
        if celery_message(&message, &mut extra) {
            raw.fields.extend(
                extra
                    .into_iter()
                    .filter(|(k, _)| k != "status" || status_of(&message).is_none()),
            );
        }
    }
}

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

/// Whether a line starts like a log record (a JSON object, a timestamp, a Celery bracket).
fn looks_like_a_record(body: &str) -> bool {
    let bytes = body.as_bytes();
    match bytes.first() {
        Some(b'{') => true,
        Some(b'[') => bytes.get(1).is_some_and(u8::is_ascii_digit),
        Some(b) => b.is_ascii_digit(),
        None => false,
    }
}

/// Reads a whole file as a log, streamed.
pub fn parse_file(path: &std::path::Path, options: &Options) -> racecert_core::Result<Parsed> {
    let file = std::fs::File::open(path).map_err(|err| racecert_core::Error::io_at(path, err))?;
    let reader = std::io::BufReader::with_capacity(1 << 20, file);
    parse_reader(reader, options).map_err(|err| racecert_core::Error::io_at(path, err))
}

#[cfg(test)]
pub(crate) mod tests;
