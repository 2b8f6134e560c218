//! Roles and redeliveries from evidence: the API that submits, times out waiting and resubmits is
//! the submitter, not a worker, and its resubmission is no queue redelivery; a visibility-timeout
//! cause needs the queue's own evidence (a receive count, a redelivered flag, a restore sweep, the
//! same job received again); Celery's framework notices (`Restoring N unacknowledged
//! message(s)`, two `succeeded in` of one task id) are that evidence and two final writes.

use super::*;

/// A fixture of the corpus (this file sits one directory deeper than `fixture!`'s).
macro_rules! corpus {
    ($name:literal) => {
        include_str!(concat!("../../../tests/fixtures/incidents/", $name))
    };
}

const API: &str = "infer-api-6d5f8b7c9-q4wzt";

/// The API's lines in `api-resubmit.json.log`: accepted, submitted, two timeouts, resubmitted.
const API_LINES: [usize; 5] = [1, 2, 5, 6, 13];

/// The API submits x-1 as j-1, times out waiting, resubmits it as j-2; w-1 and w-2 run one job
/// each and both write. Two workers, a new job per retry, two final writes; the API is none of
/// the workers and its resubmission is no redelivery.
#[test]
fn an_api_resubmitting_after_its_own_timeout_is_the_submitter_not_a_worker() {
    let analysis = expect(
        corpus!("api-resubmit.json.log"),
        &[
            (Cause::MultipleWorkers, "x-1", &[3, 7]),
            (Cause::RetryWhileRunning, "x-1", &[3, 7]),
            (Cause::MultipleFinalWrites, "x-1", &[9, 11]),
            (Cause::NewJobIdPerRetry, "x-1", &[2, 6]),
        ],
    );
    assert_eq!(
        finding(&analysis, Cause::MultipleWorkers).explanation,
        "request x-1 was executed by 2 workers: w-1, w-2"
    );
    assert_eq!(
        finding(&analysis, Cause::NewJobIdPerRetry).explanation,
        "request x-1 ran under 2 job ids (j-1 at line 2, j-2 at line 6): the retry was a new job, \
         so nothing deduplicated it against the first attempt"
    );
    // The ids were first logged by the API; the attempts that ran under them are the workers'.
    assert_eq!(
        finding(&analysis, Cause::NewJobIdPerRetry)
            .actors
            .iter()
            .map(|a| a.worker_id.as_deref())
            .collect::<Vec<_>>(),
        vec![Some("w-1"), Some("w-2")]
    );
    let story = analysis.reconstruction.request("x-1").unwrap();
    assert_eq!(story.submitters, vec![API.to_owned()]);
    assert_eq!(
        story.other.iter().map(|e| e.line).collect::<Vec<_>>(),
        API_LINES
    );
    for f in &analysis.findings {
        assert!(
            f.actors.iter().all(|a| a.worker_id.as_deref() != Some(API)),
            "{f:?}"
        );
        if f.cause == Cause::RetryWhileRunning {
            assert!(f.lines.iter().all(|l| !API_LINES.contains(l)), "{f:?}");
        }
    }
}

/// The role comes from what the process logged, not from its name: called `w-3`, the API is
/// still the submitter.
#[test]
fn the_submitter_is_known_by_its_lines_not_its_name() {
    let log = corpus!("api-resubmit.json.log").replace(API, "w-3");
    let analysis = expect(
        &log,
        &[
            (Cause::MultipleWorkers, "x-1", &[3, 7]),
            (Cause::RetryWhileRunning, "x-1", &[3, 7]),
            (Cause::MultipleFinalWrites, "x-1", &[9, 11]),
            (Cause::NewJobIdPerRetry, "x-1", &[2, 6]),
        ],
    );
    assert_eq!(
        analysis.reconstruction.requests[0].submitters,
        vec!["w-3".to_owned()]
    );
    // A process that submits and also calls the model is a worker.
    let log = "\
2026-08-20T09:00:00.000Z INFO request_id=r-1 job_id=j-1 worker_id=w-9 status=submitted
2026-08-20T09:00:00.100Z INFO request_id=r-1 job_id=j-1 worker_id=w-9 status=inference_started
2026-08-20T09:00:01.000Z INFO request_id=r-1 job_id=j-1 worker_id=w-9 status=inference_succeeded write=result_store
";
    let analysis = expect(log, &[]);
    let story = &analysis.reconstruction.requests[0];
    assert!(story.submitters.is_empty(), "{story:?}");
    assert_eq!(story.attempts.len(), 1);
}

/// The API resubmitting under the same job id: the second receipt of j-1 is the API's retry, not
/// the queue's redelivery (its receive count says 1), and no new job id was made.
#[test]
fn an_api_retry_under_the_same_job_id_is_no_redelivery() {
    let log = corpus!("api-resubmit.json.log").replace("\"j-2\"", "\"j-1\"");
    expect(
        &log,
        &[
            (Cause::MultipleWorkers, "x-1", &[3, 7]),
            (Cause::RetryWhileRunning, "x-1", &[3, 7]),
            (Cause::MultipleFinalWrites, "x-1", &[9, 11]),
        ],
    );
}

/// The same story, but the queue redelivers j-1 itself (`receive_count` 2) while w-1 still runs
/// it: the visibility timeout is found, and the API is still no worker.
#[test]
fn a_queue_redelivery_beside_the_api_is_still_the_visibility_timeout() {
    let expected: &[(Cause, &str, &[usize])] = &[
        (Cause::MultipleWorkers, "x-1", &[3, 6]),
        (Cause::RetryWhileRunning, "x-1", &[3, 6]),
        (Cause::MultipleFinalWrites, "x-1", &[8, 10]),
        (Cause::VisibilityTimeoutTooShort, "x-1", &[3, 6, 8]),
    ];
    let log = corpus!("queue-redelivery.json.log");
    let analysis = expect(log, expected);
    assert_eq!(
        finding(&analysis, Cause::MultipleWorkers).explanation,
        "request x-1 was executed by 2 workers: w-1, w-2"
    );
    assert!(
        finding(&analysis, Cause::VisibilityTimeoutTooShort)
            .explanation
            .ends_with(
                "The queue's visibility timeout (~10.0 s) is shorter than the processing time \
                 (13.7 s)"
            )
    );
    assert_eq!(
        analysis.reconstruction.requests[0].submitters,
        vec![API.to_owned()]
    );
    // Each kind of evidence alone: a redelivered flag, or the same job id received again.
    let flagged = log.replace("\"receive_count\":2", "\"redelivered\":true");
    expect(&flagged, expected);
    let same_id = log.replace("\"receive_count\":2,", "");
    expect(&same_id, expected);
}

/// Two Celery workers' own output merged by time, the second's banner in the middle (so every
/// line after it bears the second's name): the task received by infer-a, restored by infer-b's
/// `Restoring 1 unacknowledged message(s)` and received again, then `succeeded` twice. Each
/// `succeeded in N s` ends the execution that began N s before it: two attempts, two final
/// writes, the visibility timeout.
#[test]
fn merged_celery_workers_show_two_final_writes_and_the_visibility_timeout() {
    const TASK: &str = "7d3c1a52-4b0e-4f7a-9e21-5c8d0b6a3f14";
    let analysis = expect(
        corpus!("celery-merged.log"),
        &[
            (Cause::MultipleWorkers, TASK, &[22, 43]),
            (Cause::RetryWhileRunning, TASK, &[22, 43]),
            (Cause::MultipleFinalWrites, TASK, &[44, 45]),
            (Cause::VisibilityTimeoutTooShort, TASK, &[22, 42, 43, 44]),
        ],
    );
    assert!(analysis.malformed.is_empty(), "{}", analysis.text());
    let story = analysis.reconstruction.request(TASK).unwrap();
    assert_eq!(
        story
            .attempts
            .iter()
            .map(|a| (
                a.executor(),
                a.events.iter().map(|e| e.line).collect::<Vec<_>>()
            ))
            .collect::<Vec<_>>(),
        vec![
            ("celery@infer-a/ForkPoolWorker-1".to_owned(), vec![22, 44]),
            ("celery@infer-b/ForkPoolWorker-1".to_owned(), vec![43, 45]),
        ]
    );
    assert!(
        finding(&analysis, Cause::MultipleFinalWrites)
            .explanation
            .contains("the last, by attempt 2 on celery@infer-b/ForkPoolWorker-1"),
        "{}",
        analysis.text()
    );
    assert!(
        finding(&analysis, Cause::VisibilityTimeoutTooShort)
            .explanation
            .ends_with(
                "The queue's visibility timeout (~30.2 s) is shorter than the processing time \
                 (36.9 s)"
            ),
        "{}",
        analysis.text()
    );
}
