//! The fenced final write, through the reference worker's own write path: the seed's race (an
//! attempt holds its result past its lease, the retry takes over and writes) against the real
//! database, judged by the audit trail the trigger filled and by the statements on the wire.

use racecert::contract::checkpoint::Checkpoint;
use racecert::contract::log::Status;
use racecert::env::TestBed;
use racecert::fault::Fault;
use racecert::history::EventKind;
use racecert::runner::controlled::{CaseSettings, Controller};
use racecert::schedule::{RequestSpec, Schedule, Step};
use racecert::wire::{PgRequest, Reply, Request};

crate::tests!(the_late_writer_is_rejected_by_the_fence_and_the_audit_shows_one_final_write);

async fn the_late_writer_is_rejected_by_the_fence_and_the_audit_shows_one_final_write(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let controller = Controller::new(bed, CaseSettings::seed_pair()).await?;
    // worker-a (v1) holds its result just before the final write; its lease runs out; worker-c
    // (v2) takes the job over and finishes; then worker-a writes, late.
    let schedule = Schedule {
        requests: vec![RequestSpec {
            request_id: "req-91".into(),
            input: "input-0".into(),
        }],
        steps: vec![
            Step::Run {
                worker: 0,
                to: Checkpoint::BeforeFinalWrite,
            },
            Step::Fault(Fault::ExpireLease { request: 0 }),
            Step::Run {
                worker: 1,
                to: Checkpoint::Done,
            },
            Step::Run {
                worker: 0,
                to: Checkpoint::Done,
            },
        ],
    };
    let result = controller.run(&schedule).await?;
    anyhow::ensure!(
        result.violations.is_empty(),
        "the fenced worker broke {:?}\n{}",
        result.violations,
        result.history.timeline()
    );
    // The audit trail: inserted, taken by a (1), taken over by c (2), written by c (3); a's late
    // write left no row because the fence refused it.
    let trail: Vec<(Option<String>, String, i64, Option<String>)> = result
        .history
        .audit
        .iter()
        .map(|r| {
            (
                r.old_status.clone(),
                r.new_status.clone(),
                r.new_generation.unwrap_or(-1),
                r.worker_id.clone(),
            )
        })
        .collect();
    let expected = vec![
        (None, "PENDING".to_owned(), 0, None),
        (
            Some("PENDING".to_owned()),
            "IN_PROGRESS".to_owned(),
            1,
            Some("worker-a".to_owned()),
        ),
        (
            Some("IN_PROGRESS".to_owned()),
            "IN_PROGRESS".to_owned(),
            2,
            Some("worker-c".to_owned()),
        ),
        (
            Some("IN_PROGRESS".to_owned()),
            "SUCCEEDED".to_owned(),
            3,
            Some("worker-c".to_owned()),
        ),
    ];
    anyhow::ensure!(
        trail == expected,
        "audit trail\n  observed {trail:?}\n  expected {expected:?}\n{}",
        result.history.timeline()
    );
    let stored = &result.history.jobs[0];
    anyhow::ensure!(
        stored.model_version.as_deref() == Some("v2")
            && stored
                .output
                .as_deref()
                .and_then(racecert::contract::output_version)
                == Some("v2"),
        "the stored result must be v2's: {stored:?}"
    );
    anyhow::ensure!(
        result
            .history
            .with_status(Status::LateWriteRejected)
            .filter(|e| e.line().and_then(|l| l.get("worker_id")) == Some("worker-a"))
            .count()
            == 1,
        "worker-a must log its rejected write\n{}",
        result.history.timeline()
    );
    // On the wire: worker-a's final UPDATE reached Postgres and changed nothing.
    let rejected = result.history.events.iter().any(|e| match &e.kind {
        EventKind::Wire(wire) if wire.worker == "worker-a" => matches!(
            (&wire.trip.request, &wire.trip.reply),
            (Request::Postgres(PgRequest::Batch(batch)), Some(Reply::Postgres(reply)))
                if batch.statements.iter().any(|s| s.sql.contains("'SUCCEEDED'"))
                    && reply.rows_affected == Some(0)
        ),
        _ => false,
    });
    anyhow::ensure!(
        rejected,
        "worker-a's fenced UPDATE must show on the wire with 0 rows\n{}",
        result.history.timeline()
    );
    Ok(())
}
