//! The wire witness: turns the bytes a proxied connection carries into **round trips** (one per
//! request and its reply) for Redis (RESP2 and RESP3), PostgreSQL (protocol v3) and HTTP/1.1, and
//! lets a holder delay a worker's next request at a request boundary.
//!
//! A [`WireTap`] is attached to one proxy ("link") of the proxy engine
//! ([`noxious::tap::Tap`]); for every connection it frames both byte streams, sends each finished
//! [`RoundTrip`] to a [`Sink`], and, if a [`Holder`] is set, asks it before forwarding a client
//! write that starts new requests. Framing never changes what is forwarded: a parse error marks
//! the connection *opaque* (recording stops for it, forwarding goes on), and memory per connection
//! is bounded whatever the values' sizes (only what a summary needs is kept).
//!
//! ```no_run
//! use racecert_wire::{Protocol, RoundTrip, WireTap};
//! use std::sync::Arc;
//!
//! let tap = WireTap::builder("redis-w0", Protocol::Redis)
//!     .sink(|trip: RoundTrip| println!("{}", trip.request.fingerprint(None)))
//!     .build();
//! // Engine: ProxyRunner::run_proxy_with_tap(listener, info, events, stop, closer, Some(tap))
//! # let _: Arc<dyn noxious::tap::Tap> = tap;
//! ```
//!
//! What the wire cannot show: TLS (a PostgreSQL connection that negotiates SSL is opaque; Redis or
//! HTTP over TLS frames as garbage and goes opaque), Unix sockets (never proxied).

#![deny(missing_docs)]

mod commands;
mod conn;
mod describe;
mod http;
mod postgres;
mod redis;
#[cfg(test)]
mod tests;
mod text;
mod touch;

pub use commands::{command_keys, redis_reads_only};
pub use touch::{Touch, touches};

use futures::future::BoxFuture;
pub use noxious::tap::Release;
use noxious::tap::{ConnInfo, ConnTap, Tap};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

/// One round trip, attributed: which worker sent it, to which service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireEvent {
    /// The worker whose links carried it.
    pub worker: String,
    /// `redis`, `postgres`, or `backend:{version}`.
    pub service: String,
    /// The round trip.
    pub trip: RoundTrip,
}

/// Receives a link set's round trips (a run's recorder).
pub type WireListener = Arc<dyn Fn(WireEvent) + Send + Sync>;

/// One call as the backend received it.
#[derive(Debug, Clone, PartialEq)]
pub struct JournalEntry {
    /// Position in the backend's journal (arrival order).
    pub seq: usize,
    /// The backend's name.
    pub backend: String,
    /// The version it serves.
    pub model_version: String,
    /// The parsed call (None if the body was not a call of the backend's API).
    pub request: Option<racecert_core::contract::InferRequest>,
}

/// The protocol a link carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// Redis RESP2/RESP3 (the client switches with `HELLO 3`).
    Redis,
    /// PostgreSQL frontend/backend protocol v3.
    Postgres,
    /// HTTP/1.1 (model backends).
    Http,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Redis => "redis",
            Protocol::Postgres => "postgres",
            Protocol::Http => "http",
        })
    }
}

/// One request and its reply on one connection of one link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundTrip {
    /// The link (proxy) name the tap was built for.
    pub link: String,
    /// The engine's connection id (unique in the process).
    pub conn: u64,
    /// The request's position on its connection, from 0.
    pub seq: u64,
    /// When the client's first byte of the request was seen, in microseconds on the tap's
    /// [`Clock`].
    pub sent_us: u64,
    /// When the request went on to the server: `sent_us` unless a holder held it, then the
    /// release. `None` if a held request never went on (the connection ended first).
    pub forwarded_us: Option<u64>,
    /// When the reply was complete; `None` if it never came (the connection ended first).
    pub answered_us: Option<u64>,
    /// What the client asked.
    pub request: Request,
    /// What the server answered, in short; `None` if no reply came.
    pub reply: Option<Reply>,
}

/// A request, per protocol.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "protocol", rename_all = "lowercase")]
pub enum Request {
    /// A Redis command.
    Redis(RedisCommand),
    /// A PostgreSQL startup, or a batch of statements (simple query, or extended messages up to
    /// Sync).
    Postgres(PgRequest),
    /// An HTTP request.
    Http(HttpRequest),
}

/// A Redis command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedisCommand {
    /// The command name, upper case (`SET`, `EVALSHA`, ...).
    pub name: String,
    /// The arguments after the name, each truncated ([`text`] rules: UTF-8 or `0x` hex), at most
    /// the first [`MAX_ARGS`].
    pub args: Vec<String>,
    /// A push onto a queue or stream (`LPUSH`, `RPUSH`, `XADD`, ...): the values after the key,
    /// kept up to 8 KiB each, so the framework's id of a message a client enqueued can be read
    /// back. Apart from `args`: what a round trip names (and so whether it acts on a request)
    /// stays what its first bytes show.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pushed: Vec<String>,
    /// How many arguments the command really had.
    pub argc: usize,
    /// The keys the command touches, from racecert's command table ([`command_keys`]); empty for
    /// unknown commands. `EXEC` carries the keys of the commands it executes.
    pub keys: Vec<String>,
    /// Queued inside `MULTI`: the reply is `QUEUED` and the effect happens at `EXEC`.
    pub queued: bool,
    /// The command was larger than the framer keeps whole; its arguments are what fit.
    pub truncated: bool,
}

/// A PostgreSQL request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum PgRequest {
    /// Connection set-up: optional SSL/GSS request (declined), startup message, authentication,
    /// up to the first ReadyForQuery.
    Startup(PgStartup),
    /// A simple Query, or extended-protocol messages up to Sync.
    Batch(PgBatch),
    /// A CancelRequest (sent on a connection of its own).
    Cancel,
}

/// The startup of a PostgreSQL connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgStartup {
    /// The `user` startup parameter.
    pub user: Option<String>,
    /// The `database` startup parameter.
    pub database: Option<String>,
    /// The `application_name` startup parameter.
    pub application_name: Option<String>,
    /// The client asked for SSL or GSS encryption first (and was declined, or the connection
    /// would be opaque).
    pub encryption_requested: bool,
    /// The server process serving the connection (its BackendKeyData), when the server sent it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_pid: Option<i32>,
}

/// Statements sent in one round trip.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgBatch {
    /// `simple` (Query message) or `extended` (Parse/Bind/Execute/... up to Sync).
    pub mode: PgProtocol,
    /// The statements, in order: one per statement of a simple query; for the extended protocol,
    /// one per Execute, plus one per Parse that no Execute of the batch runs (a prepare). Empty
    /// for a lone Sync (sqlx's connection check) or a batch that only closes statements.
    pub statements: Vec<PgStatement>,
}

/// Which PostgreSQL query protocol a batch used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PgProtocol {
    /// A Query message.
    Simple,
    /// Extended query messages up to Sync.
    Extended,
}

/// One SQL statement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgStatement {
    /// The SQL, whitespace collapsed, truncated to [`MAX_SQL`] bytes. For an Execute of a named
    /// statement prepared earlier on the connection, the SQL it was prepared with.
    pub sql: String,
    /// The first keyword, upper case (`SELECT`, `UPDATE`, `BEGIN`, ...).
    pub verb: String,
    /// The tables it touches (PostgreSQL dialect of `sqlparser`; empty if it does not parse).
    pub tables: Vec<String>,
    /// The prepared statement name (extended protocol), if named.
    pub name: Option<String>,
    /// Bound parameter values, text (binary values decoded for common types, else hex), each
    /// truncated.
    pub params: Vec<Option<String>>,
    /// Executed in this round trip (false for a Parse that was only prepared).
    pub executed: bool,
}

/// An HTTP request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpRequest {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The request target (path and query).
    pub path: String,
    /// A few headers (lower-case names; credentials and cookies left out).
    pub headers: Vec<(String, String)>,
    /// The body, truncated ([`MAX_BODY`]).
    pub body: String,
    /// The body's full length in bytes.
    pub body_len: u64,
}

/// A reply, per protocol.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "protocol", rename_all = "lowercase")]
pub enum Reply {
    /// A Redis reply.
    Redis(RedisReply),
    /// PostgreSQL replies up to ReadyForQuery.
    Postgres(PgReply),
    /// An HTTP response.
    Http(HttpResponse),
}

/// A Redis reply in short.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "value", rename_all = "lowercase")]
pub enum RedisReply {
    /// A simple string: `OK`, `PONG`, `QUEUED`, ...
    Status(String),
    /// An error reply's message.
    Error(String),
    /// An integer.
    Int(i64),
    /// Nil (RESP2 null bulk or array, RESP3 null).
    Nil,
    /// A bulk (or verbatim) string, truncated.
    Bulk {
        /// Full length in bytes.
        len: usize,
        /// The start, [`text`] rules.
        text: String,
    },
    /// An array (or RESP3 set or push): length and the first few elements.
    Array {
        /// Element count.
        len: usize,
        /// The first [`MAX_ITEMS`] elements.
        items: Vec<RedisReply>,
    },
    /// A RESP3 map: pair count and the first few pairs (in wire order).
    Map {
        /// Pair count.
        len: usize,
        /// The first [`MAX_ITEMS`] pairs.
        items: Vec<(RedisReply, RedisReply)>,
    },
    /// A RESP3 double (formatted from its value: `3.5`, `inf`).
    Double(String),
    /// A RESP3 boolean.
    Bool(bool),
    /// A RESP3 big number, as sent.
    BigNumber(String),
}

/// PostgreSQL replies up to ReadyForQuery, in short.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PgReply {
    /// CommandComplete tags in order (`UPDATE 1`, `SELECT 3`, `INSERT 0 1`, `BEGIN`).
    pub tags: Vec<String>,
    /// Rows changed: the sum of the counts of INSERT/UPDATE/DELETE/MERGE/COPY tags, if any.
    pub rows_affected: Option<u64>,
    /// DataRow messages received.
    pub rows: u64,
    /// The first row's columns (names) and values (text; binary decoded for common types), each
    /// truncated, at most [`MAX_ITEMS`].
    pub first_row: Vec<(String, Option<String>)>,
    /// The first error, if any.
    pub error: Option<PgError>,
    /// The transaction status the ReadyForQuery reported; `None` if the reply ended without one.
    pub tx: Option<TxStatus>,
    /// For a startup: the authentication the server asked for (`ok`, `cleartext`, `md5`,
    /// `sasl:SCRAM-SHA-256`, ...).
    pub auth: Option<String>,
}

/// A PostgreSQL ErrorResponse.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgError {
    /// SQLSTATE (`23505`, `40001`, ...).
    pub code: String,
    /// The message.
    pub message: String,
}

/// ReadyForQuery's transaction status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxStatus {
    /// `I`: not in a transaction block.
    #[serde(rename = "I")]
    Idle,
    /// `T`: in a transaction block.
    #[serde(rename = "T")]
    Transaction,
    /// `E`: in a failed transaction block.
    #[serde(rename = "E")]
    Failed,
}

/// An HTTP response in short.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// A few headers (lower-case names).
    pub headers: Vec<(String, String)>,
    /// The body, truncated ([`MAX_BODY`]).
    pub body: String,
    /// The body's full length in bytes.
    pub body_len: u64,
}

/// Arguments kept per Redis command.
pub const MAX_ARGS: usize = 64;
/// Bytes kept per argument, key, parameter or value.
pub const MAX_VALUE: usize = 256;
/// Bytes kept of an SQL text.
pub const MAX_SQL: usize = 1024;
/// Bytes kept of an HTTP body.
pub const MAX_BODY: usize = 1024;
/// Elements kept of an aggregate reply, columns of a first row.
pub const MAX_ITEMS: usize = 8;

pub use text::text;

/// A request's identity across runs: what it does and to what, without the values that change
/// per run (tokens, timestamps, payloads). Issue 13's replays compare them to detect divergence.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Fingerprint(pub String);

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Placeholder for a run's key namespace in fingerprints.
pub const NAMESPACE_PLACEHOLDER: &str = "{ns}";

impl Request {
    /// The protocol of this request.
    pub fn protocol(&self) -> Protocol {
        match self {
            Request::Redis(_) => Protocol::Redis,
            Request::Postgres(_) => Protocol::Postgres,
            Request::Http(_) => Protocol::Http,
        }
    }

    /// The statements of a PostgreSQL batch (empty for anything else).
    pub fn statements(&self) -> &[PgStatement] {
        match self {
            Request::Postgres(PgRequest::Batch(batch)) => &batch.statements,
            _ => &[],
        }
    }

    /// The request's [`Fingerprint`]: Redis: name and keys (with `namespace`, if given, replaced
    /// by [`NAMESPACE_PLACEHOLDER`] wherever it occurs in a key); PostgreSQL: per statement its
    /// verb, tables and SQL (the SQL carries placeholders, not values); HTTP: method and path
    /// without the query.
    pub fn fingerprint(&self, namespace: Option<&str>) -> Fingerprint {
        let scrub = |key: &str| match namespace {
            Some(ns) if !ns.is_empty() => key.replace(ns, NAMESPACE_PLACEHOLDER),
            _ => key.to_owned(),
        };
        let print = match self {
            Request::Redis(cmd) => {
                let mut out = format!("redis {}", cmd.name);
                for key in &cmd.keys {
                    out.push(' ');
                    out.push_str(&scrub(key));
                }
                if cmd.queued {
                    out.push_str(" (queued)");
                }
                out
            }
            Request::Postgres(PgRequest::Startup(start)) => format!(
                "postgres startup {}@{}",
                start.user.as_deref().unwrap_or("?"),
                start.database.as_deref().unwrap_or("?")
            ),
            Request::Postgres(PgRequest::Cancel) => "postgres cancel".to_owned(),
            Request::Postgres(PgRequest::Batch(batch)) => {
                let mut out = String::from("postgres");
                if batch.statements.is_empty() {
                    out.push_str(" sync");
                }
                for st in &batch.statements {
                    out.push_str(&format!(
                        " [{}{} {} | {}]",
                        st.verb,
                        if st.executed { "" } else { " (prepare)" },
                        st.tables.join(","),
                        scrub(&st.sql)
                    ));
                }
                out
            }
            Request::Http(req) => {
                let path = req.path.split('?').next().unwrap_or_default();
                format!("http {} {}", req.method, scrub(path))
            }
        };
        Fingerprint(print)
    }
}

/// Where finished round trips go. Called from the proxy engine's reader tasks, with no lock of
/// the tap held: keep it quick (push to a channel or a mutex-guarded vector).
pub trait Sink: Send + Sync + 'static {
    /// A round trip is complete (or its connection ended). Per connection, in `seq` order.
    fn round_trip(&self, trip: RoundTrip);
    /// Recording stopped for a connection (TLS, a parse error, a mode the framer does not
    /// follow); forwarding goes on. Nothing more comes from that connection.
    fn opaque(&self, link: &str, conn: u64, reason: &str) {
        let _ = (link, conn, reason);
    }
    /// A client connected: the engine's connection id and the client's address as the proxy
    /// saw the peer (the client end of the socket, which names the process that holds it).
    fn opened(&self, link: &str, conn: u64, client: std::net::SocketAddr) {
        let _ = (link, conn, client);
    }
}

impl<F> Sink for F
where
    F: Fn(RoundTrip) + Send + Sync + 'static,
{
    fn round_trip(&self, trip: RoundTrip) {
        self(trip)
    }
}

/// Decides whether a client's next request(s) wait before reaching the server (issue 13).
pub trait Holder: Send + Sync + 'static {
    /// Called before the engine forwards a client write that starts new requests, with those
    /// requests (complete, parsed) in order; a write continuing a request already forwarded is
    /// never held. `first` is the first request's number on its connection (its round trip's
    /// [`RoundTrip::seq`]). Return a future to hold the write until it resolves, or `None` to
    /// let it through; a hold that ends in [`Release::Abort`] drops the requests and ends their
    /// connection (their client was killed before it sent them). Calls for one connection come
    /// in request order.
    fn before(
        &self,
        link: &str,
        conn: u64,
        first: u64,
        requests: &[Request],
    ) -> Option<BoxFuture<'static, Release>>;

    /// Whether a request of `link` is held now: what comes after it on its connection (a
    /// health check too) waits behind it.
    fn holding(&self, _link: &str) -> bool {
        false
    }
}

/// The time base of round trips: microseconds since an origin the caller chooses (the run's
/// start), so wire events line up with the rest of a history.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    origin: Instant,
}

impl Clock {
    /// A clock counting from `origin`.
    pub fn new(origin: Instant) -> Clock {
        Clock { origin }
    }

    /// Microseconds from the origin to `at` (0 before it).
    pub fn micros(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_micros()).unwrap_or(u64::MAX)
    }

    /// The origin.
    pub fn origin(&self) -> Instant {
        self.origin
    }
}

/// The engine tap for one link: frames every connection of the proxy it is attached to.
pub struct WireTap {
    link: Arc<str>,
    protocol: Protocol,
    sink: Arc<dyn Sink>,
    holder: Option<Arc<dyn Holder>>,
    clock: Clock,
}

impl fmt::Debug for WireTap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WireTap")
            .field("link", &self.link)
            .field("protocol", &self.protocol)
            .field("holds", &self.holder.is_some())
            .finish()
    }
}

/// Builds a [`WireTap`].
pub struct WireTapBuilder {
    link: String,
    protocol: Protocol,
    sink: Option<Arc<dyn Sink>>,
    holder: Option<Arc<dyn Holder>>,
    clock: Option<Clock>,
}

impl WireTap {
    /// A tap for the link (proxy) `link` carrying `protocol`.
    pub fn builder(link: impl Into<String>, protocol: Protocol) -> WireTapBuilder {
        WireTapBuilder {
            link: link.into(),
            protocol,
            sink: None,
            holder: None,
            clock: None,
        }
    }

    /// The link name.
    pub fn link(&self) -> &str {
        &self.link
    }

    /// The protocol.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }
}

impl WireTapBuilder {
    /// Where round trips go (default: nowhere, for a tap that only holds).
    pub fn sink(mut self, sink: impl Sink) -> Self {
        self.sink = Some(Arc::new(sink));
        self
    }

    /// Where round trips go, shared.
    pub fn shared_sink(mut self, sink: Arc<dyn Sink>) -> Self {
        self.sink = Some(sink);
        self
    }

    /// Asks `holder` before forwarding each client write that starts requests.
    pub fn holder(mut self, holder: Arc<dyn Holder>) -> Self {
        self.holder = Some(holder);
        self
    }

    /// The time base (default: a clock starting now).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The tap, ready for [`noxious::proxy::ProxyRunner::run_proxy_with_tap`].
    pub fn build(self) -> Arc<WireTap> {
        struct Nowhere;
        impl Sink for Nowhere {
            fn round_trip(&self, _: RoundTrip) {}
        }
        Arc::new(WireTap {
            link: self.link.into(),
            protocol: self.protocol,
            sink: self.sink.unwrap_or_else(|| Arc::new(Nowhere)),
            holder: self.holder,
            clock: self.clock.unwrap_or_else(|| Clock::new(Instant::now())),
        })
    }
}

impl Tap for WireTap {
    fn open(&self, conn: ConnInfo) -> Arc<dyn ConnTap> {
        self.sink.opened(&self.link, conn.id, conn.client);
        conn::Connection::open(self, conn.id)
    }
}
