//! Framer tests on byte fixtures: each protocol's round trips, every fixture also split at every
//! byte offset (the result must not change), holds at request boundaries, and fuzzing (garbage
//! never panics; the RESP walker agrees with the crate's decoder).
//!
//! Why one file of ~1,300 lines: the framing tests of all three protocols share the harness that
//! opens a tapped connection pair; each test is short.

use super::conn::{Connection, Ev, Framer};
use super::redis::{RedisFramer, Walker};
use super::*;
use ::redis as _;
use bytes::{Bytes, BytesMut};
use futures::FutureExt;
use noxious::tap::ConnTap;
use pgwire::messages::Message;
use std::sync::Mutex;
use tokio::sync::oneshot;

/// Who sends a fixture's bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Dir {
    Client,
    Server,
}
use Dir::{Client, Server};

#[derive(Default)]
struct Collect {
    trips: Mutex<Vec<RoundTrip>>,
    opaque: Mutex<Vec<String>>,
}

impl Sink for Arc<Collect> {
    fn round_trip(&self, trip: RoundTrip) {
        self.trips.lock().unwrap().push(trip);
    }
    fn opaque(&self, _link: &str, _conn: u64, reason: &str) {
        self.opaque.lock().unwrap().push(reason.to_owned());
    }
}

fn open(protocol: Protocol, holder: Option<Arc<dyn Holder>>) -> (Arc<Connection>, Arc<Collect>) {
    let collect = Arc::new(Collect::default());
    let mut builder = WireTap::builder("link", protocol).sink(collect.clone());
    if let Some(holder) = holder {
        builder = builder.holder(holder);
    }
    let tap = builder.build();
    (Connection::open(&tap, 1), collect)
}

/// Feeds the exchange (no holder), closes, returns the round trips and opaque reasons.
fn run(protocol: Protocol, exchange: &[(Dir, Vec<u8>)]) -> (Vec<RoundTrip>, Vec<String>) {
    let (conn, collect) = open(protocol, None);
    for (dir, bytes) in exchange {
        let bytes = Bytes::copy_from_slice(bytes);
        match dir {
            Client => assert!(conn.to_server(&bytes).is_none()),
            Server => conn.to_client(&bytes),
        }
    }
    conn.closed();
    let trips = collect.trips.lock().unwrap().clone();
    let opaque = collect.opaque.lock().unwrap().clone();
    (trips, opaque)
}

/// Times differ between runs; compare the rest.
fn untimed(trips: Vec<RoundTrip>) -> Vec<(u64, Request, Option<Reply>)> {
    trips
        .into_iter()
        .map(|t| (t.seq, t.request, t.reply))
        .collect()
}

/// Runs the exchange whole, then with every message split at every byte offset: all agree.
fn run_split_everywhere(protocol: Protocol, exchange: &[(Dir, Vec<u8>)]) -> Vec<RoundTrip> {
    let (whole, opaque) = run(protocol, exchange);
    assert!(opaque.is_empty(), "opaque: {opaque:?}");
    for (i, (dir, bytes)) in exchange.iter().enumerate() {
        for at in 1..bytes.len() {
            let mut split = exchange[..i].to_vec();
            split.push((*dir, bytes[..at].to_vec()));
            split.push((*dir, bytes[at..].to_vec()));
            split.extend_from_slice(&exchange[i + 1..]);
            let (trips, opaque) = run(protocol, &split);
            assert!(opaque.is_empty(), "split {i}@{at}: opaque {opaque:?}");
            assert_eq!(
                untimed(trips),
                untimed(whole.clone()),
                "split of message {i} at {at}"
            );
        }
    }
    whole
}

fn resp(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn cmd(request: &Request) -> &RedisCommand {
    match request {
        Request::Redis(cmd) => cmd,
        other => panic!("not redis: {other:?}"),
    }
}

fn redis_reply(trip: &RoundTrip) -> &RedisReply {
    match &trip.reply {
        Some(Reply::Redis(reply)) => reply,
        other => panic!("not a redis reply: {other:?}"),
    }
}

// ---------------------------------------------------------------- Redis

/// A message pushed onto a queue is kept whole (up to 8 KiB) beside the arguments, so the
/// framework's id of what a client enqueued can be read back from the wire; a SET keeps none.
#[test]
fn redis_a_pushed_message_is_kept_whole_and_other_values_are_cut() {
    let message = format!(
        "{{\"headers\": {{\"id\": \"t-1\"}}, \"body\": \"{}\"}}",
        "x".repeat(2000)
    );
    let mut write = resp(&[b"LPUSH", b"celery", message.as_bytes()]);
    write.extend(resp(&[b"SET", b"k", message.as_bytes()]));
    let trips = run_split_everywhere(
        Protocol::Redis,
        &[(Client, write), (Server, b":1\r\n+OK\r\n".to_vec())],
    );
    assert_eq!(trips.len(), 2);
    let push = cmd(&trips[0].request);
    assert_eq!(push.pushed, [message.as_str()]);
    // What the push names stays what its first bytes show, as for every other command.
    assert!(
        push.args[1].len() < 300 && push.args[1].ends_with('…'),
        "{}",
        push.args[1]
    );
    let set = cmd(&trips[1].request);
    assert!(set.pushed.is_empty());
    assert!(
        set.args[1].len() < 300 && set.args[1].ends_with('…'),
        "{}",
        set.args[1]
    );
}

#[test]
fn redis_pipeline_is_one_round_trip_per_command() {
    let mut write = resp(&[b"SET", b"t:lock:1", b"tok", b"NX", b"PX", b"3000"]);
    write.extend(resp(&[b"GET", b"t:lock:1"]));
    write.extend(resp(&[b"INCR", b"t:n"]));
    let trips = run_split_everywhere(
        Protocol::Redis,
        &[
            (Client, write),
            (Server, b"+OK\r\n$3\r\ntok\r\n:7\r\n".to_vec()),
        ],
    );
    assert_eq!(trips.len(), 3);
    let set = cmd(&trips[0].request);
    assert_eq!(set.name, "SET");
    assert_eq!(set.keys, ["t:lock:1"]);
    assert_eq!(set.args, ["t:lock:1", "tok", "NX", "PX", "3000"]);
    assert_eq!(redis_reply(&trips[0]), &RedisReply::Status("OK".into()));
    assert_eq!(
        redis_reply(&trips[1]),
        &RedisReply::Bulk {
            len: 3,
            text: "tok".into()
        }
    );
    assert_eq!(redis_reply(&trips[2]), &RedisReply::Int(7));
    assert_eq!(
        trips.iter().map(|t| t.seq).collect::<Vec<_>>(),
        [0, 1, 2],
        "in order"
    );
}

#[test]
fn redis_multi_exec_queues_and_exec_carries_the_keys() {
    let mut write = resp(&[b"MULTI"]);
    write.extend(resp(&[b"HSET", b"unacked", b"tag", b"body"]));
    write.extend(resp(&[b"ZADD", b"unacked_index", b"12", b"tag"]));
    write.extend(resp(&[b"EXEC"]));
    let trips = run_split_everywhere(
        Protocol::Redis,
        &[
            (Client, write),
            (
                Server,
                b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:1\r\n:1\r\n".to_vec(),
            ),
        ],
    );
    assert_eq!(trips.len(), 4);
    assert!(!cmd(&trips[0].request).queued);
    assert!(cmd(&trips[1].request).queued);
    assert_eq!(redis_reply(&trips[1]), &RedisReply::Status("QUEUED".into()));
    let exec = cmd(&trips[3].request);
    assert_eq!(exec.name, "EXEC");
    assert!(!exec.queued);
    assert_eq!(exec.keys, ["unacked", "unacked_index"]);
    assert_eq!(
        redis_reply(&trips[3]),
        &RedisReply::Array {
            len: 2,
            items: vec![RedisReply::Int(1), RedisReply::Int(1)]
        }
    );
}

#[test]
fn redis_scripts_and_functions_name_their_keys() {
    let mut write = resp(&[b"EVAL", b"return 1", b"2", b"k1", b"k2", b"arg"]);
    write.extend(resp(&[b"evalsha", b"abc", b"1", b"k3", b"a", b"b"]));
    write.extend(resp(&[b"FCALL", b"f", b"0", b"x"]));
    let trips = run_split_everywhere(
        Protocol::Redis,
        &[(Client, write), (Server, b":1\r\n:2\r\n:3\r\n".to_vec())],
    );
    assert_eq!(cmd(&trips[0].request).keys, ["k1", "k2"]);
    assert_eq!(cmd(&trips[1].request).name, "EVALSHA");
    assert_eq!(cmd(&trips[1].request).keys, ["k3"]);
    assert!(cmd(&trips[2].request).keys.is_empty());
}

#[test]
fn redis_inline_commands_are_split_like_redis_does() {
    let trips = run_split_everywhere(
        Protocol::Redis,
        &[
            (Client, b"PING\r\n\r\nset k \"a b\\n\"\r\n".to_vec()),
            (Server, b"+PONG\r\n+OK\r\n".to_vec()),
        ],
    );
    assert_eq!(trips.len(), 2, "the empty line is no command");
    assert_eq!(cmd(&trips[0].request).name, "PING");
    assert_eq!(cmd(&trips[1].request).name, "SET");
    assert_eq!(cmd(&trips[1].request).args, ["k", "a b\n"]);
    assert_eq!(cmd(&trips[1].request).keys, ["k"]);
}

#[test]
fn redis_resp3_after_hello_3_with_maps_sets_pushes_and_scalars() {
    let hello_reply = b"%2\r\n+server\r\n+redis\r\n+proto\r\n:3\r\n".to_vec();
    let mut write = resp(&[b"HELLO", b"3"]);
    write.extend(resp(&[b"HGETALL", b"h"]));
    write.extend(resp(&[b"SMEMBERS", b"s"]));
    write.extend(resp(&[b"ZSCORE", b"z", b"m"]));
    write.extend(resp(&[b"GET", b"missing"]));
    write.extend(resp(&[b"INFO"]));
    write.extend(resp(&[b"OBJECT", b"FREQ", b"big"]));
    let mut replies = hello_reply;
    replies.extend_from_slice(b"%1\r\n$1\r\nf\r\n$1\r\nv\r\n");
    // A pub/sub push in between answers nothing.
    replies.extend_from_slice(b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$1\r\nx\r\n");
    replies.extend_from_slice(b"~2\r\n$1\r\na\r\n$1\r\nb\r\n");
    replies.extend_from_slice(b",3.5\r\n");
    replies.extend_from_slice(b"_\r\n");
    replies.extend_from_slice(b"=8\r\ntxt:info\r\n");
    replies.extend_from_slice(b"(12345678901234567890\r\n");
    let trips = run_split_everywhere(Protocol::Redis, &[(Client, write), (Server, replies)]);
    assert_eq!(trips.len(), 7);
    assert!(matches!(
        redis_reply(&trips[0]),
        RedisReply::Map { len: 2, .. }
    ));
    assert_eq!(
        redis_reply(&trips[1]),
        &RedisReply::Map {
            len: 1,
            items: vec![(
                RedisReply::Bulk {
                    len: 1,
                    text: "f".into()
                },
                RedisReply::Bulk {
                    len: 1,
                    text: "v".into()
                }
            )]
        }
    );
    assert!(matches!(
        redis_reply(&trips[2]),
        RedisReply::Array { len: 2, .. }
    ));
    assert_eq!(redis_reply(&trips[3]), &RedisReply::Double("3.5".into()));
    assert_eq!(redis_reply(&trips[4]), &RedisReply::Nil);
    assert_eq!(
        redis_reply(&trips[5]),
        &RedisReply::Bulk {
            len: 4,
            text: "info".into()
        }
    );
    assert_eq!(
        redis_reply(&trips[6]),
        &RedisReply::BigNumber("12345678901234567890".into())
    );
}

#[test]
fn redis_resp2_nulls_and_errors() {
    let mut write = resp(&[b"GET", b"nope"]);
    write.extend(resp(&[b"BRPOP", b"q1", b"q2", b"1"]));
    write.extend(resp(&[b"WRONG"]));
    let trips = run_split_everywhere(
        Protocol::Redis,
        &[
            (Client, write),
            (
                Server,
                b"$-1\r\n*-1\r\n-ERR unknown command 'WRONG'\r\n".to_vec(),
            ),
        ],
    );
    assert_eq!(redis_reply(&trips[0]), &RedisReply::Nil);
    assert_eq!(cmd(&trips[1].request).keys, ["q1", "q2"]);
    assert_eq!(redis_reply(&trips[1]), &RedisReply::Nil);
    assert!(cmd(&trips[2].request).keys.is_empty());
    assert_eq!(
        redis_reply(&trips[2]),
        &RedisReply::Error("ERR unknown command 'WRONG'".into())
    );
}

#[test]
fn redis_pubsub_confirmations_answer_and_messages_do_not() {
    let mut write = resp(&[b"SUBSCRIBE", b"a", b"b"]);
    write.extend(resp(&[b"UNSUBSCRIBE"]));
    let mut replies = Vec::new();
    replies.extend_from_slice(b"*3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:1\r\n");
    replies.extend_from_slice(b"*3\r\n$9\r\nsubscribe\r\n$1\r\nb\r\n:2\r\n");
    replies.extend_from_slice(b"*3\r\n$7\r\nmessage\r\n$1\r\na\r\n$2\r\nhi\r\n");
    replies.extend_from_slice(b"*3\r\n$11\r\nunsubscribe\r\n$1\r\na\r\n:1\r\n");
    replies.extend_from_slice(b"*3\r\n$11\r\nunsubscribe\r\n$1\r\nb\r\n:0\r\n");
    let trips = run_split_everywhere(Protocol::Redis, &[(Client, write), (Server, replies)]);
    assert_eq!(trips.len(), 2);
    assert!(matches!(
        redis_reply(&trips[0]),
        RedisReply::Array { len: 3, .. }
    ));
    assert!(matches!(
        redis_reply(&trips[1]),
        RedisReply::Array { len: 3, .. }
    ));
}

#[test]
fn redis_large_values_are_summarised_without_being_buffered() {
    let big = vec![b'v'; 3 * 1024 * 1024];
    let write = resp(&[b"SET", b"cache:key", &big]);
    let mut framer = RedisFramer::default();
    let mut ev = Vec::new();
    let mut max_buffered = 0;
    for chunk in write.chunks(32 * 1024) {
        framer.client(chunk, &mut ev);
        max_buffered = max_buffered.max(framer.buffered());
    }
    assert!(
        max_buffered <= super::redis::BUFFER_CAP + 32 * 1024,
        "buffered {max_buffered}"
    );
    let ready: Vec<&Request> = ev
        .iter()
        .filter_map(|e| match e {
            Ev::Ready(r) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(ready.len(), 1, "one decision, made early: {ev:?}");
    assert_eq!(cmd(ready[0]).keys, ["cache:key"]);
    let done = ev.iter().find_map(|e| match e {
        Ev::Done(Some(r)) => Some(r),
        _ => None,
    });
    let done = cmd(done.expect("done with the full command"));
    assert_eq!(done.argc, 2);
    assert!(done.truncated);
    assert!(done.args[1].ends_with('…') && done.args[1].len() < 300);
    // A big reply too.
    let mut reply = format!("${}\r\n", big.len()).into_bytes();
    reply.extend_from_slice(&big);
    reply.extend_from_slice(b"\r\n");
    let mut ev = Vec::new();
    for chunk in reply.chunks(32 * 1024) {
        framer.server(chunk, &mut ev);
        assert!(framer.buffered() <= super::redis::BUFFER_CAP + 32 * 1024);
    }
    assert!(matches!(
        ev.as_slice(),
        [Ev::Reply(Reply::Redis(RedisReply::Bulk { len, .. }))] if *len == big.len()
    ));
}

#[test]
fn redis_garbage_makes_the_connection_opaque() {
    let (trips, opaque) = run(
        Protocol::Redis,
        &[
            (Client, resp(&[b"PING"])),
            (Server, b"+PONG\r\n".to_vec()),
            (Client, b"*1\r\n:12\r\n".to_vec()),
        ],
    );
    assert_eq!(trips.len(), 1);
    assert_eq!(opaque.len(), 1, "{opaque:?}");
}

#[test]
fn command_table_names_the_keys() {
    let keys = |line: &str| {
        let mut words: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        let name = String::from_utf8_lossy(words.remove(0)).to_string();
        command_keys(&name, &words)
            .into_iter()
            .map(|i| String::from_utf8_lossy(words[i]).to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        keys("XREADGROUP GROUP g c COUNT 1 STREAMS s1 s2 > >"),
        ["s1", "s2"]
    );
    assert_eq!(keys("XREAD BLOCK 0 STREAMS s 0"), ["s"]);
    assert_eq!(keys("BLMOVE a b LEFT RIGHT 0"), ["a", "b"]);
    assert_eq!(keys("MSET a 1 b 2"), ["a", "b"]);
    assert_eq!(keys("ZUNIONSTORE d 2 x y WEIGHTS 1 2"), ["d", "x", "y"]);
    assert_eq!(keys("XGROUP CREATE s g $ MKSTREAM"), ["s"]);
    assert_eq!(keys("XAUTOCLAIM s g c 100 0"), ["s"]);
    assert_eq!(keys("DEL a b c"), ["a", "b", "c"]);
    assert_eq!(keys("RENAME a b"), ["a", "b"]);
    assert_eq!(
        keys("EVALSHA sha 3 a b"),
        ["a", "b"],
        "numkeys past the end"
    );
    assert!(keys("SCAN 0 MATCH x*").is_empty());
    assert!(keys("KEYS inf:*").is_empty());
    assert!(keys("PUBLISH ch msg").is_empty());
}

// ---------------------------------------------------------------- PostgreSQL

fn pg(message: impl Message) -> Vec<u8> {
    let mut buf = BytesMut::new();
    message.encode(&mut buf).expect("encodes");
    buf.to_vec()
}

fn pgs(messages: Vec<Vec<u8>>) -> Vec<u8> {
    messages.concat()
}

use pgwire::messages::data::{DataRow, FieldDescription, RowDescription};
use pgwire::messages::extendedquery::{
    Bind, BindComplete, Describe, Execute, Flush, Parse, ParseComplete, Sync,
};
use pgwire::messages::response::{
    CommandComplete, ErrorResponse, ReadyForQuery, TransactionStatus,
};
use pgwire::messages::simplequery::Query;
use pgwire::messages::startup::{Authentication, ParameterStatus, Password, SslRequest, Startup};

fn startup_exchange() -> Vec<(Dir, Vec<u8>)> {
    let mut startup = Startup::new();
    startup.parameters.insert("user".into(), "racecert".into());
    startup.parameters.insert("database".into(), "jobs".into());
    vec![
        (Client, pg(SslRequest::new())),
        (Server, b"N".to_vec()),
        (Client, pg(startup)),
        (Server, pg(Authentication::MD5Password(vec![1, 2, 3, 4]))),
        (Client, pg(Password::new("md5abc".into()))),
        (
            Server,
            pgs(vec![
                pg(Authentication::Ok),
                pg(ParameterStatus::new("server_version".into(), "16".into())),
                pg(ReadyForQuery::new(TransactionStatus::Idle)),
            ]),
        ),
    ]
}

fn pg_reply(trip: &RoundTrip) -> &PgReply {
    match &trip.reply {
        Some(Reply::Postgres(reply)) => reply,
        other => panic!("not a postgres reply: {other:?}"),
    }
}

fn row(values: &[Option<&[u8]>]) -> Vec<u8> {
    let mut data = BytesMut::new();
    for v in values {
        match v {
            Some(v) => {
                data.extend_from_slice(&(v.len() as i32).to_be_bytes());
                data.extend_from_slice(v);
            }
            None => data.extend_from_slice(&(-1i32).to_be_bytes()),
        }
    }
    pg(DataRow::new(data, values.len() as i16))
}

#[test]
fn postgres_startup_with_ssl_declined_is_one_round_trip() {
    let trips = run_split_everywhere(Protocol::Postgres, &startup_exchange());
    assert_eq!(trips.len(), 1);
    match &trips[0].request {
        Request::Postgres(PgRequest::Startup(start)) => {
            assert_eq!(start.user.as_deref(), Some("racecert"));
            assert_eq!(start.database.as_deref(), Some("jobs"));
            assert!(start.encryption_requested);
        }
        other => panic!("{other:?}"),
    }
    let reply = pg_reply(&trips[0]);
    assert_eq!(reply.auth.as_deref(), Some("md5"));
    assert_eq!(reply.tx, Some(TxStatus::Idle));
}

#[test]
fn postgres_simple_query_with_several_statements() {
    let mut exchange = startup_exchange();
    exchange.push((
        Client,
        pg(Query::new(
            "BEGIN; UPDATE inference_jobs SET status = 'SUCCEEDED'\n  WHERE idempotency_key = 'k' ; COMMIT"
                .into(),
        )),
    ));
    exchange.push((
        Server,
        pgs(vec![
            pg(CommandComplete::new("BEGIN".into())),
            pg(CommandComplete::new("UPDATE 1".into())),
            pg(CommandComplete::new("COMMIT".into())),
            pg(ReadyForQuery::new(TransactionStatus::Idle)),
        ]),
    ));
    let trips = run_split_everywhere(Protocol::Postgres, &exchange);
    assert_eq!(trips.len(), 2);
    let statements = trips[1].request.statements();
    assert_eq!(
        statements
            .iter()
            .map(|s| s.verb.as_str())
            .collect::<Vec<_>>(),
        ["BEGIN", "UPDATE", "COMMIT"]
    );
    assert_eq!(statements[1].tables, ["inference_jobs"]);
    let reply = pg_reply(&trips[1]);
    assert_eq!(reply.tags, ["BEGIN", "UPDATE 1", "COMMIT"]);
    assert_eq!(reply.rows_affected, Some(1));
    assert_eq!(reply.tx, Some(TxStatus::Idle));
}

fn prepare_and_execute_twice() -> Vec<(Dir, Vec<u8>)> {
    let sql =
        "SELECT status, attempt FROM inference_jobs WHERE idempotency_key = $1 AND attempt > $2";
    let bind = |key: &str| {
        pg(Bind::new(
            None,
            Some("sqlx_s_1".into()),
            vec![1],
            vec![
                Some(Bytes::copy_from_slice(key.as_bytes())),
                Some(Bytes::copy_from_slice(&3i32.to_be_bytes())),
            ],
            vec![1],
        ))
    };
    let desc = pg(RowDescription::new(vec![
        // A statement's description has no formats yet (Bind chooses them): text.
        FieldDescription::new("status".into(), 0, 0, 25, -1, -1, 0),
        FieldDescription::new("attempt".into(), 0, 0, 23, 4, -1, 0),
    ]));
    let mut exchange = startup_exchange();
    // sqlx: Parse + Describe + Sync once, then Bind + Execute + Sync per run.
    exchange.push((
        Client,
        pgs(vec![
            pg(Parse::new(
                Some("sqlx_s_1".into()),
                sql.into(),
                vec![25, 23],
            )),
            pg(Describe::new(b'S', Some("sqlx_s_1".into()))),
            pg(Sync::new()),
        ]),
    ));
    exchange.push((
        Server,
        pgs(vec![
            pg(ParseComplete::new()),
            desc.clone(),
            pg(ReadyForQuery::new(TransactionStatus::Idle)),
        ]),
    ));
    for key in ["job-1", "job-2"] {
        exchange.push((
            Client,
            pgs(vec![bind(key), pg(Execute::new(None, 0)), pg(Sync::new())]),
        ));
        exchange.push((
            Server,
            pgs(vec![
                pg(BindComplete::new()),
                row(&[Some(b"IN_PROGRESS"), Some(&4i32.to_be_bytes())]),
                pg(CommandComplete::new("SELECT 1".into())),
                pg(ReadyForQuery::new(TransactionStatus::Transaction)),
            ]),
        ));
    }
    exchange
}

#[test]
fn postgres_a_named_statement_executed_later_carries_its_sql_and_params() {
    let trips = run_split_everywhere(Protocol::Postgres, &prepare_and_execute_twice());
    assert_eq!(trips.len(), 4);
    let prepare = &trips[1].request.statements()[0];
    assert!(!prepare.executed);
    assert_eq!(prepare.name.as_deref(), Some("sqlx_s_1"));
    assert_eq!(prepare.verb, "SELECT");
    for (trip, key) in trips[2..].iter().zip(["job-1", "job-2"]) {
        let st = &trip.request.statements()[0];
        assert!(st.executed);
        assert!(
            st.sql
                .starts_with("SELECT status, attempt FROM inference_jobs")
        );
        assert_eq!(st.tables, ["inference_jobs"]);
        assert_eq!(st.params, [Some(key.to_owned()), Some("3".to_owned())]);
        let reply = pg_reply(trip);
        assert_eq!(reply.tags, ["SELECT 1"]);
        assert_eq!(reply.rows, 1);
        assert_eq!(
            reply.first_row,
            [
                ("status".to_owned(), Some("IN_PROGRESS".to_owned())),
                ("attempt".to_owned(), Some("4".to_owned()))
            ]
        );
        assert_eq!(reply.tx, Some(TxStatus::Transaction));
    }
    assert_eq!(
        trips[2].request.fingerprint(None),
        trips[3].request.fingerprint(None),
        "values are not in the fingerprint"
    );
}

#[test]
fn sql_statements_name_their_verb_and_tables() {
    let one = |sql: &str| super::postgres::analyze_for_tests(sql);
    assert_eq!(
        one(
            "WITH c AS (SELECT * FROM inference_jobs) UPDATE inference_jobs SET attempt = 1 FROM c WHERE c.id = inference_jobs.id"
        ),
        ("WITH".to_owned(), vec!["inference_jobs".to_owned()])
    );
    assert_eq!(
        one("insert into audit (a) select a from inference_jobs"),
        (
            "INSERT".to_owned(),
            vec!["audit".to_owned(), "inference_jobs".to_owned()]
        )
    );
    assert_eq!(
        one("DROP TABLE IF EXISTS t1"),
        ("DROP".to_owned(), vec!["t1".to_owned()])
    );
    assert_eq!(
        one("DELETE FROM public.jobs WHERE id = $1"),
        ("DELETE".to_owned(), vec!["public.jobs".to_owned()])
    );
    assert_eq!(
        one("not sql at all ((("),
        ("NOT".to_owned(), Vec::<String>::new())
    );
}

#[test]
fn postgres_errors_carry_sqlstate_and_the_failed_transaction() {
    let mut exchange = startup_exchange();
    exchange.push((
        Client,
        pgs(vec![
            pg(Parse::new(
                None,
                "INSERT INTO t (k) VALUES ($1)".into(),
                vec![],
            )),
            pg(Bind::new(
                None,
                None,
                vec![],
                vec![Some(Bytes::from_static(b"dup"))],
                vec![],
            )),
            pg(Execute::new(None, 0)),
            pg(Sync::new()),
        ]),
    ));
    exchange.push((
        Server,
        pgs(vec![
            pg(ParseComplete::new()),
            pg(BindComplete::new()),
            pg(ErrorResponse::new(vec![
                (b'S', "ERROR".into()),
                (b'C', "23505".into()),
                (b'M', "duplicate key value".into()),
            ])),
            pg(ReadyForQuery::new(TransactionStatus::Error)),
        ]),
    ));
    let trips = run_split_everywhere(Protocol::Postgres, &exchange);
    let st = &trips[1].request.statements()[0];
    assert_eq!(st.verb, "INSERT");
    assert_eq!(st.tables, ["t"]);
    assert_eq!(st.params, [Some("dup".to_owned())]);
    let reply = pg_reply(&trips[1]);
    assert_eq!(
        reply.error,
        Some(PgError {
            code: "23505".into(),
            message: "duplicate key value".into()
        })
    );
    assert_eq!(reply.tx, Some(TxStatus::Failed));
}

#[test]
fn postgres_ssl_accepted_makes_the_connection_opaque() {
    let (trips, opaque) = run(
        Protocol::Postgres,
        &[
            (Client, pg(SslRequest::new())),
            (Server, b"S".to_vec()),
            (Client, b"\x16\x03\x01 tls garbage".to_vec()),
        ],
    );
    assert_eq!(opaque.len(), 1);
    assert!(trips.len() <= 1, "nothing after the handshake: {trips:?}");
}

// ---------------------------------------------------------------- HTTP

#[test]
fn http_keep_alive_with_length_and_chunked_bodies() {
    let body = br#"{"input":"hello","model_version":"v1"}"#;
    let req = |id: u8| {
        let mut r = format!(
            "POST /v1/infer HTTP/1.1\r\nhost: backend\r\nauthorization: Bearer s3cret\r\ncontent-type: application/json\r\nx-id: {id}\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        r.extend_from_slice(body);
        r
    };
    let resp1 = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 13\r\n\r\n{\"output\":1}\n".to_vec();
    let resp2 = b"HTTP/1.1 503 Service Unavailable\r\ntransfer-encoding: chunked\r\n\r\n5\r\nbusy \r\n3\r\nnow\r\n0\r\n\r\n".to_vec();
    let trips = run_split_everywhere(
        Protocol::Http,
        &[
            (Client, req(1)),
            (Server, resp1),
            (Client, req(2)),
            (Server, resp2),
        ],
    );
    assert_eq!(trips.len(), 2);
    let Request::Http(first) = &trips[0].request else {
        panic!("http")
    };
    assert_eq!(first.method, "POST");
    assert_eq!(first.path, "/v1/infer");
    assert_eq!(first.body, String::from_utf8_lossy(body));
    assert!(first.headers.iter().all(|(k, _)| k != "authorization"));
    let Some(Reply::Http(second)) = &trips[1].reply else {
        panic!("http reply")
    };
    assert_eq!(second.status, 503);
    assert_eq!(second.body, "busy now");
    assert_eq!(second.body_len, 8);
}

#[test]
fn http_a_response_until_close_ends_with_the_connection() {
    let (trips, opaque) = run(
        Protocol::Http,
        &[
            (Client, b"GET /health HTTP/1.1\r\n\r\n".to_vec()),
            (Server, b"HTTP/1.1 200 OK\r\n\r\nall good".to_vec()),
        ],
    );
    assert!(opaque.is_empty());
    let Some(Reply::Http(reply)) = &trips[0].reply else {
        panic!("a reply at close: {trips:?}")
    };
    assert_eq!(reply.body, "all good");
}

// ---------------------------------------------------------------- holds

/// Records what it is asked; holds every write until its release is sent.
#[derive(Default)]
struct Gate {
    asked: Mutex<Vec<Vec<Request>>>,
    releases: Mutex<Vec<oneshot::Sender<()>>>,
}

impl Holder for Gate {
    fn before(
        &self,
        _link: &str,
        _conn: u64,
        _first: u64,
        requests: &[Request],
    ) -> Option<futures::future::BoxFuture<'static, Release>> {
        self.asked.lock().unwrap().push(requests.to_vec());
        let (tx, rx) = oneshot::channel();
        self.releases.lock().unwrap().push(tx);
        Some(rx.map(|_| Release::Forward).boxed())
    }
}

#[test]
fn a_hold_starts_at_the_first_new_request_of_a_write() {
    let gate = Arc::new(Gate::default());
    let (conn, collect) = open(Protocol::Redis, Some(gate.clone()));
    let first = resp(&[b"GET", b"a"]);
    let second = resp(&[b"SET", b"b", b"1"]);
    // The first write ends 3 bytes into the first command.
    let hold = conn.to_server(&Bytes::copy_from_slice(&first[..3]));
    let mut hold = hold.expect("a write starting a request is held");
    assert_eq!(hold.at, 0);
    assert!(
        gate.asked.lock().unwrap().is_empty(),
        "not asked before complete"
    );
    // The second write ends the first command and starts the second: asked about both.
    let mut rest = first[3..].to_vec();
    rest.extend_from_slice(&second);
    let hold2 = conn.to_server(&Bytes::from(rest)).expect("held");
    assert_eq!(
        hold2.at,
        first.len() - 3,
        "at the second command's first byte"
    );
    assert_eq!(gate.asked.lock().unwrap().len(), 2);
    assert_eq!(cmd(&gate.asked.lock().unwrap()[0][0]).name, "GET");
    assert_eq!(cmd(&gate.asked.lock().unwrap()[1][0]).name, "SET");
    assert!((&mut hold.until).now_or_never().is_none(), "still held");
    let release = gate.releases.lock().unwrap().remove(0);
    release.send(()).unwrap();
    assert!((&mut hold.until).now_or_never().is_some(), "released");
    conn.to_client(&Bytes::from_static(b"$-1\r\n"));
    let trips = collect.trips.lock().unwrap().clone();
    assert_eq!(trips.len(), 1);
    assert!(trips[0].forwarded_us.is_some());
}

#[test]
fn postgres_holds_decide_at_sync_or_flush_not_before() {
    let gate = Arc::new(Gate::default());
    let (conn, _collect) = open(Protocol::Postgres, Some(gate.clone()));
    // Startup passes through the holder too (it decides); release it.
    for (dir, bytes) in startup_exchange() {
        let bytes = Bytes::from(bytes);
        match dir {
            Client => {
                if let Some(hold) = conn.to_server(&bytes) {
                    if let Some(release) = gate.releases.lock().unwrap().pop() {
                        release.send(()).unwrap();
                    }
                    assert!(hold.until.now_or_never().is_some());
                }
            }
            Server => conn.to_client(&bytes),
        }
    }
    let asked = gate.asked.lock().unwrap().len();
    let parse = pg(Parse::new(None, "UPDATE t SET a = 1".into(), vec![]));
    let hold = conn.to_server(&Bytes::from(parse)).expect("held");
    assert_eq!(hold.at, 0);
    assert_eq!(
        gate.asked.lock().unwrap().len(),
        asked,
        "no decision before Sync/Flush"
    );
    let rest = pgs(vec![
        pg(Bind::new(None, None, vec![], vec![], vec![])),
        pg(Execute::new(None, 0)),
        pg(Flush::new()),
    ]);
    assert!(
        conn.to_server(&Bytes::from(rest)).is_none(),
        "continues the held request"
    );
    let asked_now = gate.asked.lock().unwrap();
    assert_eq!(asked_now.len(), asked + 1);
    assert_eq!(asked_now[asked][0].statements()[0].verb, "UPDATE");
}

// ---------------------------------------------------------------- fuzz

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn chunks(bytes: Vec<u8>, cuts: Vec<usize>) -> Vec<Vec<u8>> {
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (bytes.len() + 1)).collect();
        cuts.sort_unstable();
        let mut out = Vec::new();
        let mut last = 0;
        for c in cuts {
            out.push(bytes[last..c].to_vec());
            last = c;
        }
        out.push(bytes[last..].to_vec());
        out
    }

    fn feed_garbage(protocol: Protocol, client: Vec<Vec<u8>>, server: Vec<Vec<u8>>) {
        let (conn, _) = open(protocol, None);
        let mut server = server.into_iter();
        for c in client {
            let _ = conn.to_server(&Bytes::from(c));
            if let Some(s) = server.next() {
                conn.to_client(&Bytes::from(s));
            }
        }
        for s in server {
            conn.to_client(&Bytes::from(s));
        }
        conn.closed();
    }

    /// Bytes that look like the protocol: fragments of valid frames glued with noise.
    fn protocolish(alphabet: &'static [&'static [u8]]) -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(
            prop_oneof![
                prop::sample::select(alphabet).prop_map(|s| s.to_vec()),
                prop::collection::vec(any::<u8>(), 0..8),
            ],
            0..40,
        )
        .prop_map(|parts| parts.concat())
    }

    const RESP_BITS: &[&[u8]] = &[
        b"*",
        b"$",
        b"%",
        b"~",
        b">",
        b"|",
        b"+OK",
        b"-ERR",
        b":",
        b"_",
        b",",
        b"#t",
        b"(",
        b"=",
        b"\r\n",
        b"1",
        b"2",
        b"3",
        b"-1",
        b"10",
        b"txt:",
        b"SET",
        b"HELLO",
        b"3",
        b"MULTI",
        b"EXEC",
        b"SUBSCRIBE",
        b"message",
    ];

    proptest! {
        #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

        #[test]
        fn redis_garbage_never_panics(
            client in protocolish(RESP_BITS),
            server in protocolish(RESP_BITS),
            cuts_c in prop::collection::vec(any::<usize>(), 0..6),
            cuts_s in prop::collection::vec(any::<usize>(), 0..6),
        ) {
            feed_garbage(Protocol::Redis, chunks(client, cuts_c), chunks(server, cuts_s));
        }

        #[test]
        fn postgres_garbage_never_panics(
            client in prop::collection::vec(any::<u8>(), 0..300),
            server in prop::collection::vec(any::<u8>(), 0..300),
            cuts_c in prop::collection::vec(any::<usize>(), 0..6),
            cuts_s in prop::collection::vec(any::<usize>(), 0..6),
        ) {
            // Past a valid startup, so the typed-message paths see the garbage.
            let (conn, _) = open(Protocol::Postgres, None);
            for (dir, bytes) in startup_exchange() {
                match dir {
                    Client => { let _ = conn.to_server(&Bytes::from(bytes)); }
                    Server => conn.to_client(&Bytes::from(bytes)),
                }
            }
            for c in chunks(client, cuts_c) {
                let _ = conn.to_server(&Bytes::from(c));
            }
            for s in chunks(server, cuts_s) {
                conn.to_client(&Bytes::from(s));
            }
            conn.closed();
        }

        #[test]
        fn postgres_mutated_messages_never_panic(
            seed in 0usize..1000,
            flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..6),
        ) {
            // Valid messages with a few bytes changed: lengths and counts that lie.
            let mut exchange = prepare_and_execute_twice();
            let n = exchange.len();
            let target = &mut exchange[seed % n].1;
            for (at, byte) in flips {
                let len = target.len();
                target[at % len] = byte;
            }
            let _ = run(Protocol::Postgres, &exchange);
        }

        #[test]
        fn http_garbage_never_panics(
            client in protocolish(&[b"GET / HTTP/1.1\r\n", b"content-length: 5\r\n", b"transfer-encoding: chunked\r\n", b"\r\n", b"5\r\n", b"0\r\n", b"zz"]),
            server in protocolish(&[b"HTTP/1.1 200 OK\r\n", b"HTTP/1.1 100 Continue\r\n", b"content-length: 3\r\n", b"transfer-encoding: chunked\r\n", b"\r\n", b"3\r\n", b"0\r\n"]),
            cuts_c in prop::collection::vec(any::<usize>(), 0..6),
            cuts_s in prop::collection::vec(any::<usize>(), 0..6),
        ) {
            feed_garbage(Protocol::Http, chunks(client, cuts_c), chunks(server, cuts_s));
        }

        #[test]
        fn the_walker_agrees_with_the_crate(value in resp_value(3), resp3 in any::<bool>(), cut in any::<usize>()) {
            let wire = encode(&value, resp3);
            let from_crate = super::super::redis::decode_for_tests(&wire, resp3)
                .expect("valid RESP decodes");
            let mut walker = Walker::new(resp3, super::redis::REPLY_KEEP);
            let cut = cut % (wire.len() + 1);
            let (n1, first) = walker.feed(&wire[..cut]).expect("walks");
            let walked = match first {
                Some(v) => { prop_assert_eq!(n1, wire.len()); v }
                None => {
                    let (n2, second) = walker.feed(&wire[cut..]).expect("walks");
                    prop_assert_eq!(cut + n2, wire.len());
                    second.expect("complete")
                }
            };
            prop_assert_eq!(walked, from_crate);
        }
    }

    /// A RESP value to encode (both protocols where they agree; RESP3 types only in RESP3).
    #[derive(Debug, Clone)]
    enum V {
        Simple(String),
        Error(String),
        Int(i64),
        Bulk(Vec<u8>),
        Null,
        Array(Vec<V>),
        Map(Vec<(V, V)>),
        Set(Vec<V>),
        Push(Vec<V>),
        Double(f64),
        Bool(bool),
    }

    fn blob() -> impl Strategy<Value = V> {
        prop::collection::vec(any::<u8>(), 0..20).prop_map(V::Bulk)
    }

    fn resp_value(depth: u32) -> impl Strategy<Value = V> {
        let leaf = prop_oneof![
            "[a-zA-Z ]{0,12}".prop_map(V::Simple),
            "[a-zA-Z ]{0,12}".prop_map(V::Error),
            any::<i64>().prop_map(V::Int),
            prop::collection::vec(any::<u8>(), 0..600).prop_map(V::Bulk),
            Just(V::Null),
            (-1e9f64..1e9).prop_map(V::Double),
            any::<bool>().prop_map(V::Bool),
        ];
        leaf.prop_recursive(depth, 64, 12, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..12).prop_map(V::Array),
                // Keys and members are strings, as Redis sends (the crate dedups equal scalars).
                prop::collection::vec((blob(), inner.clone()), 0..5).prop_map(V::Map),
                prop::collection::vec(blob(), 0..5).prop_map(V::Set),
                prop::collection::vec(inner, 1..5).prop_map(V::Push),
            ]
        })
    }

    fn encode(v: &V, resp3: bool) -> Vec<u8> {
        let mut out = Vec::new();
        enc(v, resp3, &mut out);
        out
    }

    fn enc(v: &V, r3: bool, out: &mut Vec<u8>) {
        match v {
            V::Simple(s) => out.extend(format!("+{s}\r\n").bytes()),
            V::Error(s) => out.extend(format!("-{s}\r\n").bytes()),
            V::Int(i) => out.extend(format!(":{i}\r\n").bytes()),
            V::Bulk(b) => {
                out.extend(format!("${}\r\n", b.len()).bytes());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            V::Null if r3 => out.extend_from_slice(b"_\r\n"),
            V::Null => out.extend_from_slice(b"$-1\r\n"),
            V::Double(d) if r3 => out.extend(format!(",{d}\r\n").bytes()),
            V::Bool(b) if r3 => out.extend(format!("#{}\r\n", if *b { 't' } else { 'f' }).bytes()),
            V::Double(d) => out.extend(format!("+{d}\r\n").bytes()),
            V::Bool(b) => out.extend(format!(":{}\r\n", i64::from(*b)).bytes()),
            V::Array(items) => {
                out.extend(format!("*{}\r\n", items.len()).bytes());
                items.iter().for_each(|i| enc(i, r3, out));
            }
            V::Set(items) | V::Push(items) if r3 => {
                let t = if matches!(v, V::Set(_)) { '~' } else { '>' };
                // Set members must differ for the crate (it dedups equal frames).
                out.extend(format!("{t}{}\r\n", items.len()).bytes());
                items.iter().for_each(|i| enc(i, r3, out));
            }
            V::Set(items) | V::Push(items) => enc(&V::Array(items.clone()), r3, out),
            V::Map(pairs) if r3 => {
                out.extend(format!("%{}\r\n", pairs.len()).bytes());
                for (k, v) in pairs {
                    enc(k, r3, out);
                    enc(v, r3, out);
                }
            }
            V::Map(pairs) => {
                let flat: Vec<V> = pairs
                    .iter()
                    .flat_map(|(k, v)| [k.clone(), v.clone()])
                    .collect();
                enc(&V::Array(flat), r3, out)
            }
        }
    }
}

#[test]
fn round_trips_survive_json() {
    let mut exchange = prepare_and_execute_twice();
    let (mut trips, _) = run(Protocol::Postgres, &exchange.split_off(0));
    let mut redis = resp(&[b"HELLO", b"3"]);
    redis.extend(resp(&[b"GET", b"k"]));
    let (more, _) = run(
        Protocol::Redis,
        &[
            (Client, redis),
            (Server, b"%1\r\n+proto\r\n:3\r\n$1\r\nv\r\n".to_vec()),
        ],
    );
    trips.extend(more);
    let (more, _) = run(
        Protocol::Http,
        &[
            (
                Client,
                b"GET /x HTTP/1.1\r\ncontent-length: 0\r\n\r\n".to_vec(),
            ),
            (Server, b"HTTP/1.1 204 No Content\r\n\r\n".to_vec()),
        ],
    );
    trips.extend(more);
    assert_eq!(trips.len(), 7);
    for trip in trips {
        let json = serde_json::to_string(&trip).expect("serializes");
        let value: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
        assert!(value.is_object());
        let back: RoundTrip = serde_json::from_str(&json).expect("deserializes");
        assert_eq!(back, trip, "{json}");
    }
}

/// Framing throughput on a realistic mix, printed (not asserted): run with
/// `cargo test --release --lib wire::tests::framing_throughput -- --ignored --nocapture`.
#[test]
#[ignore = "prints a measurement; run on demand"]
fn framing_throughput() {
    let cache_value = vec![b'x'; 2048];
    let (redis_client, redis_server) = redis_mix(&cache_value);
    let (pg_client, pg_server) = postgres_mix(&cache_value);
    let (http_client, http_server) = http_mix();
    measure_framing(Protocol::Redis, Vec::new(), &redis_client, &redis_server);
    measure_framing(
        Protocol::Postgres,
        postgres_prelude(),
        &pg_client,
        &pg_server,
    );
    measure_framing(Protocol::Http, Vec::new(), &http_client, &http_server);
}

/// A worker's Redis traffic (client bytes, server bytes) for [`framing_throughput`].
fn redis_mix(cache_value: &[u8]) -> (Vec<u8>, Vec<u8>) {
    // Redis: a worker's lease, cache lookups and writes, a queue read, in pipelines.
    let mut redis_client = Vec::new();
    let mut redis_server = Vec::new();
    redis_client.extend(resp(&[
        b"SET",
        b"inference:lock:job-42",
        b"0b7a9c",
        b"NX",
        b"PX",
        b"30000",
    ]));
    redis_server.extend_from_slice(b"+OK\r\n");
    redis_client.extend(resp(&[
        b"GET",
        b"inf:v2:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    ]));
    redis_server.extend(format!("${}\r\n", cache_value.len()).bytes());
    redis_server.extend_from_slice(cache_value);
    redis_server.extend_from_slice(b"\r\n");
    redis_client.extend(resp(&[
        b"SET",
        b"inf:v2:9f86d08188",
        cache_value,
        b"EX",
        b"600",
    ]));
    redis_server.extend_from_slice(b"+OK\r\n");
    redis_client.extend(resp(&[
        b"XREADGROUP",
        b"GROUP",
        b"workers",
        b"w0",
        b"COUNT",
        b"1",
        b"BLOCK",
        b"100",
        b"STREAMS",
        b"jobs",
        b">",
    ]));
    redis_server.extend_from_slice(b"*1\r\n*2\r\n$4\r\njobs\r\n*1\r\n*2\r\n$15\r\n1700000000000-0\r\n*4\r\n$3\r\nkey\r\n$6\r\njob-42\r\n$5\r\ninput\r\n$11\r\nhello world\r\n");
    redis_client.extend(resp(&[
        b"EVALSHA",
        b"e0e1f9fabfc9d4800c877a703b823ac0578ff8db",
        b"1",
        b"inference:lock:job-42",
        b"0b7a9c",
    ]));
    redis_server.extend_from_slice(b":1\r\n");
    (redis_client, redis_server)
}

/// A worker's PostgreSQL traffic (client bytes, server bytes) for [`framing_throughput`].
fn postgres_mix(cache_value: &[u8]) -> (Vec<u8>, Vec<u8>) {
    // PostgreSQL: a claim and a fenced final write by name, with replies.
    let mut pg_client = Vec::new();
    let mut pg_server = Vec::new();
    for (stmt, sql) in [
        (
            "s1",
            "UPDATE inference_jobs SET status = 'IN_PROGRESS', lease_token = $2, attempt = attempt + 1 WHERE idempotency_key = $1 AND status = 'PENDING' RETURNING generation",
        ),
        (
            "s2",
            "UPDATE inference_jobs SET status = 'SUCCEEDED', output = $3 WHERE idempotency_key = $1 AND lease_token = $2",
        ),
    ] {
        pg_client.extend(pgs(vec![
            pg(Bind::new(
                None,
                Some(stmt.into()),
                vec![0],
                vec![
                    Some(Bytes::from_static(b"job-42")),
                    Some(Bytes::from_static(b"0b7a9c")),
                    Some(Bytes::copy_from_slice(&cache_value[..512])),
                ],
                vec![1],
            )),
            pg(Execute::new(None, 0)),
            pg(Sync::new()),
        ]));
        pg_server.extend(pgs(vec![
            pg(BindComplete::new()),
            row(&[Some(&7i64.to_be_bytes())]),
            pg(CommandComplete::new("UPDATE 1".into())),
            pg(ReadyForQuery::new(TransactionStatus::Idle)),
        ]));
        let _ = sql;
    }
    (pg_client, pg_server)
}

/// The startup and the statements prepared before [`postgres_mix`].
fn postgres_prelude() -> Vec<(Dir, Vec<u8>)> {
    let mut prelude = startup_exchange();
    prelude.push((
        Client,
        pgs(vec![
            pg(Parse::new(Some("s1".into()), "UPDATE inference_jobs SET status = 'IN_PROGRESS', lease_token = $2 WHERE idempotency_key = $1 RETURNING generation".into(), vec![25, 25, 25])),
            pg(Parse::new(Some("s2".into()), "UPDATE inference_jobs SET status = 'SUCCEEDED', output = $3 WHERE idempotency_key = $1 AND lease_token = $2 RETURNING generation".into(), vec![25, 25, 25])),
            pg(Describe::new(b'S', Some("s1".into()))),
            pg(Describe::new(b'S', Some("s2".into()))),
            pg(Sync::new()),
        ]),
    ));
    prelude.push((
        Server,
        pgs(vec![
            pg(ParseComplete::new()),
            pg(ParseComplete::new()),
            pg(RowDescription::new(vec![FieldDescription::new(
                "generation".into(),
                0,
                0,
                20,
                8,
                -1,
                0,
            )])),
            pg(RowDescription::new(vec![FieldDescription::new(
                "generation".into(),
                0,
                0,
                20,
                8,
                -1,
                0,
            )])),
            pg(ReadyForQuery::new(TransactionStatus::Idle)),
        ]),
    ));
    prelude
}

/// A worker's HTTP traffic (client bytes, server bytes) for [`framing_throughput`].
fn http_mix() -> (Vec<u8>, Vec<u8>) {
    // HTTP: a model call.
    let body = br#"{"input":"hello world","model_version":"v2","max_tokens":64}"#;
    let mut http_client = format!("POST /v1/infer HTTP/1.1\r\nhost: model-b\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len()).into_bytes();
    http_client.extend_from_slice(body);
    let answer = br#"{"output":"v2:hello world","model_version":"v2"}"#;
    let mut http_server = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        answer.len()
    )
    .into_bytes();
    http_server.extend_from_slice(answer);
    (http_client, http_server)
}

/// Frames `client` and `server` after `prelude` on one connection for 16 MB, and prints the rate.
fn measure_framing(protocol: Protocol, prelude: Vec<(Dir, Vec<u8>)>, client: &[u8], server: &[u8]) {
    let (conn, collect) = open(protocol, None);
    for (dir, bytes) in prelude {
        match dir {
            Client => {
                let _ = conn.to_server(&Bytes::from(bytes));
            }
            Server => conn.to_client(&Bytes::from(bytes)),
        }
    }
    let rounds = (16 * 1024 * 1024) / (client.len() + server.len()) + 1;
    let (client, server) = (
        Bytes::copy_from_slice(client),
        Bytes::copy_from_slice(server),
    );
    let started = std::time::Instant::now();
    for _ in 0..rounds {
        assert!(conn.to_server(&client).is_none());
        conn.to_client(&server);
    }
    let elapsed = started.elapsed();
    let bytes = rounds * (client.len() + server.len());
    let trips = collect.trips.lock().unwrap().len();
    assert!(collect.opaque.lock().unwrap().is_empty());
    println!(
        "{protocol}: {:.1} MB/s, {:.0} round trips/s ({} MB, {trips} round trips in {elapsed:.2?})",
        bytes as f64 / elapsed.as_secs_f64() / 1e6,
        trips as f64 / elapsed.as_secs_f64(),
        bytes / 1_000_000,
    );
}
