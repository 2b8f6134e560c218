//! Synthesis: for each diagnosed cause, a controlled schedule that re-creates it. A [`Plan`] names
//! the incident's workers on the versions it logged (renamed onto versions the test bed serves),
//! the steps and faults in order, and the invariant a worker without the matching protection
//! breaks. Nothing here knows racecert's reference worker: a plan is data (it serialises) that
//! any runner able to hold workers at checkpoints and inject the faults can run, against the
//! reference worker, a worker process or a described system. Which of the reference worker's
//! defects re-create a cause is [`super::reproduce`]'s business.

use super::diagnose::{Actor, Cause, Finding};
use super::story::Reconstruction;
use crate::check::Invariant;
use crate::contract::checkpoint::Checkpoint;
use crate::contract::log::Status;
use crate::fault::Fault;
use crate::schedule::{RequestSpec, Schedule, Step, WorkerSpec};
use serde::Serialize;
use std::fmt;

/// How a plan re-creates its cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Shape {
    /// The first attempt is held in its backend call while the queue redelivers the job to a
    /// second worker (its visibility timeout expired); then both finish.
    RedeliveryWhileRunning,
    /// As [`Shape::RedeliveryWhileRunning`], but the first attempt's lease runs out first (its
    /// TTL passes), so the retry owns the job; then the first attempt finishes late.
    LeaseExpiresWhileRunning,
    /// A worker of the old version answers a request and fills the cache; the active version is
    /// cut over; a worker of the new version answers the same input.
    ReadAfterCutover,
    /// As [`Shape::ReadAfterCutover`], with the old entries' invalidation running only after the
    /// read (late, asynchronous invalidation).
    ReadBeforeInvalidation,
    /// A worker takes the job and crashes before its final write.
    CrashBeforeFinalWrite,
    /// The active version is cut over while the attempt is in its backend call.
    CutoverMidFlight,
}

impl Shape {
    /// The shape in a sentence.
    pub fn describe(self) -> &'static str {
        match self {
            Shape::RedeliveryWhileRunning => {
                "the first attempt is held in its backend call while the queue redelivers the job to a second worker; then both finish"
            }
            Shape::LeaseExpiresWhileRunning => {
                "the first attempt is held in its backend call, its lease expires, the retry runs to the end, then the first attempt finishes"
            }
            Shape::ReadAfterCutover => {
                "a worker of the old version answers and fills the cache, the active version is cut over, a worker of the new version answers the same input"
            }
            Shape::ReadBeforeInvalidation => {
                "as read-after-cutover, with the old entries invalidated only after the new version's read"
            }
            Shape::CrashBeforeFinalWrite => {
                "a worker takes the job and crashes before its final write; the queue is drained after"
            }
            Shape::CutoverMidFlight => {
                "the active version is cut over while the attempt is in its backend call; then it finishes"
            }
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Shape::RedeliveryWhileRunning => "redelivery-while-running",
            Shape::LeaseExpiresWhileRunning => "lease-expires-while-running",
            Shape::ReadAfterCutover => "read-after-cutover",
            Shape::ReadBeforeInvalidation => "read-before-invalidation",
            Shape::CrashBeforeFinalWrite => "crash-before-final-write",
            Shape::CutoverMidFlight => "cutover-mid-flight",
        };
        f.write_str(name)
    }
}

/// A schedule that re-creates one cause.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// The cause it re-creates.
    pub cause: Cause,
    /// The request of the incident it is modelled on.
    pub request_id: String,
    /// How.
    pub shape: Shape,
    /// The workers, as the incident names them, on versions the test bed serves.
    pub workers: Vec<WorkerSpec>,
    /// Requests and steps.
    pub schedule: Schedule,
    /// The invariant a worker without the protection against the cause breaks.
    #[serde(serialize_with = "super::invariant_name")]
    pub breaks: Invariant,
    /// Versions renamed onto the test bed's: (as logged, as run).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub renamed: Vec<(String, String)>,
}

/// The shape that re-creates a cause, and the invariant it breaks without protection. Causes of
/// a double execution take the lease-expiry shape when the incident shows a lease or an upstream
/// timeout (the retry came because the first attempt looked dead), else a plain redelivery.
pub fn shape_of(cause: Cause, lease_evidence: bool) -> (Shape, Invariant) {
    let overlap = if lease_evidence {
        Shape::LeaseExpiresWhileRunning
    } else {
        Shape::RedeliveryWhileRunning
    };
    match cause {
        Cause::MultipleWorkers | Cause::RetryWhileRunning | Cause::VisibilityTimeoutTooShort => (
            Shape::RedeliveryWhileRunning,
            Invariant::ComputeWasteBounded,
        ),
        Cause::NewJobIdPerRetry => (
            Shape::RedeliveryWhileRunning,
            Invariant::AtMostOneFinalWrite,
        ),
        Cause::MultipleFinalWrites => (overlap, Invariant::AtMostOneFinalWrite),
        Cause::LateWrite => (overlap, Invariant::GenerationsIncrease),
        Cause::LeaseTtlTooShort => (
            Shape::LeaseExpiresWhileRunning,
            Invariant::AtMostOneFinalWrite,
        ),
        // An old worker that took a job after the cutover runs it on its old version: the same
        // cutover around a running attempt re-creates what it stores.
        Cause::VersionSkew | Cause::ImperfectDrain => {
            (Shape::CutoverMidFlight, Invariant::ResultNamesItsVersion)
        }
        Cause::CrossVersionCache | Cause::UnversionedCacheKey => {
            (Shape::ReadAfterCutover, Invariant::NoStaleCacheRead)
        }
        Cause::CacheHitBeforeInvalidation => {
            (Shape::ReadBeforeInvalidation, Invariant::NoStaleCacheRead)
        }
        Cause::LostJob | Cause::AckBeforeFinalWrite => {
            (Shape::CrashBeforeFinalWrite, Invariant::NoLostJob)
        }
    }
}

/// Assigns the incident's versions to versions the test bed serves: a served name is kept, others
/// take the served versions left, in order.
struct Versions<'a> {
    served: &'a [&'a str],
    renamed: Vec<(String, String)>,
    used: Vec<String>,
}

impl Versions<'_> {
    fn assign(&mut self, logged: Option<&str>, avoid: Option<&str>) -> Result<String, String> {
        if let Some(logged) = logged {
            if let Some((_, run)) = self.renamed.iter().find(|(l, _)| l == logged) {
                return Ok(run.clone());
            }
            if self.served.contains(&logged) && avoid != Some(logged) {
                if !self.used.iter().any(|u| u == logged) {
                    self.used.push(logged.to_owned());
                }
                return Ok(logged.to_owned());
            }
        }
        let free = self
            .served
            .iter()
            .find(|s| !self.used.iter().any(|u| u == *s) && avoid != Some(**s))
            .or_else(|| {
                // An unlogged version may share a served one, as long as it differs from `avoid`.
                logged
                    .is_none()
                    .then(|| self.served.iter().find(|s| avoid != Some(**s)))
                    .flatten()
            })
            .ok_or_else(|| {
                format!(
                    "the incident needs more model versions than the test bed serves ({})",
                    self.served.join(", ")
                )
            })?;
        self.used.push((*free).to_owned());
        if let Some(logged) = logged {
            self.renamed.push((logged.to_owned(), (*free).to_owned()));
        }
        Ok((*free).to_owned())
    }
}

/// Whether the incident shows the first attempt's lease (or an upstream timeout that made the
/// retry treat it as dead).
fn lease_evidence(reconstruction: &Reconstruction, request_id: &str) -> bool {
    reconstruction.request(request_id).is_some_and(|story| {
        story
            .attempts
            .iter()
            .any(|a| a.find(Status::LeaseAcquired).is_some() || a.find(Status::LeaseLost).is_some())
            || story
                .attempts
                .first()
                .is_some_and(|a| a.timed_out().is_some())
    })
}

/// The actors of a finding in the order their attempts started.
fn by_start<'a>(reconstruction: &Reconstruction, actors: &'a [Actor]) -> Vec<&'a Actor> {
    let start = |actor: &Actor| {
        reconstruction
            .request(&actor.request_id)
            .and_then(|story| {
                story
                    .attempts
                    .iter()
                    .find(|a| {
                        Some(a.worker_id.as_str()) == actor.worker_id.as_deref()
                            && a.model_version == actor.model_version
                    })
                    .map(|a| a.start())
            })
            .unwrap_or(usize::MAX)
    };
    let mut sorted: Vec<&Actor> = actors.iter().collect();
    sorted.sort_by_key(|a| start(a));
    sorted
}

/// Worker ids for the roles: as logged, made distinct (a worker that plays two roles, e.g. a
/// redelivery to itself, becomes two workers), and named when the log does not name them.
fn worker_ids(roles: &[Option<&str>]) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    for (i, role) in roles.iter().enumerate() {
        let base = role
            .map(|id| id.split_whitespace().collect::<Vec<_>>().join("-"))
            .filter(|id| !id.is_empty())
            .unwrap_or_else(|| format!("worker-{}", i + 1));
        let mut id = base.clone();
        let mut n = 2;
        while ids.contains(&id) {
            id = format!("{base}-{n}");
            n += 1;
        }
        ids.push(id);
    }
    ids
}

/// Builds the plan that re-creates `finding` with workers on the `served` versions, or says why
/// the log does not allow one.
pub fn plan(
    reconstruction: &Reconstruction,
    finding: &Finding,
    served: &[&str],
) -> Result<Plan, String> {
    let (shape, breaks) = shape_of(
        finding.cause,
        lease_evidence(reconstruction, &finding.request_id),
    );
    let mut versions = Versions {
        served,
        renamed: Vec::new(),
        used: Vec::new(),
    };
    let actors = by_start(reconstruction, &finding.actors);
    let (workers, schedule) = match shape {
        Shape::RedeliveryWhileRunning | Shape::LeaseExpiresWhileRunning => {
            overlap(shape, finding, &actors, &mut versions)?
        }
        Shape::ReadAfterCutover | Shape::ReadBeforeInvalidation => {
            stale_read(shape, finding, &mut versions)?
        }
        Shape::CrashBeforeFinalWrite => crash_before_final_write(finding, &actors, &mut versions)?,
        Shape::CutoverMidFlight => cutover_mid_flight(finding, &actors, &mut versions)?,
    };
    Ok(Plan {
        cause: finding.cause,
        request_id: finding.request_id.clone(),
        shape,
        workers,
        schedule,
        breaks,
        renamed: versions.renamed,
    })
}

/// The workers and schedule of an overlap (a plain redelivery, or with the first attempt's
/// lease expiring): the first attempt held in its backend call while the retry runs.
fn overlap(
    shape: Shape,
    finding: &Finding,
    actors: &[&Actor],
    versions: &mut Versions,
) -> Result<(Vec<WorkerSpec>, Schedule), String> {
    let [first, retry, ..] = actors else {
        return Err(format!(
            "the log does not show two attempts of {} with their workers; re-creating the overlap needs the first attempt and the retry",
            finding.request_id
        ));
    };
    let first_version = versions.assign(first.model_version.as_deref(), None)?;
    let retry_version = match retry.model_version.as_deref() {
        Some(v) => versions.assign(Some(v), None)?,
        None => first_version.clone(),
    };
    let ids = worker_ids(&[first.worker_id.as_deref(), retry.worker_id.as_deref()]);
    let mut steps = vec![run(0, Checkpoint::AfterBackendCall)];
    if shape == Shape::LeaseExpiresWhileRunning {
        steps.push(Step::Fault(Fault::ExpireLease { request: 0 }));
    }
    steps.extend([run(1, Checkpoint::Done), run(0, Checkpoint::Done)]);
    Ok((
        vec![spec(&ids[0], first_version), spec(&ids[1], retry_version)],
        Schedule {
            requests: vec![request(&finding.request_id)],
            steps,
        },
    ))
}

/// The workers and schedule of a stale cache read: the finding's filler on the old version, a
/// cutover, its reader on the new one (and, for a late invalidation, the invalidation after).
fn stale_read(
    shape: Shape,
    finding: &Finding,
    versions: &mut Versions,
) -> Result<(Vec<WorkerSpec>, Schedule), String> {
    let [filler, reader, ..] = finding.actors.as_slice() else {
        return Err(
            "the log names no reader of the cache entry: a stale read needs a writer and a reader"
                .to_owned(),
        );
    };
    let old = versions.assign(filler.model_version.as_deref(), None)?;
    let new = match reader.model_version.as_deref() {
        Some(v) if v != filler.model_version.as_deref().unwrap_or_default() => {
            versions.assign(Some(v), Some(&old))?
        }
        _ => versions.assign(None, Some(&old))?,
    };
    if new == old {
        return Err(format!(
            "a stale read needs two model versions; the test bed serves {}",
            versions.served.join(", ")
        ));
    }
    let ids = worker_ids(&[filler.worker_id.as_deref(), reader.worker_id.as_deref()]);
    let fill_request = if filler.request_id == reader.request_id {
        format!("{}-earlier", reader.request_id)
    } else {
        filler.request_id.clone()
    };
    let mut steps = vec![
        run(0, Checkpoint::Done),
        Step::Fault(Fault::Cutover { to: new.clone() }),
        run(1, Checkpoint::Done),
    ];
    if shape == Shape::ReadBeforeInvalidation {
        steps.push(Step::Fault(Fault::InvalidateCache));
    }
    Ok((
        vec![spec(&ids[0], old), spec(&ids[1], new)],
        Schedule {
            requests: vec![request(&fill_request), request(&reader.request_id)],
            steps,
        },
    ))
}

/// The worker and schedule of a lost job: the first worker takes it and crashes.
fn crash_before_final_write(
    finding: &Finding,
    actors: &[&Actor],
    versions: &mut Versions,
) -> Result<(Vec<WorkerSpec>, Schedule), String> {
    let Some(worker) = actors.first() else {
        return Err("the log names no worker that held the job".to_owned());
    };
    let version = versions.assign(worker.model_version.as_deref(), None)?;
    let ids = worker_ids(&[worker.worker_id.as_deref()]);
    Ok((
        vec![spec(&ids[0], version)],
        Schedule {
            requests: vec![request(&finding.request_id)],
            steps: vec![run(0, Checkpoint::AfterTake), Step::Crash { worker: 0 }],
        },
    ))
}

/// The worker and schedule of version skew: the old attempt's worker held in its backend call
/// while the active version is cut over to the new attempt's.
fn cutover_mid_flight(
    finding: &Finding,
    actors: &[&Actor],
    versions: &mut Versions,
) -> Result<(Vec<WorkerSpec>, Schedule), String> {
    let [old, new, ..] = actors else {
        return Err("version skew needs two attempts whose versions the log names".to_owned());
    };
    let old_version = versions.assign(old.model_version.as_deref(), None)?;
    let new_version = versions.assign(new.model_version.as_deref(), Some(&old_version))?;
    let ids = worker_ids(&[old.worker_id.as_deref()]);
    Ok((
        vec![spec(&ids[0], old_version)],
        Schedule {
            requests: vec![request(&finding.request_id)],
            steps: vec![
                run(0, Checkpoint::AfterBackendCall),
                Step::Fault(Fault::Cutover { to: new_version }),
                run(0, Checkpoint::Done),
            ],
        },
    ))
}

/// Request `id` of a plan (every plan's input is the same).
fn request(id: &str) -> RequestSpec {
    RequestSpec {
        request_id: id.to_owned(),
        input: "input-0".to_owned(),
    }
}

/// Runs `worker` to the checkpoint `to`.
fn run(worker: usize, to: Checkpoint) -> Step {
    Step::Run { worker, to }
}

fn spec(id: &str, version: String) -> WorkerSpec {
    WorkerSpec {
        id: id.to_owned(),
        version,
    }
}
