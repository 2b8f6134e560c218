//! Running the plans: each diagnosed cause's schedule runs on the test bed against racecert's
//! reference worker twice, once with the defect that removes the protection against the cause
//! (it should break the plan's invariant: the cause is reproduced) and once safe (every invariant
//! should hold: the cause is prevented). The run's own worker log is diagnosed again with the
//! same code that read the incident, as a second witness.
//!
//! Only this module knows the reference worker: [`defects_for`] maps a cause (in a shape) to the
//! reference's defects and [`protection`] says what each defect switches off. The plans
//! themselves ([`super::plan`](mod@super::plan)) are data another runner can take to a worker process or a
//! described system.

use super::diagnose::Cause;
use super::plan::{Plan, Shape, plan};
use super::{Analysis, analyse};
use crate::check::CaseResult;
use crate::check::Invariant;
use crate::contract::defect::{Defect, Defects};
use crate::contract::log::{LogLine, Status};
use crate::env::TestBed;
use crate::fault::Effect;
use crate::history::{EventKind, History};
use crate::runner::controlled::{CaseSettings, Controller};
use serde::Serialize;
use std::collections::HashMap;

/// The worker the reproductions run against.
pub const REFERENCE_WORKER: &str = "racecert's reference worker (in process)";

/// The reference worker's defects that remove its protection against `cause` in `shape`.
pub fn defects_for(cause: Cause, shape: Shape) -> Vec<Defect> {
    match cause {
        Cause::MultipleWorkers | Cause::RetryWhileRunning | Cause::VisibilityTimeoutTooShort => {
            vec![Defect::RetryWithoutDedupe]
        }
        Cause::NewJobIdPerRetry => vec![Defect::RandomIdPerRetry],
        Cause::MultipleFinalWrites | Cause::LateWrite | Cause::LeaseTtlTooShort => {
            if shape == Shape::RedeliveryWhileRunning {
                // Without a lease expiry the retry must also get past the held lease.
                vec![Defect::RetryWithoutDedupe, Defect::UnfencedFinalWrite]
            } else {
                vec![Defect::UnfencedFinalWrite]
            }
        }
        Cause::VersionSkew | Cause::ImperfectDrain => vec![Defect::RereadActiveVersion],
        Cause::CrossVersionCache | Cause::UnversionedCacheKey => {
            vec![Defect::UnversionedCacheKey]
        }
        Cause::CacheHitBeforeInvalidation => vec![Defect::LateCacheInvalidation],
        Cause::LostJob | Cause::AckBeforeFinalWrite => vec![Defect::AckBeforeFinalWrite],
    }
}

/// What the safe reference worker does that a defect switches off.
pub fn protection(defect: Defect) -> &'static str {
    match defect {
        Defect::UnversionedCacheKey => "cache keys carry the model version",
        Defect::RetryWithoutDedupe => "a retry that finds the lease held is skipped as a duplicate",
        Defect::RandomIdPerRetry => {
            "a retry keeps the job's idempotency key, so the lease deduplicates it"
        }
        Defect::UnfencedFinalWrite => {
            "the final write is fenced on IN_PROGRESS, the lease token and a larger generation, so a late writer is rejected"
        }
        Defect::LateCacheInvalidation => {
            "a cutover switches the active-version pointer between per-version cache namespaces, so nothing waits for an invalidation"
        }
        Defect::RereadActiveVersion => "a worker is bound to one model version for its lifetime",
        Defect::AckBeforeFinalWrite => {
            "the delivery is acknowledged only after the final write, so a crash leaves it to be redelivered"
        }
        Defect::ReleaseWithoutTokenCheck => {
            "the lease is released by compare-and-delete, only while it still holds the releaser's token"
        }
        Defect::LeaseWithoutNx => "the lease is taken with SET NX, only when it is free",
        Defect::CacheWriteActiveNamespace => {
            "an output is cached in the namespace of the version that produced it"
        }
        Defect::LateWriteWithoutToken => {
            "the final write compares the lease token in the same statement, so a writer whose lease was taken over is rejected"
        }
        Defect::LeaseTtlInSeconds => {
            "the lease is taken for its TTL in milliseconds, so a crashed holder's job is free again within it"
        }
        Defect::NoAckWhenCompleted => {
            "a delivery of a job already completed is acknowledged, so it is not redelivered forever"
        }
        Defect::ReadThenWrite => {
            "the final write checks status, token and generation in the UPDATE itself, so nothing can come between the check and the write"
        }
    }
}

/// How one run of a plan came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// With the defects on, the plan's invariant broke.
    Reproduced,
    /// With the defects on, the plan's invariant held.
    NotReproduced,
    /// The safe worker held every invariant.
    Prevented,
    /// The safe worker broke an invariant.
    NotPrevented,
}

/// A broken invariant, as a report carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Broken {
    /// Which invariant.
    #[serde(serialize_with = "super::invariant_name")]
    pub invariant: Invariant,
    /// What was observed.
    pub observed: String,
    /// The events and rows that prove it.
    pub evidence: Vec<String>,
}

/// One run of a plan.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    /// The worker it ran against.
    pub worker: String,
    /// Defects switched on (none: the safe reference).
    pub defects: Vec<String>,
    /// What the safe worker does that the defects switch off.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub protections: Vec<String>,
    /// How it came out.
    pub verdict: Verdict,
    /// The invariants it broke.
    pub violations: Vec<Broken>,
    /// Whether the run's own log shows the cause again (diagnosed as the incident was).
    pub diagnosed_again: bool,
    /// The run, in the seed's log format.
    pub timeline: String,
}

/// How a cause's reproduction went.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum Outcome {
    /// The plan was built and run.
    Ran {
        /// The plan.
        plan: Plan,
        /// The run with the defects, then the safe run.
        runs: Vec<Run>,
    },
    /// The log does not allow a plan.
    CouldNotBeBuilt {
        /// Why.
        reason: String,
    },
}

/// One diagnosed cause and its reproduction.
#[derive(Debug, Clone, Serialize)]
pub struct Reproduction {
    /// The cause.
    pub cause: Cause,
    /// The request whose finding the plan is modelled on.
    pub request_id: String,
    /// What happened.
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// What `racecert replay` reports: the analysis and every cause's reproduction.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    /// The incident, read and diagnosed.
    pub analysis: Analysis,
    /// The worker the reproductions ran against.
    pub worker: String,
    /// Defects given for every reproduction instead of each cause's own (`--defect`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub defects_given: Option<Vec<String>>,
    /// One per diagnosed cause, in the findings' order.
    pub reproductions: Vec<Reproduction>,
}

impl ReplayReport {
    /// Whether the worker under test held: the safe reference (or, with `--defect`, the reference
    /// with those defects) broke no invariant in any run.
    pub fn held(&self) -> bool {
        let given = self.defects_given.is_some();
        let under_test = |run: &Run| run.defects.is_empty() != given;
        self.reproductions.iter().all(|r| match &r.outcome {
            Outcome::Ran { runs, .. } => runs
                .iter()
                .filter(|run| under_test(run))
                .all(|run| run.violations.is_empty()),
            Outcome::CouldNotBeBuilt { .. } => true,
        })
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct ReproduceOptions {
    /// Defects for every reproduction instead of each cause's own.
    pub defects: Option<Defects>,
    /// Also run the safe reference to show what prevents each cause.
    pub safe: bool,
}

impl Default for ReproduceOptions {
    fn default() -> ReproduceOptions {
        ReproduceOptions {
            defects: None,
            safe: true,
        }
    }
}

/// Builds and runs a plan for every diagnosed cause (the first finding of each) on `bed`.
/// Plans shared by several causes run once per defect set.
pub async fn reproduce_on(
    bed: &TestBed,
    analysis: Analysis,
    options: &ReproduceOptions,
) -> crate::Result<ReplayReport> {
    let served = bed.versions();
    let mut done: HashMap<String, CaseResult> = HashMap::new();
    let mut reproductions = Vec::new();
    let mut causes: Vec<Cause> = Vec::new();
    for finding in &analysis.findings {
        if causes.contains(&finding.cause) {
            continue;
        }
        causes.push(finding.cause);
        let outcome = match plan(&analysis.reconstruction, finding, &served) {
            Err(reason) => Outcome::CouldNotBeBuilt { reason },
            Ok(plan) => {
                let defects = options
                    .defects
                    .clone()
                    .unwrap_or_else(|| Defects::of(defects_for(plan.cause, plan.shape)));
                let mut sets = vec![defects];
                if options.safe {
                    sets.push(Defects::none());
                }
                let mut runs = Vec::new();
                for defects in sets {
                    let key = format!(
                        "{:?}|{}",
                        (&plan.workers, &plan.schedule),
                        defects
                            .iter()
                            .map(Defect::name)
                            .collect::<Vec<_>>()
                            .join(",")
                    );
                    let result = match done.get(&key) {
                        Some(result) => result.clone(),
                        None => {
                            let result = run_plan(bed, &plan, defects.clone()).await?;
                            done.insert(key, result.clone());
                            result
                        }
                    };
                    runs.push(judge(&plan, &defects, &result));
                }
                Outcome::Ran { plan, runs }
            }
        };
        reproductions.push(Reproduction {
            cause: finding.cause,
            request_id: finding.request_id.clone(),
            outcome,
        });
    }
    Ok(ReplayReport {
        analysis,
        worker: REFERENCE_WORKER.to_owned(),
        defects_given: options
            .defects
            .as_ref()
            .map(|d| d.iter().map(|d| d.name().to_owned()).collect()),
        reproductions,
    })
}

/// Runs one plan against the reference worker with `defects`.
pub async fn run_plan(bed: &TestBed, plan: &Plan, defects: Defects) -> crate::Result<CaseResult> {
    let mut settings = CaseSettings::seed_pair();
    settings.workers = plan.workers.clone();
    settings.defects = defects;
    let controller = Controller::new(bed, settings).await?;
    controller.run(&plan.schedule).await
}

fn judge(plan: &Plan, defects: &Defects, result: &CaseResult) -> Run {
    let safe = defects.iter().next().is_none();
    let broke = |invariant| result.violations.iter().any(|v| v.invariant == invariant);
    let verdict = match (safe, result.violations.is_empty()) {
        (true, true) => Verdict::Prevented,
        (true, false) => Verdict::NotPrevented,
        (false, _) if broke(plan.breaks) => Verdict::Reproduced,
        (false, _) => Verdict::NotReproduced,
    };
    let again = analyse(run_log(&result.history).as_bytes(), None);
    Run {
        worker: REFERENCE_WORKER.to_owned(),
        defects: defects.iter().map(|d| d.name().to_owned()).collect(),
        protections: defects.iter().map(|d| protection(d).to_owned()).collect(),
        verdict,
        violations: result
            .violations
            .iter()
            .map(|v| Broken {
                invariant: v.invariant,
                observed: v.observed.clone(),
                evidence: v.evidence.clone(),
            })
            .collect(),
        diagnosed_again: again.findings.iter().any(|f| f.cause == plan.cause),
        timeline: result.history.timeline(),
    }
}

/// A run's history as the log a production system would have written: the workers' lines, and a
/// `worker_lost` line where the harness crashed a worker.
pub fn run_log(history: &History) -> String {
    let mut out = String::new();
    let mut ts = String::new();
    for event in &history.events {
        match &event.kind {
            EventKind::Worker(line) => {
                ts.clone_from(&line.ts);
                out.push_str(&line.to_logfmt());
                out.push('\n');
            }
            // The rollout's own lines, as an operator's tooling logs them.
            EventKind::Fault(
                effect @ (Effect::CutOver { .. } | Effect::CacheInvalidated { .. }),
            ) => {
                let status = if matches!(effect, Effect::CutOver { .. }) {
                    Status::Cutover
                } else {
                    Status::CacheInvalidated
                };
                let mut fields = vec![("status".to_owned(), status.as_str().to_owned())];
                fields.extend(effect.fields().into_iter().map(|(k, v)| (k.to_owned(), v)));
                let line = LogLine {
                    ts: ts.clone(),
                    level: crate::contract::log::Level::Info,
                    fields,
                };
                out.push_str(&line.to_logfmt());
                out.push('\n');
            }
            EventKind::Fault(Effect::WorkerCrashed { worker, .. }) => {
                let mut lost = LogLine {
                    ts: ts.clone(),
                    level: crate::contract::log::Level::Error,
                    fields: vec![("worker_id".into(), worker.clone())],
                };
                lost.fields
                    .push(("status".into(), Status::WorkerLost.as_str().into()));
                out.push_str(&lost.to_logfmt());
                out.push('\n');
            }
            _ => {}
        }
    }
    out
}
