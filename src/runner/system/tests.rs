//! Unit tests of the system runner's pieces that need no test bed.

use super::fleet::{simple_command, with_path};
use super::settle::in_transaction;
use super::*;
use crate::system::Framework;
use crate::wire::{PgRequest, Reply, Request, TxStatus};

/// Case 1 of request `r`: its fault, writes and the invariants it broke; no diagram.
fn case_of(
    fault: FaultKind,
    writes: Vec<AuditRow>,
    broke: &[&str],
    final_writes: usize,
) -> SystemCase {
    SystemCase {
        number: 1,
        fault,
        request: "r".into(),
        writes,
        violations: broke
            .iter()
            .map(|i| Violation {
                invariant: i.parse().expect("an invariant"),
                observed: String::new(),
                evidence: Vec::new(),
            })
            .collect(),
        not_judged: Vec::new(),
        effect: None,
        landed: false,
        diagram: Vec::new(),
        lanes: Vec::new(),
        elapsed_ms: 0,
        model_calls: 1,
        final_writes,
        liveness_blind: None,
        refused: None,
    }
}

#[test]
fn a_fault_is_skipped_once_every_goal_it_serves_is_met() {
    let case = |fault, broke: &[&str]| case_of(fault, Vec::new(), broke, 1);
    let duplicate = Goal {
        faults: vec![FaultKind::ForcedRestore, FaultKind::VisibilityOutlived],
        breaks: vec!["at-most-one-final-write".into()],
    };
    let lost = Goal {
        faults: vec![FaultKind::KillPoolChild, FaultKind::VisibilityOutlived],
        breaks: vec!["no-lost-job".into()],
    };
    let goals = [duplicate, lost];
    assert!(still_needed(&[], FaultKind::KillMain, &[]));
    assert!(!still_needed(&goals, FaultKind::KillMain, &[]));
    // A restore that broke something else met nothing.
    let ran = [case(FaultKind::ForcedRestore, &["no-lost-job"])];
    assert!(still_needed(&goals, FaultKind::VisibilityOutlived, &ran));
    // Once it reproduced the duplicate, visibility-outlived still serves the lost job.
    let ran = [case(FaultKind::ForcedRestore, &["at-most-one-final-write"])];
    assert!(still_needed(&goals, FaultKind::VisibilityOutlived, &ran));
    let ran = [
        case(FaultKind::ForcedRestore, &["at-most-one-final-write"]),
        case(FaultKind::KillPoolChild, &["no-lost-job"]),
    ];
    assert!(!still_needed(&goals, FaultKind::VisibilityOutlived, &ran));
}

#[test]
fn a_worker_is_in_a_transaction_while_its_last_reply_on_a_connection_says_so() {
    use crate::wire::{PgBatch, PgProtocol, PgReply, RoundTrip};
    let trip = |worker: &str, conn: u64, seq: u64, tx: Option<TxStatus>| {
        (
            0,
            WireEvent {
                worker: worker.into(),
                service: "postgres".into(),
                trip: RoundTrip {
                    link: "l".into(),
                    conn,
                    seq,
                    sent_us: 0,
                    forwarded_us: Some(0),
                    answered_us: tx.map(|_| 1),
                    request: Request::Postgres(PgRequest::Batch(PgBatch {
                        mode: PgProtocol::Simple,
                        statements: Vec::new(),
                    })),
                    reply: tx.map(|tx| {
                        Reply::Postgres(PgReply {
                            tx: Some(tx),
                            ..PgReply::default()
                        })
                    }),
                },
            },
        )
    };
    let wire: Wire = Arc::default();
    assert!(!in_transaction(&wire, "worker-a"));
    // BEGIN on connection 7, then an UPDATE in it: open.
    wire.lock().unwrap().extend([
        trip("worker-a", 7, 0, Some(TxStatus::Transaction)),
        trip("worker-a", 7, 1, Some(TxStatus::Transaction)),
        trip("worker-a", 8, 0, Some(TxStatus::Idle)),
    ]);
    assert!(in_transaction(&wire, "worker-a"));
    assert!(!in_transaction(&wire, "worker-b"));
    // COMMIT answered: closed.
    wire.lock()
        .unwrap()
        .push(trip("worker-a", 7, 2, Some(TxStatus::Idle)));
    assert!(!in_transaction(&wire, "worker-a"));
    // A failed transaction is open until its ROLLBACK; a connection that ended is closed.
    wire.lock().unwrap().extend([
        trip("worker-a", 9, 0, Some(TxStatus::Failed)),
        trip("worker-a", 10, 0, Some(TxStatus::Transaction)),
        trip("worker-a", 10, 1, None),
    ]);
    assert!(in_transaction(&wire, "worker-a"));
    wire.lock()
        .unwrap()
        .push(trip("worker-a", 9, 1, Some(TxStatus::Idle)));
    assert!(!in_transaction(&wire, "worker-a"));
}

#[test]
fn only_simple_commands_are_execed() {
    assert!(simple_command(
        "/v/bin/celery -A tasks worker -n a@racecert"
    ));
    assert!(!simple_command("echo boom >&2; exit 3"));
    assert!(!simple_command("build && run"));
}

#[test]
fn paths_are_replaced_and_queries_kept() {
    assert_eq!(
        with_path("redis://127.0.0.1:6379", "3"),
        "redis://127.0.0.1:6379/3"
    );
    assert_eq!(
        with_path("redis://127.0.0.1:6379/0", "3"),
        "redis://127.0.0.1:6379/3"
    );
    assert_eq!(
        with_path("postgresql://u:p@127.0.0.1:5/db?sslmode=disable", "x"),
        "postgresql://u:p@127.0.0.1:5/x?sslmode=disable"
    );
}

#[test]
fn fault_names_round_trip_and_presets_have_their_own() {
    for fault in FaultKind::ALL {
        assert_eq!(fault.name().parse::<FaultKind>(), Ok(fault));
    }
    let has = |framework, kind| crate::system::preset::faults(framework).contains(&kind);
    assert!(has(Framework::Celery, FaultKind::ForcedRestore));
    assert!(!has(Framework::Apalis, FaultKind::ForcedRestore));
    assert!(has(Framework::Apalis, FaultKind::HeartbeatMiss));
    assert!(
        "nap"
            .parse::<FaultKind>()
            .unwrap_err()
            .contains("forced-restore")
    );
}

#[test]
fn the_diagram_draws_arrows_between_lanes() {
    let case = SystemCase {
        number: 1,
        fault: FaultKind::ForcedRestore,
        request: "r".into(),
        writes: Vec::new(),
        violations: Vec::new(),
        not_judged: Vec::new(),
        effect: None,
        landed: false,
        liveness_blind: None,
        refused: None,
        diagram: vec![
            Arrow {
                at_ms: 5,
                from: "a".into(),
                to: "c".into(),
                label: "call".into(),
                kind: "message".into(),
            },
            Arrow {
                at_ms: 9,
                from: "c".into(),
                to: "a".into(),
                label: "back".into(),
                kind: "message".into(),
            },
        ],
        lanes: vec!["a".into(), "b".into(), "c".into()],
        elapsed_ms: 0,
        model_calls: 0,
        final_writes: 0,
    };
    let text = sequence_text(&case);
    assert!(text.contains("o---------------------->| call"), "{text}");
    assert!(text.contains("|<----------------------o back"), "{text}");
}

#[test]
fn a_terminal_list_that_matches_no_written_status_is_the_files_error() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/celery-worker/naive.toml");
    let system = System::load(&path).expect("the example loads");
    let write = |status: &str, output: Option<&str>| AuditRow {
        audit_id: 1,
        idempotency_key: "r".into(),
        operation: "UPDATE".into(),
        old_status: None,
        new_status: status.into(),
        old_generation: None,
        new_generation: None,
        old_model_version: None,
        new_model_version: None,
        old_lease_token: None,
        new_lease_token: None,
        worker_id: None,
        attempt: 0,
        output: output.map(str::to_owned),
        txid: None,
        backend_pid: None,
        recorded_us: None,
        writer: None,
    };
    let case = |writes: Vec<AuditRow>| case_of(FaultKind::KillPoolChild, writes, &[], 0);
    // The app writes `done` with its output; the file lists SUCCEEDED and FAILED.
    let cases = [case(vec![
        write("RUNNING", None),
        write("done", Some("cat")),
    ])];
    let message = terminal_matches_nothing(&system, &cases).expect("the list's error");
    assert!(message.contains("set \"done\""), "{message}");
    assert!(
        message.contains("other statuses written: \"RUNNING\""),
        "{message}"
    );
    // A job really lost (no output stored) is the system's failure, not the file's.
    assert_eq!(
        terminal_matches_nothing(&system, &[case(vec![write("RUNNING", None)])]),
        None
    );
    // Once any write set a listed status, the list is right.
    let cases = [
        case(vec![write("done", Some("cat"))]),
        case(vec![write("SUCCEEDED", Some("cat"))]),
    ];
    assert_eq!(terminal_matches_nothing(&system, &cases), None);
}

#[test]
fn cases_asked_for_without_a_budget_get_the_time_to_run() {
    // The Celery preset's eleven kinds: 165 s by default, whatever --cases says.
    let mut settings = SystemSettings::certify(1);
    assert_eq!(settings.budget_for(11), Duration::from_secs(165));
    assert_eq!(settings.budget_for(3), Duration::from_secs(120));
    // `--cases 20` without `--budget`: 40 s a case, so the count decides.
    settings.budget_per_case = Some(BUDGET_PER_CASE);
    assert_eq!(settings.budget_for(11), Duration::from_secs(800));
    // `--cases 2`: the default by kinds is larger and stays.
    settings.cases = 2;
    assert_eq!(settings.budget_for(11), Duration::from_secs(165));
    // A budget the user gave is the budget.
    let mut given = SystemSettings::certify(1);
    given.budget = Duration::from_secs(30);
    given.budget_per_kind = None;
    assert_eq!(given.budget_for(11), Duration::from_secs(30));
}
