//! `racecert replay`: incident logs become schedules that run on the real test bed.

use racecert::check::Invariant;
use racecert::contract::defect::{Defect, Defects};
use racecert::contract::log::Status;
use racecert::env::TestBed;
use racecert::replay::{Race, analyse, replay_on, seed_log};
use std::collections::BTreeSet;

crate::tests!(
    the_seed_log_replays_and_only_the_unfenced_worker_overwrites,
    a_duplicate_execution_and_a_stale_cache_read_replay_as_their_defects,
    garbage_logs_end_with_a_clear_report_and_exit_code_2,
);

fn broken(run: &racecert::replay::ReplayRun) -> BTreeSet<Invariant> {
    run.result.violations.iter().map(|v| v.invariant).collect()
}

async fn the_seed_log_replays_and_only_the_unfenced_worker_overwrites(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let analysis = analyse(seed_log().as_bytes(), None);
    let reference = replay_on(bed, &analysis, "req-91", Defects::none()).await?;
    anyhow::ensure!(
        reference.result.violations.is_empty(),
        "the reference worker must hold: {:?}",
        reference.result.violations
    );
    anyhow::ensure!(
        reference.prevented == vec![Race::LateWrite],
        "prevented {:?}",
        reference.prevented
    );
    anyhow::ensure!(
        reference
            .result
            .history
            .with_status(Status::LateWriteRejected)
            .any(|e| e.field("worker_id").as_deref() == Some("worker-a")),
        "worker-a's late write must be rejected:\n{}",
        reference.result.history.timeline()
    );
    let unfenced = replay_on(
        bed,
        &analysis,
        "req-91",
        Defects::of([Defect::UnfencedFinalWrite]),
    )
    .await?;
    let broken = broken(&unfenced);
    anyhow::ensure!(
        broken.contains(&Invariant::AtMostOneFinalWrite)
            && broken.contains(&Invariant::GenerationsIncrease),
        "unfenced replay broke {broken:?}"
    );
    anyhow::ensure!(unfenced.reproduced.contains(&Race::LateWrite));
    Ok(())
}

async fn a_duplicate_execution_and_a_stale_cache_read_replay_as_their_defects(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let duplicate = "\
2026-06-26T12:00:00.000Z INFO request_id=req-5 attempt=1 worker_id=worker-a model_version=v1 status=inference_started
2026-06-26T12:00:00.100Z INFO request_id=req-5 attempt=2 worker_id=worker-b model_version=v1 status=retry_dispatched
2026-06-26T12:00:00.150Z INFO request_id=req-5 attempt=2 worker_id=worker-b model_version=v1 status=inference_started
2026-06-26T12:00:00.300Z INFO request_id=req-5 attempt=1 worker_id=worker-a model_version=v1 status=inference_succeeded write=result_store
2026-06-26T12:00:00.350Z INFO request_id=req-5 attempt=2 worker_id=worker-b model_version=v1 status=inference_succeeded write=result_store
";
    let analysis = analyse(duplicate.as_bytes(), None);
    let reference = replay_on(bed, &analysis, "req-5", Defects::none()).await?;
    anyhow::ensure!(
        reference.result.violations.is_empty(),
        "{:?}",
        reference.result.violations
    );
    anyhow::ensure!(reference.prevented.contains(&Race::MultipleWorkers));
    let without_dedupe = replay_on(
        bed,
        &analysis,
        "req-5",
        Defects::of([Defect::RetryWithoutDedupe]),
    )
    .await?;
    anyhow::ensure!(
        broken(&without_dedupe).contains(&Invariant::ComputeWasteBounded),
        "{:?}",
        without_dedupe.result.violations
    );

    let stale = "\
2026-06-26T11:00:00.000Z INFO request_id=req-1 attempt=1 worker_id=worker-a model_version=v1 cache_key=inf:x1 status=cache_miss
2026-06-26T11:00:00.400Z INFO request_id=req-1 attempt=1 worker_id=worker-a model_version=v1 status=inference_succeeded write=result_store
2026-06-26T11:00:01.000Z INFO status=cutover previous_model_version=v1 new_model_version=v2
2026-06-26T11:00:02.000Z INFO request_id=req-2 attempt=1 worker_id=worker-c model_version=v2 cache_key=inf:x1 status=cache_hit
";
    let analysis = analyse(stale.as_bytes(), None);
    let reference = replay_on(bed, &analysis, "req-2", Defects::none()).await?;
    anyhow::ensure!(
        reference.result.violations.is_empty(),
        "{:?}",
        reference.result.violations
    );
    let unversioned = replay_on(
        bed,
        &analysis,
        "req-2",
        Defects::of([Defect::UnversionedCacheKey]),
    )
    .await?;
    anyhow::ensure!(
        broken(&unversioned).contains(&Invariant::NoStaleCacheRead),
        "{:?}\n{}",
        unversioned.result.violations,
        unversioned.result.history.timeline()
    );
    anyhow::ensure!(unversioned.reproduced.contains(&Race::CrossVersionCache));
    Ok(())
}

async fn garbage_logs_end_with_a_clear_report_and_exit_code_2(
    _bed: &TestBed,
) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("racecert-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut huge = vec![b'x'; 200_000];
    huge.extend(b"\n2026 INFO request_id=\"trunc");
    let inputs: [(&str, Vec<u8>); 3] = [
        (
            "binary.log",
            (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect(),
        ),
        ("empty.log", Vec::new()),
        ("huge.log", huge),
    ];
    for (name, bytes) in inputs {
        let path = dir.join(name);
        std::fs::write(&path, bytes)?;
        let output = tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_racecert"))
                .arg("replay")
                .arg(&path)
                .output()
        })
        .await??;
        let stderr = String::from_utf8_lossy(&output.stderr);
        anyhow::ensure!(
            output.status.code() == Some(2) && stderr.contains("nothing to replay"),
            "{name}: {:?} {stderr}",
            output.status
        );
        anyhow::ensure!(!stderr.contains("panicked"), "{name} panicked: {stderr}");
    }
    Ok(())
}
