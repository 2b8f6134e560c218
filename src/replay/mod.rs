//! Reproducing a reported race from production logs (`racecert replay`), so "random and
//! unreproducible" becomes a sequence of events that replays on a laptop:
//!
//! - [`parse`] reads the lines as teams write them (logfmt, JSON, nested JSON, Celery's worker
//!   format; common spellings of each field), counting what it cannot read;
//! - [`story`] groups them per request into attempts (worker, version, what each did, in time
//!   order), with cutovers, invalidations and worker starts and losses beside them;
//! - [`diagnose`](mod@diagnose) names every root cause of the seed the lines show ([`Cause`]), each with the
//!   line numbers that prove it and one sentence;
//! - [`plan`](mod@plan) synthesises, per cause, a controlled schedule that re-creates it, independent of
//!   the worker it will run against;
//! - [`reproduce`] runs each plan against racecert's reference worker, with the defect that
//!   removes the protection against the cause and then safe, and reports per cause: reproduced,
//!   prevented, or could not be built;
//! - [`system`](mod@system) runs, instead, the faults of a team's own framework that re-create
//!   each cause against the team's system (`replay LOG --system FILE`) and reports per cause:
//!   reproduced on its worker, prevented by it, or not reproducible with that framework.
//!
//! ```no_run
//! # async fn example(bed: &racecert::env::TestBed) -> racecert::Result<()> {
//! use racecert::replay::{ReproduceOptions, analyse, reproduce_on, seed_log};
//! let analysis = analyse(seed_log().as_bytes(), None);
//! let report = reproduce_on(bed, analysis, &ReproduceOptions::default()).await?;
//! print!("{}", report.text());
//! # Ok(())
//! # }
//! ```

pub use crate::contract::log::parse;

pub mod diagnose;
pub mod plan;
mod report;
pub mod reproduce;
pub mod story;
pub mod system;

pub use diagnose::{Cause, Detail, Finding, diagnose};
pub use plan::{Plan, Shape, plan};
pub use reproduce::{
    Outcome, ReplayReport, ReproduceOptions, Reproduction, Run, Verdict, reproduce_on,
};
pub use story::{Attempt, Event, Reconstruction, RequestStory, reconstruct};

use crate::check::Invariant;
use parse::Malformed;
use serde::Serialize;

/// The whole analysis of a log: what was read, the stories, the diagnoses.
#[derive(Debug, Clone, Serialize)]
pub struct Analysis {
    /// Lines read that concern requests, workers or the rollout.
    pub lines: usize,
    /// Lines that could not be read, with their numbers and why.
    pub malformed: Vec<Malformed>,
    /// Well-formed lines about something else.
    pub unrelated: usize,
    /// The stories (only the chosen request's, when one was chosen).
    pub reconstruction: Reconstruction,
    /// The diagnoses (only the chosen request's, when one was chosen).
    pub findings: Vec<Finding>,
}

/// Parses, reconstructs and diagnoses `bytes`. `only` keeps one request (by request id,
/// idempotency key or job id): the whole log is still read, so causes that span requests (a cache
/// entry filled by another) are found.
pub fn analyse(bytes: &[u8], only: Option<&str>) -> Analysis {
    let parsed = parse::parse(bytes);
    let mut reconstruction = reconstruct(&parsed);
    let mut findings = diagnose(&reconstruction);
    if let Some(wanted) = only {
        reconstruction.requests.retain(|story| {
            story.request_id == wanted
                || story.events().iter().any(|(e, _)| {
                    e.job_id.as_deref() == Some(wanted)
                        || e.idempotency_key.as_deref() == Some(wanted)
                })
        });
        findings.retain(|f| {
            reconstruction
                .requests
                .iter()
                .any(|r| r.request_id == f.request_id)
        });
    }
    Analysis {
        lines: parsed.lines.len(),
        malformed: parsed.malformed,
        unrelated: parsed.unrelated,
        reconstruction,
        findings,
    }
}

/// Lines as the seed's log shows them (used by tests and examples).
pub fn seed_log() -> &'static str {
    include_str!("seed.log")
}

/// Serialises an invariant by its name (the check module's types stay serde-free).
fn invariant_name<S: serde::Serializer>(
    invariant: &Invariant,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(invariant.name())
}

#[cfg(test)]
mod bench;
#[cfg(test)]
mod tests;
