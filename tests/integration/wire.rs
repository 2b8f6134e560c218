//! The wire witness against the real services: a proxy-engine run with a `WireTap` in front of
//! the bed's Redis and PostgreSQL, driven by the clients racecert uses (redis-rs with a
//! ConnectionManager, sqlx's PgPool), records what they really sent and got; a holder delays a
//! write until released.

use futures::FutureExt;
use futures::future::BoxFuture;
use noxious::proxy::{ProxyConfig, ProxyRunner, Runner, Toxics};
use noxious::signal::{Close, Stop, Stopper};
use noxious::socket::TcpListener as EngineListener;
use racecert::env::TestBed;
use racecert::wire::{
    Holder, PgRequest, Protocol, RedisReply, Release, Reply, Request, RoundTrip, TxStatus, WireTap,
};
use reqwest::Url;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, oneshot};

crate::tests!(
    redis_commands_pipelines_transactions_and_scripts_are_recorded,
    redis_resp3_replies_are_recorded_after_hello_3,
    postgres_startup_simple_extended_and_transactions_are_recorded,
    a_held_set_is_invisible_to_others_until_released,
    an_aborted_held_set_never_reaches_redis,
);

/// A bound on waiting for events that must come; reaching it fails the test.
const DEADLINE: Duration = Duration::from_secs(20);

/// Round trips as the sink receives them, with a wake-up per arrival.
#[derive(Default)]
struct Recorded {
    trips: Mutex<Vec<RoundTrip>>,
    arrived: Notify,
}

impl Recorded {
    /// Waits until `pick` finds what it looks for in the round trips so far.
    async fn until<T>(
        &self,
        what: &str,
        pick: impl Fn(&[RoundTrip]) -> Option<T>,
    ) -> anyhow::Result<T> {
        let wait = async {
            loop {
                let notified = self.arrived.notified();
                if let Some(found) = pick(&self.trips.lock().unwrap()) {
                    return found;
                }
                notified.await;
            }
        };
        match tokio::time::timeout(DEADLINE, wait).await {
            Ok(found) => Ok(found),
            Err(_) => anyhow::bail!(
                "no {what} on the wire; recorded: {:#?}",
                self.trips.lock().unwrap()
            ),
        }
    }
}

/// An engine proxy run with a wire tap, stopped on drop.
struct Tapped {
    listen: SocketAddr,
    recorded: Arc<Recorded>,
    stopper: Option<Stopper>,
    closed: Option<Close>,
}

impl Tapped {
    async fn start(
        link: &str,
        upstream_url: &str,
        protocol: Protocol,
        holder: Option<Arc<dyn Holder>>,
    ) -> anyhow::Result<Tapped> {
        let url = Url::parse(upstream_url)?;
        let upstream = format!(
            "{}:{}",
            url.host_str().unwrap_or("127.0.0.1"),
            url.port().unwrap_or_default()
        );
        let recorded = Arc::new(Recorded::default());
        let sink = recorded.clone();
        let mut tap = WireTap::builder(link, protocol).sink(move |trip: RoundTrip| {
            sink.trips.lock().unwrap().push(trip);
            sink.arrived.notify_waiters();
        });
        if let Some(holder) = holder {
            tap = tap.holder(holder);
        }
        let config = ProxyConfig {
            name: link.to_owned(),
            listen: "127.0.0.1:0".to_owned(),
            upstream,
            enabled: true,
            rand_seed: None,
        };
        let (listener, info) =
            ProxyRunner::initialize_proxy::<EngineListener>(config, Toxics::empty()).await?;
        let listen = listener.local_addr()?;
        let (_events, receiver) = bmrng::channel(1);
        let (stop, stopper) = Stop::new();
        let (closed, closer) = Close::new();
        tokio::spawn(ProxyRunner::run_proxy_with_tap(
            listener,
            info,
            receiver,
            stop,
            closer,
            Some(tap.build()),
        ));
        Ok(Tapped {
            listen,
            recorded,
            stopper: Some(stopper),
            closed: Some(closed),
        })
    }

    /// `url` with its host and port replaced by this proxy's.
    fn url(&self, url: &str) -> anyhow::Result<String> {
        let mut out = Url::parse(url)?;
        let _ = out.set_host(Some(&self.listen.ip().to_string()));
        let _ = out.set_port(Some(self.listen.port()));
        Ok(out.to_string())
    }

    async fn stop(mut self) {
        if let (Some(stopper), Some(closed)) = (self.stopper.take(), self.closed.take()) {
            stopper.stop();
            let _ = tokio::time::timeout(DEADLINE, closed.recv()).await;
        }
    }
}

impl Drop for Tapped {
    fn drop(&mut self) {
        if let Some(stopper) = self.stopper.take() {
            stopper.stop();
        }
    }
}

fn redis_cmd(trip: &RoundTrip) -> Option<&racecert::wire::RedisCommand> {
    match &trip.request {
        Request::Redis(cmd) => Some(cmd),
        _ => None,
    }
}

fn redis_reply(trip: &RoundTrip) -> Option<&RedisReply> {
    match &trip.reply {
        Some(Reply::Redis(reply)) => Some(reply),
        _ => None,
    }
}

/// The first round trip of `name` touching `key`.
fn find<'a>(trips: &'a [RoundTrip], name: &str, key: &str) -> Option<&'a RoundTrip> {
    trips
        .iter()
        .find(|t| redis_cmd(t).is_some_and(|c| c.name == name && c.keys.iter().any(|k| k == key)))
}

async fn redis_commands_pipelines_transactions_and_scripts_are_recorded(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let ns = crate::namespace("wire-redis");
    let tapped = Tapped::start("redis-w0", &bed.redis_direct_url(), Protocol::Redis, None).await?;
    let client = redis::Client::open(tapped.url(&bed.redis_direct_url())?)?;
    let mut conn = redis::aio::ConnectionManager::new(client).await?;
    let lock = format!("{ns}:inference:lock:job-1");
    let (a, b) = (format!("{ns}:a"), format!("{ns}:b"));
    let (unacked, index) = (format!("{ns}:unacked"), format!("{ns}:unacked_index"));

    let won: Option<String> = redis::cmd("SET")
        .arg(&lock)
        .arg("token-1")
        .arg("NX")
        .arg("PX")
        .arg(5000)
        .query_async(&mut conn)
        .await?;
    anyhow::ensure!(won.is_some(), "the lease is free");
    let (_, n, got): ((), i64, String) = redis::pipe()
        .set(&a, "1")
        .incr(&b, 5)
        .get(&a)
        .query_async(&mut conn)
        .await?;
    anyhow::ensure!(n == 5 && got == "1");
    let (_, _): (i64, i64) = redis::pipe()
        .atomic()
        .hset(&unacked, "tag-1", "body")
        .zadd(&index, "tag-1", 12)
        .query_async(&mut conn)
        .await?;
    let script = redis::Script::new("return redis.call('GET', KEYS[1])");
    let via_script: String = script.key(&a).invoke_async(&mut conn).await?;
    anyhow::ensure!(via_script == "1");

    let recorded = &tapped.recorded;
    let set = recorded
        .until("the lease SET", |t| find(t, "SET", &lock).cloned())
        .await?;
    let cmd = redis_cmd(&set).expect("redis");
    anyhow::ensure!(
        cmd.args == [lock.as_str(), "token-1", "NX", "PX", "5000"],
        "{cmd:?}"
    );
    anyhow::ensure!(redis_reply(&set) == Some(&RedisReply::Status("OK".into())));
    anyhow::ensure!(set.answered_us >= set.forwarded_us && set.forwarded_us >= Some(set.sent_us));

    let incr = recorded
        .until("INCRBY", |t| find(t, "INCRBY", &b).cloned())
        .await?;
    anyhow::ensure!(redis_reply(&incr) == Some(&RedisReply::Int(5)), "{incr:?}");
    let get = recorded
        .until("GET", |t| find(t, "GET", &a).cloned())
        .await?;
    anyhow::ensure!(
        redis_reply(&get)
            == Some(&RedisReply::Bulk {
                len: 1,
                text: "1".into()
            }),
        "{get:?}"
    );
    anyhow::ensure!(
        incr.seq + 1 == get.seq,
        "a pipeline is one round trip per command"
    );

    let hset = recorded
        .until("HSET", |t| find(t, "HSET", &unacked).cloned())
        .await?;
    anyhow::ensure!(redis_cmd(&hset).is_some_and(|c| c.queued), "{hset:?}");
    anyhow::ensure!(redis_reply(&hset) == Some(&RedisReply::Status("QUEUED".into())));
    let exec = recorded
        .until("EXEC", |t| find(t, "EXEC", &index).cloned())
        .await?;
    anyhow::ensure!(
        redis_cmd(&exec).is_some_and(|c| c.keys == [unacked.clone(), index.clone()]),
        "{exec:?}"
    );
    anyhow::ensure!(
        matches!(redis_reply(&exec), Some(RedisReply::Array { len: 2, .. })),
        "{exec:?}"
    );
    // redis-rs runs a script by its hash, loading it when the server does not know it.
    let scripted = recorded
        .until("the script", |t| {
            t.iter()
                .filter(|t| {
                    redis_cmd(t).is_some_and(|c| {
                        matches!(c.name.as_str(), "EVALSHA" | "EVAL") && c.keys == [a.clone()]
                    })
                })
                .find(|t| matches!(redis_reply(t), Some(RedisReply::Bulk { .. })))
                .cloned()
        })
        .await?;
    anyhow::ensure!(
        redis_reply(&scripted)
            == Some(&RedisReply::Bulk {
                len: 1,
                text: "1".into()
            }),
        "{scripted:?}"
    );
    let fingerprint = set.request.fingerprint(Some(&ns));
    anyhow::ensure!(
        fingerprint.0 == "redis SET {ns}:inference:lock:job-1",
        "fingerprint {fingerprint}"
    );
    drop(conn);
    tapped.stop().await;
    Ok(())
}

async fn redis_resp3_replies_are_recorded_after_hello_3(bed: &TestBed) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let ns = crate::namespace("wire-resp3");
    let tapped = Tapped::start("redis-w1", &bed.redis_direct_url(), Protocol::Redis, None).await?;
    let url = format!("{}?protocol=resp3", tapped.url(&bed.redis_direct_url())?);
    let client = redis::Client::open(url)?;
    let mut conn = redis::aio::ConnectionManager::new(client).await?;
    let hash = format!("{ns}:h");
    let _: () = redis::cmd("HSET")
        .arg(&hash)
        .arg("f")
        .arg("v")
        .query_async(&mut conn)
        .await?;
    let all: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg(&hash)
        .query_async(&mut conn)
        .await?;
    anyhow::ensure!(all.get("f").map(String::as_str) == Some("v"));
    let recorded = &tapped.recorded;
    let hello = recorded
        .until("HELLO", |t| {
            t.iter()
                .find(|t| redis_cmd(t).is_some_and(|c| c.name == "HELLO"))
                .cloned()
        })
        .await?;
    anyhow::ensure!(
        matches!(redis_reply(&hello), Some(RedisReply::Map { .. })),
        "HELLO 3 answers a map: {hello:?}"
    );
    let hgetall = recorded
        .until("HGETALL", |t| find(t, "HGETALL", &hash).cloned())
        .await?;
    let expected = RedisReply::Map {
        len: 1,
        items: vec![(
            RedisReply::Bulk {
                len: 1,
                text: "f".into(),
            },
            RedisReply::Bulk {
                len: 1,
                text: "v".into(),
            },
        )],
    };
    anyhow::ensure!(redis_reply(&hgetall) == Some(&expected), "{hgetall:?}");
    drop(conn);
    tapped.stop().await;
    Ok(())
}

fn statements_matching<'a>(trips: &'a [RoundTrip], needle: &str) -> Vec<&'a RoundTrip> {
    trips
        .iter()
        .filter(|t| {
            t.request
                .statements()
                .iter()
                .any(|s| s.executed && s.sql.contains(needle))
        })
        .collect()
}

fn pg_reply(trip: &RoundTrip) -> &racecert::wire::PgReply {
    match &trip.reply {
        Some(Reply::Postgres(reply)) => reply,
        other => panic!("not a postgres reply: {other:?}"),
    }
}

async fn postgres_startup_simple_extended_and_transactions_are_recorded(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let table = crate::namespace("wire_pg").replace('-', "_");
    let tapped = Tapped::start(
        "postgres-w0",
        &bed.database_direct_url(),
        Protocol::Postgres,
        None,
    )
    .await?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&tapped.url(&bed.database_direct_url())?)
        .await?;
    run_postgres_session(&pool, &table).await?;
    pool.close().await;

    let recorded = &tapped.recorded;
    ensure_startup_recorded(recorded).await?;
    ensure_simple_query_recorded(recorded, &table).await?;
    ensure_extended_selects_recorded(recorded, &table).await?;
    ensure_transaction_recorded(recorded, &table).await?;
    tapped.stop().await;
    Ok(())
}

/// The client side of the postgres test: a simple-protocol round trip of several statements, one
/// extended-protocol statement twice, an UPDATE inside a transaction, and the table dropped.
async fn run_postgres_session(pool: &sqlx::PgPool, table: &str) -> anyhow::Result<()> {
    // Simple protocol (a plain string), several statements in one round trip.
    // The table name is the test's own namespace, not input.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {table} (k text PRIMARY KEY, n int4 NOT NULL); INSERT INTO {table} VALUES ('a', 1)"
    )))
    .execute(pool)
    .await?;
    // Extended protocol, the same statement twice: parsed once, executed by name.
    for _ in 0..2 {
        let n: i32 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT n FROM {table} WHERE k = $1"
        )))
        .bind("a")
        .fetch_one(pool)
        .await?;
        anyhow::ensure!(n == 1);
    }
    let mut tx = pool.begin().await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {table} SET n = n + $2 WHERE k = $1"
    )))
    .bind("a")
    .bind(41i32)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP TABLE {table}")))
        .execute(pool)
        .await?;
    Ok(())
}

/// The startup round trip: authenticated, idle after it.
async fn ensure_startup_recorded(recorded: &Recorded) -> anyhow::Result<()> {
    let startup = recorded
        .until("the startup", |t| {
            t.iter()
                .find(|t| matches!(t.request, Request::Postgres(PgRequest::Startup(_))))
                .cloned()
        })
        .await?;
    anyhow::ensure!(pg_reply(&startup).tx == Some(TxStatus::Idle), "{startup:?}");
    anyhow::ensure!(pg_reply(&startup).auth.is_some(), "{startup:?}");
    Ok(())
}

/// The simple query: both statements of the one round trip, the INSERT's table and row count.
async fn ensure_simple_query_recorded(recorded: &Recorded, table: &str) -> anyhow::Result<()> {
    let create = recorded
        .until("the simple query", |t| {
            statements_matching(t, "INSERT INTO")
                .first()
                .map(|t| (*t).clone())
        })
        .await?;
    let statements = create.request.statements();
    anyhow::ensure!(
        statements
            .iter()
            .map(|s| s.verb.as_str())
            .collect::<Vec<_>>()
            == ["CREATE", "INSERT"],
        "{create:?}"
    );
    anyhow::ensure!(statements[1].tables == [table.to_owned()], "{create:?}");
    anyhow::ensure!(pg_reply(&create).rows_affected == Some(1), "{create:?}");
    Ok(())
}

/// The two executions of the extended-protocol SELECT: table, parameter, reply, one fingerprint.
async fn ensure_extended_selects_recorded(recorded: &Recorded, table: &str) -> anyhow::Result<()> {
    let selects = recorded
        .until("two SELECT executions", |t| {
            let found = statements_matching(t, &format!("SELECT n FROM {table}"));
            (found.len() >= 2).then(|| found.into_iter().cloned().collect::<Vec<_>>())
        })
        .await?;
    for select in &selects {
        let st = select
            .request
            .statements()
            .iter()
            .find(|s| s.executed)
            .expect("executed");
        anyhow::ensure!(st.tables == [table.to_owned()], "{select:?}");
        anyhow::ensure!(st.params == [Some("a".to_owned())], "{select:?}");
        let reply = pg_reply(select);
        anyhow::ensure!(reply.tags == ["SELECT 1"], "{select:?}");
        anyhow::ensure!(
            reply.first_row == [("n".to_owned(), Some("1".to_owned()))],
            "{select:?}"
        );
    }
    anyhow::ensure!(
        selects[0].request.fingerprint(None) == selects[1].request.fingerprint(None),
        "one statement, one fingerprint"
    );
    Ok(())
}

/// The UPDATE inside the transaction (its parameters, reply and transaction status), then the
/// COMMIT back to idle.
async fn ensure_transaction_recorded(recorded: &Recorded, table: &str) -> anyhow::Result<()> {
    let update = recorded
        .until("the UPDATE", |t| {
            statements_matching(t, &format!("UPDATE {table}"))
                .first()
                .map(|t| (*t).clone())
        })
        .await?;
    let st = &update.request.statements()[0];
    anyhow::ensure!(
        st.verb == "UPDATE" && st.tables == [table.to_owned()],
        "{update:?}"
    );
    anyhow::ensure!(
        st.params == [Some("a".to_owned()), Some("41".to_owned())],
        "{update:?}"
    );
    let reply = pg_reply(&update);
    anyhow::ensure!(
        reply.tags == ["UPDATE 1"] && reply.rows_affected == Some(1),
        "{update:?}"
    );
    anyhow::ensure!(
        reply.tx == Some(TxStatus::Transaction),
        "inside BEGIN: {update:?}"
    );
    let commit = recorded
        .until("COMMIT", |t| {
            t.iter()
                .find(|t| t.request.statements().iter().any(|s| s.verb == "COMMIT"))
                .cloned()
        })
        .await?;
    anyhow::ensure!(pg_reply(&commit).tx == Some(TxStatus::Idle), "{commit:?}");
    Ok(())
}

/// Holds every write that starts a SET of `key` until released; reports when it holds.
struct HoldSets {
    key: String,
    held: Mutex<Option<oneshot::Sender<()>>>,
    release: Mutex<Option<oneshot::Receiver<Release>>>,
}

impl Holder for HoldSets {
    fn before(
        &self,
        _link: &str,
        _conn: u64,
        _first: u64,
        requests: &[Request],
    ) -> Option<BoxFuture<'static, Release>> {
        let is_set = requests.iter().any(|r| match r {
            Request::Redis(c) => c.name == "SET" && c.keys.contains(&self.key),
            _ => false,
        });
        if !is_set {
            return None;
        }
        let release = self.release.lock().unwrap().take()?;
        if let Some(held) = self.held.lock().unwrap().take() {
            let _ = held.send(());
        }
        Some(release.map(|r| r.unwrap_or(Release::Abort)).boxed())
    }
}

/// A SET of a fresh key sent through a tapped Redis proxy that holds it, once it is held.
struct HeldSet {
    key: String,
    tapped: Tapped,
    /// Ends the hold (once).
    release: Option<oneshot::Sender<Release>>,
    /// The SET's answer, as its client got it.
    setter: tokio::task::JoinHandle<redis::RedisResult<()>>,
    /// Straight to Redis.
    other: redis::aio::MultiplexedConnection,
}

impl HeldSet {
    async fn send(bed: &TestBed, name: &str) -> anyhow::Result<HeldSet> {
        let key = format!("{}:{name}", crate::namespace("wire-hold"));
        let (held_tx, held_rx) = oneshot::channel();
        let (release, release_rx) = oneshot::channel();
        let holder = Arc::new(HoldSets {
            key: key.clone(),
            held: Mutex::new(Some(held_tx)),
            release: Mutex::new(Some(release_rx)),
        });
        let tapped = Tapped::start(
            &format!("redis-{name}"),
            &bed.redis_direct_url(),
            Protocol::Redis,
            Some(holder),
        )
        .await?;
        let held_client = redis::Client::open(tapped.url(&bed.redis_direct_url())?)?;
        let mut held_conn = held_client.get_multiplexed_async_connection().await?;
        let other = redis::Client::open(bed.redis_direct_url())?;
        let other = other.get_multiplexed_async_connection().await?;
        let setter = {
            let key = key.clone();
            tokio::spawn(async move {
                redis::cmd("SET")
                    .arg(&key)
                    .arg("v")
                    .query_async::<()>(&mut held_conn)
                    .await
            })
        };
        tokio::time::timeout(DEADLINE, held_rx).await??;
        Ok(HeldSet {
            key,
            tapped,
            release: Some(release),
            setter,
            other,
        })
    }

    /// Ends the hold with `release`; the SET's answer.
    async fn end(&mut self, release: Release) -> anyhow::Result<redis::RedisResult<()>> {
        self.release
            .take()
            .ok_or_else(|| anyhow::anyhow!("the hold was ended already"))?
            .send(release)
            .map_err(|_| anyhow::anyhow!("the hold was dropped"))?;
        Ok(tokio::time::timeout(DEADLINE, &mut self.setter).await??)
    }

    async fn seen(&mut self) -> anyhow::Result<Option<String>> {
        Ok(redis::cmd("GET")
            .arg(&self.key)
            .query_async(&mut self.other)
            .await?)
    }
}

/// A hold that ends in an abort (the wire runner killed the worker holding it): the SET never
/// reaches Redis, and its client's connection ends instead of being answered.
async fn an_aborted_held_set_never_reaches_redis(bed: &TestBed) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let mut set = HeldSet::send(bed, "aborted").await?;
    let answered = set.end(Release::Abort).await?;
    anyhow::ensure!(
        answered.is_err(),
        "the aborted SET was answered: {answered:?}"
    );
    let seen = set.seen().await?;
    anyhow::ensure!(seen.is_none(), "an aborted SET reached Redis: {seen:?}");
    set.tapped.stop().await;
    Ok(())
}

async fn a_held_set_is_invisible_to_others_until_released(bed: &TestBed) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let mut held = HeldSet::send(bed, "held").await?;
    let seen = held.seen().await?;
    anyhow::ensure!(seen.is_none(), "a held SET reached Redis: {seen:?}");
    anyhow::ensure!(!held.setter.is_finished(), "the held SET was answered");

    held.end(Release::Forward).await??;
    let seen = held.seen().await?;
    anyhow::ensure!(
        seen.as_deref() == Some("v"),
        "released SET is visible: {seen:?}"
    );
    let (key, tapped, mut other) = (held.key, held.tapped, held.other);
    let set = tapped
        .recorded
        .until("the held SET", |t| find(t, "SET", &key).cloned())
        .await?;
    anyhow::ensure!(
        set.forwarded_us > Some(set.sent_us),
        "forwarded after it was sent: {set:?}"
    );
    let _: () = redis::cmd("DEL").arg(&key).query_async(&mut other).await?;
    tapped.stop().await;
    Ok(())
}
