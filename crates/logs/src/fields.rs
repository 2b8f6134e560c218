//! Field names and values folded into the seed's vocabulary, whatever shape the line came in:
//! spellings (`requestId`, `request_id`, `request.id`, `fields.requestId`), the team's own names
//! given with `--field NAME=PATH` ([`FieldMap`]), timestamps in any common form, levels, and the
//! worker a line came from (an explicit worker id, else the pod, container or host the record or
//! its container names). One table for every reader, so a spelling is taught once.

use super::words::status_of;
use racecert_core::contract::log::{Level, LogLine, format_timestamp};
use std::fmt;
use std::str::FromStr;

/// A line before canonicalisation: what a reader found, under the names the line used.
#[derive(Debug, Default, Clone)]
pub(super) struct Raw {
    pub ts: Option<String>,
    pub level: Option<String>,
    pub fields: Vec<(String, String)>,
    /// The worker the line came from when it does not say (a prefix, a Celery hostname, the
    /// host or pod of a journald entry, an OTLP resource, Loki labels, a CSV column).
    pub worker: Option<String>,
    /// The process within the worker, when the container says (journald's `_PID`).
    pub process: Option<String>,
}

/// What a field name means once spellings are folded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Meaning {
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
    /// Where the line ran (pod, container, host): the worker when no field names the worker;
    /// lower ranks are more specific (a pod before the node it runs on).
    Host(u8),
    /// The process within the worker (a pid, Celery's process name).
    Process,
}

/// Names `--field` may map, beyond the seed's diagnosis fields.
const MAPPABLE_EXTRA: [&str; 6] = [
    "status",
    "ts",
    "level",
    "process",
    "served_model_version",
    "new_model_version",
];

/// A team's own name for a field: `--field NAME=PATH` says the value at `PATH` (a key as the
/// reader flattens a record: nested JSON objects joined with dots, OTLP and journald attributes by
/// their key, CSV columns by their header) is the seed's `NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldMap {
    /// The seed's name.
    pub name: &'static str,
    /// The key as the record spells it.
    pub path: String,
}

impl FieldMap {
    fn meaning(&self) -> Meaning {
        match self.name {
            "ts" => Meaning::Ts,
            "level" => Meaning::Level,
            "status" => Meaning::Message(0),
            "process" => Meaning::Process,
            name => Meaning::Field(name),
        }
    }
}

impl FromStr for FieldMap {
    type Err = String;

    fn from_str(text: &str) -> Result<FieldMap, String> {
        let names = || {
            racecert_core::contract::LOG_FIELDS
                .iter()
                .chain(MAPPABLE_EXTRA.iter())
                .copied()
        };
        let Some((name, path)) = text.split_once('=') else {
            return Err(format!(
                "--field {text:?}: expected NAME=PATH (e.g. request_id=ctx.rid)"
            ));
        };
        let (name, path) = (name.trim(), path.trim());
        let Some(name) = names().find(|n| *n == name) else {
            return Err(format!(
                "--field {text:?}: {name:?} is not a field racecert reads; NAME is one of {}",
                names().collect::<Vec<_>>().join(", ")
            ));
        };
        if path.is_empty() {
            return Err(format!(
                "--field {text:?}: the PATH after '=' is empty (a key such as ctx.rid)"
            ));
        }
        Ok(FieldMap {
            name,
            path: path.to_owned(),
        })
    }
}

impl fmt::Display for FieldMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.name, self.path)
    }
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
        Meaning::Host(_) => Some("worker_id"),
        Meaning::Process => Some("process"),
    }
}

pub(super) fn meaning(key: &str) -> Option<Meaning> {
    // Folded on the stack: this runs for every key of every line. No known name is longer.
    let mut folded = [0u8; 32];
    let mut length = 0;
    for byte in key.bytes().filter(u8::is_ascii_alphanumeric) {
        if length == folded.len() {
            return None;
        }
        folded[length] = byte.to_ascii_lowercase();
        length += 1;
    }
    folded_meaning(std::str::from_utf8(&folded[..length]).ok()?)
}

/// Objects in which loggers and exporters put a record's own fields: tracing's JSON format
/// (`fields`), OpenTelemetry-style `attributes`, Loki `labels`, Python's `extra`, `context`; and
/// the string fields in which shippers carry the program's own record (`log`, `message`, `msg`,
/// `textPayload`, read as its fields under that key). A key under them means what it means at
/// the top, however deep (`log.fields.requestId`).
const WRAPPERS: &[&str] = &[
    "log.",
    "message.",
    "msg.",
    "textPayload.",
    "fields.",
    "attributes.",
    "attrs.",
    "labels.",
    "extra.",
    "context.",
    "ctx.",
];

/// The meaning of a key at the top or under a wrapper ([`WRAPPERS`]).
pub(super) fn top_meaning(key: &str) -> Option<Meaning> {
    let mut key = key;
    loop {
        if let Some(found) = meaning(key) {
            return Some(found);
        }
        key = WRAPPERS.iter().find_map(|w| key.strip_prefix(w))?;
    }
}

/// The meaning of a dotted key: the whole key's, else that of its shortest tail that has one
/// (`fields.requestId` is `requestId`: tracing's JSON puts the event's fields under `fields`,
/// OTLP exports put them under `attributes`, Loki under `labels`). A message found in a tail
/// ranks after every message named at the top (`error.message` is not the record's message).
fn path_meaning(key: &str) -> Option<Meaning> {
    if let Some(found) = meaning(key) {
        return Some(found);
    }
    if !key.contains('.') {
        return None;
    }
    let mut rest = key;
    while let Some((_, tail)) = rest.split_once('.') {
        rest = tail;
        if let Some(found) = meaning(rest) {
            return Some(match found {
                Meaning::Message(rank) => Meaning::Message(rank + 4),
                other => other,
            });
        }
    }
    None
}

fn folded_meaning(folded: &str) -> Option<Meaning> {
    Some(match folded {
        "ts" | "time" | "timestamp" | "asctime" | "datetime" | "timeunixnano" | "tsns"
        | "eventtime" => Meaning::Ts,
        "level" | "severity" | "lvl" | "levelname" | "loglevel" | "severitytext" => Meaning::Level,
        "status" => Meaning::Message(0),
        "event" => Meaning::Message(1),
        "msg" => Meaning::Message(2),
        "message" | "body" => Meaning::Message(3),
        "requestid" | "reqid" | "xrequestid" => Meaning::Field("request_id"),
        "jobid" | "taskid" | "jid" => Meaning::Field("job_id"),
        "idempotencykey" | "idempotencyid" | "dedupekey" | "dedupkey" | "dedupeid" => {
            Meaning::Field("idempotency_key")
        }
        "workerid" | "worker" | "workername" => Meaning::Field("worker_id"),
        "podname" | "pod" | "k8spodname" => Meaning::Host(0),
        "containername" | "container" | "logstreamname" => Meaning::Host(1),
        "hostname" | "host" | "nodename" => Meaning::Host(2),
        "instance" | "serviceinstanceid" => Meaning::Host(3),
        "pid" | "process" | "processname" | "processpid" | "processid" => Meaning::Process,
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
    let text = raw
        .trim()
        .trim_matches(|c| c == '[' || c == ']' || c == '"');
    if text.is_empty() || text.len() > 64 {
        return None;
    }
    quick_timestamp(text).or_else(|| any_timestamp(text))
}

/// `YYYY-MM-DD(T| )HH:MM:SS[(.|,)DIGITS][Z]`, the shape of nearly every line of most logs, read
/// without allocating or a general parser (a replay reads one per line). `None` for anything
/// else, and for a field out of its range, which [`any_timestamp`] then reads or refuses.
fn quick_timestamp(text: &str) -> Option<jiff::Timestamp> {
    let b = text.as_bytes();
    if b.len() < 19
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let number = |range: std::ops::Range<usize>| {
        b[range].iter().try_fold(0i64, |value, digit| {
            digit
                .is_ascii_digit()
                .then(|| value * 10 + i64::from(digit - b'0'))
        })
    };
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    let mut rest = &b[19..];
    let mut nanos = 0i64;
    if let Some((b'.' | b',', fraction)) = rest.split_first() {
        let digits = fraction.iter().take_while(|d| d.is_ascii_digit()).count();
        if digits == 0 || digits > 9 {
            return None;
        }
        nanos = number(20..20 + digits)? * 10i64.pow(9 - digits as u32);
        rest = &fraction[digits..];
    }
    if !(rest.is_empty() || rest == b"Z") || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    // A leap second (`23:59:60.5`) is read as the last second of its minute, fraction kept, as
    // the general reader (jiff) reads it: the two readers never disagree on a line.
    let second = second.min(59);
    // The date checked by the calendar (months' lengths, leap years), then days since the epoch
    // by the civil-from-days inverse (H. Hinnant's `days_from_civil`).
    jiff::civil::Date::new(year as i16, month as i8, day as i8).ok()?;
    let shifted = if month <= 2 { year - 1 } else { year };
    let era = shifted.div_euclid(400);
    let year_of_era = shifted - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second;
    jiff::Timestamp::new(seconds, nanos as i32).ok()
}

/// Whether a timestamp that was read is written as [`format_timestamp`] writes it (a leap
/// second is not: it was read as `:59`, and is written so).
fn is_seed_timestamp(ts: &str) -> bool {
    let b = ts.as_bytes();
    b.len() == 24
        && b[0].is_ascii_digit()
        && b[10] == b'T'
        && b[19] == b'.'
        && b[23] == b'Z'
        && &b[17..19] != b"60"
}

/// Every other shape [`read_timestamp`] reads.
fn any_timestamp(text: &str) -> Option<jiff::Timestamp> {
    if text.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        // Whole digits apart, so nanoseconds keep their milliseconds exactly.
        let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
        let digits = whole.trim_start_matches('0').len();
        let (divisor, unit): (i128, i128) = match digits {
            0..=11 => (1, 1000),
            12..=14 => (1000, 1000),
            15..=17 => (1_000_000, 1000),
            18..=20 => (1_000_000_000, 1000),
            _ => return None,
        };
        let whole: i128 = if whole.is_empty() {
            0
        } else {
            whole.parse().ok()?
        };
        // Milliseconds: whole units scaled, plus the fraction's share of one unit.
        let mut millis = whole * unit / divisor;
        if !fraction.is_empty() {
            let value: f64 = format!("0.{fraction}").parse().ok()?;
            millis += (value * unit as f64 / divisor as f64).round() as i128;
        }
        let millis = i64::try_from(millis).ok()?;
        if millis.unsigned_abs() > 250_000_000_000_000 {
            return None;
        }
        return jiff::Timestamp::from_millisecond(millis).ok();
    }
    let bytes = text.as_bytes();
    if bytes.len() < 19 || !bytes[0].is_ascii_digit() || bytes[4] != b'-' {
        return None;
    }
    let mut normal = text.replace(',', ".");
    if normal.as_bytes().get(10) == Some(&b' ') {
        normal.replace_range(10..11, "T");
    }
    // `2026-07-03 08:00:00.000 +0000 UTC` (Go's default) and `... UTC`: the zone words go.
    if let Some(stripped) = normal.strip_suffix(" UTC") {
        normal = stripped.to_owned();
    }
    if let Ok(ts) = normal.parse::<jiff::Timestamp>() {
        return Some(ts);
    }
    if let Some((civil, offset)) = normal.rsplit_once(' ')
        && (offset.starts_with('+') || offset.starts_with('-'))
        && let Ok(ts) = format!("{civil}{offset}").parse::<jiff::Timestamp>()
    {
        return Some(ts);
    }
    let civil: jiff::civil::DateTime = normal.parse().ok()?;
    civil
        .to_zoned(jiff::tz::TimeZone::UTC)
        .ok()
        .map(|z| z.timestamp())
}

pub(super) fn level_of(word: &str) -> Option<Level> {
    let word = word.trim_matches(|c: char| c == '[' || c == ']' || c == ':');
    match word.to_ascii_uppercase().as_str() {
        "INFO" | "DEBUG" | "TRACE" | "NOTICE" | "I" | "D" | "10" | "20" | "30" => Some(Level::Info),
        "WARN" | "WARNING" | "W" | "40" => Some(Level::Warn),
        "ERROR" | "ERR" | "FATAL" | "CRITICAL" | "CRIT" | "E" | "50" | "60" => Some(Level::Error),
        _ => None,
    }
}

/// The value of the first field meaning `seed_name`, whatever its spelling.
pub(super) fn field_value(fields: &[(String, String)], seed_name: &str) -> Option<String> {
    fields
        .iter()
        .find(|(k, _)| matches!(meaning(k), Some(Meaning::Field(name)) if name == seed_name))
        .map(|(_, v)| v.clone())
}

/// Keys remembered with their tier and meaning, up to [`Meanings::CAPACITY`] keys (a log has a
/// few dozen; one that names its keys after its values stops being remembered, not growing).
#[derive(Debug, Default)]
pub(super) struct Meanings {
    known: rustc_hash::FxHashMap<String, (u8, Option<Meaning>)>,
}

impl Meanings {
    const CAPACITY: usize = 4096;

    /// A key's tier and meaning: tier 0 mapped by the team, 1 spelled at the top (or under a
    /// wrapper), 2 found in a dotted tail.
    fn of(&mut self, key: &str, maps: &[FieldMap]) -> (u8, Option<Meaning>) {
        if let Some(known) = self.known.get(key) {
            return *known;
        }
        let found = if let Some(map) = maps.iter().find(|m| m.path.eq_ignore_ascii_case(key)) {
            (0, Some(map.meaning()))
        } else {
            match top_meaning(key) {
                Some(found) => (1, Some(found)),
                None => (2, path_meaning(key)),
            }
        };
        if self.known.len() < Self::CAPACITY {
            self.known.insert(key.to_owned(), found);
        }
        found
    }
}

/// Folds a raw line into the seed's vocabulary. `maps` are the team's own names (`--field`),
/// which win over every spelling (`meanings` remembers keys under these maps);
/// `note(seed name, key)` hears where each field was found.
pub(super) fn canonical(
    raw: Raw,
    maps: &[FieldMap],
    meanings: &mut Meanings,
    note: &mut dyn FnMut(&'static str, &str),
) -> (LogLine, Option<i64>) {
    // Each key's meaning and tier. A seed field takes the value of its lowest tier, then its
    // first key.
    let meanings: Vec<(u8, Option<Meaning>)> = raw
        .fields
        .iter()
        .map(|(key, _)| meanings.of(key, maps))
        .collect();
    let picks = Picks::of(&raw, &meanings);
    let mut folded = Folded {
        ts: raw.ts,
        level: raw.level.as_deref().and_then(level_of),
        fields: Vec::with_capacity(raw.fields.len() + 3),
        messages: Vec::new(),
        maybe_version: None,
        retries: None,
        worker: None,
        process: None,
        seen: Vec::new(),
    };
    for (i, (key, value)) in raw.fields.into_iter().enumerate() {
        let (_, m) = meanings[i];
        folded.field(i, key, value, m, &picks, note);
    }
    folded.derive(raw.process, raw.worker, note);
    folded.place_status(note);
    folded.into_line()
}

/// Which keys a line's one-valued meanings take their values from (indices into its fields).
struct Picks {
    /// The timestamp's, when the reader found none.
    ts: Option<usize>,
    /// The worker's place.
    host: Option<usize>,
    /// The process's.
    process: Option<usize>,
    /// Each seed field's best-ranked key.
    winners: Vec<(&'static str, usize)>,
}

impl Picks {
    /// The picks of a line whose keys have these tiers and meanings.
    fn of(raw: &Raw, meanings: &[(u8, Option<Meaning>)]) -> Picks {
        let winner = |wanted: &dyn Fn(Meaning) -> bool| {
            meanings
                .iter()
                .enumerate()
                .filter(|(_, (_, m))| m.is_some_and(wanted))
                .min_by_key(|(i, (tier, _))| (*tier, *i))
                .map(|(i, _)| i)
        };
        let mut ts: Option<usize> = None;
        if raw.ts.is_none() {
            ts = winner(&|m| m == Meaning::Ts);
        }
        let host = winner(&|m| matches!(m, Meaning::Host(_)))
            .and_then(|first| {
                // The most specific place wins (a pod before its node), then the lowest tier.
                meanings
                    .iter()
                    .enumerate()
                    .filter_map(|(i, (tier, m))| match m {
                        Some(Meaning::Host(rank)) => Some((*rank, *tier, i)),
                        _ => None,
                    })
                    .min()
                    .map(|(_, _, i)| i)
                    .or(Some(first))
            })
            .filter(|&i| !raw.fields[i].1.is_empty());
        let process = winner(&|m| m == Meaning::Process);
        // Fields the team mapped or spelled at the top, then those found in tails: a field takes
        // its best-ranked key's value, whatever the order of the keys.
        let mut winners: Vec<(&'static str, usize)> = Vec::new();
        for (i, (tier, m)) in meanings.iter().enumerate() {
            if let Some(Meaning::Field(name)) = m {
                match winners.iter_mut().find(|(n, _)| n == name) {
                    Some(best) if meanings[best.1].0 > *tier => best.1 = i,
                    Some(_) => {}
                    None => winners.push((name, i)),
                }
            }
        }
        Picks {
            ts,
            host,
            process,
            winners,
        }
    }
}

/// A line as its fields are folded, with what the folding found for the fields it derives.
struct Folded {
    ts: Option<String>,
    level: Option<Level>,
    fields: Vec<(String, String)>,
    /// (rank, value, index in `fields`): messages stay where they were written.
    messages: Vec<(u8, String, usize)>,
    maybe_version: Option<(String, String)>,
    retries: Option<(String, String)>,
    worker: Option<(String, String)>,
    process: Option<String>,
    seen: Vec<&'static str>,
}

impl Folded {
    /// Folds the line's `i`th field, whose key means `m`.
    fn field(
        &mut self,
        i: usize,
        key: String,
        value: String,
        m: Option<Meaning>,
        picks: &Picks,
        note: &mut dyn FnMut(&'static str, &str),
    ) {
        match m {
            Some(Meaning::Ts) if picks.ts == Some(i) => {
                note("ts", &key);
                self.ts = Some(value);
            }
            Some(Meaning::Level) if self.level.is_none() && level_of(&value).is_some() => {
                note("level", &key);
                self.level = level_of(&value);
            }
            Some(Meaning::Message(rank)) => {
                self.messages.push((rank, value.clone(), self.fields.len()));
                self.fields.push((key, value));
            }
            Some(Meaning::Field(name)) if picks.winners.contains(&(name, i)) => {
                if !self.seen.contains(&name) {
                    self.seen.push(name);
                    note(name, &key);
                    self.fields.push((name.to_owned(), value));
                }
            }
            Some(Meaning::MaybeVersion) if looks_like_version(&value) => {
                if self.maybe_version.is_none() {
                    self.maybe_version = Some((key.clone(), value.clone()));
                }
                self.fields.push((key, value));
            }
            Some(Meaning::Retries) => {
                if self.retries.is_none() {
                    self.retries = Some((key.clone(), value.clone()));
                }
                self.fields.push((key, value));
            }
            Some(Meaning::Host(_)) if picks.host == Some(i) => {
                self.worker = Some((key.clone(), value.clone()));
                self.fields.push((key, value));
            }
            Some(Meaning::Process) if picks.process == Some(i) && key != "process" => {
                note("process", &key);
                self.process = Some(value.clone());
                self.fields.push((key, value));
            }
            _ => self.fields.push((key, value)),
        }
    }

    /// The seed fields the line did not spell but implied: the model version, the attempt (from
    /// a retry count), the process and the worker (else the reader's).
    fn derive(
        &mut self,
        raw_process: Option<String>,
        raw_worker: Option<String>,
        note: &mut dyn FnMut(&'static str, &str),
    ) {
        let fields = &mut self.fields;
        let has = |fields: &[(String, String)], name: &str| fields.iter().any(|(k, _)| k == name);
        if !has(fields, "model_version")
            && let Some((key, version)) = self.maybe_version.take()
        {
            note("model_version", &key);
            fields.push(("model_version".to_owned(), version));
        }
        if !has(fields, "attempt")
            && let Some((key, retries)) = self.retries.take()
            && let Ok(retries) = retries.trim().parse::<u32>()
        {
            note("attempt", &key);
            fields.push((
                "attempt".to_owned(),
                (retries.saturating_add(1)).to_string(),
            ));
        }
        if !has(fields, "process")
            && let Some(process) = self.process.take().or(raw_process)
        {
            fields.push(("process".to_owned(), process));
        }
        if !has(fields, "worker_id") {
            if let Some((key, worker)) = self.worker.take() {
                note("worker_id", &key);
                fields.push(("worker_id".to_owned(), worker));
            } else if let Some(worker) = raw_worker {
                fields.push(("worker_id".to_owned(), worker));
            }
        }
    }

    /// The status: the first candidate (status, event, msg, message) that names a status word;
    /// else an explicit status or event, raw. It takes the place of an explicit `status` (whose
    /// raw text, if different, stays as `status_text`); messages stay as they were written.
    fn place_status(&mut self, note: &mut dyn FnMut(&'static str, &str)) {
        let (fields, messages) = (&mut self.fields, &mut self.messages);
        messages.sort_by_key(|(rank, _, _)| *rank);
        let named = messages.iter().find_map(|(_, value, index)| {
            status_of(value).map(|w| (w.as_str().to_owned(), *index))
        });
        let status = named.clone().or_else(|| {
            messages
                .iter()
                .find(|(rank, _, _)| *rank <= 1)
                .map(|(_, value, index)| (value.clone(), *index))
        });
        if let Some((status, from)) = status {
            note("status", &fields[from].0);
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
    }

    /// The folded line, and its time in ms when its timestamp reads.
    fn into_line(self) -> (LogLine, Option<i64>) {
        let (ts, level, fields) = (self.ts, self.level, self.fields);
        let at = ts.as_deref().and_then(read_timestamp);
        let line = LogLine {
            ts: match (at, ts) {
                // Already as the seed writes it (what [`quick_timestamp`] read, 24 bytes from a
                // digit to the `Z`: nothing trimmed, three fraction digits): kept, not formatted
                // again.
                (Some(_), Some(ts)) if is_seed_timestamp(&ts) => ts,
                (Some(at), _) => format_timestamp(at),
                (None, ts) => ts.unwrap_or_default(),
            },
            level: level.unwrap_or(Level::Info),
            fields,
        };
        (line, at.map(|at| at.as_millisecond()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The quick reader reads what the general one reads, as the general one reads it, on
        /// the quick reader's shape with fields at and just past their ranges' edges.
        #[test]
        fn the_quick_reader_agrees_with_the_general_one(
            date in (0u32..=9999, 0u32..=13, 0u32..=32),
            time in (0u32..=24, 0u32..=60, 0u32..=60),
            date_time in proptest::sample::select(vec!['T', ' ']),
            fraction in proptest::option::of(("[.,]", "[0-9]{0,10}")),
            zone in proptest::sample::select(vec!["", "Z", "+00:00", " UTC", "z"]),
        ) {
            let ((year, month, day), (hour, minute, second)) = (date, time);
            let mut text = format!(
                "{year:04}-{month:02}-{day:02}{date_time}{hour:02}:{minute:02}:{second:02}"
            );
            if let Some((separator, digits)) = &fraction {
                text.push_str(separator);
                text.push_str(digits);
            }
            text.push_str(zone);
            if let Some(quick) = quick_timestamp(&text) {
                prop_assert_eq!(Some(quick), any_timestamp(&text), "{}", text);
            }
            if is_seed_timestamp(&text) && let Some(at) = read_timestamp(&text) {
                prop_assert_eq!(format_timestamp(at), text);
            }
        }

        /// A leap second is read as `:59` of its minute by every reader, and written so.
        #[test]
        fn a_leap_second_is_the_last_second_of_its_minute(
            date in (1u32..=9999, 1u32..=12, 1u32..=28),
            time in (0u32..=23, 0u32..=59),
            millis in 0u32..1000,
        ) {
            let ((year, month, day), (hour, minute)) = (date, time);
            let leap = format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:60.{millis:03}Z");
            let last = format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:59.{millis:03}Z");
            let at = read_timestamp(&last).unwrap();
            prop_assert_eq!(quick_timestamp(&leap), Some(at));
            prop_assert_eq!(any_timestamp(&leap), Some(at));
            prop_assert_eq!(read_timestamp(&leap).map(format_timestamp), Some(last));
        }

        /// Valid timestamps of any day: the quick reader reads them all.
        #[test]
        fn the_quick_reader_reads_every_day(millis in -62_135_596_800_000i64..253_402_207_200_000) {
            let at = jiff::Timestamp::from_millisecond(millis).unwrap();
            let text = format_timestamp(at);
            prop_assert_eq!(quick_timestamp(&text), Some(at), "{}", text);
        }
    }
}
