//! Whole JSON documents, as teams download them from their log platforms, streamed record by
//! record with serde_json's deserializer (never held whole: a 1 GB export costs one record):
//! - a JSON array of records (`gcloud logging read --format=json`, a `jq -s` dump, Grafana's
//!   data frames), pretty-printed or compact;
//! - an object that wraps them: `events` (`aws logs filter-log-events`), `entries` (the Cloud
//!   Logging API), `hits.hits[]._source` (an Elasticsearch or OpenSearch `_search` response),
//! - several documents one after another (`jq .` over JSON lines);
//! - anything else is handed back whole (up to [`super::MAX_DOCUMENT`]): one pretty-printed
//!   record, Grafana's data frames, OTLP JSON, and Loki's query responses, whose size Loki itself
//!   bounds (a query returns at most its `limit` of lines) and whose records are numbered one
//!   after another from the document's first line, as a container's are.
//!
//! Each record is numbered by the line its first byte is on, read from a counter the input
//! shares with the visitors, so a diagnosis cites the line a team's editor opens at.

use super::stream::{Lines, Next, Rest, TooBig};
use super::{Mode, Options, Parsed, Reader, State, UNRELATED_SAMPLES, take};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::cell::Cell;
use std::fmt;
use std::io::BufRead;
use std::rc::Rc;

/// One record of a document.
pub(super) struct Record {
    /// The line its first byte is on.
    pub line: usize,
    /// The record, as the reader of JSON lines would have seen it.
    pub value: Value,
    /// The document's shape (`JSON array`, `CloudWatch events`, ...).
    pub shape: &'static str,
}

/// What a document's top level was.
pub(super) enum Top {
    /// Its records went to the sink.
    Streamed,
    /// No wrapper racecert knows: the value whole, to be read as one record or container.
    Whole(Value),
}

/// JSON documents over many lines (a pretty-printed export, an array of records, an object
/// that wraps them): streamed record by record ([`document`]), each numbered by the line it
/// starts on. If the input is no JSON document after all (a truncated first line of a JSON-lines
/// log), the line it breaks on and the lines after it are read one by one.
pub(super) fn read<R: BufRead>(
    lines: &mut Lines<R>,
    reader: &mut Reader,
    parsed: &mut Parsed,
    options: &Options,
) -> std::io::Result<bool> {
    let start = lines.number;
    let mut rest = Rest::new(lines);
    let at = rest.at.clone();
    let mut state = State {
        mode: Some(Mode::Document),
        ..State::default()
    };
    let mut deserializer = serde_json::Deserializer::from_reader(&mut rest);
    let mut records = |record: Record| {
        // The text of a record is kept only while samples of unrelated records are wanted.
        let sample = if parsed.unrelated_samples.len() < UNRELATED_SAMPLES {
            record.value.to_string()
        } else {
            String::new()
        };
        reader.line_no = record.line;
        parsed.document_records += 1;
        match reader.json(record.value, None, "") {
            Ok(reads) => {
                let kind = reader.kind;
                reader.tally(record.shape, kind);
                // Records are numbered by their own lines: nothing shifts the ones after them.
                state.shift = 0;
                take(
                    reads,
                    record.line,
                    sample.as_bytes(),
                    &mut state,
                    reader,
                    parsed,
                    options,
                );
            }
            Err(reason) => parsed.malformed(record.line, reason, sample.as_bytes()),
        }
    };
    let mut first = start;
    let outcome = loop {
        let mut sink = Sink {
            at: at.clone(),
            records: &mut records,
        };
        match top(&mut sink, &mut deserializer) {
            Ok(Top::Streamed) => {}
            Ok(Top::Whole(value)) => {
                at.held.set(0);
                records(Record {
                    line: first,
                    value,
                    shape: "",
                });
            }
            Err(err) => break Err(err),
        }
        // Another document may follow (`jq .` over JSON lines writes one after another).
        match deserializer.end() {
            Ok(()) => break Ok(()),
            Err(_) => first = at.line.get(),
        }
    };
    drop(deserializer);
    let err = match outcome {
        Ok(()) => {
            rest.finish();
            return Ok(false);
        }
        Err(err) => err,
    };
    if err.is_io() {
        let io = std::io::Error::from(err);
        if io.get_ref().is_none_or(|inner| !inner.is::<TooBig>()) {
            return Err(io);
        }
        let line = at.line.get();
        parsed.malformed(
            first,
            format!("{TooBig} at line {line}: export one record per line, or an array of records"),
            b"",
        );
        // The rest is read, not held, so the counts stay right.
        let mut next = rest.resume()?;
        while !matches!(next, Next::End) {
            next = lines.next_line()?;
        }
        return Ok(false);
    }
    if err.is_eof() {
        // A download cut short: the records before the cut were read; the one it cut is named.
        rest.finish();
        parsed.malformed(
            first,
            format!(
                "a JSON document that ends at line {} before it closes (a download cut short?)",
                lines.number
            ),
            b"",
        );
        return Ok(false);
    }
    // Not a document: the line it broke on is read as a line, and so are the ones after it.
    let broken = at.line.get();
    if broken > first {
        parsed.malformed(first, format!("an unfinished JSON record ({err})"), b"");
    }
    match rest.resume()? {
        Next::End => Ok(false),
        _ => Ok(true),
    }
}

/// Where the reader of a document is: shared by the input, which moves it, and the visitors,
/// which read it.
#[derive(Debug, Default)]
pub(super) struct Position {
    /// The line of the byte read last.
    pub line: Cell<usize>,
    /// Bytes read since the last record went to the sink: what is being held.
    pub held: Cell<u64>,
}

/// Where the visitors send records, and the position they read.
pub(super) struct Sink<'s> {
    pub at: Rc<Position>,
    pub records: &'s mut dyn FnMut(Record),
}

/// How an array's elements become records.
#[derive(Clone, Copy)]
enum Wrap {
    /// Each element is a record.
    Itself,
    /// Each element is an Elasticsearch hit: the record is its `_source`.
    Source,
}

impl Wrap {
    fn record(self, value: Value) -> Value {
        match self {
            Wrap::Itself => value,
            Wrap::Source => match value {
                Value::Object(mut hit) => hit.remove("_source").unwrap_or(Value::Object(hit)),
                other => other,
            },
        }
    }
}

/// Reads one top-level value.
pub(super) fn top<'de, D: Deserializer<'de>>(sink: &mut Sink<'_>, d: D) -> Result<Top, D::Error> {
    d.deserialize_any(TopVisitor { sink })
}

struct TopVisitor<'a, 's> {
    sink: &'a mut Sink<'s>,
}

impl<'de> Visitor<'de> for TopVisitor<'_, '_> {
    type Value = Top;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON array of records or an object")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Top, A::Error> {
        stream(self.sink, seq, Wrap::Itself, "JSON array").map(|_| Top::Streamed)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Top, A::Error> {
        let (streamed, kept) = wrapper(self.sink, map, Level::Top)?;
        Ok(if streamed > 0 {
            Top::Streamed
        } else {
            Top::Whole(Value::Object(kept))
        })
    }
}

/// Which object of a wrapper is being read: the keys that hold records differ.
#[derive(Clone, Copy, PartialEq)]
enum Level {
    Top,
    /// `hits` of an Elasticsearch response.
    Hits,
}

/// Reads an object's keys: the ones that hold records at this level are streamed, the others
/// kept (metadata such as `searchedLogStreams`, `took`; or a record's own fields).
fn wrapper<'de, A: MapAccess<'de>>(
    sink: &mut Sink<'_>,
    mut map: A,
    level: Level,
) -> Result<(usize, Map<String, Value>), A::Error> {
    let mut streamed = 0;
    let mut kept = Map::new();
    while let Some(key) = map.next_key::<String>()? {
        let part = match (level, key.as_str()) {
            (Level::Top, "events" | "logEvents") => {
                Part::Records(Wrap::Itself, "CloudWatch events")
            }
            (Level::Top, "entries") => Part::Records(Wrap::Itself, "Cloud Logging entries"),
            (Level::Hits, "hits") => Part::Records(Wrap::Source, "Elasticsearch _search response"),
            (Level::Top, "hits") => Part::Nested(Level::Hits),
            _ => {
                kept.insert(key, map.next_value::<Value>()?);
                continue;
            }
        };
        let value = map.next_value_seed(PartSeed { sink, part })?;
        match value {
            Held::Streamed(n) => streamed += n,
            Held::Value(value) => {
                kept.insert(key, value);
            }
        }
    }
    Ok((streamed, kept))
}

/// A value that was streamed, or held because it holds no records.
enum Held {
    Streamed(usize),
    Value(Value),
}

/// What a key of a wrapper holds.
#[derive(Clone, Copy)]
enum Part {
    /// An array of records (streamed), or any other value (held).
    Records(Wrap, &'static str),
    /// An object one level down a wrapper (`hits`, `data`): its record keys streamed, the rest
    /// held.
    Nested(Level),
}

/// A key's value read as its [`Part`] says.
struct PartSeed<'a, 's> {
    sink: &'a mut Sink<'s>,
    part: Part,
}

impl<'de> DeserializeSeed<'de> for PartSeed<'_, '_> {
    type Value = Held;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Held, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for PartSeed<'_, '_> {
    type Value = Held;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Held, A::Error> {
        match self.part {
            Part::Records(wrap, shape) => stream(self.sink, seq, wrap, shape).map(Held::Streamed),
            Part::Nested(_) => ValueVisitor.visit_seq(seq).map(Held::Value),
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Held, A::Error> {
        match self.part {
            Part::Records(..) => ValueVisitor.visit_map(map).map(Held::Value),
            Part::Nested(level) => {
                let (streamed, kept) = wrapper(self.sink, map, level)?;
                Ok(if streamed > 0 {
                    Held::Streamed(streamed)
                } else {
                    Held::Value(Value::Object(kept))
                })
            }
        }
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Held, E> {
        Ok(Held::Value(Value::String(v.to_owned())))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Held, E> {
        Ok(Held::Value(Value::Bool(v)))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Held, E> {
        Ok(Held::Value(Value::from(v)))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Held, E> {
        Ok(Held::Value(Value::from(v)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Held, E> {
        Ok(Held::Value(Value::from(v)))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Held, E> {
        Ok(Held::Value(Value::Null))
    }
}

/// serde_json's own visitor for [`Value`], reached through its `Deserialize` impl.
struct ValueVisitor;

impl ValueVisitor {
    fn visit_map<'de, A: MapAccess<'de>>(self, map: A) -> Result<Value, A::Error> {
        serde::Deserialize::deserialize(de::value::MapAccessDeserializer::new(map))
    }

    fn visit_seq<'de, A: SeqAccess<'de>>(self, seq: A) -> Result<Value, A::Error> {
        serde::Deserialize::deserialize(de::value::SeqAccessDeserializer::new(seq))
    }
}

/// Streams an array's elements to the sink, each numbered by the line it starts on.
fn stream<'de, A: SeqAccess<'de>>(
    sink: &mut Sink<'_>,
    mut seq: A,
    wrap: Wrap,
    shape: &'static str,
) -> Result<usize, A::Error> {
    let mut count = 0;
    while let Some((line, value)) = seq.next_element_seed(Numbered(&sink.at))? {
        sink.at.held.set(0);
        (sink.records)(Record {
            line,
            value: wrap.record(value),
            shape,
        });
        count += 1;
    }
    Ok(count)
}

/// One element with the line it starts on: the deserializer has peeked its first byte when it
/// hands the element over, so the counter is on that byte's line.
struct Numbered<'a>(&'a Position);

impl<'de> DeserializeSeed<'de> for Numbered<'_> {
    type Value = (usize, Value);

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(usize, Value), D::Error> {
        let line = self.0.line.get();
        let value = serde::Deserialize::deserialize(d)?;
        Ok((line, value))
    }
}
