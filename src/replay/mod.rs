//! Reproducing a reported race from production logs (`racecert replay`), so "random and
//! unreproducible" becomes a sequence of events that replays on a laptop:
//!
//! - [`parse`] reads the log as teams' platforms export it (logfmt, JSON, Celery's worker format,
//!   behind `kubectl`, `stern` or `docker compose` prefixes; journald JSON, OTLP JSON, Loki and
//!   Grafana exports, CSV; whole JSON documents: arrays, CloudWatch events, Elasticsearch
//!   `_search` hits; JSON or logfmt inside a string field), streamed in bounded memory, saying where it found each field and
//!   what the lines it could not use looked like;
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

pub use crate::logs as parse;

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
use parse::{Container, Found, Malformed, Parsed};
use serde::Serialize;

/// How the log was read: its shapes, where each field was found, what could not be used.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Reading {
    /// Physical lines read.
    pub lines_read: usize,
    /// Bytes read.
    pub bytes: u64,
    /// Shapes read, with their line counts (`stern › Celery`, `OTLP JSON`).
    pub shapes: Vec<(String, usize)>,
    /// Where each seed field was found.
    pub found: Vec<Found>,
    /// Lines holding several records, and how their records are numbered.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<Container>,
    /// Lines that could not be read, all counted (the first ones are in `malformed`).
    pub malformed_count: usize,
    /// A few well-formed records that named no request and no status, as they looked.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unrelated_samples: Vec<Malformed>,
    /// Records whose worker could not be told apart, with the workers they may be from.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ambiguous: Vec<(usize, String)>,
    /// Relevant records read but not kept (over the limit of kept lines).
    #[serde(skip_serializing_if = "is_zero")]
    pub not_kept: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The whole analysis of a log: what was read, the stories, the diagnoses.
#[derive(Debug, Clone, Serialize)]
pub struct Analysis {
    /// Lines read that concern requests, workers or the rollout.
    pub lines: usize,
    /// Lines that could not be read, with their numbers, why and what they looked like (the
    /// first [`parse::MAX_MALFORMED`]; [`Reading::malformed_count`] counts them all).
    pub malformed: Vec<Malformed>,
    /// Well-formed lines about something else.
    pub unrelated: usize,
    /// How the log was read.
    pub reading: Reading,
    /// The stories (only the chosen request's, when one was chosen).
    pub reconstruction: Reconstruction,
    /// The diagnoses (only the chosen request's, when one was chosen).
    pub findings: Vec<Finding>,
}

/// Parses, reconstructs and diagnoses `bytes`. `only` keeps one request (by request id,
/// idempotency key or job id): the whole log is still read, so causes that span requests (a cache
/// entry filled by another) are found.
pub fn analyse(bytes: &[u8], only: Option<&str>) -> Analysis {
    analyse_parsed(parse::parse(bytes), only)
}

/// Streams a log file (any size, bounded memory) with the team's own field names, then
/// reconstructs and diagnoses it as [`analyse`] does. With `only`, only that request's lines (and
/// those naming no request, and cache lines) are kept while reading.
pub fn analyse_file(
    path: &std::path::Path,
    fields: &[parse::FieldMap],
    only: Option<&str>,
) -> crate::Result<Analysis> {
    let options = parse::Options {
        fields: fields.to_vec(),
        only: only.map(str::to_owned),
        compact: true,
        ..parse::Options::default()
    };
    Ok(analyse_parsed(parse::parse_file(path, &options)?, only))
}

/// Reconstructs and diagnoses what was parsed.
pub fn analyse_parsed(parsed: Parsed, only: Option<&str>) -> Analysis {
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
        reading: Reading {
            lines_read: parsed.lines_read,
            bytes: parsed.bytes,
            shapes: parsed.shapes,
            found: parsed.found,
            containers: parsed.containers,
            malformed_count: parsed.malformed_count,
            unrelated_samples: parsed.unrelated_samples,
            ambiguous: parsed.ambiguous,
            not_kept: parsed.not_kept,
        },
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
