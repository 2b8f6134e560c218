//! The reference pipeline on the real test bed: the happy path, the seed's story replayed by hand
//! with checkpoints and a backend delay, and one hand-written interleaving per defect, run with
//! the defect on (it produces its bad outcome) and off (it stays correct).

use racecert::contract::JobRow;
use racecert::contract::checkpoint::{Checkpoint, Gate};
use racecert::contract::defect::{Defect, Defects};
use racecert::contract::delivery::Delivery;
use racecert::contract::log::LogSink;
use racecert::contract::{model_output, output_version};
use racecert::env::TestBed;
use racecert::env::backends::Behaviour;
use racecert::reference::Pipeline;
use racecert::reference::submit::InferenceRequest;
use racecert::reference::worker::{Outcome, Worker};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

crate::tests!(
    happy_path_one_succeeded_row_and_an_identical_request_is_answered_from_the_cache,
    seed_story_reference_worker_rejects_the_late_v1_write,
    seed_story_unfenced_final_write_lets_v1_overwrite_v2,
    defect_unversioned_cache_key_serves_v1_output_after_cutover,
    defect_retry_without_dedupe_runs_the_backend_twice,
    defect_random_id_per_retry_gives_one_request_two_final_results,
    defect_late_cache_invalidation_serves_stale_output_until_it_runs,
    defect_reread_active_version_stores_a_result_labelled_with_another_version,
    defect_ack_before_final_write_loses_the_job_when_the_worker_crashes,
);

/// One test's pipeline and gate.
struct Case {
    pipeline: Pipeline,
    gate: Arc<Gate>,
}

impl Case {
    async fn new(bed: &TestBed, name: &str) -> anyhow::Result<Case> {
        let namespace = crate::namespace(name);
        Ok(Case {
            pipeline: Pipeline::on(bed, &namespace, LogSink::default()).await?,
            gate: Arc::new(Gate::new(Duration::from_secs(20))),
        })
    }

    /// A worker with short timeouts, defects as given, held by the gate if `held`.
    async fn worker(
        &self,
        id: &str,
        version: &str,
        defects: &Defects,
        held: bool,
    ) -> anyhow::Result<Arc<Worker>> {
        let config = self
            .pipeline
            .worker_config(id, version)
            .backend_timeout(Duration::from_secs(3))
            .upstream_warn_after(Duration::from_millis(100))
            .visibility_timeout(Duration::from_secs(30))
            .lease_ttl(Duration::from_secs(30))
            .defects(defects.clone())
            .build()?;
        if held {
            self.gate.hold(id);
        }
        Ok(Arc::new(
            self.pipeline
                .worker(config, self.gate.checkpoints())
                .await?,
        ))
    }

    async fn submit(&mut self, request_id: &str, input: &str) -> anyhow::Result<String> {
        let submitted = self
            .pipeline
            .api
            .submit(&InferenceRequest {
                request_id: request_id.into(),
                input: input.into(),
            })
            .await?;
        Ok(submitted.idempotency_key)
    }

    async fn job(&self, key: &str) -> anyhow::Result<JobRow> {
        self.pipeline
            .job(key)
            .await?
            .ok_or_else(|| anyhow::anyhow!("job {key} missing"))
    }

    fn statuses_of(&self, worker: &str) -> Vec<String> {
        self.pipeline
            .log
            .matching("worker_id", worker)
            .iter()
            .filter_map(|l| l.status().map(str::to_owned))
            .collect()
    }
}

fn spawn(worker: &Arc<Worker>, delivery: Delivery) -> JoinHandle<racecert::Result<Outcome>> {
    let worker = worker.clone();
    tokio::spawn(async move { worker.process(delivery).await })
}

async fn receive(worker: &Worker) -> anyhow::Result<Delivery> {
    worker
        .receive()
        .await?
        .ok_or_else(|| anyhow::anyhow!("{} received nothing", worker.id()))
}

async fn redeliver(worker: &Worker) -> anyhow::Result<Delivery> {
    worker
        .receive_redelivery()
        .await?
        .ok_or_else(|| anyhow::anyhow!("{}: nothing to redeliver", worker.id()))
}

async fn happy_path_one_succeeded_row_and_an_identical_request_is_answered_from_the_cache(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let mut case = Case::new(bed, "happy").await?;
    let worker = case
        .worker("worker-a", "v1", &Defects::none(), false)
        .await?;
    let key = case.submit("req-1", "  What is   X? ").await?;
    let duplicate = case
        .pipeline
        .api
        .submit(&InferenceRequest {
            request_id: "req-1".into(),
            input: "What is X?".into(),
        })
        .await?;
    anyhow::ensure!(
        duplicate.idempotency_key == key && !duplicate.created,
        "a duplicate submission must map to the same job and not enqueue it again"
    );
    let outcomes = worker.run_until_idle().await?;
    anyhow::ensure!(
        outcomes
            == vec![Outcome::Succeeded {
                generation: 2,
                from_cache: false
            }],
        "outcomes {outcomes:?}"
    );
    let row = case.job(&key).await?;
    anyhow::ensure!(row.status == "SUCCEEDED" && row.model_version.as_deref() == Some("v1"));
    anyhow::ensure!(row.output.as_deref() == Some(model_output("What is X?", "v1").as_str()));

    // A second request (another request id) with the same input: answered from the cache.
    let second = case.submit("req-2", "What is X?").await?;
    let outcomes = worker.run_until_idle().await?;
    anyhow::ensure!(
        outcomes
            == vec![Outcome::Succeeded {
                generation: 2,
                from_cache: true
            }],
        "second request: {outcomes:?}"
    );
    anyhow::ensure!(case.job(&second).await?.output == row.output);
    let calls = bed
        .backend("v1")?
        .journal(Some(case.pipeline.keys.prefix()))
        .await
        .len();
    anyhow::ensure!(calls == 1, "backend called {calls} times, expected once");
    Ok(())
}

/// The seed's story: attempt 1 on a v1 worker waits on a slow backend (timeout_waiting_upstream),
/// its lease runs out, the job is redelivered to a v2 worker which succeeds first, then attempt 1
/// finishes late. Returns the case, the key and worker A's outcome.
async fn seed_story(bed: &TestBed, defects: Defects) -> anyhow::Result<(Case, String, Outcome)> {
    let mut case = Case::new(bed, "seed").await?;
    let a = case.worker("worker-a", "v1", &defects, true).await?;
    let c = case.worker("worker-c", "v2", &defects, false).await?;
    let _slow = bed
        .backend("v1")?
        .program(
            case.pipeline.keys.prefix(),
            Behaviour::Delay(Duration::from_millis(400)),
        )
        .await?;
    let key = case.submit("req-91", "the seed's input").await?;

    let attempt1 = spawn(&a, receive(&a).await?);
    // Attempt 1 waits on the slow v1 backend, warns, gets its answer, and is held before writing.
    let parked = case
        .gate
        .run_to("worker-a", Checkpoint::BeforeFinalWrite)
        .await?;
    // Its lease expires (the schedule makes the TTL pass) and the queue redelivers the job.
    anyhow::ensure!(
        case.pipeline.expire_lease(&key).await?,
        "lease of attempt 1 was not held"
    );
    let retry = redeliver(&c).await?;
    anyhow::ensure!(
        retry.receive_count == 2,
        "retry delivery count {}",
        retry.receive_count
    );
    let attempt2 = c.process(retry).await?;
    anyhow::ensure!(
        matches!(attempt2, Outcome::Succeeded { .. }),
        "attempt 2 (v2) should succeed first: {attempt2:?}"
    );
    // Attempt 1 had not failed: it goes on and writes late.
    parked.proceed();
    case.gate.free("worker-a");
    let outcome1 = attempt1.await??;
    Ok((case, key, outcome1))
}

fn check_seed_log(case: &Case, late_words: &[&str]) -> anyhow::Result<()> {
    let a = case.statuses_of("worker-a");
    for word in [
        "cache_miss",
        "inference_started",
        "timeout_waiting_upstream",
    ]
    .iter()
    .chain(late_words)
    {
        anyhow::ensure!(
            a.iter().any(|s| s == word),
            "worker-a never logged {word}: {a:?}"
        );
    }
    let c = case.statuses_of("worker-c");
    for word in ["retry_dispatched", "inference_succeeded"] {
        anyhow::ensure!(
            c.iter().any(|s| s == word),
            "worker-c never logged {word}: {c:?}"
        );
    }
    // Every worker line carries the seed's diagnosis fields.
    for line in case
        .pipeline
        .log
        .lines()
        .iter()
        .filter(|l| l.get("worker_id").is_some())
    {
        for field in racecert::contract::LOG_FIELDS {
            anyhow::ensure!(
                line.get(field).is_some(),
                "line without {field}: {}",
                line.to_logfmt()
            );
        }
    }
    let success = case.pipeline.log.matching("status", "inference_succeeded");
    anyhow::ensure!(
        success
            .iter()
            .all(|l| l.get("write") == Some("result_store"))
    );
    Ok(())
}

async fn seed_story_reference_worker_rejects_the_late_v1_write(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let (case, key, outcome1) = seed_story(bed, Defects::none()).await?;
    anyhow::ensure!(
        outcome1 == Outcome::LateWriteRejected,
        "attempt 1: {outcome1:?}"
    );
    let row = case.job(&key).await?;
    anyhow::ensure!(
        row.model_version.as_deref() == Some("v2")
            && output_version(row.output.as_deref().unwrap_or("")) == Some("v2"),
        "stored result must stay v2's: {row:?}"
    );
    anyhow::ensure!(
        case.pipeline.final_writes(&key).await?.len() == 1,
        "exactly one final write"
    );
    check_seed_log(&case, &["late_write_rejected", "discarded_late_result"])
}

async fn seed_story_unfenced_final_write_lets_v1_overwrite_v2(bed: &TestBed) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let (case, key, outcome1) = seed_story(bed, Defects::of([Defect::UnfencedFinalWrite])).await?;
    anyhow::ensure!(
        outcome1
            == Outcome::Overwrote {
                previous_version: Some("v2".into())
            },
        "attempt 1: {outcome1:?}"
    );
    let row = case.job(&key).await?;
    anyhow::ensure!(
        row.model_version.as_deref() == Some("v1"),
        "the late v1 result overwrote v2: {row:?}"
    );
    let finals = case.pipeline.final_writes(&key).await?;
    anyhow::ensure!(
        finals.len() == 2,
        "two final writes expected, audit shows {finals:?}"
    );
    let overwrite = case.pipeline.log.matching("status", "overwrite_detected");
    anyhow::ensure!(
        overwrite.len() == 1
            && overwrite[0].get("previous_model_version") == Some("v2")
            && overwrite[0].get("new_model_version") == Some("v1")
    );
    check_seed_log(&case, &["late_success"])
}

/// v1 answers input X and caches it; cutover to v2; a v2 worker answers a new request for X.
/// Returns the stored row of the second request.
async fn cache_across_cutover(
    bed: &TestBed,
    defects: Defects,
    invalidate_before_second: bool,
) -> anyhow::Result<(Case, JobRow)> {
    let mut case = Case::new(bed, "cache").await?;
    let v1 = case.worker("worker-a", "v1", &defects, false).await?;
    let v2 = case.worker("worker-b", "v2", &defects, false).await?;
    case.submit("req-1", "input X").await?;
    v1.run_until_idle().await?;
    let mut cutover = case.pipeline.cutover("v2", &defects).await?;
    if invalidate_before_second {
        case.pipeline.invalidate(&mut cutover).await?;
    }
    let second = case.submit("req-2", "input X").await?;
    v2.run_until_idle().await?;
    let row = case.job(&second).await?;
    Ok((case, row))
}

fn produced_by(row: &JobRow) -> Option<&str> {
    row.output.as_deref().and_then(output_version)
}

async fn defect_unversioned_cache_key_serves_v1_output_after_cutover(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let (_, bad) =
        cache_across_cutover(bed, Defects::of([Defect::UnversionedCacheKey]), false).await?;
    anyhow::ensure!(
        bad.model_version.as_deref() == Some("v2") && produced_by(&bad) == Some("v1"),
        "with the defect the v2 job is answered with v1's cached output: {bad:?}"
    );
    let (_, good) = cache_across_cutover(bed, Defects::none(), false).await?;
    anyhow::ensure!(
        good.model_version.as_deref() == Some("v2") && produced_by(&good) == Some("v2"),
        "reference: v2 job answered by v2: {good:?}"
    );
    Ok(())
}

async fn defect_late_cache_invalidation_serves_stale_output_until_it_runs(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let defects = Defects::of([Defect::LateCacheInvalidation]);
    let (_, stale) = cache_across_cutover(bed, defects.clone(), false).await?;
    anyhow::ensure!(
        produced_by(&stale) == Some("v1"),
        "before the late invalidation: {stale:?}"
    );
    let (_, fresh) = cache_across_cutover(bed, defects, true).await?;
    anyhow::ensure!(
        produced_by(&fresh) == Some("v2"),
        "after the invalidation: {fresh:?}"
    );
    let (_, good) = cache_across_cutover(bed, Defects::none(), false).await?;
    anyhow::ensure!(produced_by(&good) == Some("v2"), "reference: {good:?}");
    Ok(())
}

/// Worker A takes the job and is held before its backend call; the job is redelivered to B while
/// A still runs. Returns the backend calls of the case and both outcomes.
async fn overlapping_retry(
    bed: &TestBed,
    defects: Defects,
) -> anyhow::Result<(usize, Outcome, Outcome)> {
    let mut case = Case::new(bed, "overlap").await?;
    let a = case.worker("worker-a", "v1", &defects, true).await?;
    let b = case.worker("worker-b", "v1", &defects, false).await?;
    case.submit("req-1", "input").await?;
    let first = spawn(&a, receive(&a).await?);
    let parked = case
        .gate
        .run_to("worker-a", Checkpoint::BeforeBackendCall)
        .await?;
    let second = b.process(redeliver(&b).await?).await?;
    parked.proceed();
    case.gate.free("worker-a");
    let first = first.await??;
    let calls = bed
        .backend("v1")?
        .journal(Some(case.pipeline.keys.prefix()))
        .await
        .len();
    Ok((calls, first, second))
}

async fn defect_retry_without_dedupe_runs_the_backend_twice(bed: &TestBed) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let (calls, _, second) =
        overlapping_retry(bed, Defects::of([Defect::RetryWithoutDedupe])).await?;
    anyhow::ensure!(
        calls == 2 && matches!(second, Outcome::Succeeded { .. }),
        "with the defect both attempts run: {calls} calls, retry {second:?}"
    );
    let (calls, first, second) = overlapping_retry(bed, Defects::none()).await?;
    anyhow::ensure!(
        calls == 1
            && second == Outcome::DuplicateSkipped
            && matches!(first, Outcome::Succeeded { .. }),
        "reference: the retry is skipped as a duplicate: {calls} calls, {first:?}, {second:?}"
    );
    Ok(())
}

/// A holds the job before its final write, its lease expires, B gets the redelivery and finishes,
/// then A resumes. Returns the rows of the request.
async fn retry_after_expiry(bed: &TestBed, defects: Defects) -> anyhow::Result<Vec<JobRow>> {
    let mut case = Case::new(bed, "newid").await?;
    let a = case.worker("worker-a", "v1", &defects, true).await?;
    let b = case.worker("worker-b", "v1", &defects, false).await?;
    let key = case.submit("req-7", "input").await?;
    let first = spawn(&a, receive(&a).await?);
    let parked = case
        .gate
        .run_to("worker-a", Checkpoint::BeforeFinalWrite)
        .await?;
    case.pipeline.expire_lease(&key).await?;
    b.process(redeliver(&b).await?).await?;
    parked.proceed();
    case.gate.free("worker-a");
    first.await??;
    Ok(case.pipeline.jobs_of_request("req-7").await?)
}

async fn defect_random_id_per_retry_gives_one_request_two_final_results(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let rows = retry_after_expiry(bed, Defects::of([Defect::RandomIdPerRetry])).await?;
    let succeeded = rows.iter().filter(|r| r.status == "SUCCEEDED").count();
    anyhow::ensure!(
        rows.len() == 2 && succeeded == 2,
        "with the defect the retry is a second job with its own final result: {rows:?}"
    );
    let rows = retry_after_expiry(bed, Defects::none()).await?;
    anyhow::ensure!(
        rows.len() == 1
            && rows[0].status == "SUCCEEDED"
            && rows[0].worker_id.as_deref() == Some("worker-b"),
        "reference: one job, completed by the retry: {rows:?}"
    );
    Ok(())
}

/// Worker A (bound to v1) calls its backend, then cutover to v2 happens before its final write.
async fn cutover_mid_job(bed: &TestBed, defects: Defects) -> anyhow::Result<JobRow> {
    let mut case = Case::new(bed, "reread").await?;
    let a = case.worker("worker-a", "v1", &defects, true).await?;
    let key = case.submit("req-1", "input").await?;
    let run = spawn(&a, receive(&a).await?);
    let parked = case
        .gate
        .run_to("worker-a", Checkpoint::BeforeFinalWrite)
        .await?;
    case.pipeline.cutover("v2", &defects).await?;
    parked.proceed();
    case.gate.free("worker-a");
    run.await??;
    case.job(&key).await
}

async fn defect_reread_active_version_stores_a_result_labelled_with_another_version(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let bad = cutover_mid_job(bed, Defects::of([Defect::RereadActiveVersion])).await?;
    anyhow::ensure!(
        bad.model_version.as_deref() == Some("v2") && produced_by(&bad) == Some("v1"),
        "with the defect the record names v2 but v1 produced it: {bad:?}"
    );
    let good = cutover_mid_job(bed, Defects::none()).await?;
    anyhow::ensure!(
        good.model_version.as_deref() == Some("v1") && produced_by(&good) == Some("v1"),
        "reference: bound to v1 for the whole job: {good:?}"
    );
    Ok(())
}

/// A crashes just before its final write; the lease expires; B asks for a redelivery.
async fn crash_before_final_write(
    bed: &TestBed,
    defects: Defects,
) -> anyhow::Result<(Option<Delivery>, JobRow)> {
    let mut case = Case::new(bed, "crash").await?;
    let a = case.worker("worker-a", "v1", &defects, true).await?;
    let b = case.worker("worker-b", "v1", &defects, false).await?;
    let key = case.submit("req-1", "input").await?;
    let run = spawn(&a, receive(&a).await?);
    case.gate
        .run_to("worker-a", Checkpoint::BeforeFinalWrite)
        .await?
        .crash();
    anyhow::ensure!(run.await?? == Outcome::Crashed(Checkpoint::BeforeFinalWrite));
    case.pipeline.expire_lease(&key).await?;
    let redelivery = b.receive_redelivery().await?;
    if let Some(delivery) = redelivery.clone() {
        b.process(delivery).await?;
    }
    Ok((redelivery, case.job(&key).await?))
}

async fn defect_ack_before_final_write_loses_the_job_when_the_worker_crashes(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let (redelivery, row) =
        crash_before_final_write(bed, Defects::of([Defect::AckBeforeFinalWrite])).await?;
    anyhow::ensure!(
        redelivery.is_none() && row.status == "IN_PROGRESS",
        "with the defect the job is acked and lost: {redelivery:?}, {row:?}"
    );
    let (redelivery, row) = crash_before_final_write(bed, Defects::none()).await?;
    anyhow::ensure!(
        redelivery.is_some() && row.status == "SUCCEEDED",
        "reference: redelivered and completed: {row:?}"
    );
    Ok(())
}
