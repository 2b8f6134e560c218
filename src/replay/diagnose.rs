//! Diagnosis: the seed's root causes named from a reconstruction, each with the line numbers that
//! prove it and one sentence saying what happened. Every cause has a stable kebab-case name
//! ([`Cause::name`]) and says what it needs from the log ([`Cause::needs`]).
//!
//! Why one file of ~1,000 lines: one function per root cause, all reading the same
//! reconstruction with the same helpers; a cause is found by its name here, and each is short.

mod cache;
mod drain;
mod redelivery;

pub use cache::key_version;
use cache::*;

use super::story::{Attempt, Event, Reconstruction, RequestStory};
use crate::contract::log::Status;
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::fmt;

/// A root cause of the seed, as a log can show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Cause {
    /// The same request executed by more than one worker.
    MultipleWorkers,
    /// An older attempt wrote after a newer one had written (a late write over a newer result).
    LateWrite,
    /// Attempts of one request ran on different model versions.
    VersionSkew,
    /// A cache hit served an entry of another model version.
    CrossVersionCache,
    /// A retry dispatched while an earlier attempt was still running.
    RetryWhileRunning,
    /// Two or more final writes for one request: "at most one final write" broken in production.
    MultipleFinalWrites,
    /// A cache key that names no model version (shared by versions, or next to keys that do).
    UnversionedCacheKey,
    /// A cache hit between a cutover's start and the end of its cache invalidation.
    CacheHitBeforeInvalidation,
    /// The queue redelivered a job while its first attempt still ran: the visibility timeout is
    /// shorter than the processing time.
    VisibilityTimeoutTooShort,
    /// A second attempt acquired the lease while the first still ran: the lease TTL is shorter
    /// than the processing time.
    LeaseTtlTooShort,
    /// A job received and never finished, though its delivery was acknowledged or its worker
    /// died.
    LostJob,
    /// A delivery acknowledged before its final write.
    AckBeforeFinalWrite,
    /// A retry of a request ran under a new job id or idempotency key.
    NewJobIdPerRetry,
    /// A worker on the old version took a request accepted after the cutover, or a worker took
    /// a job after its own stop signal: the rollout did not drain it.
    ImperfectDrain,
}

impl Cause {
    /// Every cause.
    pub const ALL: [Cause; 14] = [
        Cause::MultipleWorkers,
        Cause::LateWrite,
        Cause::VersionSkew,
        Cause::CrossVersionCache,
        Cause::RetryWhileRunning,
        Cause::MultipleFinalWrites,
        Cause::UnversionedCacheKey,
        Cause::CacheHitBeforeInvalidation,
        Cause::VisibilityTimeoutTooShort,
        Cause::LeaseTtlTooShort,
        Cause::LostJob,
        Cause::AckBeforeFinalWrite,
        Cause::NewJobIdPerRetry,
        Cause::ImperfectDrain,
    ];

    /// kebab-case name, stable across releases.
    pub fn name(self) -> &'static str {
        match self {
            Cause::MultipleWorkers => "multiple-workers",
            Cause::LateWrite => "late-write",
            Cause::VersionSkew => "version-skew",
            Cause::CrossVersionCache => "cross-version-cache",
            Cause::RetryWhileRunning => "retry-while-running",
            Cause::MultipleFinalWrites => "multiple-final-writes",
            Cause::UnversionedCacheKey => "unversioned-cache-key",
            Cause::CacheHitBeforeInvalidation => "cache-hit-before-invalidation",
            Cause::VisibilityTimeoutTooShort => "visibility-timeout-too-short",
            Cause::LeaseTtlTooShort => "lease-ttl-too-short",
            Cause::LostJob => "lost-job",
            Cause::AckBeforeFinalWrite => "ack-before-final-write",
            Cause::NewJobIdPerRetry => "new-job-id-per-retry",
            Cause::ImperfectDrain => "imperfect-drain",
        }
    }

    /// What the log must show for the diagnosis.
    pub fn needs(self) -> &'static str {
        match self {
            Cause::MultipleWorkers => {
                "a request id (or job id) and the worker on lines showing execution (cache, backend call, write, failure)"
            }
            Cause::LateWrite => {
                "final writes of two attempts, told apart by attempt number (or order of receipt)"
            }
            Cause::VersionSkew => "the model version on the lines of two executing attempts",
            Cause::CrossVersionCache => {
                "a cache hit with the worker's version and the entry's (served/cached version, a versioned key, or the miss that filled the key)"
            }
            Cause::RetryWhileRunning => {
                "two attempts of a request, the earlier not yet ended when the later starts"
            }
            Cause::MultipleFinalWrites => {
                "two or more final-write lines for one request (write=result_store, inference_succeeded, late_success, Celery succeeded)"
            }
            Cause::UnversionedCacheKey => "cache keys, and the versions of the attempts using them",
            Cause::CacheHitBeforeInvalidation => {
                "a cutover line, a cache_invalidated line after it, and a cache hit in between"
            }
            Cause::VisibilityTimeoutTooShort => {
                "timestamps on the first attempt's receipt and end and on the redelivery"
            }
            Cause::LeaseTtlTooShort => {
                "timestamped lease_acquired lines of both attempts and the first attempt's end"
            }
            Cause::LostJob => {
                "a receipt with no final write or failure after it, and an ack or the worker's loss or restart"
            }
            Cause::AckBeforeFinalWrite => {
                "an acked line of an executing attempt before its write (or with no write)"
            }
            Cause::NewJobIdPerRetry => {
                "the request id on lines of two attempts with different job ids or idempotency keys"
            }
            Cause::ImperfectDrain => {
                "a cutover naming the new version and a later receipt or execution by a worker on another version of a request first seen after it; or a worker's stop signal (SIGTERM, warm shutdown, draining) and a later receipt by that worker"
            }
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A worker of the incident and what it ran, as a finding involves it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Actor {
    /// The request it worked on.
    pub request_id: String,
    /// The worker, if the log names it.
    pub worker_id: Option<String>,
    /// Its model version, if logged.
    pub model_version: Option<String>,
}

impl Actor {
    fn of(story: &RequestStory, attempt: &Attempt) -> Actor {
        Actor {
            request_id: story.request_id.clone(),
            worker_id: Some(attempt.worker_id.clone()),
            model_version: attempt.model_version.clone(),
        }
    }
}

/// Numbers a finding carries beyond its sentence.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Detail {
    /// A timing cause: the timeout the log implies against the measured processing time.
    Timing {
        /// Redelivery (or second lease) time minus the first receipt (or lease).
        implied_timeout_ms: i64,
        /// The first attempt's first line to its end.
        processing_ms: i64,
    },
    /// Several final writes: the one that stands.
    Winner {
        /// Final writes counted.
        writes: usize,
        /// The last write's line.
        line: usize,
        /// Its attempt, if the line names a worker.
        attempt: Option<u32>,
        /// Its worker.
        worker_id: Option<String>,
        /// Its version.
        model_version: Option<String>,
    },
}

/// A diagnosis with its proof.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Finding {
    /// Which cause.
    pub cause: Cause,
    /// The request.
    pub request_id: String,
    /// What happened, in a sentence.
    pub explanation: String,
    /// Line numbers that prove it, ascending.
    pub lines: Vec<usize>,
    /// Who was involved, in the order the cause names them (the first attempt, then the retry;
    /// the attempt that filled a cache entry, then the one that read it).
    pub actors: Vec<Actor>,
    /// Numbers beyond the sentence.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<Detail>,
}

impl Finding {
    fn new(
        cause: Cause,
        request_id: &str,
        explanation: String,
        mut lines: Vec<usize>,
        actors: Vec<Actor>,
    ) -> Finding {
        lines.sort_unstable();
        lines.dedup();
        Finding {
            cause,
            request_id: request_id.to_owned(),
            explanation,
            lines,
            actors,
            detail: None,
        }
    }

    fn with(mut self, detail: Detail) -> Finding {
        self.detail = Some(detail);
        self
    }
}

/// Names every cause the reconstruction shows, sorted by cause, then request, then lines.
pub fn diagnose(reconstruction: &Reconstruction) -> Vec<Finding> {
    let mut findings = Vec::new();
    for story in &reconstruction.requests {
        multiple_workers(story, &mut findings);
        version_skew(story, &mut findings);
        retry_while_running(reconstruction, story, &mut findings);
        late_write(story, &mut findings);
        multiple_final_writes(story, &mut findings);
        timing(reconstruction, story, &mut findings);
        lost_job(reconstruction, story, &mut findings);
        ack_before_final_write(reconstruction, story, &mut findings);
        new_job_id_per_retry(story, &mut findings);
        drain::imperfect_drain(reconstruction, story, &mut findings);
    }
    let versions = known_versions(reconstruction);
    cross_version_cache(reconstruction, &versions, &mut findings);
    unversioned_cache_key(reconstruction, &versions, &mut findings);
    cache_hit_before_invalidation(reconstruction, &versions, &mut findings);
    findings.sort_by(|a, b| {
        (a.cause, &a.request_id, &a.lines).cmp(&(b.cause, &b.request_id, &b.lines))
    });
    findings
}

fn seconds(ms: i64) -> String {
    format!("{:.1}", ms as f64 / 1000.0)
}

fn list(lines: &[usize]) -> String {
    lines
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn executed(story: &RequestStory) -> Vec<&Attempt> {
    story.attempts.iter().filter(|a| a.executed()).collect()
}

fn multiple_workers(story: &RequestStory, findings: &mut Vec<Finding>) {
    let working = executed(story);
    let mut executors: Vec<String> = working.iter().map(|a| a.executor()).collect();
    executors.sort();
    executors.dedup();
    if executors.len() < 2 {
        return;
    }
    findings.push(Finding::new(
        Cause::MultipleWorkers,
        &story.request_id,
        format!(
            "request {} was executed by {} workers: {}",
            story.request_id,
            executors.len(),
            executors.join(", ")
        ),
        working.iter().map(|a| a.first_line()).collect(),
        working.iter().map(|a| Actor::of(story, a)).collect(),
    ));
}

fn version_skew(story: &RequestStory, findings: &mut Vec<Finding>) {
    let working = executed(story);
    let mut versions: Vec<&str> = working
        .iter()
        .filter_map(|a| a.model_version.as_deref())
        .collect();
    versions.sort();
    versions.dedup();
    if versions.len() < 2 {
        return;
    }
    // One attempt per version, in order of start: the roles of a reproduction.
    let mut actors: Vec<Actor> = Vec::new();
    for attempt in &working {
        if attempt.model_version.is_some()
            && !actors
                .iter()
                .any(|a| a.model_version == attempt.model_version)
        {
            actors.push(Actor::of(story, attempt));
        }
    }
    findings.push(Finding::new(
        Cause::VersionSkew,
        &story.request_id,
        format!(
            "attempts of {} ran on versions {}",
            story.request_id,
            versions.join(" and ")
        ),
        working.iter().map(|a| a.first_line()).collect(),
        actors,
    ));
}

/// Whether `earlier` was still running when the line ranked `at` was logged: it had started, had
/// not ended, and its worker had not died or restarted since its last line before `at`.
fn running_at(reconstruction: &Reconstruction, earlier: &Attempt, at: usize) -> bool {
    if earlier.start() >= at || earlier.end().is_some_and(|end| end.seq < at) {
        return false;
    }
    let last_before = earlier
        .events
        .iter()
        .filter(|e| e.seq < at)
        .map(|e| e.seq)
        .max()
        .unwrap_or(0);
    reconstruction
        .mark_between(
            &earlier.worker_id,
            &[Status::WorkerStarted, Status::WorkerLost],
            last_before,
            at,
        )
        .is_none()
}

fn retry_while_running(
    reconstruction: &Reconstruction,
    story: &RequestStory,
    findings: &mut Vec<Finding>,
) {
    for pair in story.attempts.windows(2) {
        let (earlier, later) = (&pair[0], &pair[1]);
        if !running_at(reconstruction, earlier, later.start()) {
            continue;
        }
        findings.push(Finding::new(
            Cause::RetryWhileRunning,
            &story.request_id,
            format!(
                "attempt {} on {} started (line {}) while attempt {} on {} was still running{}",
                later.attempt,
                later.worker_id,
                later.first_line(),
                earlier.attempt,
                earlier.worker_id,
                earlier
                    .timed_out()
                    .map(|l| format!(" (it had only timed out waiting upstream, line {l})"))
                    .unwrap_or_default()
            ),
            vec![earlier.first_line(), later.first_line()],
            vec![Actor::of(story, earlier), Actor::of(story, later)],
        ));
    }
}

fn late_write(story: &RequestStory, findings: &mut Vec<Finding>) {
    let mut writes: Vec<(&Event, &Attempt)> = story
        .attempts
        .iter()
        .filter_map(|a| a.write().map(|w| (w, a)))
        .collect();
    writes.sort_by_key(|(write, _)| write.seq);
    let overwrites: Vec<usize> = story
        .events()
        .into_iter()
        .filter(|(e, _)| e.is(Status::OverwriteDetected))
        .map(|(e, _)| e.line)
        .collect();
    for pair in writes.windows(2) {
        let ((first_write, first), (second_write, second)) = (pair[0], pair[1]);
        if second.attempt >= first.attempt {
            continue;
        }
        let mut lines = vec![first_write.line, second_write.line];
        lines.extend(&overwrites);
        findings.push(Finding::new(
            Cause::LateWrite,
            &story.request_id,
            format!(
                "attempt {} ({} on {}) wrote at line {}, after the newer attempt {} ({} on {}) had written at line {}: the late result overwrote the newer one",
                second.attempt,
                second.worker_id,
                second.model_version.as_deref().unwrap_or("?"),
                second_write.line,
                first.attempt,
                first.worker_id,
                first.model_version.as_deref().unwrap_or("?"),
                first_write.line,
            ),
            lines,
            vec![Actor::of(story, second), Actor::of(story, first)],
        ));
    }
}

fn multiple_final_writes(story: &RequestStory, findings: &mut Vec<Finding>) {
    let writes: Vec<(&Event, Option<&Attempt>)> = story
        .events()
        .into_iter()
        .filter(|(e, _)| e.final_write)
        .collect();
    let Some(&(last, winner)) = writes.last() else {
        return;
    };
    if writes.len() < 2 {
        return;
    }
    let lines: Vec<usize> = writes.iter().map(|(e, _)| e.line).collect();
    let by = match winner {
        Some(a) => format!("attempt {} on {}", a.attempt, a.who()),
        None => "a line naming no worker".to_owned(),
    };
    let mut actors: Vec<Actor> = Vec::new();
    for attempt in writes.iter().filter_map(|(_, a)| *a) {
        if !actors
            .iter()
            .any(|a| a.worker_id.as_deref() == Some(attempt.worker_id.as_str()))
        {
            actors.push(Actor::of(story, attempt));
        }
    }
    findings.push(
        Finding::new(
            Cause::MultipleFinalWrites,
            &story.request_id,
            format!(
                "request {} has {} final writes (lines {}): at most one final write was broken in production; the last, by {by} at line {}, is the result that stands",
                story.request_id,
                writes.len(),
                list(&lines),
                last.line
            ),
            lines,
            actors,
        )
        .with(Detail::Winner {
            writes: writes.len(),
            line: last.line,
            attempt: winner.map(|a| a.attempt),
            worker_id: winner.map(|a| a.worker_id.clone()),
            model_version: winner.and_then(|a| a.model_version.clone()),
        }),
    );
}

/// `second`'s lease taken before `first` ended, with both leases' lines and times.
fn second_lease<'a>(
    first: &'a Attempt,
    second: &'a Attempt,
    end: &Event,
) -> Option<(&'a Event, &'a Event, i64, i64)> {
    let (a, b) = (
        first.find(Status::LeaseAcquired)?,
        second.find(Status::LeaseAcquired)?,
    );
    (b.seq < end.seq).then_some(())?;
    Some((a, b, a.millis?, b.millis?))
}

/// A redelivery or a second lease while the first attempt still ran, timed from the timestamps.
fn timing(reconstruction: &Reconstruction, story: &RequestStory, findings: &mut Vec<Finding>) {
    for (i, first) in story.attempts.iter().enumerate() {
        let (Some(end), Some(started)) = (first.end(), first.start_millis()) else {
            continue;
        };
        let Some(end_ms) = end.millis else {
            continue;
        };
        // A later attempt while this one ran: a second lease, or a redelivery the log shows (an
        // overlap alone may be the API's own retry, which no queue timeout explains).
        let Some(second) = story.attempts[i + 1..].iter().find(|b| {
            running_at(reconstruction, first, b.start())
                && b.start_millis().is_some()
                && (second_lease(first, b, end).is_some()
                    || redelivery::redelivered(reconstruction, story, first, b))
        }) else {
            continue;
        };
        let processing = end_ms - started;
        let finding = if let Some((a, b, a_ms, b_ms)) = second_lease(first, second, end) {
            let implied = b_ms - a_ms;
            let mut lines = vec![a.line, b.line, end.line];
            lines.extend(first.find(Status::LeaseLost).map(|e| e.line));
            Finding::new(
                Cause::LeaseTtlTooShort,
                &story.request_id,
                format!(
                    "{} acquired the lease of request {} at line {}, {} s after {} had acquired it (line {}) and while that attempt still ran: it ended {} s after it started (line {}). The lease TTL (~{} s) is shorter than the processing time ({} s)",
                    second.who(),
                    story.request_id,
                    b.line,
                    seconds(implied),
                    first.who(),
                    a.line,
                    seconds(processing),
                    end.line,
                    seconds(implied),
                    seconds(processing),
                ),
                lines,
                vec![Actor::of(story, first), Actor::of(story, second)],
            )
            .with(Detail::Timing {
                implied_timeout_ms: implied,
                processing_ms: processing,
            })
        } else {
            let Some(redelivered) = second.start_millis() else {
                continue;
            };
            let implied = redelivered - started;
            let mut lines = vec![first.first_line(), second.first_line(), end.line];
            lines.extend(
                reconstruction
                    .marks
                    .iter()
                    .find(|m| {
                        m.status == Status::DeliveriesRestored
                            && m.seq > first.start()
                            && m.seq < second.start()
                    })
                    .map(|m| m.line),
            );
            Finding::new(
                Cause::VisibilityTimeoutTooShort,
                &story.request_id,
                format!(
                    "{} received request {} again at line {}, {} s after {} received it (line {}) and while that attempt still ran: it ended {} s after it started (line {}). The queue's visibility timeout (~{} s) is shorter than the processing time ({} s)",
                    second.who(),
                    story.request_id,
                    second.first_line(),
                    seconds(implied),
                    first.who(),
                    first.first_line(),
                    seconds(processing),
                    end.line,
                    seconds(implied),
                    seconds(processing),
                ),
                lines,
                vec![Actor::of(story, first), Actor::of(story, second)],
            )
            .with(Detail::Timing {
                implied_timeout_ms: implied,
                processing_ms: processing,
            })
        };
        findings.push(finding);
        return;
    }
}

fn lost_job(reconstruction: &Reconstruction, story: &RequestStory, findings: &mut Vec<Finding>) {
    let events = story.events();
    if events.iter().any(|(e, _)| e.ends_job()) {
        return;
    }
    let Some(attempt) = story.attempts.iter().rfind(|a| {
        a.events
            .iter()
            .any(|e| e.executes() || e.word.is_some_and(Status::is_receive))
    }) else {
        return;
    };
    let ack = story.attempts.iter().find_map(|a| a.find(Status::Acked));
    let last = attempt.events.last().map_or(0, |e| e.seq);
    let loss = attempt
        .find(Status::WorkerLost)
        .map(|e| (e.line, "was lost"))
        .or_else(|| {
            reconstruction
                .mark_between(
                    &attempt.worker_id,
                    &[Status::WorkerLost, Status::WorkerStarted],
                    last,
                    usize::MAX,
                )
                .map(|m| {
                    (
                        m.line,
                        if m.status == Status::WorkerLost {
                            "was lost"
                        } else {
                            "restarted"
                        },
                    )
                })
        });
    if ack.is_none() && loss.is_none() {
        return;
    }
    let mut because = Vec::new();
    let mut lines = vec![attempt.first_line()];
    if let Some(ack) = ack {
        because.push(format!(
            "its delivery was acknowledged at line {}",
            ack.line
        ));
        lines.push(ack.line);
    }
    if let Some((line, what)) = loss {
        because.push(format!("its worker {what} at line {line}"));
        lines.push(line);
    }
    findings.push(Finding::new(
        Cause::LostJob,
        &story.request_id,
        format!(
            "request {} was received by {} at line {} and never finished: {}, and no attempt wrote a result or failed",
            story.request_id,
            attempt.who(),
            attempt.first_line(),
            because.join(" and ")
        ),
        lines,
        vec![Actor::of(story, attempt)],
    ));
}

fn ack_before_final_write(
    reconstruction: &Reconstruction,
    story: &RequestStory,
    findings: &mut Vec<Finding>,
) {
    for attempt in story.attempts.iter().filter(|a| a.executed()) {
        let mut settled = false;
        let mut early = None;
        for event in &attempt.events {
            if event.is(Status::Acked) && !settled {
                early = Some(event);
                break;
            }
            settled |= event.final_write
                || event.word.is_some_and(|w| {
                    matches!(
                        w,
                        Status::LateWriteRejected
                            | Status::DiscardedLateResult
                            | Status::AlreadyCompleted
                            | Status::DuplicateSkipped
                            | Status::JobFailed
                            | Status::UpstreamFailed
                    )
                });
        }
        let Some(ack) = early else {
            continue;
        };
        let write = attempt.write().filter(|w| w.seq > ack.seq);
        let (explanation, lines) = match write {
            Some(write) => (
                format!(
                    "{} acknowledged request {}'s delivery at line {}, before its final write at line {}: a crash in between loses the job",
                    attempt.who(),
                    story.request_id,
                    ack.line,
                    write.line
                ),
                vec![ack.line, write.line],
            ),
            None => {
                let loss = attempt
                    .find(Status::WorkerLost)
                    .map(|e| e.line)
                    .or_else(|| {
                        reconstruction
                            .mark_between(
                                &attempt.worker_id,
                                &[Status::WorkerLost, Status::WorkerStarted],
                                ack.seq,
                                usize::MAX,
                            )
                            .map(|m| m.line)
                    });
                let mut lines = vec![ack.line];
                lines.extend(loss);
                (
                    format!(
                        "{} acknowledged request {}'s delivery at line {} and never wrote a result{}: the job went with the acknowledgement",
                        attempt.who(),
                        story.request_id,
                        ack.line,
                        loss.map(|l| format!(" (its worker died or restarted at line {l})"))
                            .unwrap_or_default()
                    ),
                    lines,
                )
            }
        };
        findings.push(Finding::new(
            Cause::AckBeforeFinalWrite,
            &story.request_id,
            explanation,
            lines,
            vec![Actor::of(story, attempt)],
        ));
    }
}

fn new_job_id_per_retry(story: &RequestStory, findings: &mut Vec<Finding>) {
    if !story.named {
        return;
    }
    // First line bearing each distinct id, with the first attempt that ran under it (the line
    // may be the submitter's, which is no attempt: the API's submission comes first).
    let mut jobs: Vec<(&str, usize, Option<&Attempt>)> = Vec::new();
    let mut keys: Vec<(&str, usize, Option<&Attempt>)> = Vec::new();
    for (event, attempt) in story.events() {
        if let Some(job) = event.job_id.as_deref() {
            note_id(&mut jobs, job, event.line, attempt);
        }
        if let Some(key) = event.idempotency_key.as_deref() {
            note_id(&mut keys, key, event.line, attempt);
        }
    }
    let mut said = Vec::new();
    let mut lines = Vec::new();
    let mut actors: Vec<Actor> = Vec::new();
    for (kind, ids) in [("job ids", &jobs), ("idempotency keys", &keys)] {
        if ids.len() < 2 {
            continue;
        }
        said.push(format!(
            "{} {kind} ({})",
            ids.len(),
            ids.iter()
                .map(|(id, line, _)| format!("{id} at line {line}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        lines.extend(ids.iter().map(|(_, line, _)| *line));
        for attempt in ids.iter().filter_map(|(_, _, a)| *a) {
            if !actors.iter().any(|a| {
                a.worker_id.as_deref() == Some(attempt.worker_id.as_str())
                    && a.model_version == attempt.model_version
            }) {
                actors.push(Actor::of(story, attempt));
            }
        }
    }
    if said.is_empty() {
        return;
    }
    findings.push(Finding::new(
        Cause::NewJobIdPerRetry,
        &story.request_id,
        format!(
            "request {} ran under {}: the retry was a new job, so nothing deduplicated it against the first attempt",
            story.request_id,
            said.join(" and ")
        ),
        lines,
        actors,
    ));
}

/// Notes a line bearing `id`: its first line, and the first attempt that ran under it.
fn note_id<'a>(
    ids: &mut Vec<(&'a str, usize, Option<&'a Attempt>)>,
    id: &'a str,
    line: usize,
    attempt: Option<&'a Attempt>,
) {
    match ids.iter_mut().find(|(known, _, _)| *known == id) {
        Some((_, _, ran)) => *ran = ran.or(attempt),
        None => ids.push((id, line, attempt)),
    }
}
