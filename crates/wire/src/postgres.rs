//! PostgreSQL protocol v3 framing, both sides: SSL/GSS requests (declined, or the connection is
//! opaque), startup and authentication up to the first ReadyForQuery as one round trip, simple
//! queries, and extended-protocol batches (Parse/Bind/Describe/Execute/Close/Flush up to Sync)
//! with the connection's prepared statements remembered, so an Execute of a statement parsed
//! long before still carries its SQL.
//!
//! Why one file of ~900 lines: both directions of the v3 protocol share the connection's state
//! (prepared statements, the open batch, transaction status); its tests are in `tests.rs`.
//!
//! Message bodies are decoded by `pgwire`'s codecs. Messages are first cut out by their length
//! header (the only hand-written framing: a type byte and a length), so a codec only ever sees
//! one whole message; its decoders assume well-formed bodies and may panic on garbage, which is
//! contained (`catch_unwind`) and marks the connection opaque. A message larger than
//! [`MESSAGE_CAP`] (or than the codec accepts) is not buffered: its first bytes are kept and what
//! a summary needs (SQL text, statement name) is read from them.

use super::conn::{Ev, Framer};
use super::text::{collapse, text};
use super::{
    MAX_ITEMS, MAX_SQL, MAX_VALUE, PgBatch, PgError, PgProtocol, PgReply, PgRequest, PgStartup,
    PgStatement, Reply, Request, TxStatus,
};
use bytes::BytesMut;
use pgwire::messages::data::{DataRow, RowDescription};
use pgwire::messages::extendedquery::{Bind, Close, Describe, Execute, Parse};
use pgwire::messages::response::{
    CommandComplete, ErrorResponse, ReadyForQuery, TransactionStatus,
};
use pgwire::messages::simplequery::Query;
use pgwire::messages::startup::{Authentication, BackendKeyData, Startup};
use pgwire::messages::{DecodeContext, Message, ProtocolVersion};
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Bytes of one message buffered whole; larger ones keep only [`PREFIX`] bytes.
pub(crate) const MESSAGE_CAP: usize = 256 * 1024;
/// Bytes kept of an oversized message.
const PREFIX: usize = 8 * 1024;
/// Client bytes of one batch after which the holder decides on what is known, even before Sync
/// or Flush (the engine reads only so far ahead of a hold).
const READY_AFTER: usize = 1024 * 1024;
/// Prepared statements and portals remembered per connection.
const MAX_PREPARED: usize = 4096;

const SSL_REQUEST: u32 = 80_877_103;
const GSS_REQUEST: u32 = 80_877_104;
const CANCEL_REQUEST: u32 = 80_877_102;

/// Runs a codec on one whole message, containing a panic on a malformed body.
fn decode<M: Message>(message: &[u8], ctx: &DecodeContext) -> Result<M, String> {
    let mut buf = BytesMut::from(message);
    match catch_unwind(AssertUnwindSafe(|| M::decode(&mut buf, ctx))) {
        Ok(Ok(Some(message))) => Ok(message),
        Ok(Ok(None)) => Err("a message shorter than its length".into()),
        Ok(Err(err)) => Err(err.to_string()),
        Err(_) => Err("a malformed message".into()),
    }
}

/// A null-terminated string at `*at`, advancing past it.
fn cstr<'a>(buf: &'a [u8], at: &mut usize) -> Option<&'a [u8]> {
    let rest = buf.get(*at..)?;
    let end = rest.iter().position(|b| *b == 0)?;
    *at += end + 1;
    Some(&rest[..end])
}

fn name(raw: Option<String>) -> String {
    raw.unwrap_or_default()
}

/// A statement's verb and tables, from its SQL (PostgreSQL dialect).
fn analyze(sql: &str) -> Vec<(String, String, Vec<String>)> {
    use sqlparser::dialect::PostgreSqlDialect;
    use sqlparser::parser::Parser;
    let verb_of = |s: &str| {
        s.split(|c: char| !c.is_ascii_alphabetic())
            .find(|w| !w.is_empty())
            .unwrap_or_default()
            .to_ascii_uppercase()
    };
    let parsed = catch_unwind(|| Parser::parse_sql(&PostgreSqlDialect {}, sql));
    match parsed {
        Ok(Ok(statements)) if !statements.is_empty() => {
            let single = statements.len() == 1;
            statements
                .iter()
                .map(|st| {
                    let mut tables: Vec<String> = Vec::new();
                    let _ = sqlparser::ast::visit_relations(st, |rel| {
                        let table = rel.to_string();
                        if !tables.contains(&table) {
                            tables.push(table);
                        }
                        std::ops::ControlFlow::<()>::Continue(())
                    });
                    // The visitor does not see the tables a DROP TABLE names.
                    if let sqlparser::ast::Statement::Drop {
                        object_type: sqlparser::ast::ObjectType::Table,
                        names,
                        ..
                    } = st
                    {
                        for table in names {
                            let table = table.to_string();
                            if !tables.contains(&table) {
                                tables.push(table);
                            }
                        }
                    }
                    // CTE names are relations of the statement, not tables.
                    if let sqlparser::ast::Statement::Query(q) = st
                        && let Some(with) = &q.with
                    {
                        for cte in &with.cte_tables {
                            let alias = cte.alias.name.to_string();
                            tables.retain(|t| *t != alias);
                        }
                    }
                    let sql_text = if single {
                        collapse(sql, MAX_SQL)
                    } else {
                        collapse(&st.to_string(), MAX_SQL)
                    };
                    let verb = verb_of(&sql_text);
                    (sql_text, verb, tables)
                })
                .collect()
        }
        _ => {
            let sql_text = collapse(sql, MAX_SQL);
            let verb = verb_of(&sql_text);
            vec![(sql_text, verb, Vec::new())]
        }
    }
}

/// The verb and tables of a single statement.
#[cfg(test)]
pub(crate) fn analyze_for_tests(sql: &str) -> (String, Vec<String>) {
    let (_, verb, tables) = analyze(sql).into_iter().next().unwrap_or_default();
    (verb, tables)
}

/// A value of type `oid` in wire format `format` (0 text, 1 binary), as short text.
fn value(oid: u32, format: i16, bytes: &[u8]) -> String {
    if format == 0 {
        return text(bytes, MAX_VALUE);
    }
    let int = |b: &[u8]| -> Option<i64> {
        Some(match b.len() {
            2 => i64::from(i16::from_be_bytes(b.try_into().ok()?)),
            4 => i64::from(i32::from_be_bytes(b.try_into().ok()?)),
            8 => i64::from_be_bytes(b.try_into().ok()?),
            _ => return None,
        })
    };
    const EPOCH_2000_US: i64 = 946_684_800_000_000;
    let decoded = match oid {
        16 => bytes
            .first()
            .map(|b| if *b != 0 { "t" } else { "f" }.to_owned()),
        20 | 21 | 23 | 26 => int(bytes).map(|i| i.to_string()),
        700 => bytes
            .try_into()
            .ok()
            .map(|b| f32::from_be_bytes(b).to_string()),
        701 => bytes
            .try_into()
            .ok()
            .map(|b| f64::from_be_bytes(b).to_string()),
        25 | 1043 | 1042 | 19 | 114 | 142 | 705 => Some(text(bytes, MAX_VALUE)),
        3802 if bytes.first() == Some(&1) => Some(text(&bytes[1..], MAX_VALUE)),
        2950 if bytes.len() == 16 => {
            let h = hex::encode(bytes);
            Some(format!(
                "{}-{}-{}-{}-{}",
                &h[..8],
                &h[8..12],
                &h[12..16],
                &h[16..20],
                &h[20..]
            ))
        }
        1184 | 1114 => int(bytes)
            .and_then(|us| us.checked_add(EPOCH_2000_US))
            .and_then(|us| jiff::Timestamp::from_microsecond(us).ok())
            .map(|ts| {
                if oid == 1184 {
                    ts.to_string()
                } else {
                    ts.to_zoned(jiff::tz::TimeZone::UTC).datetime().to_string()
                }
            }),
        1082 => int(bytes).and_then(|days| {
            jiff::civil::date(2000, 1, 1)
                .checked_add(jiff::Span::new().try_days(days).ok()?)
                .ok()
                .map(|d| d.to_string())
        }),
        _ => None,
    };
    decoded.unwrap_or_else(|| {
        let n = bytes.len().min(MAX_VALUE / 2);
        let mut s = format!("0x{}", hex::encode(&bytes[..n]));
        if n < bytes.len() {
            s.push('…');
        }
        s
    })
}

#[derive(Debug, Clone)]
struct Prepared {
    sql: String,
    verb: String,
    tables: Vec<String>,
    types: Vec<u32>,
}

#[derive(Debug, Clone)]
struct Portal {
    statement: String,
    params: Vec<Option<String>>,
    /// Bind's result format codes (none: all text; one: for all; else per column).
    formats: Vec<i16>,
}

/// What a sent batch's replies will describe: statements described by name, and the executed
/// statements with their result formats, in order.
#[derive(Debug, Default)]
struct Answering {
    described: Vec<String>,
    executed: Vec<(String, Vec<i16>)>,
}

/// The format of column `i` under Bind's result format codes.
fn format_of(formats: &[i16], i: usize) -> i16 {
    match formats.len() {
        0 => 0,
        1 => formats[0],
        _ => formats.get(i).copied().unwrap_or(0),
    }
}

/// The connection's phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the first message (SSL/GSS request, startup, cancel): no type byte.
    Startup,
    /// SSL or GSS requested: the server answers one byte.
    Encryption,
    /// Startup sent; authentication until the first ReadyForQuery.
    Auth,
    /// Queries.
    Ready,
}

/// A message being received.
#[derive(Debug, Default)]
struct Side {
    buf: Vec<u8>,
    /// An oversized message: its type, total length, bytes consumed, first bytes.
    big: Option<(u8, usize, usize, Vec<u8>)>,
}

impl Side {
    /// The next whole message (or an oversized message's prefix, flagged), from `data`
    /// (appended to what is buffered). `typed`: the message has a type byte.
    /// Returns (message bytes, oversized, bytes of `data` consumed).
    fn next(&mut self, data: &[u8], typed: bool) -> Result<Option<(Vec<u8>, bool, usize)>, String> {
        if let Some((_, total, got, prefix)) = &mut self.big {
            let take = (*total - *got).min(data.len());
            let room = PREFIX.saturating_sub(prefix.len());
            prefix.extend_from_slice(&data[..take.min(room)]);
            *got += take;
            if *got < *total {
                return Ok(None);
            }
            let (_, _, _, prefix) = self.big.take().expect("in a big message");
            return Ok(Some((prefix, true, take)));
        }
        let head = usize::from(typed);
        let before = self.buf.len();
        // Take only what the header needs first, then the rest of the message.
        let need_header = (head + 4).saturating_sub(before);
        let take = need_header.min(data.len());
        self.buf.extend_from_slice(&data[..take]);
        if self.buf.len() < head + 4 {
            return Ok(None);
        }
        let len = u32::from_be_bytes(self.buf[head..head + 4].try_into().expect("4 bytes"));
        let len = usize::try_from(len).map_err(|_| "message length overflow")?;
        if len < 4 || (!typed && len < 8) {
            return Err(format!("a message length of {len}"));
        }
        let total = head + len;
        if total > MESSAGE_CAP {
            let mut prefix = std::mem::take(&mut self.buf);
            let more = (total - prefix.len()).min(data.len() - take);
            let room = PREFIX.saturating_sub(prefix.len());
            prefix.extend_from_slice(&data[take..take + more.min(room)]);
            let got = before + take + more;
            if got < total {
                self.big = Some((self.buf_type(&prefix, typed), total, got, prefix));
                return Ok(None);
            }
            return Ok(Some((prefix, true, take + more)));
        }
        let more = (total - self.buf.len()).min(data.len() - take);
        self.buf.extend_from_slice(&data[take..take + more]);
        if self.buf.len() < total {
            return Ok(None);
        }
        Ok(Some((std::mem::take(&mut self.buf), false, take + more)))
    }

    fn buf_type(&self, prefix: &[u8], typed: bool) -> u8 {
        if typed { prefix[0] } else { 0 }
    }
}

/// The extended-protocol batch being sent (since the last Sync).
#[derive(Debug, Default)]
struct Batch {
    statements: Vec<PgStatement>,
    /// Statements parsed in this batch (names), to report those no Execute ran.
    parsed: Vec<String>,
    executed: Vec<String>,
    answering: Answering,
    bytes: usize,
    ready_sent: bool,
}

/// Frames one PostgreSQL connection.
#[derive(Debug)]
pub(crate) struct PgFramer {
    phase: Phase,
    ctx: DecodeContext,
    client: Side,
    server: Side,
    startup: PgStartup,
    /// A request is started and not done (startup, or a batch).
    in_request: bool,
    startup_ready: bool,
    batch: Option<Batch>,
    prepared: HashMap<String, Prepared>,
    portals: HashMap<String, Portal>,
    /// Replies being gathered for the oldest unanswered request.
    reply: PgReply,
    /// The current result's columns: name, type, format.
    columns: Vec<(String, u32, i16)>,
    /// Row descriptions of prepared statements (a Describe answered them once; later Executes
    /// of the statement get rows without one).
    described: HashMap<String, Vec<(String, u32, i16)>>,
    /// Batches sent and not yet answered, oldest first.
    answering: std::collections::VecDeque<Answering>,
}

impl Default for PgFramer {
    fn default() -> PgFramer {
        PgFramer {
            phase: Phase::Startup,
            ctx: DecodeContext::new(ProtocolVersion::PROTOCOL3_0),
            client: Side::default(),
            server: Side::default(),
            startup: PgStartup {
                user: None,
                database: None,
                application_name: None,
                encryption_requested: false,
                backend_pid: None,
            },
            in_request: false,
            startup_ready: false,
            batch: None,
            prepared: HashMap::new(),
            portals: HashMap::new(),
            reply: PgReply::default(),
            columns: Vec::new(),
            described: HashMap::new(),
            answering: std::collections::VecDeque::new(),
        }
    }
}

impl PgFramer {
    fn statement(&self, portal: &str) -> PgStatement {
        let portal = self.portals.get(portal);
        let stmt_name = portal.map(|p| p.statement.clone()).unwrap_or_default();
        let prepared = self.prepared.get(&stmt_name);
        PgStatement {
            sql: prepared.map(|p| p.sql.clone()).unwrap_or_default(),
            verb: prepared.map(|p| p.verb.clone()).unwrap_or_default(),
            tables: prepared.map(|p| p.tables.clone()).unwrap_or_default(),
            name: (!stmt_name.is_empty()).then_some(stmt_name),
            params: portal.map(|p| p.params.clone()).unwrap_or_default(),
            executed: true,
        }
    }

    fn batch_request(&self, batch: &Batch) -> Request {
        let mut statements = batch.statements.clone();
        for parsed in &batch.parsed {
            if !batch.executed.contains(parsed)
                && let Some(p) = self.prepared.get(parsed)
            {
                statements.push(PgStatement {
                    sql: p.sql.clone(),
                    verb: p.verb.clone(),
                    tables: p.tables.clone(),
                    name: (!parsed.is_empty()).then(|| parsed.clone()),
                    params: Vec::new(),
                    executed: false,
                });
            }
        }
        Request::Postgres(PgRequest::Batch(PgBatch {
            mode: PgProtocol::Extended,
            statements,
        }))
    }

    fn remember<T>(map: &mut HashMap<String, T>, key: String, value: T) {
        if map.len() < MAX_PREPARED || map.contains_key(&key) {
            map.insert(key, value);
        }
    }

    fn prepare(&mut self, name: String, sql: &str, types: Vec<u32>) -> String {
        let (sql, verb, tables) = analyze(sql).into_iter().next().unwrap_or_default();
        let prepared = Prepared {
            sql,
            verb,
            tables,
            types,
        };
        Self::remember(&mut self.prepared, name.clone(), prepared);
        name
    }

    fn bind(&mut self, bind: Bind) {
        let statement = name(bind.statement_name);
        let types = self
            .prepared
            .get(&statement)
            .map(|p| p.types.clone())
            .unwrap_or_default();
        let formats = bind.parameter_format_codes;
        let result_formats = bind.result_column_format_codes;
        let params = bind
            .parameters
            .iter()
            .enumerate()
            .map(|(i, raw)| {
                let format = format_of(&formats, i);
                raw.as_ref()
                    .map(|b| value(types.get(i).copied().unwrap_or(0), format, b))
            })
            .collect();
        Self::remember(
            &mut self.portals,
            name(bind.portal_name),
            Portal {
                statement,
                params,
                formats: result_formats,
            },
        );
    }

    /// One whole client message (or an oversized one's prefix) in the Ready phase.
    fn client_message(
        &mut self,
        msg: &[u8],
        oversized: bool,
        ev: &mut Vec<Ev>,
    ) -> Result<(), String> {
        let kind = msg[0];
        if !starts_request(kind) {
            return Ok(());
        }
        let batch = self.batch.get_or_insert_with(Batch::default);
        batch.bytes += msg.len();
        match kind {
            b'Q' => self.simple_query(msg, oversized, ev)?,
            b'P' => self.parse_message(msg, oversized)?,
            b'B' => self.bind_message(msg, oversized)?,
            b'E' => self.execute_message(msg, oversized)?,
            b'C' => {
                if !oversized {
                    let close = decode::<Close>(msg, &self.ctx)?;
                    let target = name(close.name);
                    if close.target_type == b'S' {
                        self.prepared.remove(&target);
                        self.described.remove(&target);
                    } else {
                        self.portals.remove(&target);
                    }
                }
            }
            b'D' => {
                if !oversized {
                    let describe = decode::<Describe>(msg, &self.ctx)?;
                    if let (b'S', Some(batch)) = (describe.target_type, self.batch.as_mut()) {
                        batch.answering.described.push(name(describe.name));
                    }
                }
            }
            b'H' => {
                let batch = self.batch.take().unwrap_or_default();
                if !batch.ready_sent {
                    ev.push(Ev::Ready(self.batch_request(&batch)));
                }
                self.batch = Some(Batch {
                    ready_sent: true,
                    ..batch
                });
            }
            b'S' => {
                let mut batch = self.batch.take().unwrap_or_default();
                self.answering
                    .push_back(std::mem::take(&mut batch.answering));
                let request = self.batch_request(&batch);
                self.finish(request, batch.ready_sent, ev);
                self.in_request = false;
            }
            b'F' => self.function_call(ev),
            other => return Err(format!("an unknown client message type {other:#04x}")),
        }
        // A batch that grows without Sync or Flush: decide on what is known.
        if let Some(batch) = self.batch.take() {
            if !batch.ready_sent && batch.bytes > READY_AFTER {
                ev.push(Ev::Ready(self.batch_request(&batch)));
                self.batch = Some(Batch {
                    ready_sent: true,
                    ..batch
                });
            } else {
                self.batch = Some(batch);
            }
        }
        Ok(())
    }

    /// A simple Query: its statements end the batch and the request.
    fn simple_query(
        &mut self,
        msg: &[u8],
        oversized: bool,
        ev: &mut Vec<Ev>,
    ) -> Result<(), String> {
        let too_large = |e: &str| e.contains("too large") || e.contains("Too large");
        let sql = if oversized {
            let mut at = 5;
            String::from_utf8_lossy(cstr(msg, &mut at).unwrap_or(&msg[5..])).into_owned()
        } else {
            match decode::<Query>(msg, &self.ctx) {
                Ok(q) => q.query,
                Err(e) if too_large(&e) => {
                    String::from_utf8_lossy(&msg[5..msg.len().saturating_sub(1)]).into_owned()
                }
                Err(e) => return Err(e),
            }
        };
        let statements = analyze(&sql)
            .into_iter()
            .map(|(sql, verb, tables)| PgStatement {
                sql,
                verb,
                tables,
                name: None,
                params: Vec::new(),
                executed: true,
            })
            .collect::<Vec<_>>();
        let mut batch = self.batch.take().unwrap_or_default();
        self.answering
            .push_back(std::mem::take(&mut batch.answering));
        let mut request = self.batch_request(&batch);
        if let Request::Postgres(PgRequest::Batch(b)) = &mut request {
            b.statements.extend(statements);
            if batch.statements.is_empty() && batch.parsed.is_empty() {
                b.mode = PgProtocol::Simple;
            }
        }
        self.finish(request, batch.ready_sent, ev);
        self.in_request = false;
        Ok(())
    }

    /// A Parse: the statement is prepared, and parsed in the batch.
    fn parse_message(&mut self, msg: &[u8], oversized: bool) -> Result<(), String> {
        let (stmt, sql, types) = if oversized {
            let mut at = 5;
            let stmt = cstr(msg, &mut at).unwrap_or_default().to_vec();
            let sql = cstr(msg, &mut at).unwrap_or(msg.get(at..).unwrap_or_default());
            (
                String::from_utf8_lossy(&stmt).into_owned(),
                String::from_utf8_lossy(sql).into_owned(),
                Vec::new(),
            )
        } else {
            let p = decode::<Parse>(msg, &self.ctx)?;
            (name(p.name), p.query, p.type_oids)
        };
        let stmt = self.prepare(stmt, &sql, types);
        if let Some(batch) = self.batch.as_mut() {
            batch.parsed.push(stmt);
        }
        Ok(())
    }

    /// A Bind: the portal is remembered (an oversized one's parameters elided).
    fn bind_message(&mut self, msg: &[u8], oversized: bool) -> Result<(), String> {
        if oversized {
            let mut at = 5;
            let portal = cstr(msg, &mut at).unwrap_or_default();
            let statement = cstr(msg, &mut at).unwrap_or_default();
            let portal_name = String::from_utf8_lossy(portal).into_owned();
            let portal = Portal {
                statement: String::from_utf8_lossy(statement).into_owned(),
                params: vec![Some("…".to_owned())],
                formats: Vec::new(),
            };
            Self::remember(&mut self.portals, portal_name, portal);
        } else {
            let bind = decode::<Bind>(msg, &self.ctx)?;
            self.bind(bind);
        }
        Ok(())
    }

    /// An Execute: the portal's statement joins the batch, awaiting its answer.
    fn execute_message(&mut self, msg: &[u8], oversized: bool) -> Result<(), String> {
        let portal = if oversized {
            String::new()
        } else {
            name(decode::<Execute>(msg, &self.ctx)?.name)
        };
        let statement = self.statement(&portal);
        let formats = self
            .portals
            .get(&portal)
            .map(|p| p.formats.clone())
            .unwrap_or_default();
        if let Some(batch) = self.batch.as_mut() {
            batch
                .answering
                .executed
                .push((statement.name.clone().unwrap_or_default(), formats));
            if let Some(n) = &statement.name {
                batch.executed.push(n.clone());
            } else {
                batch.executed.push(String::new());
            }
            batch.statements.push(statement);
        }
        Ok(())
    }

    /// A FunctionCall: a request of its own, dropping the batch.
    fn function_call(&mut self, ev: &mut Vec<Ev>) {
        let statement = PgStatement {
            sql: "function call".to_owned(),
            verb: "FUNCTION".to_owned(),
            tables: Vec::new(),
            name: None,
            params: Vec::new(),
            executed: true,
        };
        self.batch = None;
        self.answering.push_back(Answering::default());
        let request = Request::Postgres(PgRequest::Batch(PgBatch {
            mode: PgProtocol::Simple,
            statements: vec![statement],
        }));
        self.finish(request, false, ev);
        self.in_request = false;
    }

    /// The request is complete: Ready (unless already) and Done.
    fn finish(&mut self, request: Request, ready_sent: bool, ev: &mut Vec<Ev>) {
        if ready_sent {
            ev.push(Ev::Done(Some(request)));
        } else {
            ev.push(Ev::Ready(request));
            ev.push(Ev::Done(None));
        }
    }

    /// The first message of a connection (no type byte).
    fn startup_message(&mut self, msg: &[u8], ev: &mut Vec<Ev>) -> Result<(), String> {
        let code = u32::from_be_bytes(msg[4..8].try_into().expect("8 bytes"));
        match code {
            SSL_REQUEST | GSS_REQUEST => {
                self.startup.encryption_requested = true;
                self.phase = Phase::Encryption;
                self.ready(ev);
            }
            CANCEL_REQUEST => {
                ev.push(Ev::Ready(Request::Postgres(PgRequest::Cancel)));
                ev.push(Ev::Done(None));
                self.in_request = false;
                // The server answers a cancel by closing.
                self.phase = Phase::Ready;
            }
            _ => {
                let startup = decode::<Startup>(msg, &self.ctx)?;
                if startup.protocol_number_major != 3 {
                    return Err("not protocol 3".into());
                }
                let param = |k: &str| startup.parameters.get(k).cloned();
                self.startup.user = param("user");
                self.startup.database = param("database").or_else(|| param("user"));
                self.startup.application_name = param("application_name");
                self.phase = Phase::Auth;
                self.ready(ev);
            }
        }
        Ok(())
    }

    fn ready(&mut self, ev: &mut Vec<Ev>) {
        if !self.startup_ready {
            self.startup_ready = true;
            ev.push(Ev::Ready(Request::Postgres(PgRequest::Startup(
                self.startup.clone(),
            ))));
        }
    }

    /// One whole server message (or an oversized one's prefix).
    fn server_message(
        &mut self,
        msg: &[u8],
        oversized: bool,
        ev: &mut Vec<Ev>,
    ) -> Result<(), String> {
        let kind = msg[0];
        match kind {
            b'R' if !oversized => {
                let auth = match decode::<Authentication>(msg, &self.ctx)? {
                    Authentication::Ok => "ok".to_owned(),
                    Authentication::CleartextPassword => "cleartext".to_owned(),
                    Authentication::MD5Password(_) => "md5".to_owned(),
                    Authentication::KerberosV5 => "kerberos".to_owned(),
                    Authentication::SASL(methods) => format!("sasl:{}", methods.join(",")),
                    _ => return Ok(()),
                };
                // The first request names the method; a later Ok only confirms it.
                if self.reply.auth.is_none() {
                    self.reply.auth = Some(auth);
                }
            }
            b'T' if !oversized => {
                let desc = decode::<RowDescription>(msg, &self.ctx)?;
                self.columns = desc
                    .fields
                    .into_iter()
                    .map(|f| (f.name, f.type_id, f.format_code))
                    .collect();
                if let Some(front) = self.answering.front() {
                    for stmt in &front.described {
                        if self.described.len() < MAX_PREPARED || self.described.contains_key(stmt)
                        {
                            self.described.insert(stmt.clone(), self.columns.clone());
                        }
                    }
                }
            }
            b'D' => {
                self.reply.rows += 1;
                if self.reply.rows == 1 && !oversized {
                    let row = decode::<DataRow>(msg, &self.ctx)?;
                    self.reply.first_row = self.first_row(&row.data, row.field_count);
                }
            }
            b'C' if !oversized => {
                let tag = decode::<CommandComplete>(msg, &self.ctx)?.tag;
                let mut words = tag.split_whitespace();
                if let (Some(verb), Some(count)) = (words.next(), tag.split_whitespace().last())
                    && matches!(verb, "INSERT" | "UPDATE" | "DELETE" | "MERGE" | "COPY")
                    && let Ok(n) = count.parse::<u64>()
                {
                    *self.reply.rows_affected.get_or_insert(0) += n;
                }
                self.reply.tags.push(text(tag.as_bytes(), MAX_VALUE));
            }
            b'E' => {
                let error = if oversized {
                    PgError {
                        code: String::new(),
                        message: "(error message too large)".into(),
                    }
                } else {
                    let fields = decode::<ErrorResponse>(msg, &self.ctx)?.fields;
                    let field = |code: u8| {
                        fields
                            .iter()
                            .find(|(c, _)| *c == code)
                            .map(|(_, v)| text(v.as_bytes(), MAX_VALUE))
                            .unwrap_or_default()
                    };
                    PgError {
                        code: field(b'C'),
                        message: field(b'M'),
                    }
                };
                self.reply.error.get_or_insert(error);
                if self.phase == Phase::Auth {
                    // Authentication failed; the server closes.
                    self.answer(None, ev);
                }
            }
            b'Z' => {
                let status = decode::<ReadyForQuery>(msg, &self.ctx)?.status;
                let tx = match status {
                    TransactionStatus::Idle => TxStatus::Idle,
                    TransactionStatus::Transaction => TxStatus::Transaction,
                    TransactionStatus::Error => TxStatus::Failed,
                };
                if self.phase == Phase::Ready {
                    self.answering.pop_front();
                }
                if self.phase == Phase::Auth {
                    self.phase = Phase::Ready;
                    ev.push(Ev::Done(Some(Request::Postgres(PgRequest::Startup(
                        self.startup.clone(),
                    )))));
                    self.in_request = false;
                }
                self.answer(Some(tx), ev);
            }
            // The server process serving the connection: what attributes a write recorded by a
            // trigger (`pg_backend_pid()`) to the connection, hence the worker, that sent it.
            b'K' if self.phase == Phase::Auth => {
                let key = decode::<BackendKeyData>(msg, &self.ctx)?;
                self.startup.backend_pid = Some(key.pid);
            }
            // Completions, descriptions, notices, notifications, parameter status, COPY in/out:
            // nothing the summary needs.
            _ => {}
        }
        Ok(())
    }

    fn first_row(&self, data: &[u8], count: i16) -> Vec<(String, Option<String>)> {
        // An Execute's rows are typed by its statement's description (this reply's, or an
        // earlier Describe's) and formatted as its Bind asked; a simple query's by its own.
        let executed = self.answering.front().and_then(|a| a.executed.first());
        let columns: Vec<(String, u32, i16)> = match executed {
            Some((stmt, formats)) => {
                let described = if self.columns.is_empty() {
                    self.described.get(stmt).cloned().unwrap_or_default()
                } else {
                    self.columns.clone()
                };
                described
                    .into_iter()
                    .enumerate()
                    .map(|(i, (name, oid, _))| (name, oid, format_of(formats, i)))
                    .collect()
            }
            None => self.columns.clone(),
        };
        let mut out = Vec::new();
        let mut at = 0;
        for i in 0..usize::try_from(count).unwrap_or(0).min(MAX_ITEMS) {
            let Some(len) = data.get(at..at + 4) else {
                break;
            };
            at += 4;
            let len = i32::from_be_bytes(len.try_into().expect("4 bytes"));
            let (name, oid, format) = columns.get(i).cloned().unwrap_or_default();
            let field = if len < 0 {
                None
            } else {
                let len = usize::try_from(len).unwrap_or(0);
                let Some(bytes) = data.get(at..at + len) else {
                    break;
                };
                at += len;
                Some(value(oid, format, bytes))
            };
            out.push((name, field));
        }
        out
    }

    fn answer(&mut self, tx: Option<TxStatus>, ev: &mut Vec<Ev>) {
        let mut reply = std::mem::take(&mut self.reply);
        reply.tx = tx;
        self.columns.clear();
        ev.push(Ev::Reply(Reply::Postgres(reply)));
    }
}

impl Framer for PgFramer {
    fn client(&mut self, data: &[u8], ev: &mut Vec<Ev>) {
        let mut i = 0;
        while i < data.len() {
            let typed = self.phase != Phase::Startup;
            // A message begins here: the first of a request, unless one is under way.
            if self.client.buf.is_empty() && self.client.big.is_none() && !self.in_request {
                let starts = match self.phase {
                    Phase::Startup => true,
                    Phase::Ready => starts_request(data[i]),
                    Phase::Encryption | Phase::Auth => false,
                };
                if starts {
                    self.in_request = true;
                    ev.push(Ev::Start(i));
                }
            }
            let (msg, oversized, used) = match self.client.next(&data[i..], typed) {
                Err(err) => return ev.push(Ev::Opaque(err)),
                Ok(None) => return,
                Ok(Some(next)) => next,
            };
            i += used;
            let result = match self.phase {
                Phase::Startup => self.startup_message(&msg, ev),
                Phase::Encryption => Err("client bytes before the server answered SSL".into()),
                Phase::Auth => Ok(()),
                Phase::Ready => self.client_message(&msg, oversized, ev),
            };
            if let Err(err) = result {
                return ev.push(Ev::Opaque(err));
            }
        }
    }

    fn server(&mut self, data: &[u8], ev: &mut Vec<Ev>) {
        let mut i = 0;
        while i < data.len() {
            if self.phase == Phase::Encryption {
                match data[i] {
                    b'N' => {
                        i += 1;
                        self.phase = Phase::Startup;
                        continue;
                    }
                    b'S' | b'G' => {
                        return ev.push(Ev::Opaque("the server accepted encryption".into()));
                    }
                    _ => return ev.push(Ev::Opaque("a bad answer to an SSL request".into())),
                }
            }
            let next = match self.server.next(&data[i..], true) {
                Err(err) => return ev.push(Ev::Opaque(err)),
                Ok(None) => return,
                Ok(Some(next)) => next,
            };
            let (msg, oversized, used) = next;
            i += used;
            if let Err(err) = self.server_message(&msg, oversized, ev) {
                return ev.push(Ev::Opaque(err));
            }
        }
    }
}

/// Whether a client message of this type begins a request (COPY data, passwords and Terminate
/// belong to none).
fn starts_request(kind: u8) -> bool {
    !matches!(kind, b'd' | b'c' | b'f' | b'p' | b'X')
}
