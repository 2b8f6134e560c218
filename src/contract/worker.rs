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
//! use racecert::contract::worker::{WorkerContext, WorkerFactory, WorkerUnderTest};
//! use racecert::reference::queue::Delivery;
//! use std::sync::Arc;
//!
//! #[derive(Debug)]
//! struct MyWorker { id: String, version: String }
//!
//! impl WorkerUnderTest for MyWorker {
//!     fn id(&self) -> &str { &self.id }
//!     fn model_version(&self) -> &str { &self.version }
//!     fn process(&self, delivery: Delivery) -> racecert::contract::worker::BoxFuture<'_, racecert::Result<()>> {
//!         Box::pin(async move { /* lease, take, cache, call, fenced write, ack */ let _ = delivery; Ok(()) })
//!     }
//! }
//!
//! #[derive(Debug)]
//! struct MyFactory;
//!
//! impl WorkerFactory for MyFactory {
//!     fn start<'a>(&'a self, ctx: WorkerContext<'a>)
//!         -> racecert::contract::worker::BoxFuture<'a, racecert::Result<Arc<dyn WorkerUnderTest>>> {
//!         Box::pin(async move {
//!             Ok(Arc::new(MyWorker { id: ctx.spec.id.clone(), version: ctx.spec.version.clone() })
//!                 as Arc<dyn WorkerUnderTest>)
//!         })
//!     }
//! }
//! ```
//! `examples/custom_worker.rs` runs a complete one through a shipped suite.

use crate::contract::Keys;
use crate::contract::log::LogSink;
use crate::reference::checkpoints::Checkpoints;
use crate::reference::defects::Defects;
use crate::reference::queue::Delivery;
use crate::reference::worker::{BackendEndpoint, Infra};
use crate::schedule::WorkerSpec;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

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
