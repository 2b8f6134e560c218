//! Diagnosis of the seed's log and of incident logs written as teams write them
//! (`tests/fixtures/incidents`), each with its exact lines, and the plans that re-create them.
//!
//! Why one file of ~750 lines: one test per incident fixture and diagnosis, each short, read as
//! the catalogue of what replay must find.

use super::reproduce::{Broken, defects_for, run_log};
use super::*;
use crate::check::Invariant;
use crate::contract::checkpoint::Checkpoint;
use crate::contract::defect::Defect;
use crate::contract::log::{Level, LogLine, Status};
use crate::fault::Fault;
use crate::history::{Event as HistoryEvent, EventKind, History};
use crate::schedule::Step;

macro_rules! fixture {
    ($name:literal) => {
        include_str!(concat!("../../tests/fixtures/incidents/", $name))
    };
}

const SERVED: [&str; 2] = ["v1", "v2"];

fn causes(log: &str) -> Vec<Cause> {
    let mut causes: Vec<Cause> = analyse(log.as_bytes(), None)
        .findings
        .iter()
        .map(|f| f.cause)
        .collect();
    causes.dedup();
    causes
}

/// Analyses `log` and checks its findings are exactly `expected` (cause, request, lines).
fn expect(log: &str, expected: &[(Cause, &str, &[usize])]) -> Analysis {
    let analysis = analyse(log.as_bytes(), None);
    let found: Vec<(Cause, &str, &[usize])> = analysis
        .findings
        .iter()
        .map(|f| (f.cause, f.request_id.as_str(), f.lines.as_slice()))
        .collect();
    assert_eq!(found, expected, "{}", analysis.text());
    analysis
}

fn finding(analysis: &Analysis, cause: Cause) -> &Finding {
    analysis
        .findings
        .iter()
        .find(|f| f.cause == cause)
        .unwrap_or_else(|| panic!("no {cause}: {}", analysis.text()))
}

fn plan_of(analysis: &Analysis, cause: Cause) -> Plan {
    plan(&analysis.reconstruction, finding(analysis, cause), &SERVED)
        .unwrap_or_else(|reason| panic!("{cause}: {reason}"))
}

fn workers(plan: &Plan) -> Vec<(&str, &str)> {
    plan.workers
        .iter()
        .map(|w| (w.id.as_str(), w.version.as_str()))
        .collect()
}

fn run(worker: usize, to: Checkpoint) -> Step {
    Step::Run { worker, to }
}

/// The seed's log analysed, its findings checked to be exactly the seed's seven.
fn seed_analysis() -> Analysis {
    expect(
        seed_log(),
        &[
            (Cause::MultipleWorkers, "req-91", &[1, 4]),
            (Cause::LateWrite, "req-91", &[5, 6, 7]),
            (Cause::VersionSkew, "req-91", &[1, 4]),
            (Cause::RetryWhileRunning, "req-91", &[1, 4]),
            (Cause::MultipleFinalWrites, "req-91", &[5, 6]),
            (Cause::UnversionedCacheKey, "req-91", &[1, 4]),
            (Cause::VisibilityTimeoutTooShort, "req-91", &[1, 4, 6]),
        ],
    )
}

#[test]
fn the_seed_log_tells_the_seed_story() {
    let analysis = seed_analysis();
    assert!(analysis.malformed.is_empty());
    let story = &analysis.reconstruction.requests[0];
    assert_eq!(story.request_id, "req-91");
    let [first, second] = story.attempts.as_slice() else {
        panic!("two attempts expected: {story:?}")
    };
    assert_eq!(
        (
            first.attempt,
            first.worker_id.as_str(),
            first.model_version.as_deref()
        ),
        (1, "worker-a", Some("v1"))
    );
    assert_eq!(first.timed_out(), Some(3));
    assert_eq!(
        (
            second.attempt,
            second.worker_id.as_str(),
            second.model_version.as_deref()
        ),
        (2, "worker-c", Some("v2"))
    );
    assert_eq!(second.write_line(), Some(5));
    assert_eq!(first.write_line(), Some(6));
    assert_eq!(story.other.len(), 1, "overwrite_detected names no worker");
    let retry = finding(&analysis, Cause::RetryWhileRunning);
    assert!(
        retry
            .explanation
            .contains("timed out waiting upstream, line 3"),
        "{}",
        retry.explanation
    );
    let writes = finding(&analysis, Cause::MultipleFinalWrites);
    assert_eq!(
        writes.detail,
        Some(Detail::Winner {
            writes: 2,
            line: 6,
            attempt: Some(1),
            worker_id: Some("worker-a".into()),
            model_version: Some("v1".into()),
        })
    );
    assert!(
        writes
            .explanation
            .contains("the last, by attempt 1 on worker-a (v1) at line 6"),
        "{}",
        writes.explanation
    );
    let timing = finding(&analysis, Cause::VisibilityTimeoutTooShort);
    assert_eq!(
        timing.detail,
        Some(Detail::Timing {
            implied_timeout_ms: 3103,
            processing_ms: 4887
        })
    );
    assert!(
        timing.explanation.ends_with(
            "The queue's visibility timeout (~3.1 s) is shorter than the processing time (4.9 s)"
        ),
        "{}",
        timing.explanation
    );
}

#[test]
fn the_seed_story_is_re_created_by_its_plans() {
    let analysis = seed_analysis();
    // The late write re-created: attempt 1 held in its backend call, its lease expiring (it had
    // timed out upstream, so the retry took it for dead), the retry writing, then attempt 1.
    let late = plan_of(&analysis, Cause::LateWrite);
    assert_eq!(late.shape, Shape::LeaseExpiresWhileRunning);
    assert_eq!(late.breaks, Invariant::GenerationsIncrease);
    assert_eq!(workers(&late), vec![("worker-a", "v1"), ("worker-c", "v2")]);
    assert_eq!(
        late.schedule.steps,
        vec![
            run(0, Checkpoint::AfterBackendCall),
            Step::Fault(Fault::ExpireLease { request: 0 }),
            run(1, Checkpoint::Done),
            run(0, Checkpoint::Done),
        ]
    );
    assert_eq!(
        defects_for(late.cause, late.shape),
        vec![Defect::UnfencedFinalWrite]
    );
    // The duplicate execution re-created without the expiry: the retry meets a held lease.
    let workers_plan = plan_of(&analysis, Cause::MultipleWorkers);
    assert_eq!(workers_plan.shape, Shape::RedeliveryWhileRunning);
    assert_eq!(workers_plan.breaks, Invariant::ComputeWasteBounded);
    let skew = plan_of(&analysis, Cause::VersionSkew);
    assert_eq!(workers(&skew), vec![("worker-a", "v1")]);
    assert_eq!(
        skew.schedule.steps,
        vec![
            run(0, Checkpoint::AfterBackendCall),
            Step::Fault(Fault::Cutover { to: "v2".into() }),
            run(0, Checkpoint::Done),
        ]
    );
    // One request filled and read the unversioned key: the plan reads it from a second one.
    let key = plan_of(&analysis, Cause::UnversionedCacheKey);
    assert_eq!(
        key.schedule
            .requests
            .iter()
            .map(|r| r.request_id.as_str())
            .collect::<Vec<_>>(),
        vec!["req-91-earlier", "req-91"]
    );
}

#[test]
fn json_lines_and_shuffled_fields_give_the_same_diagnosis() {
    let json: String = seed_log()
        .lines()
        .map(|l| parse::parse_line(l).unwrap().to_json() + "\n")
        .collect();
    assert_eq!(causes(&json), causes(seed_log()));
    let shuffled: String = seed_log()
        .lines()
        .map(|l| {
            let line = parse::parse_line(l).unwrap();
            let mut fields = line.fields.clone();
            fields.reverse();
            LogLine { fields, ..line }.to_logfmt() + "\n"
        })
        .collect();
    assert_eq!(causes(&shuffled), causes(seed_log()));
}

#[test]
fn unrelated_requests_and_lines_do_not_mix_in() {
    let mut log = String::from("2026-06-26T10:15:20.000Z INFO service started version=1.2\n");
    for line in seed_log().lines() {
        log.push_str(line);
        log.push('\n');
        log.push_str("2026-06-26T10:15:22.000Z INFO request_id=req-7 attempt=1 worker_id=worker-b model_version=v1 status=cache_miss\n");
    }
    log.push_str("2026-06-26T10:15:26.000Z INFO request_id=req-7 attempt=1 worker_id=worker-b model_version=v1 status=inference_succeeded write=result_store\n");
    let analysis = analyse(log.as_bytes(), None);
    assert_eq!(analysis.unrelated, 1);
    assert_eq!(analysis.reconstruction.requests.len(), 2);
    assert!(
        analysis.findings.iter().all(|f| f.request_id == "req-91"),
        "{:?}",
        analysis.findings
    );
    let only = analyse(log.as_bytes(), Some("req-7"));
    assert_eq!(only.reconstruction.requests.len(), 1);
    assert!(only.findings.is_empty());
    let by_job = analyse(log.as_bytes(), Some("job-441"));
    assert_eq!(by_job.reconstruction.requests[0].request_id, "req-91");
}

#[test]
fn a_stale_cache_read_after_cutover_is_a_cross_version_cache() {
    let log = "\
2026-06-26T11:00:00.000Z INFO request_id=req-1 attempt=1 worker_id=worker-a model_version=v1 backend_endpoint=model-a cache_key=inf:x1 status=cache_miss
2026-06-26T11:00:00.400Z INFO request_id=req-1 attempt=1 worker_id=worker-a model_version=v1 status=inference_succeeded write=result_store
2026-06-26T11:00:01.000Z INFO status=cutover previous_model_version=v1 new_model_version=v2
2026-06-26T11:00:02.000Z INFO request_id=req-2 attempt=1 worker_id=worker-c model_version=v2 backend_endpoint=model-b cache_key=inf:x1 status=cache_hit
2026-06-26T11:00:02.010Z INFO request_id=req-2 attempt=1 worker_id=worker-c model_version=v2 status=inference_succeeded write=result_store
";
    let analysis = expect(
        log,
        &[
            (Cause::CrossVersionCache, "req-2", &[1, 4]),
            (Cause::UnversionedCacheKey, "req-2", &[1, 4]),
        ],
    );
    assert_eq!(analysis.reconstruction.cutovers.len(), 1);
    let plan = plan_of(&analysis, Cause::CrossVersionCache);
    assert_eq!(workers(&plan), vec![("worker-a", "v1"), ("worker-c", "v2")]);
    assert_eq!(plan.schedule.requests.len(), 2);
    assert_eq!(
        plan.schedule.steps,
        vec![
            run(0, Checkpoint::Done),
            Step::Fault(Fault::Cutover { to: "v2".into() }),
            run(1, Checkpoint::Done),
        ]
    );
}

#[test]
fn a_duplicate_execution_without_a_timeout() {
    let log = "\
2026-06-26T12:00:00.000Z INFO request_id=req-5 attempt=1 worker_id=worker-a model_version=v1 status=inference_started
2026-06-26T12:00:00.100Z INFO request_id=req-5 attempt=2 worker_id=worker-b model_version=v1 status=retry_dispatched
2026-06-26T12:00:00.150Z INFO request_id=req-5 attempt=2 worker_id=worker-b model_version=v1 status=inference_started
2026-06-26T12:00:00.300Z INFO request_id=req-5 attempt=1 worker_id=worker-a model_version=v1 status=inference_succeeded write=result_store
2026-06-26T12:00:00.350Z INFO request_id=req-5 attempt=2 worker_id=worker-b model_version=v1 status=inference_succeeded write=result_store
";
    let analysis = expect(
        log,
        &[
            (Cause::MultipleWorkers, "req-5", &[1, 2]),
            (Cause::RetryWhileRunning, "req-5", &[1, 2]),
            (Cause::MultipleFinalWrites, "req-5", &[4, 5]),
            (Cause::VisibilityTimeoutTooShort, "req-5", &[1, 2, 4]),
        ],
    );
    // No timeout, no lease: the retry meets a held lease, and both writes need both defects.
    for cause in [Cause::MultipleWorkers, Cause::MultipleFinalWrites] {
        let plan = plan_of(&analysis, cause);
        assert!(
            !plan
                .schedule
                .steps
                .iter()
                .any(|s| matches!(s, Step::Fault(_))),
            "{:?}",
            plan.schedule.steps
        );
    }
    let writes = plan_of(&analysis, Cause::MultipleFinalWrites);
    assert_eq!(
        defects_for(writes.cause, writes.shape),
        vec![Defect::RetryWithoutDedupe, Defect::UnfencedFinalWrite]
    );
}

#[test]
fn logfmt_with_team_spellings_shows_two_final_writes_and_the_visibility_timeout() {
    let analysis = expect(
        fixture!("double-write.logfmt.log"),
        &[
            (Cause::MultipleWorkers, "r-100", &[2, 6]),
            (Cause::RetryWhileRunning, "r-100", &[2, 6]),
            (Cause::MultipleFinalWrites, "r-100", &[9, 11]),
            (Cause::VisibilityTimeoutTooShort, "r-100", &[2, 6, 9]),
        ],
    );
    assert_eq!((analysis.unrelated, analysis.malformed.len()), (1, 0));
    assert_eq!(
        analysis.reconstruction.marks[0].status,
        Status::WorkerStarted
    );
    let story = &analysis.reconstruction.requests[0];
    assert_eq!(
        story
            .attempts
            .iter()
            .map(|a| (a.attempt, a.worker_id.as_str(), a.model_version.as_deref()))
            .collect::<Vec<_>>(),
        vec![(1, "wk-1", Some("v2")), (2, "wk-2", Some("v2"))],
        "retries=0 and retries=1 are attempts 1 and 2"
    );
    let timing = finding(&analysis, Cause::VisibilityTimeoutTooShort);
    assert!(
        timing.explanation.ends_with(
            "The queue's visibility timeout (~30.0 s) is shorter than the processing time (42.9 s)"
        ),
        "{}",
        timing.explanation
    );
    assert!(
        finding(&analysis, Cause::MultipleFinalWrites)
            .explanation
            .contains("the last, by attempt 2 on wk-2 (v2) at line 11"),
    );
    let plan = plan_of(&analysis, Cause::VisibilityTimeoutTooShort);
    assert_eq!(workers(&plan), vec![("wk-1", "v2"), ("wk-2", "v2")]);
    assert_eq!(
        plan.schedule.steps,
        vec![
            run(0, Checkpoint::AfterBackendCall),
            run(1, Checkpoint::Done),
            run(0, Checkpoint::Done),
        ]
    );
}

#[test]
fn json_with_a_truncated_line_shows_the_lease_ttl_and_the_late_write() {
    let analysis = expect(
        fixture!("lease-expiry.json.log"),
        &[
            (Cause::MultipleWorkers, "r-200", &[1, 4]),
            (Cause::LateWrite, "r-200", &[7, 9]),
            (Cause::RetryWhileRunning, "r-200", &[1, 4]),
            (Cause::MultipleFinalWrites, "r-200", &[7, 9]),
            (Cause::LeaseTtlTooShort, "r-200", &[2, 5, 8, 9]),
        ],
    );
    assert_eq!(analysis.malformed.len(), 1);
    assert_eq!(analysis.malformed[0].line_no, 10);
    assert!(
        analysis.malformed[0]
            .reason
            .starts_with("invalid JSON: EOF"),
        "{}",
        analysis.malformed[0].reason
    );
    assert!(analysis.text().contains("malformed line 10: invalid JSON"));
    let lease = finding(&analysis, Cause::LeaseTtlTooShort);
    assert!(
        lease
            .explanation
            .ends_with("The lease TTL (~10.0 s) is shorter than the processing time (14.3 s)"),
        "{}",
        lease.explanation
    );
    let plan = plan_of(&analysis, Cause::LeaseTtlTooShort);
    assert_eq!(plan.shape, Shape::LeaseExpiresWhileRunning);
    assert_eq!(plan.breaks, Invariant::AtMostOneFinalWrite);
    assert_eq!(workers(&plan), vec![("w-a", "v1"), ("w-b", "v1")]);
}

#[test]
fn nested_camel_case_json_shows_a_stale_cache_read_before_the_invalidation() {
    let analysis = expect(
        fixture!("stale-cache.nested.log"),
        &[
            (Cause::CrossVersionCache, "q-2", &[1, 4]),
            (Cause::UnversionedCacheKey, "q-2", &[1, 4]),
            (Cause::CacheHitBeforeInvalidation, "q-2", &[3, 4, 6]),
        ],
    );
    let cutover = &analysis.reconstruction.cutovers[0];
    assert_eq!(
        (cutover.line, cutover.from.as_deref(), cutover.to.as_deref()),
        (3, Some("v1"), Some("v2"))
    );
    assert_eq!(
        finding(&analysis, Cause::CacheHitBeforeInvalidation).explanation,
        "new-1 (v2) got a cache hit on inf:5e2a at line 4, 1.5 s after the cutover to v2 began \
         (line 3) and 3.5 s before the cache invalidation finished (line 6): entries of the \
         previous version were still served"
    );
    assert!(
        finding(&analysis, Cause::CrossVersionCache)
            .explanation
            .contains("served an entry of v1, filled by old-1 for request q-1 (line 1)")
    );
    let plan = plan_of(&analysis, Cause::CacheHitBeforeInvalidation);
    assert_eq!(plan.shape, Shape::ReadBeforeInvalidation);
    assert_eq!(workers(&plan), vec![("worker-1", "v1"), ("new-1", "v2")]);
    assert_eq!(
        plan.schedule.steps,
        vec![
            run(0, Checkpoint::Done),
            Step::Fault(Fault::Cutover { to: "v2".into() }),
            run(1, Checkpoint::Done),
            Step::Fault(Fault::InvalidateCache),
        ]
    );
    assert_eq!(
        defects_for(plan.cause, plan.shape),
        vec![Defect::LateCacheInvalidation]
    );
}

#[test]
fn a_celery_worker_log_shows_the_visibility_timeout_double_execution() {
    let analysis = expect(
        fixture!("celery-visibility-timeout.log"),
        &[
            (Cause::MultipleWorkers, "req-314", &[3, 22]),
            (Cause::RetryWhileRunning, "req-314", &[3, 22]),
            (Cause::MultipleFinalWrites, "req-314", &[5, 24]),
            (Cause::VisibilityTimeoutTooShort, "req-314", &[3, 5, 22]),
        ],
    );
    assert_eq!(
        (analysis.lines, analysis.unrelated, analysis.malformed.len()),
        (8, 14, 0)
    );
    let story = &analysis.reconstruction.requests[0];
    assert_eq!(
        story
            .attempts
            .iter()
            .map(|a| (a.attempt, a.executor(), a.events.len()))
            .collect::<Vec<_>>(),
        vec![
            (1, "celery@host-a/ForkPoolWorker-1".to_owned(), 3),
            (2, "celery@host-b/ForkPoolWorker-1".to_owned(), 3)
        ],
        "the second `received` of the task id is a redelivery"
    );
    let timing = finding(&analysis, Cause::VisibilityTimeoutTooShort);
    assert!(
        timing.explanation.ends_with(
            "The queue's visibility timeout (~7.3 s) is shorter than the processing time (12.0 s)"
        ),
        "{}",
        timing.explanation
    );
    let plan = plan_of(&analysis, Cause::MultipleFinalWrites);
    assert_eq!(plan.shape, Shape::RedeliveryWhileRunning);
    assert_eq!(
        workers(&plan),
        vec![("celery@host-a", "v2"), ("celery@host-b", "v2")]
    );
}

/// An apalis worker's own output (tracing's fmt lines behind `docker compose logs` prefixes):
/// the naive example caught by missed heartbeats. apalis' "Re-enqueued N orphaned tasks" and its
/// schema notices are no attempts; the handler's lines are; and the system replay runs apalis'
/// heartbeat fault for them.
#[test]
fn an_apalis_worker_log_shows_the_requeue_after_missed_heartbeats() {
    let analysis = expect(
        fixture!("apalis-heartbeat.tracing.log"),
        &[
            (Cause::MultipleWorkers, "rs8383x0c1-req", &[11, 14]),
            (Cause::LateWrite, "rs8383x0c1-req", &[16, 18]),
            (Cause::VersionSkew, "rs8383x0c1-req", &[11, 14]),
            (Cause::RetryWhileRunning, "rs8383x0c1-req", &[11, 14]),
            (Cause::MultipleFinalWrites, "rs8383x0c1-req", &[16, 18]),
            (
                Cause::VisibilityTimeoutTooShort,
                "rs8383x0c1-req",
                &[11, 14, 18],
            ),
        ],
    );
    assert!(analysis.malformed.is_empty(), "{}", analysis.text());
    let keys = crate::contract::layout::KeyLayout::default();
    assert_eq!(
        system::faults_to_run(&analysis, crate::system::Framework::Apalis, &keys),
        vec![crate::fault::FaultKind::HeartbeatMiss]
    );
}

#[test]
fn a_merged_celery_log_names_workers_by_prefix_and_shows_the_restore_sweep() {
    let log = "\
worker-a-1  | [2026-06-26 10:15:15,210: INFO/MainProcess] celery@a ready.
worker-a-1  | [2026-06-26 10:15:21,104: INFO/MainProcess] Task tasks.infer[t-1] received
worker-b-1  | [2026-06-26 10:15:27,990: INFO/MainProcess] celery@b ready.
worker-b-1  | [2026-06-26 10:15:28,000: WARNING/MainProcess] Restoring 1 unacknowledged message(s)
worker-b-1  | [2026-06-26 10:15:28,415: INFO/MainProcess] Task tasks.infer[t-1] received
worker-a-1  | [2026-06-26 10:15:33,110: INFO/ForkPoolWorker-1] Task tasks.infer[t-1] succeeded in 12.00s: None
worker-b-1  | [2026-06-26 10:15:40,480: INFO/ForkPoolWorker-1] Task tasks.infer[t-1] succeeded in 12.00s: None
";
    let analysis = expect(
        log,
        &[
            (Cause::MultipleWorkers, "t-1", &[2, 5]),
            (Cause::RetryWhileRunning, "t-1", &[2, 5]),
            (Cause::MultipleFinalWrites, "t-1", &[6, 7]),
            (Cause::VisibilityTimeoutTooShort, "t-1", &[2, 4, 5, 6]),
        ],
    );
    assert!(
        finding(&analysis, Cause::MultipleWorkers)
            .explanation
            .ends_with("celery@a/ForkPoolWorker-1, celery@b/ForkPoolWorker-1"),
    );
    let marks: Vec<(usize, Status, Option<&str>)> = analysis
        .reconstruction
        .marks
        .iter()
        .map(|m| (m.line, m.status, m.worker_id.as_deref()))
        .collect();
    assert_eq!(
        marks,
        vec![
            (1, Status::WorkerStarted, Some("celery@a")),
            (3, Status::WorkerStarted, Some("celery@b")),
            (4, Status::DeliveriesRestored, Some("celery@b")),
        ]
    );
}

#[test]
fn a_lost_job_after_an_early_ack() {
    let analysis = expect(
        fixture!("lost-job.python.log"),
        &[
            (Cause::LostJob, "r-9", &[1, 3, 5]),
            (Cause::AckBeforeFinalWrite, "r-9", &[3, 5]),
        ],
    );
    assert_eq!(
        finding(&analysis, Cause::LostJob).explanation,
        "request r-9 was received by wx (v1) at line 1 and never finished: its delivery was \
         acknowledged at line 3 and its worker was lost at line 5, and no attempt wrote a result \
         or failed"
    );
    let plan = plan_of(&analysis, Cause::LostJob);
    assert_eq!(plan.breaks, Invariant::NoLostJob);
    assert_eq!(workers(&plan), vec![("wx", "v1")]);
    assert_eq!(
        plan.schedule.steps,
        vec![run(0, Checkpoint::AfterTake), Step::Crash { worker: 0 }]
    );
    assert_eq!(plan, {
        let mut same = plan_of(&analysis, Cause::AckBeforeFinalWrite);
        same.cause = Cause::LostJob;
        same
    });
}

#[test]
fn a_retry_under_a_new_job_id() {
    let analysis = expect(
        fixture!("new-id-retry.camel.json.log"),
        &[
            (Cause::MultipleWorkers, "order-77", &[1, 4]),
            (Cause::RetryWhileRunning, "order-77", &[1, 4]),
            (Cause::MultipleFinalWrites, "order-77", &[6, 7]),
            (Cause::VisibilityTimeoutTooShort, "order-77", &[1, 4, 6]),
            (Cause::NewJobIdPerRetry, "order-77", &[1, 4]),
        ],
    );
    assert_eq!(
        finding(&analysis, Cause::NewJobIdPerRetry).explanation,
        "request order-77 ran under 2 job ids (job-a1 at line 1, job-f93 at line 4) and 2 \
         idempotency keys (idem-a1 at line 1, idem-f93 at line 4): the retry was a new job, so \
         nothing deduplicated it against the first attempt"
    );
    let plan = plan_of(&analysis, Cause::NewJobIdPerRetry);
    assert_eq!(plan.breaks, Invariant::AtMostOneFinalWrite);
    assert_eq!(
        defects_for(plan.cause, plan.shape),
        vec![Defect::RandomIdPerRetry]
    );
}

#[test]
fn versions_are_renamed_onto_the_test_beds_and_plans_say_when_they_cannot_be_built() {
    let renamed = seed_log()
        .replace("=v1", "=2026-05-a")
        .replace("=v2", "=2026-06-b");
    let analysis = analyse(renamed.as_bytes(), None);
    let late = plan_of(&analysis, Cause::LateWrite);
    assert_eq!(workers(&late), vec![("worker-a", "v1"), ("worker-c", "v2")]);
    assert_eq!(
        late.renamed,
        vec![
            ("2026-05-a".to_owned(), "v1".to_owned()),
            ("2026-06-b".to_owned(), "v2".to_owned())
        ]
    );
    // A bed serving one version cannot host a cutover.
    let skew = finding(&analysis, Cause::VersionSkew);
    let reason = plan(&analysis.reconstruction, skew, &["v1"]).unwrap_err();
    assert!(reason.contains("more model versions"), "{reason}");
    // Writes that name no worker: the log does not say who ran the attempts.
    let anonymous = "\
2026-06-26T12:00:00.000Z INFO request_id=r-1 status=inference_succeeded write=result_store
2026-06-26T12:00:01.000Z INFO request_id=r-1 status=inference_succeeded write=result_store
";
    let analysis = expect(anonymous, &[(Cause::MultipleFinalWrites, "r-1", &[1, 2])]);
    let writes = finding(&analysis, Cause::MultipleFinalWrites);
    let reason = plan(&analysis.reconstruction, writes, &SERVED).unwrap_err();
    assert!(reason.contains("re-creating the overlap needs"), "{reason}");
}

#[test]
fn a_run_log_reads_back_as_the_incident_did() {
    let line = |status: Status, extra: &[(&str, &str)]| {
        let mut fields = vec![
            ("request_id".to_owned(), "req-0".to_owned()),
            ("idempotency_key".to_owned(), "k".to_owned()),
            ("attempt".to_owned(), "1".to_owned()),
            ("worker_id".to_owned(), "worker-a".to_owned()),
            ("model_version".to_owned(), "v1".to_owned()),
        ];
        fields.extend(
            extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        fields.push(("status".to_owned(), status.as_str().to_owned()));
        EventKind::Worker(LogLine {
            ts: "2026-06-26T10:00:00.000Z".into(),
            level: Level::Info,
            fields,
        })
    };
    let history = History {
        events: [
            line(Status::JobReceived, &[]),
            line(Status::JobTaken, &[]),
            line(Status::Acked, &[]),
            EventKind::Fault(crate::fault::Effect::WorkerCrashed {
                worker: "worker-a".into(),
                at: Some("after_take".into()),
            }),
        ]
        .into_iter()
        .map(|kind| HistoryEvent {
            step: 1,
            at_ms: 0,
            kind,
        })
        .collect(),
        ..History::default()
    };
    let analysis = analyse(run_log(&history).as_bytes(), None);
    let found: Vec<(Cause, Vec<usize>)> = analysis
        .findings
        .iter()
        .map(|f| (f.cause, f.lines.clone()))
        .collect();
    assert_eq!(
        found,
        vec![
            (Cause::LostJob, vec![1, 3, 4]),
            (Cause::AckBeforeFinalWrite, vec![3, 4])
        ]
    );
}

#[test]
fn the_json_report_carries_causes_plans_and_reasons() {
    let analysis = analyse(fixture!("lost-job.python.log").as_bytes(), None);
    let plan = plan_of(&analysis, Cause::LostJob);
    let run = |defects: Vec<String>, verdict, violations| Run {
        worker: reproduce::REFERENCE_WORKER.to_owned(),
        protections: Vec::new(),
        defects,
        verdict,
        violations,
        diagnosed_again: true,
        timeline: String::new(),
    };
    let report = ReplayReport {
        analysis,
        worker: reproduce::REFERENCE_WORKER.to_owned(),
        defects_given: None,
        reproductions: vec![
            Reproduction {
                cause: Cause::LostJob,
                request_id: "r-9".into(),
                outcome: Outcome::Ran {
                    plan,
                    runs: vec![
                        run(
                            vec!["ack-before-final-write".into()],
                            Verdict::Reproduced,
                            vec![Broken {
                                invariant: Invariant::NoLostJob,
                                observed: "request r-9 is IN_PROGRESS".into(),
                                evidence: Vec::new(),
                            }],
                        ),
                        run(Vec::new(), Verdict::Prevented, Vec::new()),
                    ],
                },
            },
            Reproduction {
                cause: Cause::AckBeforeFinalWrite,
                request_id: "r-9".into(),
                outcome: Outcome::CouldNotBeBuilt {
                    reason: "for the test".into(),
                },
            },
        ],
    };
    assert!(report.held(), "the safe run held");
    let json = serde_json::to_value(&report).unwrap();
    let first = &json["reproductions"][0];
    assert_eq!(first["cause"], "lost-job");
    assert_eq!(first["status"], "ran");
    assert_eq!(first["plan"]["breaks"], "no-lost-job");
    assert_eq!(first["plan"]["shape"], "crash-before-final-write");
    assert_eq!(first["runs"][0]["verdict"], "reproduced");
    assert_eq!(
        first["runs"][0]["violations"][0]["invariant"],
        "no-lost-job"
    );
    assert_eq!(json["reproductions"][1]["status"], "could-not-be-built");
    assert_eq!(json["reproductions"][1]["reason"], "for the test");
    assert_eq!(json["analysis"]["findings"][0]["cause"], "lost-job");
    assert_eq!(
        json["analysis"]["findings"][0]["lines"],
        serde_json::json!([1, 3, 5])
    );
    let text = report.text();
    assert!(
        text.contains("reproduced with ack-before-final-write: no-lost-job broke"),
        "{text}"
    );
    assert!(
        text.contains("prevented by the safe reference: every invariant held"),
        "{text}"
    );
    assert!(text.contains("could not be built: for the test"), "{text}");
}

#[test]
fn garbage_yields_a_report_and_no_story() {
    for input in [
        &b""[..],
        b"\x00\x01\x02\xff\xfe",
        b"2026-06-26T10:15:21.104Z INFO request_id=\"unterminated",
        b"hello world\nno fields\n",
    ] {
        let analysis = analyse(input, None);
        assert!(analysis.reconstruction.requests.is_empty());
        assert!(analysis.findings.is_empty());
        assert!(analysis.text().contains("no race in these lines"));
    }
}

/// A Celery incident as the workers' own output shows it (Celery's lines and the task's, behind
/// `compose logs` prefixes): one attempt per delivery, the task's lines joined to the attempt
/// Celery's `received` opened, Celery's `succeeded in` not counted as a second write.
#[test]
fn a_celery_redelivery_is_two_attempts_with_two_final_writes() {
    let analysis = super::analyse(
        include_str!("../../crates/logs/fixtures/celery-compose.log").as_bytes(),
        None,
    );
    assert!(analysis.malformed.is_empty(), "{}", analysis.text());
    let story = analysis
        .reconstruction
        .request("req-1")
        .unwrap_or_else(|| panic!("{}", analysis.text()));
    let who: Vec<(u32, &str)> = story
        .attempts
        .iter()
        .map(|a| (a.attempt, a.worker_id.as_str()))
        .collect();
    assert_eq!(
        who,
        [(1, "worker-a@racecert"), (2, "worker-b@racecert")],
        "{}",
        analysis.text()
    );
    let causes: Vec<Cause> = analysis.findings.iter().map(|f| f.cause).collect();
    for cause in [
        Cause::MultipleFinalWrites,
        Cause::LateWrite,
        Cause::RetryWhileRunning,
        Cause::VisibilityTimeoutTooShort,
        Cause::VersionSkew,
    ] {
        assert!(
            causes.contains(&cause),
            "{cause} missing: {}",
            analysis.text()
        );
    }
    let writes = analysis
        .findings
        .iter()
        .find(|f| f.cause == Cause::MultipleFinalWrites)
        .map(|f| f.lines.clone());
    assert_eq!(writes, Some(vec![21, 23]), "{}", analysis.text());
}

/// prefetch > 1, as the Celery example's workers logged it under racecert's `prefetch-restore`
/// (shortened): worker-a reserved the request behind a slow task, the reserved delivery was
/// restored and worker-a took it back, then ran the request twice in a row on its one pool
/// process. Two attempts in order of receipt, each with its own lines and one final write; Celery's
/// `succeeded in` goes to the attempt that just ran on the process, not to the one waiting.
#[test]
fn a_prefetched_celery_request_restored_to_the_same_worker_is_two_attempts_in_order() {
    const LOG: &str = "\
worker-a | [2026-11-30 00:24:09,996: INFO/MainProcess] worker-a@racecert ready.
worker-a | [2026-11-30 00:24:10,098: INFO/MainProcess] Task tasks.infer_naive[b4b0] received
worker-a | [2026-11-30 00:24:16,282: INFO/MainProcess] Task tasks.infer_naive[b4b0] received
worker-a | [2026-11-30 00:24:23,246: INFO/ForkPoolWorker-1] tasks.infer_naive[b4b0]: request_id=req-p job_id=b4b0 attempt=1 redelivered=false worker_id=worker-a model_version=v1 status=job_received
worker-a | [2026-11-30 00:24:23,264: INFO/ForkPoolWorker-1] tasks.infer_naive[b4b0]: request_id=req-p job_id=b4b0 attempt=1 redelivered=false worker_id=worker-a model_version=v1 status=inference_started
worker-a | [2026-11-30 00:24:23,268: INFO/ForkPoolWorker-1] tasks.infer_naive[b4b0]: request_id=req-p job_id=b4b0 attempt=1 redelivered=false worker_id=worker-a model_version=v1 status=inference_succeeded write=result_store
worker-a | [2026-11-30 00:24:23,268: INFO/ForkPoolWorker-1] Task tasks.infer_naive[b4b0] succeeded in 0.021s: None
worker-a | [2026-11-30 00:24:23,274: INFO/ForkPoolWorker-1] tasks.infer_naive[b4b0]: request_id=req-p job_id=b4b0 attempt=1 redelivered=true worker_id=worker-a model_version=v1 status=retry_dispatched
worker-a | [2026-11-30 00:24:23,282: INFO/ForkPoolWorker-1] tasks.infer_naive[b4b0]: request_id=req-p job_id=b4b0 attempt=1 redelivered=true worker_id=worker-a model_version=v1 status=inference_started
worker-a | [2026-11-30 00:24:23,290: INFO/ForkPoolWorker-1] tasks.infer_naive[b4b0]: request_id=req-p job_id=b4b0 attempt=1 redelivered=true worker_id=worker-a model_version=v1 status=inference_succeeded write=result_store
worker-a | [2026-11-30 00:24:23,290: INFO/ForkPoolWorker-1] Task tasks.infer_naive[b4b0] succeeded in 0.016s: None
";
    let analysis = super::analyse(LOG.as_bytes(), None);
    let story = analysis
        .reconstruction
        .request("req-p")
        .unwrap_or_else(|| panic!("{}", analysis.text()));
    let lines: Vec<Vec<usize>> = story
        .attempts
        .iter()
        .map(|a| a.events.iter().map(|e| e.line).collect())
        .collect();
    assert_eq!(
        lines,
        [vec![2, 4, 5, 6, 7], vec![3, 8, 9, 10, 11]],
        "{}",
        analysis.text()
    );
    let writes = analysis
        .findings
        .iter()
        .find(|f| f.cause == Cause::MultipleFinalWrites)
        .map(|f| f.lines.clone());
    assert_eq!(writes, Some(vec![6, 10]), "{}", analysis.text());
    // Sequential runs on one process: the second did not overwrite a newer result.
    assert!(
        !analysis
            .findings
            .iter()
            .any(|f| f.cause == Cause::LateWrite),
        "{}",
        analysis.text()
    );
}

mod roles;
mod shapes;
