//! CSV exports of a log platform (Grafana's "Download CSV" of a logs panel, a search export):
//! a header row naming a time column (`Time`, `timestamp`, `@timestamp`, `_time`, `Date`, ...)
//! and a message column (`Line`, `message`, `@message`, `_raw`, `log`, ...), then one record per
//! row. The other columns are the record's fields under their headers: a `host`, `pod` or
//! `container` column names the worker, a `labels` column (JSON, or Loki's `{k="v", ..}`) adds
//! its labels. Rows are split by the `csv` crate; a quoted field may span lines (up to the line
//! limit), and a row is numbered by the line it starts on.

use super::records::Origin;
use regex::Regex;
use std::sync::LazyLock;

static LABEL_PAIR: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"([A-Za-z_][\w.]*)\s*=\s*"((?:[^"\\]|\\.)*)""#).expect("valid regex")
});

/// Column names, folded (lower case, alphanumerics only).
const TIME_COLUMNS: &[&str] = &[
    "time",
    "timestamp",
    "ts",
    "tsns",
    "date",
    "datetime",
    "eventtime",
    "timeunixnano",
];
const MESSAGE_COLUMNS: &[&str] = &[
    "line", "message", "msg", "raw", "log", "body", "content", "text",
];
const LEVEL_COLUMNS: &[&str] = &["level", "severity", "severitytext", "loglevel"];

fn fold(name: &str) -> String {
    name.chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// Fields of a CSV row.
fn split(text: &str) -> Option<Vec<String>> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .buffer_capacity(text.len().clamp(64, 64 * 1024))
        .from_reader(text.as_bytes());
    let mut record = csv::StringRecord::new();
    match reader.read_record(&mut record) {
        Ok(true) => Some(record.iter().map(str::to_owned).collect()),
        _ => None,
    }
}

/// A CSV export's columns, as its header names them.
#[derive(Debug, Clone)]
pub(super) struct Table {
    headers: Vec<String>,
    time: usize,
    message: usize,
    level: Option<usize>,
    /// A row begun on an earlier line whose quoted field is still open: its text and first line.
    pub pending: Option<(String, usize)>,
}

impl Table {
    /// The table a header row describes, if it is one: at least two columns, one of time and
    /// one of message. Headers are case-, `@`- and `_`-blind (`@timestamp`, `_raw`, `Line`).
    pub(super) fn header(line: &str) -> Option<Table> {
        if !line.contains(',') || line.starts_with('{') {
            return None;
        }
        let headers = split(line)?;
        let folded: Vec<String> = headers.iter().map(|h| fold(h)).collect();
        let find = |names: &[&str]| {
            names
                .iter()
                .find_map(|name| folded.iter().position(|h| h == name))
        };
        let time = find(TIME_COLUMNS)?;
        let message = find(MESSAGE_COLUMNS)?;
        if time == message {
            return None;
        }
        Some(Table {
            level: find(LEVEL_COLUMNS).filter(|&i| i != message),
            headers,
            time,
            message,
            pending: None,
        })
    }

    /// Whether `text` leaves a quoted field open (an odd number of quotes).
    pub(super) fn open_quote(text: &str) -> bool {
        text.bytes().filter(|b| *b == b'"').count() % 2 == 1
    }

    /// A row: where the record came from and its message.
    pub(super) fn row(&self, text: &str) -> Result<(Origin, String), String> {
        let cells = split(text).ok_or_else(|| "a CSV row that does not parse".to_owned())?;
        let message = cells.get(self.message).cloned().ok_or_else(|| {
            format!(
                "a CSV row of {} field(s) with no {} column",
                cells.len(),
                self.headers[self.message]
            )
        })?;
        let mut fields = Vec::new();
        for (i, cell) in cells.iter().enumerate() {
            if i == self.message || i == self.time || Some(i) == self.level || cell.is_empty() {
                continue;
            }
            let header = self.headers.get(i).map_or("", String::as_str);
            if fold(header) == "labels" {
                fields.extend(labels(cell));
            } else if !header.is_empty() {
                fields.push((header.to_owned(), cell.clone()));
            }
        }
        let origin = Origin {
            ts: cells.get(self.time).cloned(),
            level: self.level.and_then(|i| cells.get(i).cloned()),
            fields,
            worker: None,
        }
        .identify();
        Ok((origin, message))
    }
}

/// Labels as JSON (`{"pod":"x"}`) or in Loki's own spelling (`{pod="x", app="y"}`).
fn labels(text: &str) -> Vec<(String, String)> {
    if let Ok(serde_json::Value::Object(map)) = serde_json::from_str(text) {
        return map
            .into_iter()
            .map(|(k, v)| {
                let v = match v {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                };
                (k, v)
            })
            .collect();
    }
    label_pairs(text)
}

/// `key="value"` pairs of a Loki label set.
pub(super) fn label_pairs(text: &str) -> Vec<(String, String)> {
    LABEL_PAIR
        .captures_iter(text)
        .map(|c| (c[1].to_owned(), c[2].replace("\\\"", "\"")))
        .collect()
}
