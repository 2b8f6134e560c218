//! The Rust face of the contract: how a team plugs its own worker into racecert's harness.
//!
//! The harness owns the queue side (it receives deliveries from the contract's Redis Stream on
//! the worker's behalf, so a schedule decides who gets what and when); the worker owns everything
//! a delivery sets off: lease, job row, cache, backend call, final write, ack, release. It calls
//! [`Checkpoints::reached`] at its checkpoints, so the controller can interleave it with other
//! workers, and logs through the [`LogSink`] with the contract's fields, so the checkers see its
//! cache reads and backend calls. Whatever it logs, the audit trigger and the backend journals
//! judge its writes and calls independently.
//!
//! ```no_run
//! use racecert_core::contract::worker::{WorkerContext, WorkerFactory, WorkerUnderTest};
//! use racecert_core::contract::delivery::Delivery;
//! use std::sync::Arc;
//!
//! #[derive(Debug)]
//! struct MyWorker { id: String, version: String }
//!
//! impl WorkerUnderTest for MyWorker {
//!     fn id(&self) -> &str { &self.id }
//!     fn model_version(&self) -> &str { &self.version }
//!     fn process(&self, delivery: Delivery) -> racecert_core::contract::worker::BoxFuture<'_, racecert_core::Result<()>> {
//!         Box::pin(async move { /* lease, take, cache, call, fenced write, ack */ let _ = delivery; Ok(()) })
//!     }
//! }
//!
//! #[derive(Debug)]
//! struct MyFactory;
//!
//! impl WorkerFactory for MyFactory {
//!     fn start<'a>(&'a self, ctx: WorkerContext<'a>)
//!         -> racecert_core::contract::worker::BoxFuture<'a, racecert_core::Result<Arc<dyn WorkerUnderTest>>> {
//!         Box::pin(async move {
//!             Ok(Arc::new(MyWorker { id: ctx.spec.id.clone(), version: ctx.spec.version.clone() })
//!                 as Arc<dyn WorkerUnderTest>)
//!         })
//!     }
//! }
//! ```
//! `examples/custom_worker.rs` runs a complete one through a shipped suite.

use crate::Result;
use crate::contract::Keys;
use crate::contract::checkpoint::Checkpoints;
use crate::contract::defect::Defects;
use crate::contract::delivery::Delivery;
use crate::contract::log::LogSink;
use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// One worker of a case.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerSpec {
    /// Worker id, e.g. `worker-a`.
    pub id: String,
    /// The version it is bound to.
    pub version: String,
}

/// A model backend as a worker's configuration names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendEndpoint {
    /// Name for logs (`backend_endpoint`), e.g. `model-a`.
    pub name: String,
    /// Base URL, through the proxy.
    pub url: String,
}

/// Connections a worker uses; shared by all workers of a suite (cheap clones).
#[derive(Clone)]
pub struct Infra {
    /// Redis, through the proxy (reconnects after restarts and partitions).
    pub redis: ConnectionManager,
    /// Postgres, through the proxy.
    pub pg: PgPool,
    /// HTTP client for the backends.
    pub http: reqwest::Client,
}

impl std::fmt::Debug for Infra {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Infra").finish_non_exhaustive()
    }
}

impl Infra {
    /// Connects to Redis and Postgres at the given (proxied) URLs. A worker cut off from Redis or
    /// Postgres must give up its attempt (its delivery is redelivered), not sit in reconnect
    /// loops: racecert cuts a link by resetting its connections, which ends a query or a
    /// connection attempt at once, so the acquire timeout can stay patient for a loaded machine.
    pub async fn connect(redis_url: &str, database_url: &str) -> Result<Infra> {
        Infra::connect_with(redis_url, database_url, Duration::from_secs(10)).await
    }

    /// Connects with `acquire_timeout` for a Postgres connection. Two connections are opened
    /// before it returns, so a worker's first queries never pay for connection setup (SCRAM
    /// authentication is slow on a loaded machine) inside a short timeout.
    pub async fn connect_with(
        redis_url: &str,
        database_url: &str,
        acquire_timeout: Duration,
    ) -> Result<Infra> {
        let client = redis::Client::open(redis_url)?;
        // Short timeouts, no retry loop: see `connect`. A reconnect that fails (the link is cut)
        // fails at once and the next command tries again; with retries, the manager slept up to
        // 200 ms between attempts, and a heal found it asleep (every partition's drain waited).
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_response_timeout(Some(Duration::from_secs(5)))
            .set_number_of_retries(0);
        let redis = ConnectionManager::new_with_config(client, config).await?;
        // A worker runs one statement at a time: a small pool (every connection counts against
        // the server's max_connections, shared by every worker of every case).
        let options = sqlx::postgres::PgPoolOptions::new()
            .max_connections(3)
            .min_connections(2)
            .acquire_timeout(acquire_timeout);
        let setting_up = std::time::Instant::now();
        let pg = options.connect(database_url).await?;
        // The pool opens the rest of its minimum in the background; wait for it too.
        while pg.num_idle() < 2 && setting_up.elapsed() < Duration::from_secs(30) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(Infra {
            redis,
            pg,
            http: reqwest::Client::new(),
        })
    }

    /// The harness's own connections (expiring leases, reading the audit trail): patient, because
    /// a harness query that gives up under load is an error of the run, not a finding.
    pub async fn connect_harness(redis_url: &str, database_url: &str) -> Result<Infra> {
        // Not the client's defaults (a 500 ms reply timeout): on a loaded machine a harness
        // query waited longer than that and ended a whole run with "redis: timed out".
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(HARNESS_REDIS_PATIENCE.0))
            .set_response_timeout(Some(HARNESS_REDIS_PATIENCE.1));
        let redis =
            ConnectionManager::new_with_config(redis::Client::open(redis_url)?, config).await?;
        let pg = sqlx::postgres::PgPoolOptions::new()
            // Few: the harness's queries are short and rare, and every connection counts against
            // the server's max_connections, shared by every case and worker.
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(30))
            .connect(database_url)
            .await?;
        Ok(Infra {
            redis,
            pg,
            http: reqwest::Client::new(),
        })
    }
}

/// How long the harness's own Redis connections wait (to connect, for a reply): far longer than
/// any fault racecert injects, so only a dead server makes them give up.
pub const HARNESS_REDIS_PATIENCE: (Duration, Duration) =
    (Duration::from_secs(10), Duration::from_secs(30));

/// Every key matching `pattern` (a Redis glob), walked with SCAN 10,000 keys a round trip (the
/// default of 10 made one walk of a shared keyspace hundreds of round trips).
pub async fn scan_keys(redis: &mut ConnectionManager, pattern: &str) -> Result<Vec<String>> {
    let mut found = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(10_000)
            .query_async(redis)
            .await?;
        found.extend(keys);
        if next == 0 {
            return Ok(found);
        }
        cursor = next;
    }
}

/// A boxed, sendable future (the trait objects below need one).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A worker under test, as the harness drives it.
pub trait WorkerUnderTest: Send + Sync + std::fmt::Debug {
    /// Its id (also its consumer name on the stream).
    fn id(&self) -> &str;
    /// The model version it is bound to.
    fn model_version(&self) -> &str;
    /// Processes one delivery the harness received for it. `Ok` whatever the job's fate
    /// (succeeded, skipped as a duplicate, rejected late write); `Err` when an infrastructure
    /// failure ended the attempt (the delivery stays unacknowledged). A crash directive at a
    /// checkpoint must end processing at once without cleanup, and return `Ok`.
    fn process(&self, delivery: Delivery) -> BoxFuture<'_, crate::Result<()>>;
    /// Whether it stopped taking new jobs (the harness then hands it none).
    fn is_draining(&self) -> bool {
        false
    }
}

/// Everything a worker of one case needs.
#[derive(Debug)]
pub struct WorkerContext<'a> {
    /// Which worker (id, version).
    pub spec: &'a WorkerSpec,
    /// Its index in the case (a stable seed for its randomness).
    pub index: usize,
    /// Redis, Postgres and HTTP, every connection through the fault proxy.
    pub infra: Infra,
    /// The case's key namespace.
    pub keys: Keys,
    /// Backend endpoint of every version (through the proxy).
    pub backends: &'a BTreeMap<String, BackendEndpoint>,
    /// Where to report checkpoints.
    pub checkpoints: Checkpoints,
    /// Where to log.
    pub log: LogSink,
    /// The backend timeout the suite asks for.
    pub backend_timeout: Duration,
    /// The lease time-to-live to use (long in controlled runs, where the schedule expires
    /// leases; short in chaos runs, where the clock does).
    pub lease_ttl: Duration,
    /// Defects the suite asks for (meaningful to the reference worker; others may ignore them).
    pub defects: Defects,
}

/// Starts the workers of each case.
pub trait WorkerFactory: Send + Sync + std::fmt::Debug {
    /// Starts one worker for a case.
    fn start<'a>(
        &'a self,
        ctx: WorkerContext<'a>,
    ) -> BoxFuture<'a, crate::Result<Arc<dyn WorkerUnderTest>>>;
}
