//! Redis framing: RESP2 and RESP3 (after `HELLO 3`), arrays and inline commands, pipelines,
//! MULTI/EXEC, scripts and functions with their keys, pub/sub (pushes are not round trips).
//!
//! Why one file of ~1,100 lines: framing, the transaction/pipeline state and the reply summary
//! share one per-connection state machine; split, each part would expose its internals to the
//! others. Its tests are in `tests.rs`.
//!
//! Frames are decoded by the `redis-protocol` crate (with its `index-map` feature, so a map's
//! order is stable; it is the reverse of the wire order, which the summary restores). Two cases go to [`Walker`], a small
//! streaming walker over the same grammar that keeps only a summary: a frame still incomplete
//! after [`BUFFER_CAP`] bytes (a large value must not be buffered whole), and a frame with more
//! aggregate headers than [`NESTING_GUARD`] (the crate's decoder recurses per nesting level). The
//! walker is checked against the crate on generated frames (see the tests).

use super::commands::command_keys;
use super::conn::{Ev, Framer};
use super::text::text;
use super::{MAX_ARGS, MAX_ITEMS, MAX_VALUE, RedisCommand, RedisReply, Reply, Request};
use redis_protocol::resp2::decode as resp2;
use redis_protocol::resp2::types::RangeFrame as R2;
use redis_protocol::resp3::decode::complete as resp3;
use redis_protocol::resp3::types::RangeFrame as R3;
use std::collections::VecDeque;

/// Bytes of one incomplete frame buffered before the walker takes over.
pub(crate) const BUFFER_CAP: usize = 256 * 1024;
/// Aggregate headers in a buffer beyond which the crate's recursive decoder is not used.
const NESTING_GUARD: usize = 128;
/// Nesting depth the walker accepts; deeper frames are not RESP any real server sends.
const MAX_DEPTH: usize = 512;
/// Bytes of a header or simple-string line kept (the rest is counted, not stored).
const LINE_MAX: usize = 4096;
/// Arguments of one command kept for key extraction (MSET of many keys).
const REQUEST_ITEMS: usize = 4096;
/// An inline command line longer than this is not Redis (its server limit is 64 KiB).
const INLINE_MAX: usize = 64 * 1024;

/// A RESP value as far as a summary needs it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Simple(Vec<u8>),
    Error(Vec<u8>),
    Int(i64),
    Double(String),
    Bool(bool),
    Null,
    BigNumber(String),
    /// A blob (bulk, verbatim without its format prefix, or blob error when `error`).
    Bulk {
        len: usize,
        head: Vec<u8>,
        error: bool,
    },
    Agg {
        kind: AggKind,
        /// Elements (pairs for a map).
        len: usize,
        /// The first elements kept (flattened key, value for a map).
        items: Vec<Value>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AggKind {
    Array,
    Set,
    Map,
    Push,
}

/// How much of a frame the summary keeps: the first `items` elements of an aggregate, the
/// first `value` bytes of a blob. A request keeps more of its values than a reply
/// ([`REQUEST_KEEP`]): a message a client pushes onto a queue is read back whole.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Keep {
    pub(crate) items: usize,
    pub(crate) value: usize,
}

/// What a reply's summary keeps.
pub(crate) const REPLY_KEEP: Keep = Keep {
    items: MAX_ITEMS,
    value: MAX_VALUE,
};

/// What a request's summary keeps: a queue message (a Celery envelope is about 1.5 KB) fits
/// whole in [`MESSAGE_VALUE`] bytes, so the framework's id of what a client enqueued can be read
/// from the wire ([`RedisCommand::pushed`]); in `args` every value is still cut at [`MAX_VALUE`].
const REQUEST_KEEP: Keep = Keep {
    items: REQUEST_ITEMS,
    value: MESSAGE_VALUE,
};

/// Bytes of a pushed message's value kept ([`REQUEST_KEEP`]).
pub(crate) const MESSAGE_VALUE: usize = 8 * 1024;

/// The commands whose values may be messages onto a queue or stream (kept to
/// [`MESSAGE_VALUE`]): the pushes, the hash writes a broker keeps its messages in (Dramatiq's
/// `{queue}.msgs`, RQ's job hash) and the scripts that enqueue (Dramatiq's `dispatch.lua`).
const PUSHES: [&str; 10] = [
    "LPUSH", "RPUSH", "LPUSHX", "RPUSHX", "XADD", "HSET", "HMSET", "HSETNX", "EVALSHA", "EVAL",
];

fn head(bytes: &[u8], keep: usize) -> Vec<u8> {
    bytes[..bytes.len().min(keep)].to_vec()
}

fn double(value: f64) -> String {
    format!("{value}")
}

fn from_resp2(buf: &[u8], frame: &R2, keep: Keep) -> Value {
    match frame {
        R2::SimpleString((a, b)) => Value::Simple(head(&buf[*a..*b], keep.value)),
        R2::Error((a, b)) => Value::Error(head(&buf[*a..*b], keep.value)),
        R2::Integer(i) => Value::Int(*i),
        R2::BulkString((a, b)) => Value::Bulk {
            len: b - a,
            head: head(&buf[*a..*b], keep.value),
            error: false,
        },
        R2::Array(items) => Value::Agg {
            kind: AggKind::Array,
            len: items.len(),
            items: items
                .iter()
                .take(keep.items)
                .map(|f| from_resp2(buf, f, keep))
                .collect(),
        },
        R2::Null => Value::Null,
    }
}

fn from_resp3(buf: &[u8], frame: &R3, keep: Keep) -> Value {
    let agg = |kind, items: Vec<&R3>| Value::Agg {
        kind,
        len: if kind == AggKind::Map {
            items.len() / 2
        } else {
            items.len()
        },
        items: items
            .into_iter()
            .take(if kind == AggKind::Map {
                keep.items * 2
            } else {
                keep.items
            })
            .map(|f| from_resp3(buf, f, keep))
            .collect(),
    };
    let blob = |(a, b): &(usize, usize), error| Value::Bulk {
        len: b - a,
        head: head(&buf[*a..*b], keep.value),
        error,
    };
    match frame {
        R3::BlobString { data, .. } | R3::ChunkedString(data) => blob(data, false),
        R3::VerbatimString { data, .. } => blob(data, false),
        R3::BlobError { data, .. } => blob(data, true),
        R3::SimpleString { data: (a, b), .. } => Value::Simple(head(&buf[*a..*b], keep.value)),
        R3::SimpleError { data: (a, b), .. } => Value::Error(head(&buf[*a..*b], keep.value)),
        R3::Boolean { data, .. } => Value::Bool(*data),
        R3::Null => Value::Null,
        R3::Number { data, .. } => Value::Int(*data),
        R3::Double { data, .. } => Value::Double(double(*data)),
        R3::BigNumber { data: (a, b), .. } => {
            Value::BigNumber(String::from_utf8_lossy(&head(&buf[*a..*b], keep.value)).into_owned())
        }
        R3::Array { data, .. } => agg(AggKind::Array, data.iter().collect()),
        R3::Push { data, .. } => agg(AggKind::Push, data.iter().collect()),
        R3::Set { data, .. } => agg(AggKind::Set, data.iter().collect()),
        // The crate builds maps from the last pair back: reverse to get the wire order.
        R3::Map { data, .. } => agg(
            AggKind::Map,
            data.iter().rev().flat_map(|(k, v)| [k, v]).collect(),
        ),
        // Only a client sends HELLO in this form, and it is not framed as a reply.
        R3::Hello { .. } => Value::Null,
    }
}

/// Counts aggregate headers (a type byte of an aggregate at a line start), bounded by `limit`.
fn aggregate_headers(buf: &[u8], limit: usize) -> usize {
    let mut n = 0;
    let mut line_start = true;
    for &b in buf {
        if line_start && matches!(b, b'*' | b'%' | b'~' | b'>' | b'|') {
            n += 1;
            if n >= limit {
                return n;
            }
        }
        line_start = b == b'\n';
    }
    n
}

/// Decodes one frame with the crate: `Ok(None)` if incomplete.
fn decode_crate(
    buf: &[u8],
    resp3_mode: bool,
    keep: Keep,
) -> Result<Option<(Value, usize)>, String> {
    if resp3_mode {
        match resp3::decode_range(buf) {
            Ok(Some((frame, n))) => Ok(Some((from_resp3(buf, &frame, keep), n))),
            Ok(None) => Ok(None),
            Err(err) => Err(format!("RESP3: {err:?}")),
        }
    } else {
        match resp2::decode_range(buf) {
            Ok(Some((frame, n))) => Ok(Some((from_resp2(buf, &frame, keep), n))),
            Ok(None) => Ok(None),
            Err(err) => Err(format!("RESP2: {err:?}")),
        }
    }
}

/// A streaming RESP walker that keeps a summary of the frame: blob heads, the first elements of
/// aggregates. Used for frames too large to buffer or too deep for the crate.
#[derive(Debug)]
pub(crate) struct Walker {
    resp3: bool,
    keep: Keep,
    stack: Vec<Open>,
    step: Step,
    line: Vec<u8>,
    line_len: usize,
}

#[derive(Debug)]
struct Open {
    kind: AggKind,
    attribute: bool,
    /// Elements declared (pairs for a map or attribute).
    declared: usize,
    /// Values expected (2 per pair).
    expected: usize,
    seen: usize,
    items: Vec<Value>,
}

#[derive(Debug)]
enum Step {
    Line,
    Blob {
        kind: u8,
        /// Length of the data (for a verbatim string, including its `fmt:` prefix).
        len: usize,
        /// Bytes consumed of data + CRLF.
        at: usize,
        head: Vec<u8>,
    },
}

fn parse_len(rest: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(rest)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| format!("bad length {:?}", text(rest, 32)))
}

impl Walker {
    pub(crate) fn new(resp3: bool, keep: Keep) -> Walker {
        Walker {
            resp3,
            keep,
            stack: Vec::new(),
            step: Step::Line,
            line: Vec::new(),
            line_len: 0,
        }
    }

    /// Feeds bytes; returns how many were consumed and the frame if it completed there.
    pub(crate) fn feed(&mut self, data: &[u8]) -> Result<(usize, Option<Value>), String> {
        let mut i = 0;
        while i < data.len() {
            match &mut self.step {
                Step::Line => {
                    let rest = &data[i..];
                    let (part, end) = match rest.iter().position(|b| *b == b'\n') {
                        Some(p) => (&rest[..p], Some(p + 1)),
                        None => (rest, None),
                    };
                    let room = LINE_MAX.saturating_sub(self.line.len());
                    self.line.extend_from_slice(&part[..part.len().min(room)]);
                    self.line_len += part.len();
                    let Some(end) = end else {
                        return Ok((data.len(), None));
                    };
                    i += end;
                    let mut line = std::mem::take(&mut self.line);
                    let full = std::mem::take(&mut self.line_len);
                    // A line cut at LINE_MAX lost its CR; one that was not must end with it.
                    if full <= line.len() && line.last() != Some(&b'\r') {
                        return Err("a line not ended by CRLF".into());
                    }
                    if full <= line.len() {
                        line.pop();
                    }
                    if let Some(value) = self.header(&line)?
                        && let Some(done) = self.complete(value)?
                    {
                        return Ok((i, Some(done)));
                    }
                }
                Step::Blob {
                    kind,
                    len,
                    at,
                    head,
                } => {
                    let total = *len + 2;
                    let take = (total - *at).min(data.len() - i);
                    for (k, b) in data[i..i + take].iter().enumerate() {
                        let pos = *at + k;
                        if pos < *len {
                            if head.len() < self.keep.value + 4 {
                                head.push(*b);
                            }
                        } else if (pos == *len && *b != b'\r') || (pos == *len + 1 && *b != b'\n') {
                            return Err("a blob not ended by CRLF".into());
                        }
                    }
                    *at += take;
                    i += take;
                    if *at == total {
                        let (kind, len, mut head) = (*kind, *len, std::mem::take(head));
                        self.step = Step::Line;
                        let (len, error) = match kind {
                            b'=' => {
                                if len < 4 {
                                    return Err("verbatim string shorter than its format".into());
                                }
                                head.drain(..4);
                                (len - 4, false)
                            }
                            b'!' => (len, true),
                            _ => (len, false),
                        };
                        head.truncate(self.keep.value);
                        if let Some(done) = self.complete(Value::Bulk { len, head, error })? {
                            return Ok((i, Some(done)));
                        }
                    }
                }
            }
        }
        Ok((i, None))
    }

    /// A header line: a complete scalar, or the start of a blob or aggregate (`None`).
    fn header(&mut self, line: &[u8]) -> Result<Option<Value>, String> {
        let Some((&kind, rest)) = line.split_first() else {
            return Err("an empty line".into());
        };
        let line_text = || String::from_utf8_lossy(&rest[..rest.len().min(MAX_VALUE)]).into_owned();
        let r3 = self.resp3;
        Ok(Some(match kind {
            b'+' => Value::Simple(head(rest, MAX_VALUE)),
            b'-' => Value::Error(head(rest, MAX_VALUE)),
            b':' => Value::Int(parse_len(rest)?),
            b'_' if r3 && rest.is_empty() => Value::Null,
            b'#' if r3 => match rest {
                b"t" => Value::Bool(true),
                b"f" => Value::Bool(false),
                _ => return Err("bad boolean".into()),
            },
            b',' if r3 => Value::Double(double(
                line_text().parse::<f64>().map_err(|_| "bad double")?,
            )),
            b'(' if r3 => Value::BigNumber(line_text()),
            b'$' | b'!' | b'=' if kind == b'$' || r3 => {
                let len = parse_len(rest)?;
                if len == -1 && kind == b'$' {
                    Value::Null
                } else {
                    let len = usize::try_from(len).map_err(|_| "negative blob length")?;
                    self.step = Step::Blob {
                        kind,
                        len,
                        at: 0,
                        head: Vec::new(),
                    };
                    return Ok(None);
                }
            }
            b'*' | b'%' | b'~' | b'>' | b'|' if kind == b'*' || r3 => {
                let len = parse_len(rest)?;
                if len == -1 && kind == b'*' {
                    Value::Null
                } else {
                    let declared = usize::try_from(len).map_err(|_| "negative aggregate length")?;
                    let pairs = matches!(kind, b'%' | b'|');
                    let expected = if pairs {
                        declared.checked_mul(2).ok_or("aggregate too long")?
                    } else {
                        declared
                    };
                    let agg_kind = match kind {
                        b'%' | b'|' => AggKind::Map,
                        b'~' => AggKind::Set,
                        b'>' => AggKind::Push,
                        _ => AggKind::Array,
                    };
                    if expected == 0 {
                        if kind == b'|' {
                            return Ok(None);
                        }
                        Value::Agg {
                            kind: agg_kind,
                            len: 0,
                            items: Vec::new(),
                        }
                    } else {
                        if self.stack.len() >= MAX_DEPTH {
                            return Err("nested too deep".into());
                        }
                        self.stack.push(Open {
                            kind: agg_kind,
                            attribute: kind == b'|',
                            declared,
                            expected,
                            seen: 0,
                            items: Vec::new(),
                        });
                        return Ok(None);
                    }
                }
            }
            other => return Err(format!("unknown type byte {other:#04x}")),
        }))
    }

    /// A value is complete: add it to its aggregate; returns the frame when the outermost ends.
    fn complete(&mut self, mut value: Value) -> Result<Option<Value>, String> {
        loop {
            let Some(top) = self.stack.last_mut() else {
                return Ok(Some(value));
            };
            let keep = if top.kind == AggKind::Map {
                self.keep.items * 2
            } else {
                self.keep.items
            };
            if top.items.len() < keep {
                top.items.push(value);
            }
            top.seen += 1;
            if top.seen < top.expected {
                return Ok(None);
            }
            let open = self.stack.pop().expect("top exists");
            if open.attribute {
                // Attributes annotate the next value; the summary leaves them out.
                return Ok(None);
            }
            value = Value::Agg {
                kind: open.kind,
                len: open.declared,
                items: open.items,
            };
        }
    }

    /// The elements of the outermost aggregate completed so far (a large command's arguments
    /// before its large value).
    fn partial(&self) -> Vec<Value> {
        self.stack
            .first()
            .map(|open| open.items.clone())
            .unwrap_or_default()
    }
}

/// One direction's buffer: bytes of the frame being received, or a walker once it is large.
#[derive(Debug, Default)]
struct Side {
    buf: Vec<u8>,
    walker: Option<Walker>,
}

/// What a pending command's reply looks like.
#[derive(Debug)]
enum Expect {
    One,
    /// `HELLO n`: the reply is already in protocol `n`.
    Hello(u8),
    /// (P|S)SUBSCRIBE, or (P|S)UNSUBSCRIBE with channels: one confirmation per channel.
    Confirm {
        left: usize,
        replied: bool,
    },
    /// (P|S)UNSUBSCRIBE with no channel: confirmations until the count reaches 0.
    ConfirmAll {
        replied: bool,
    },
    Monitor,
}

/// Frames one Redis connection.
#[derive(Debug, Default)]
pub(crate) struct RedisFramer {
    client: Side,
    server: Side,
    resp3: bool,
    expect: VecDeque<Expect>,
    /// Keys of the commands queued since MULTI; `None` outside MULTI.
    multi: Option<Vec<String>>,
    subscribed: bool,
    /// A command is started and not yet done (for Start/Ready/Done bookkeeping).
    in_command: bool,
    ready_sent: bool,
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

/// Splits an inline command line the way Redis does (`sdssplitargs`): spaces separate, double
/// quotes allow escapes, single quotes are literal. `None` if the quotes do not balance.
fn split_inline(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut args = Vec::new();
    let mut i = 0;
    while i < line.len() {
        while i < line.len() && is_space(line[i]) {
            i += 1;
        }
        if i == line.len() {
            break;
        }
        let mut arg = Vec::new();
        match line[i] {
            b'"' => {
                i += 1;
                loop {
                    let b = *line.get(i)?;
                    i += 1;
                    match b {
                        b'"' => break,
                        b'\\' => {
                            let e = *line.get(i)?;
                            i += 1;
                            arg.push(match e {
                                b'n' => b'\n',
                                b'r' => b'\r',
                                b't' => b'\t',
                                b'a' => 7,
                                b'b' => 8,
                                b'x' if i + 1 < line.len() => {
                                    let hex = std::str::from_utf8(&line[i..i + 2]).ok();
                                    match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                                        Some(v) => {
                                            i += 2;
                                            v
                                        }
                                        None => b'x',
                                    }
                                }
                                other => other,
                            });
                        }
                        other => arg.push(other),
                    }
                }
            }
            b'\'' => {
                i += 1;
                loop {
                    let b = *line.get(i)?;
                    i += 1;
                    if b == b'\'' {
                        break;
                    }
                    arg.push(b);
                }
            }
            _ => {
                while i < line.len() && !is_space(line[i]) {
                    arg.push(line[i]);
                    i += 1;
                }
            }
        }
        args.push(arg);
    }
    Some(args)
}

/// Builds a command from its parts (name first): each part's length and kept head.
fn command(parts: &[(usize, &[u8])], queued: bool, truncated: bool) -> RedisCommand {
    let name = parts
        .first()
        .map(|(_, h)| String::from_utf8_lossy(h).to_ascii_uppercase())
        .unwrap_or_default();
    let args: Vec<&[u8]> = parts.iter().skip(1).map(|(_, h)| *h).collect();
    let show_up_to = |(len, h): &(usize, &[u8]), limit: usize| {
        let mut s = text(h, limit);
        if *len > h.len() && !s.ends_with('…') {
            s.push('…');
        }
        s
    };
    let show = |part: &(usize, &[u8])| show_up_to(part, MAX_VALUE);
    let keys = command_keys(&name, &args)
        .into_iter()
        .map(|i| show(&parts[i + 1]))
        .collect();
    let args = parts.iter().skip(1).take(MAX_ARGS).map(show).collect();
    // A push's values are messages, kept whole up to MESSAGE_VALUE (its key is the first).
    let pushed = if PUSHES.contains(&name.as_str()) {
        parts
            .iter()
            .skip(2)
            .take(MAX_ARGS)
            .map(|part| show_up_to(part, MESSAGE_VALUE))
            .collect()
    } else {
        Vec::new()
    };
    RedisCommand {
        name,
        args,
        pushed,
        argc: parts.len().saturating_sub(1),
        keys,
        queued,
        truncated,
    }
}

fn parts_of(items: &[Value]) -> Result<Vec<(usize, &[u8])>, String> {
    items
        .iter()
        .map(|v| match v {
            Value::Bulk { len, head, .. } => Ok((*len, head.as_slice())),
            _ => Err("a command argument that is not a bulk string".to_owned()),
        })
        .collect()
}

fn reply(value: &Value) -> RedisReply {
    let items = |items: &[Value]| items.iter().take(MAX_ITEMS).map(reply).collect();
    match value {
        Value::Simple(s) => RedisReply::Status(text(s, MAX_VALUE)),
        Value::Error(s) => RedisReply::Error(text(s, MAX_VALUE)),
        Value::Int(i) => RedisReply::Int(*i),
        Value::Double(d) => RedisReply::Double(d.clone()),
        Value::Bool(b) => RedisReply::Bool(*b),
        Value::Null => RedisReply::Nil,
        Value::BigNumber(n) => RedisReply::BigNumber(n.clone()),
        Value::Bulk {
            head, error: true, ..
        } => RedisReply::Error(text(head, MAX_VALUE)),
        Value::Bulk { len, head, .. } => {
            let mut t = text(head, MAX_VALUE);
            if *len > head.len() && !t.ends_with('…') {
                t.push('…');
            }
            RedisReply::Bulk { len: *len, text: t }
        }
        Value::Agg {
            kind: AggKind::Map,
            len,
            items: kv,
        } => RedisReply::Map {
            len: *len,
            items: kv
                .chunks(2)
                .take(MAX_ITEMS)
                .filter_map(|pair| match pair {
                    [k, v] => Some((reply(k), reply(v))),
                    _ => None,
                })
                .collect(),
        },
        Value::Agg { len, items: v, .. } => RedisReply::Array {
            len: *len,
            items: items(v),
        },
    }
}

/// The kind word of a pub/sub message or confirmation (`message`, `subscribe`, ...).
fn pubsub_kind(value: &Value) -> Option<&[u8]> {
    match value {
        Value::Agg { items, .. } => match items.first() {
            Some(Value::Bulk { head, .. }) | Some(Value::Simple(head)) => Some(head.as_slice()),
            _ => None,
        },
        _ => None,
    }
}

fn is_confirmation(kind: &[u8]) -> bool {
    matches!(
        kind.to_ascii_lowercase().as_slice(),
        b"subscribe"
            | b"psubscribe"
            | b"ssubscribe"
            | b"unsubscribe"
            | b"punsubscribe"
            | b"sunsubscribe"
    )
}

fn is_message(kind: &[u8]) -> bool {
    matches!(
        kind.to_ascii_lowercase().as_slice(),
        b"message" | b"pmessage" | b"smessage"
    )
}

/// The remaining subscription count a confirmation carries (its third element).
fn confirmation_count(value: &Value) -> Option<i64> {
    match value {
        Value::Agg { items, .. } => match items.get(2) {
            Some(Value::Int(n)) => Some(*n),
            _ => None,
        },
        _ => None,
    }
}

/// Next frame of one side: `Ok(None)` when more bytes are needed.
fn next_frame(side: &mut Side, resp3_mode: bool, keep: Keep) -> Result<Option<Value>, String> {
    if side.buf.is_empty() {
        return Ok(None);
    }
    let nested = aggregate_headers(&side.buf, NESTING_GUARD) >= NESTING_GUARD;
    if !nested {
        if let Some((value, n)) = decode_crate(&side.buf, resp3_mode, keep)? {
            side.buf.drain(..n);
            return Ok(Some(value));
        }
        if side.buf.len() <= BUFFER_CAP {
            return Ok(None);
        }
    }
    let mut walker = Walker::new(resp3_mode, keep);
    let buf = std::mem::take(&mut side.buf);
    let (n, done) = walker.feed(&buf)?;
    match done {
        Some(value) => {
            side.buf = buf[n..].to_vec();
            Ok(Some(value))
        }
        None => {
            side.walker = Some(walker);
            Ok(None)
        }
    }
}

impl RedisFramer {
    fn fail(ev: &mut Vec<Ev>, reason: String) {
        ev.push(Ev::Opaque(reason));
    }

    /// A client frame is complete: a command (or nothing, for an empty one).
    fn command_done(&mut self, parts: &[(usize, &[u8])], ev: &mut Vec<Ev>, truncated: bool) {
        if parts.is_empty() {
            ev.push(Ev::Cancel);
            self.in_command = false;
            return;
        }
        let name = String::from_utf8_lossy(parts[0].1).to_ascii_uppercase();
        let queued = self.multi.is_some()
            && !matches!(
                name.as_str(),
                "EXEC" | "DISCARD" | "MULTI" | "WATCH" | "UNWATCH" | "QUIT" | "RESET"
            );
        let mut cmd = command(parts, queued, truncated);
        match name.as_str() {
            "MULTI" => self.multi = Some(Vec::new()),
            "EXEC" => {
                let mut keys = self.multi.take().unwrap_or_default();
                keys.dedup();
                cmd.keys = keys;
            }
            "DISCARD" | "RESET" => self.multi = None,
            _ if queued => {
                if let Some(keys) = self.multi.as_mut() {
                    keys.extend(cmd.keys.iter().cloned());
                }
            }
            _ => {}
        }
        let args_upper = |i: usize| {
            parts
                .get(i)
                .map(|(_, h)| h.to_ascii_uppercase())
                .unwrap_or_default()
        };
        let expect = if queued {
            Expect::One
        } else {
            match name.as_str() {
                "HELLO" => {
                    let version = match parts.get(1).map(|(_, h)| *h) {
                        Some(b"3") => 3,
                        Some(b"2") => 2,
                        _ => {
                            if self.resp3 {
                                3
                            } else {
                                2
                            }
                        }
                    };
                    Expect::Hello(version)
                }
                "SUBSCRIBE" | "PSUBSCRIBE" | "SSUBSCRIBE" => Expect::Confirm {
                    left: parts.len().saturating_sub(1).max(1),
                    replied: false,
                },
                "UNSUBSCRIBE" | "PUNSUBSCRIBE" | "SUNSUBSCRIBE" if parts.len() > 1 => {
                    Expect::Confirm {
                        left: parts.len() - 1,
                        replied: false,
                    }
                }
                "UNSUBSCRIBE" | "PUNSUBSCRIBE" | "SUNSUBSCRIBE" => {
                    Expect::ConfirmAll { replied: false }
                }
                "MONITOR" => Expect::Monitor,
                "CLIENT"
                    if args_upper(1) == b"REPLY"
                        && matches!(args_upper(2).as_slice(), b"OFF" | b"SKIP") =>
                {
                    Self::fail(ev, "CLIENT REPLY OFF/SKIP: replies no longer pair".into());
                    return;
                }
                _ => Expect::One,
            }
        };
        self.expect.push_back(expect);
        let request = Request::Redis(cmd);
        if self.ready_sent {
            ev.push(Ev::Done(Some(request)));
        } else {
            ev.push(Ev::Ready(request));
            ev.push(Ev::Done(None));
        }
        self.in_command = false;
        self.ready_sent = false;
    }

    /// Frames what the client buffer holds. `base` is the chunk offset of the bytes appended
    /// after the `carried` ones (which belong to a command already started).
    fn client_frames(&mut self, base: usize, carried: usize, ev: &mut Vec<Ev>) {
        let mut consumed = 0;
        loop {
            if !self.in_command {
                // Bytes between commands that Redis skips.
                let skip = self
                    .client
                    .buf
                    .iter()
                    .position(|b| !is_space(*b))
                    .unwrap_or(self.client.buf.len());
                self.client.buf.drain(..skip);
                consumed += skip;
                if self.client.buf.is_empty() {
                    return;
                }
                self.in_command = true;
                ev.push(Ev::Start((base + consumed).saturating_sub(carried)));
            }
            let before = self.client.buf.len();
            if self.client.buf[0] == b'*' {
                let next = next_frame(&mut self.client, false, REQUEST_KEEP);
                consumed += before - self.client.buf.len();
                match next {
                    Err(err) => return Self::fail(ev, err),
                    Ok(None) => {
                        if let Some(items) = self.client.walker.as_ref().map(Walker::partial) {
                            self.walker_ready(items, ev);
                        }
                        return;
                    }
                    Ok(Some(value)) => {
                        if !self.finish_array(value, ev) {
                            return;
                        }
                    }
                }
            } else {
                let Some(end) = self.client.buf.iter().position(|b| *b == b'\n') else {
                    if self.client.buf.len() > INLINE_MAX {
                        return Self::fail(ev, "an inline command longer than 64 KiB".into());
                    }
                    return;
                };
                let line: Vec<u8> = self.client.buf.drain(..=end).collect();
                consumed += line.len();
                let Some(args) = split_inline(&line) else {
                    return Self::fail(ev, "an inline command with unbalanced quotes".into());
                };
                let parts: Vec<(usize, &[u8])> = args
                    .iter()
                    .map(|a| (a.len(), &a[..a.len().min(MESSAGE_VALUE)]))
                    .collect();
                self.command_done(&parts, ev, false);
            }
        }
    }

    fn finish_array(&mut self, value: Value, ev: &mut Vec<Ev>) -> bool {
        let truncated = self.ready_sent;
        match value {
            Value::Agg {
                kind: AggKind::Array,
                items,
                len,
            } => match parts_of(&items) {
                Ok(parts) => {
                    let truncated = truncated || len > items.len();
                    self.command_done(&parts, ev, truncated);
                    true
                }
                Err(err) => {
                    Self::fail(ev, err);
                    false
                }
            },
            Value::Null => {
                self.command_done(&[], ev, false);
                true
            }
            _ => {
                Self::fail(ev, "a client frame that is not an array".into());
                false
            }
        }
    }

    /// A large command is still arriving: the holder decides on what is known (its name and the
    /// arguments before the large value).
    fn walker_ready(&mut self, items: Vec<Value>, ev: &mut Vec<Ev>) {
        if self.ready_sent {
            return;
        }
        if let Ok(parts) = parts_of(&items)
            && !parts.is_empty()
        {
            let queued = self.multi.is_some();
            ev.push(Ev::Ready(Request::Redis(command(&parts, queued, true))));
            self.ready_sent = true;
        }
    }

    fn server_value(&mut self, value: Value, ev: &mut Vec<Ev>) {
        let kind = pubsub_kind(&value).map(<[u8]>::to_vec);
        let push = matches!(
            value,
            Value::Agg {
                kind: AggKind::Push,
                ..
            }
        );
        let confirmation = kind.as_deref().is_some_and(is_confirmation);
        // Out-of-band data: pub/sub messages, RESP3 pushes that answer nothing.
        if (push && !confirmation)
            || (self.subscribed && !push && kind.as_deref().is_some_and(is_message))
        {
            return;
        }
        if confirmation && let Some(count) = confirmation_count(&value) {
            self.subscribed = count > 0;
        }
        let Some(front) = self.expect.front_mut() else {
            // A confirmation nobody waits for (an UNSUBSCRIBE's extra ones) answers nothing.
            if confirmation {
                return;
            }
            return Self::fail(ev, "a reply with no request".into());
        };
        let error = matches!(value, Value::Error(_) | Value::Bulk { error: true, .. });
        let summary = Reply::Redis(reply(&value));
        match front {
            Expect::One => {
                self.expect.pop_front();
                ev.push(Ev::Reply(summary));
            }
            Expect::Hello(version) => {
                if !error {
                    self.resp3 = *version == 3;
                }
                self.expect.pop_front();
                ev.push(Ev::Reply(summary));
            }
            Expect::Monitor => {
                self.expect.pop_front();
                ev.push(Ev::Reply(summary));
                if !error {
                    Self::fail(ev, "MONITOR: the server now streams, not replies".into());
                }
            }
            Expect::Confirm { left, replied } => {
                if !*replied {
                    ev.push(Ev::Reply(summary));
                    *replied = true;
                }
                *left = left.saturating_sub(1);
                if *left == 0 || error {
                    self.expect.pop_front();
                }
            }
            Expect::ConfirmAll { replied } => {
                if !*replied {
                    ev.push(Ev::Reply(summary));
                    *replied = true;
                }
                if error || confirmation_count(&value).is_none_or(|n| n <= 0) {
                    self.expect.pop_front();
                }
            }
        }
    }
}

#[cfg(test)]
impl RedisFramer {
    /// Bytes held in buffers (not the walkers' bounded summaries).
    pub(crate) fn buffered(&self) -> usize {
        self.client.buf.len() + self.server.buf.len()
    }
}

/// The crate's decoding of one whole frame, as the framer summarises it.
#[cfg(test)]
pub(crate) fn decode_for_tests(buf: &[u8], resp3: bool) -> Option<Value> {
    decode_crate(buf, resp3, REPLY_KEEP)
        .ok()
        .flatten()
        .map(|(v, _)| v)
}

impl Framer for RedisFramer {
    fn client(&mut self, data: &[u8], ev: &mut Vec<Ev>) {
        let mut base = 0;
        if let Some(walker) = self.client.walker.as_mut() {
            match walker.feed(data) {
                Err(err) => return Self::fail(ev, err),
                Ok((_, None)) => {
                    let items = walker.partial();
                    return self.walker_ready(items, ev);
                }
                Ok((n, Some(value))) => {
                    self.client.walker = None;
                    if !self.finish_array(value, ev) {
                        return;
                    }
                    base = n;
                }
            }
        }
        let carried = self.client.buf.len();
        self.client.buf.extend_from_slice(&data[base..]);
        self.client_frames(base, carried, ev);
    }

    fn server(&mut self, data: &[u8], ev: &mut Vec<Ev>) {
        let mut base = 0;
        if let Some(walker) = self.server.walker.as_mut() {
            match walker.feed(data) {
                Err(err) => return Self::fail(ev, err),
                Ok((_, None)) => return,
                Ok((n, Some(value))) => {
                    self.server.walker = None;
                    self.server_value(value, ev);
                    base = n;
                }
            }
        }
        self.server.buf.extend_from_slice(&data[base..]);
        while !matches!(ev.last(), Some(Ev::Opaque(_))) {
            let resp3_mode = match self.expect.front() {
                Some(Expect::Hello(version)) => *version == 3,
                _ => self.resp3,
            };
            match next_frame(&mut self.server, resp3_mode, REPLY_KEEP) {
                Err(err) => return Self::fail(ev, err),
                Ok(None) => return,
                Ok(Some(value)) => self.server_value(value, ev),
            }
        }
    }
}
