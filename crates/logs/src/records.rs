//! JSON records, ordinary or from a platform's export, each shape read as its own documentation
//! describes it:
//! - an ordinary JSON log line, nested objects flattened with dotted keys (`{"fields":
//!   {"requestId":..}}` is `fields.requestId`, which [`super::fields`] folds to `request_id`);
//! - journald's export (`journalctl -o json`): `MESSAGE` is the program's own line,
//!   `__REALTIME_TIMESTAMP` its time in microseconds, `_HOSTNAME`, `CONTAINER_NAME` and `_PID`
//!   where it ran, `PRIORITY` its syslog level;
//! - OTLP JSON as the OpenTelemetry collector's file exporter writes it (`resourceLogs` >
//!   `scopeLogs` > `logRecords`, attributes as `[{key, value: {stringValue|intValue|..}}]`,
//!   `timeUnixNano`, the resource's `k8s.pod.name`, `host.name`, `process.pid`);
//! - Loki: the HTTP API's query response (`data.result[].stream` labels and `values` of
//!   `[nanoseconds, line]`), its push body (`streams`), and `logcli --output=jsonl` lines
//!   (`labels`, `line`, `timestamp`);
//! - Grafana data frames (a panel's data as JSON: `schema.fields` names the columns,
//!   `data.values` holds them), with Loki's `labels`, `Time` and `Line` columns.
//!
//! A container's record carries the program's own line as text; that text is read like any
//! other line (it may be logfmt, JSON or Celery's), then the container's fields fill what the
//! line does not say: its time, level, and the pod, container or host it ran on.

use super::fields::{Meaning, Raw, meaning};
use serde_json::{Map, Value};

/// Where a container says a record came from.
#[derive(Debug, Default, Clone)]
pub(super) struct Origin {
    pub ts: Option<String>,
    pub level: Option<String>,
    /// The container's own fields (labels, attributes, columns), under their own names.
    pub fields: Vec<(String, String)>,
    /// The pod, container or host the fields name, most specific first: the worker when the
    /// line does not name one, and the stream a Celery worker's hostname is remembered in.
    pub worker: Option<String>,
}

impl Origin {
    /// Completes `worker` from `fields`.
    pub(super) fn identify(mut self) -> Origin {
        self.worker = self
            .fields
            .iter()
            .filter_map(|(key, value)| match meaning(key) {
                Some(Meaning::Host(rank)) if !value.is_empty() => Some((rank, value)),
                _ => None,
            })
            .min_by_key(|(rank, _)| *rank)
            .map(|(_, value)| value.clone());
        self
    }

    /// Fills what `raw` does not say from the container.
    pub(super) fn fill(self, raw: &mut Raw) {
        if raw.ts.is_none() {
            raw.ts = self.ts;
        }
        if raw.level.is_none() {
            raw.level = self.level;
        }
        if raw.worker.is_none() {
            raw.worker = self.worker;
        }
        for (key, value) in self.fields {
            if !raw.fields.iter().any(|(k, _)| *k == key) {
                raw.fields.push((key, value));
            }
        }
    }
}

/// One record of a container: where it came from, and the program's own line if it has one.
#[derive(Debug)]
pub(super) struct Entry {
    pub origin: Origin,
    pub text: Option<String>,
    /// The key whose string value held `text`, when a shipper wrapped the program's line in a
    /// JSON record (`log`, `message`): the fields read from it are keyed under it
    /// (`message.request_id`), so the report says where each came from.
    pub carrier: Option<&'static str>,
}

/// What a JSON value was.
pub(super) enum Json {
    /// An ordinary JSON log record.
    Plain(Raw),
    /// A platform's container of records, with the shape's name.
    Entries(&'static str, Vec<Entry>),
}

/// Reads a JSON value: a platform's container if its keys say so, else an ordinary record.
pub(super) fn read(value: Value) -> Result<Json, String> {
    let object = match value {
        Value::Object(object) => object,
        Value::Array(items) => {
            return frames(items.iter())
                .map(|entries| Json::Entries("Grafana data frames", entries))
                .ok_or_else(|| "a JSON array that is no Grafana data frame list".to_owned());
        }
        _ => return Err("JSON line is not an object".to_owned()),
    };
    if object.contains_key("resourceLogs") || object.contains_key("resource_logs") {
        return Ok(Json::Entries("OTLP JSON", otlp(&Value::Object(object))));
    }
    if object.contains_key("__REALTIME_TIMESTAMP")
        || (object.contains_key("MESSAGE") && object.keys().any(|k| k.starts_with('_')))
    {
        return Ok(Json::Entries("journald JSON", vec![journald(object)]));
    }
    if let Some(Value::Object(data)) = object.get("data")
        && let Some(Value::Array(result)) = data.get("result")
        && data.get("resultType").and_then(Value::as_str) == Some("streams")
    {
        return Ok(Json::Entries("Loki query response", loki_streams(result)));
    }
    if let Some(Value::Array(streams)) = object.get("streams")
        && streams.iter().all(|s| s.get("values").is_some())
    {
        return Ok(Json::Entries("Loki push body", loki_streams(streams)));
    }
    if let Some(Value::String(line)) = object.get("line")
        && let Some(Value::Object(labels)) = object.get("labels")
    {
        let origin = Origin {
            ts: object.get("timestamp").map(text_of),
            level: None,
            fields: labels
                .iter()
                .map(|(k, v)| (k.clone(), text_of(v)))
                .collect(),
            worker: None,
        }
        .identify();
        let entry = Entry {
            origin,
            text: Some(line.clone()),
            carrier: None,
        };
        return Ok(Json::Entries("logcli JSON lines", vec![entry]));
    }
    if object.contains_key("schema") && object.contains_key("data")
        || object.contains_key("frames")
        || object.contains_key("results")
    {
        let value = Value::Object(object);
        if let Some(entries) = frames(std::iter::once(&value)) {
            return Ok(Json::Entries("Grafana data frames", entries));
        }
        let Value::Object(object) = value else {
            unreachable!("built from an object above")
        };
        return Ok(carried(object));
    }
    Ok(carried(object))
}

/// Keys in which log shippers put the program's own line as a string: Docker's json-file driver,
/// Fluent Bit and Vector (`log`), CloudWatch events and most shippers (`message`, `msg`),
/// Cloud Logging (`textPayload`).
const CARRIERS: [&str; 4] = ["log", "message", "msg", "textPayload"];

/// An ordinary record, or one whose line is inside a string: `log` always (a shipper's record of
/// a container's output, whatever the program wrote), the others when the string is itself a
/// JSON object or a logfmt line naming a seed field (free text stays the record's message).
fn carried(mut object: Map<String, Value>) -> Json {
    let carrier = CARRIERS.into_iter().find(|key| match object.get(*key) {
        Some(Value::String(text)) => *key == "log" || holds_a_record(text),
        _ => false,
    });
    let Some(carrier) = carrier else {
        return Json::Plain(plain(object));
    };
    let Some(Value::String(text)) = object.remove(carrier) else {
        unreachable!("found above")
    };
    let has = |key: &str| object.contains_key(key);
    let shape = if has("eventId") || has("logStreamName") || has("ingestionTime") {
        "CloudWatch event"
    } else if carrier == "log" && has("stream") && has("time") {
        "Docker json-file"
    } else if carrier == "textPayload" {
        "Cloud Logging entry"
    } else {
        match carrier {
            "log" => "JSON, line in `log`",
            "msg" => "JSON, record in `msg`",
            _ => "JSON, record in `message`",
        }
    };
    // The outer record's time, level and place stay ordinary fields after the inner ones: where
    // the program's line names its own, the line's win.
    let origin = Origin {
        fields: plain(object).fields,
        ..Origin::default()
    }
    .identify();
    Json::Entries(
        shape,
        vec![Entry {
            origin,
            text: Some(text),
            carrier: Some(carrier),
        }],
    )
}

/// Whether a string is a record of its own: a JSON object, or a logfmt line naming a seed field.
fn holds_a_record(text: &str) -> bool {
    let text = text.trim();
    if text.starts_with('{') {
        return text.ends_with('}') && serde_json::from_str::<Map<String, Value>>(text).is_ok();
    }
    text.contains('=')
        && super::logfmt::logfmt(text).is_ok_and(|raw| {
            raw.fields.iter().any(|(key, _)| {
                matches!(meaning(key), Some(Meaning::Field(_) | Meaning::Message(0)))
            })
        })
}

/// An ordinary JSON record, nested objects flattened with dotted keys (arrays stay JSON text).
pub(super) fn plain(object: Map<String, Value>) -> Raw {
    let mut fields = Vec::new();
    flatten("", object, &mut fields);
    Raw {
        fields,
        ..Raw::default()
    }
}

fn flatten(prefix: &str, object: Map<String, Value>, out: &mut Vec<(String, String)>) {
    for (key, value) in object {
        let key = if prefix.is_empty() {
            key
        } else {
            format!("{prefix}.{key}")
        };
        match value {
            Value::Object(inner) => flatten(&key, inner, out),
            Value::String(s) => out.push((key, s)),
            Value::Null => {}
            other => out.push((key, other.to_string())),
        }
    }
}

/// A scalar as text (strings unquoted), anything else as JSON.
fn text_of(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// journald's syslog priority as a level word.
fn priority_level(priority: &str) -> Option<String> {
    let word = match priority.trim().parse::<u8>().ok()? {
        0..=3 => "ERROR",
        4 => "WARN",
        _ => "INFO",
    };
    Some(word.to_owned())
}

/// Fields of a journald entry that describe the machine, not where the program ran: left out so
/// they neither name the worker nor clutter the line.
const JOURNALD_NOISE: &[&str] = &[
    "MESSAGE",
    "PRIORITY",
    "SYSLOG_FACILITY",
    "SYSLOG_TIMESTAMP",
    "CONTAINER_ID",
    "CONTAINER_ID_FULL",
    "CONTAINER_TAG",
    "IMAGE_NAME",
    "__CURSOR",
    "__MONOTONIC_TIMESTAMP",
    "__REALTIME_TIMESTAMP",
];

fn journald(object: Map<String, Value>) -> Entry {
    let text = match object.get("MESSAGE") {
        Some(Value::String(s)) => Some(s.clone()),
        // journald exports a message that is not valid UTF-8 as an array of its bytes.
        Some(Value::Array(bytes)) => {
            let bytes: Vec<u8> = bytes
                .iter()
                .filter_map(Value::as_u64)
                .map(|b| b.min(255) as u8)
                .collect();
            Some(String::from_utf8_lossy(&bytes).into_owned())
        }
        _ => None,
    };
    let ts = object.get("__REALTIME_TIMESTAMP").map(text_of);
    let level = object
        .get("PRIORITY")
        .map(text_of)
        .and_then(|p| priority_level(&p));
    let fields = object
        .iter()
        .filter(|(key, _)| {
            !JOURNALD_NOISE.contains(&key.as_str())
                && (!key.starts_with('_')
                    || matches!(key.as_str(), "_HOSTNAME" | "_PID" | "_SYSTEMD_UNIT"))
        })
        .map(|(key, value)| (key.clone(), text_of(value)))
        .collect();
    Entry {
        origin: Origin {
            ts,
            level,
            fields,
            worker: None,
        }
        .identify(),
        text,
        carrier: None,
    }
}

/// An OTLP `AnyValue` flattened under `key` (`kvlistValue` entries as `key.name`).
fn any_value(key: &str, value: &Value, out: &mut Vec<(String, String)>) {
    let Some(object) = value.as_object() else {
        out.push((key.to_owned(), text_of(value)));
        return;
    };
    if let Some(list) = object
        .get("kvlistValue")
        .and_then(|l| l.get("values"))
        .and_then(Value::as_array)
    {
        for kv in list {
            if let Some(name) = kv.get("key").and_then(Value::as_str) {
                let nested = format!("{key}.{name}");
                any_value(&nested, kv.get("value").unwrap_or(&Value::Null), out);
            }
        }
        return;
    }
    let scalar = [
        "stringValue",
        "intValue",
        "doubleValue",
        "boolValue",
        "bytesValue",
    ]
    .iter()
    .find_map(|k| object.get(*k));
    match scalar {
        Some(value) => out.push((key.to_owned(), text_of(value))),
        None => {
            if let Some(array) = object.get("arrayValue") {
                out.push((key.to_owned(), array.to_string()));
            }
        }
    }
}

/// OTLP attributes (`[{key, value}]`) under their own keys.
fn attributes(list: Option<&Value>, out: &mut Vec<(String, String)>) {
    for kv in list.and_then(Value::as_array).into_iter().flatten() {
        if let Some(key) = kv.get("key").and_then(Value::as_str) {
            any_value(key, kv.get("value").unwrap_or(&Value::Null), out);
        }
    }
}

/// An array field under either of OTLP JSON's spellings (lowerCamelCase per the protocol's JSON
/// mapping; snake_case as some exporters write the protobuf names).
fn array<'a>(object: &'a Value, names: &[&str]) -> impl Iterator<Item = &'a Value> {
    names
        .iter()
        .find_map(|name| object.get(*name).and_then(Value::as_array))
        .into_iter()
        .flatten()
}

fn otlp(root: &Value) -> Vec<Entry> {
    let mut entries = Vec::new();
    for resource_logs in array(root, &["resourceLogs", "resource_logs"]) {
        let mut resource = Vec::new();
        attributes(
            resource_logs
                .get("resource")
                .and_then(|r| r.get("attributes")),
            &mut resource,
        );
        let scopes = array(
            resource_logs,
            &["scopeLogs", "scope_logs", "instrumentationLibraryLogs"],
        );
        for scope in scopes {
            for record in array(scope, &["logRecords", "log_records"]) {
                let mut fields = Vec::new();
                attributes(record.get("attributes"), &mut fields);
                let mut text = None;
                if let Some(body) = record.get("body") {
                    match body.get("stringValue").and_then(Value::as_str) {
                        Some(s) => text = Some(s.to_owned()),
                        None => any_value("body", body, &mut fields),
                    }
                }
                fields.extend(resource.iter().cloned());
                let time = |name: &str| {
                    record
                        .get(name)
                        .map(text_of)
                        .filter(|t| !t.is_empty() && t != "0")
                };
                let level = record
                    .get("severityText")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .or_else(|| {
                        let number = record.get("severityNumber")?.as_u64()?;
                        Some(
                            match number {
                                17.. => "ERROR",
                                13..=16 => "WARN",
                                _ => "INFO",
                            }
                            .to_owned(),
                        )
                    });
                let origin = Origin {
                    ts: time("timeUnixNano").or_else(|| time("observedTimeUnixNano")),
                    level,
                    fields,
                    worker: None,
                }
                .identify();
                entries.push(Entry {
                    origin,
                    text,
                    carrier: None,
                });
            }
        }
    }
    entries
}

fn loki_streams(streams: &[Value]) -> Vec<Entry> {
    let mut entries = Vec::new();
    for stream in streams {
        let labels: Vec<(String, String)> = stream
            .get("stream")
            .and_then(Value::as_object)
            .map(|labels| {
                labels
                    .iter()
                    .map(|(k, v)| (k.clone(), text_of(v)))
                    .collect()
            })
            .unwrap_or_default();
        for value in stream
            .get("values")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(pair) = value.as_array() else {
                continue;
            };
            let mut fields = labels.clone();
            // Loki 3's structured metadata rides as a third element.
            if let Some(Value::Object(metadata)) = pair.get(2) {
                fields.extend(metadata.iter().map(|(k, v)| (k.clone(), text_of(v))));
            }
            let origin = Origin {
                ts: pair.first().map(text_of),
                level: None,
                fields,
                worker: None,
            }
            .identify();
            entries.push(Entry {
                origin,
                text: pair.get(1).map(text_of),
                carrier: None,
            });
        }
    }
    entries
}

/// Grafana data frames wherever an export puts them: one frame, a list of frames, `frames`, or a
/// query response's `results.<refId>.frames`. `None` when there are none.
fn frames<'a>(values: impl Iterator<Item = &'a Value>) -> Option<Vec<Entry>> {
    let mut found = false;
    let mut entries = Vec::new();
    let mut queue: Vec<&Value> = values.collect();
    while let Some(value) = queue.pop() {
        match value {
            Value::Array(items) => queue.extend(items.iter().rev()),
            Value::Object(object) if object.contains_key("schema") => {
                found = true;
                frame(object, &mut entries);
            }
            Value::Object(object) => {
                if let Some(frames) = object.get("frames") {
                    queue.push(frames);
                }
                if let Some(Value::Object(results)) = object.get("results") {
                    queue.extend(results.values().filter_map(|r| r.get("frames")));
                }
            }
            _ => {}
        }
    }
    found.then_some(entries)
}

fn frame(object: &Map<String, Value>, entries: &mut Vec<Entry>) {
    let names: Vec<String> = object
        .get("schema")
        .and_then(|s| s.get("fields"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|f| f.get("name").map(text_of).unwrap_or_default())
        .collect();
    let Some(columns) = object
        .get("data")
        .and_then(|d| d.get("values"))
        .and_then(Value::as_array)
    else {
        return;
    };
    let column = |wanted: &[&str]| {
        names
            .iter()
            .position(|n| wanted.iter().any(|w| n.eq_ignore_ascii_case(w)))
    };
    let line = column(&["Line", "body", "message", "msg", "content", "log"]);
    let time = column(&["tsNs", "Time", "timestamp", "ts"]);
    let labels = column(&["labels"]);
    let rows = columns
        .iter()
        .filter_map(Value::as_array)
        .map(Vec::len)
        .max()
        .unwrap_or(0);
    for row in 0..rows {
        let cell = |i: usize| columns.get(i).and_then(|c| c.get(row));
        let mut fields = Vec::new();
        match labels.and_then(cell) {
            Some(Value::Object(map)) => {
                fields.extend(map.iter().map(|(k, v)| (k.clone(), text_of(v))))
            }
            Some(Value::String(s)) => fields.extend(super::table::label_pairs(s)),
            _ => {}
        }
        for (i, name) in names.iter().enumerate() {
            if Some(i) != line
                && Some(i) != time
                && Some(i) != labels
                && name != "id"
                && let Some(value) = cell(i).filter(|v| !v.is_null())
            {
                fields.push((name.clone(), text_of(value)));
            }
        }
        let origin = Origin {
            ts: time.and_then(cell).map(text_of),
            level: None,
            fields,
            worker: None,
        }
        .identify();
        entries.push(Entry {
            origin,
            text: line.and_then(cell).map(text_of),
            carrier: None,
        });
    }
}
