//! # racecert
//!
//! A fault-injection test harness that certifies inference workers (API -> queue -> worker ->
//! model backend -> cache -> result store) against the races of a model-backend rollout: version
//! skew between workers, retries without dedupe, late writes that overwrite newer results, stale
//! caches. Workers run against **real** Redis and PostgreSQL in containers, every connection goes
//! through a Toxiproxy fault proxy, and each model version is a wiremock backend.
//!
//! ## Map of the modules
//! - [`contract`]: what every worker under test agrees to: schema (jobs table + audit trigger),
//!   Redis key names, job state machine, log lines, backend API, and the [`contract::worker`]
//!   trait a team implements to plug its own worker in.
//! - [`env`](mod@env): the test bed: images built offline, containers, external services, the
//!   Toxiproxy-API fault proxy and its client, the wiremock model backends, the container reaper.
//! - [`reference`](mod@reference): the seed's pipeline done right (submit, queue, worker, cutover), with a switch
//!   per root cause ([`reference::defects`]) and checkpoints a harness can hold.
//! - [`fault`]: the fault vocabulary.
//! - [`schedule`]: schedules, the deterministic controlled runner, the chaos runner, proptest
//!   exploration with shrinking.
//! - [`history`]: what happened: worker events, the audit trail, the backend journals.
//! - [`check`]: the invariants, each with a report.
//! - [`suite`]: suite files and the certify runner.
//! - [`report`]: terminal, JSON, JUnit XML and HTML/SVG reports.
//! - [`replay`]: incident logs -> reconstruction, diagnosis, a schedule that replays the race.
//! - [`smoke`]: the smoke scenario behind `racecert smoke`.
//! - [`error`]: the library error type.
//!
//! ## The test bed in one example
//! ```no_run
//! use racecert::env::{TestBed, proxy::{Direction, Toxic}};
//!
//! # async fn demo() -> racecert::Result<()> {
//! let bed = TestBed::builder().start().await?;          // builds images on first use
//! let backend = bed.backend_proxy("v1")?;                 // model-backend-A behind its proxy
//! backend
//!     .add_toxic(Toxic::Latency { latency_ms: 300, jitter_ms: 0 }, Direction::Downstream, 1.0)
//!     .await?;                                            // every v1 call now takes >= 300 ms
//! bed.shutdown().await;                                   // containers removed
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

pub mod check;
pub mod contract;
pub mod env;
pub mod error;
pub mod fault;
pub mod history;
pub mod reference;
pub mod replay;
pub mod report;
pub mod schedule;
pub mod smoke;
pub mod suite;

pub use error::{Error, Result};
