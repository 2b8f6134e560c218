//! Tests of the checkers on histories written as tables of events.

use super::*;

// One argument per audit column keeps the fixtures below readable as table rows.
#[allow(clippy::too_many_arguments)]
fn row(
    id: i64,
    key: &str,
    old: Option<&str>,
    new: &str,
    old_gen: Option<i64>,
    new_gen: i64,
    old_tok: Option<&str>,
    new_tok: Option<&str>,
    version: Option<&str>,
    output: Option<&str>,
) -> AuditRow {
    AuditRow {
        audit_id: id,
        idempotency_key: key.into(),
        operation: if old.is_none() {
            "INSERT".into()
        } else {
            "UPDATE".into()
        },
        old_status: old.map(Into::into),
        new_status: new.into(),
        old_generation: old_gen,
        new_generation: Some(new_gen),
        old_model_version: None,
        new_model_version: version.map(Into::into),
        old_lease_token: old_tok.map(Into::into),
        new_lease_token: new_tok.map(Into::into),
        worker_id: None,
        attempt: 1,
        output: output.map(Into::into),
        txid: None,
        backend_pid: None,
        recorded_us: None,
        writer: None,
    }
}

#[test]
fn the_seed_overwrite_breaks_three_invariants_and_the_fenced_run_none() {
    let v1 = racecert_core::contract::model_output("x", "v1");
    let v2 = racecert_core::contract::model_output("x", "v2");
    let fenced = History {
        audit: vec![
            row(1, "k", None, "PENDING", None, 0, None, None, None, None),
            row(
                2,
                "k",
                Some("PENDING"),
                "IN_PROGRESS",
                Some(0),
                1,
                None,
                Some("a"),
                Some("v1"),
                None,
            ),
            row(
                3,
                "k",
                Some("IN_PROGRESS"),
                "IN_PROGRESS",
                Some(1),
                2,
                Some("a"),
                Some("c"),
                Some("v2"),
                None,
            ),
            row(
                4,
                "k",
                Some("IN_PROGRESS"),
                "SUCCEEDED",
                Some(2),
                3,
                Some("c"),
                Some("c"),
                Some("v2"),
                Some(&v2),
            ),
        ],
        ..History::default()
    };
    assert!(check(&fenced, &Invariant::ALL).is_empty());
    let mut unfenced = fenced.clone();
    unfenced.audit.push(row(
        5,
        "k",
        Some("SUCCEEDED"),
        "SUCCEEDED",
        Some(3),
        2,
        Some("c"),
        Some("a"),
        Some("v1"),
        Some(&v1),
    ));
    let broken = broken(&check(&unfenced, &Invariant::ALL));
    assert_eq!(
        broken,
        BTreeSet::from([
            Invariant::AtMostOneFinalWrite,
            Invariant::GenerationsIncrease,
            Invariant::NoNonOwnerFinalWrite
        ])
    );
}

/// `worker` takes the lease of key `k` at `at_ms` (its `SET NX PX` answered OK).
fn lease_taken(worker: &str, at_ms: u64) -> racecert_history::Event {
    use racecert_wire::{RedisCommand, RedisReply, Reply, Request, RoundTrip, WireEvent};
    let lease = "c:inference:lock:k";
    racecert_history::Event {
        step: at_ms as usize,
        at_ms,
        kind: EventKind::Wire(Box::new(WireEvent {
            worker: worker.into(),
            service: "redis".into(),
            trip: RoundTrip {
                link: "l".into(),
                conn: 1,
                seq: 0,
                sent_us: 0,
                forwarded_us: None,
                answered_us: None,
                request: Request::Redis(RedisCommand {
                    name: "SET".into(),
                    args: [lease, worker, "NX", "PX", "60000"]
                        .map(String::from)
                        .to_vec(),
                    argc: 5,
                    keys: vec![lease.into()],
                    queued: false,
                    truncated: false,
                    pushed: Vec::new(),
                }),
                reply: Some(Reply::Redis(RedisReply::Status("OK".into()))),
            },
        })),
    }
}

/// A write of key `k` by `writer`'s connection at `at_ms`, token columns left as they were.
fn written(id: i64, old: &str, new: &str, writer: &str, at_ms: u64) -> AuditRow {
    AuditRow {
        recorded_us: Some(at_ms as i64 * 1000),
        writer: Some(writer.into()),
        ..row(
            id,
            "k",
            Some(old),
            new,
            Some(id - 1),
            id,
            Some("t"),
            Some("t"),
            None,
            None,
        )
    }
}

#[test]
fn ownership_passes_to_a_new_lease_holder_once_it_takes_the_job() {
    let history = |events, audit| History {
        events,
        audit,
        wire_recorded: true,
        epoch_unix_ms: Some(0),
        layout: racecert_core::contract::layout::KeyLayout::contract("c:"),
        ..History::default()
    };
    let non_owner = |h: &History| {
        no_non_owner_final_write(h)
            .into_iter()
            .map(|v| v.observed)
            .collect::<Vec<_>>()
    };
    // a leases and takes; c takes the lease over but a's write comes before c touches the
    // job: the store had not heard of c, a was still the owner.
    let before_use = history(
        vec![lease_taken("a", 1), lease_taken("c", 3)],
        vec![
            written(1, "PENDING", "IN_PROGRESS", "a", 2),
            written(2, "IN_PROGRESS", "SUCCEEDED", "a", 4),
        ],
    );
    assert!(
        non_owner(&before_use).is_empty(),
        "{:?}",
        non_owner(&before_use)
    );
    // c takes the job (its row write) before a's final write: a is no longer the owner,
    // whatever token columns its write left alone.
    let taken_over = history(
        vec![lease_taken("a", 1), lease_taken("c", 3)],
        vec![
            written(1, "PENDING", "IN_PROGRESS", "a", 2),
            written(2, "IN_PROGRESS", "IN_PROGRESS", "c", 4),
            written(3, "IN_PROGRESS", "SUCCEEDED", "a", 5),
        ],
    );
    let found = non_owner(&taken_over);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("c had taken since"), "{}", found[0]);
    // A writer that never took the lease.
    let never = history(
        vec![lease_taken("a", 1)],
        vec![
            written(1, "PENDING", "IN_PROGRESS", "a", 2),
            written(2, "IN_PROGRESS", "SUCCEEDED", "b", 3),
        ],
    );
    let found = non_owner(&never);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("never took"), "{}", found[0]);
}

#[test]
fn invariant_names_round_trip() {
    for invariant in Invariant::ALL {
        assert_eq!(invariant.name().parse::<Invariant>().unwrap(), invariant);
    }
    assert!("nope".parse::<Invariant>().is_err());
}

#[test]
fn a_delivery_the_broker_still_holds_says_where_and_leaves_out_a_count_it_did_not_see() {
    let pending = |key: &str, deliveries: u64, held: Option<&str>| racecert_history::Event {
        step: 0,
        at_ms: 0,
        kind: EventKind::Harness(Observation::Pending {
            key: key.into(),
            deliveries,
            held: held.map(Into::into),
        }),
    };
    let history = History {
        events: vec![
            pending("counted", 2, None),
            pending("read", 0, Some("kombu's `unacked` (delivery 7)")),
        ],
        ..History::default()
    };
    let found = no_stuck_delivery(&history);
    let observed: Vec<&str> = found.iter().map(|v| v.observed.as_str()).collect();
    assert_eq!(
        observed,
        [
            "the delivery of counted (counted) is still unacknowledged after the drain, delivered 2 time(s); its job is missing",
            "the delivery of read (read) is still unacknowledged after the drain; its job is missing; the broker holds it in kombu's `unacked` (delivery 7)",
        ]
    );
}

#[test]
fn a_request_accepted_after_the_switch_and_answered_by_the_old_version_breaks_served_by_new_version()
 {
    let at = |ms: u64, kind: EventKind| racecert_history::Event {
        step: 0,
        at_ms: ms,
        kind,
    };
    let submitted = |key: &str| {
        EventKind::Harness(Observation::Submitted {
            key: key.to_owned(),
        })
    };
    let row = |key: &str, output: &str| racecert_core::contract::JobRow {
        idempotency_key: key.into(),
        request_id: key.into(),
        status: "SUCCEEDED".into(),
        generation: 0,
        model_version: None,
        output: Some(output.into()),
        lease_token: None,
        worker_id: None,
    };
    let switched = EventKind::Harness(Observation::Switched {
        from: "v1".into(),
        to: "v2".into(),
        window_ms: 500,
    });
    let history = History {
        events: vec![
            at(0, submitted("before")),
            at(100, switched),
            // Inside the mixed window: either version may answer.
            at(400, submitted("window")),
            at(700, submitted("after-old")),
            at(800, submitted("after-new")),
        ],
        jobs: vec![
            row("before", "v1:0123456789abcdef"),
            row("window", "v1:0123456789abcdef"),
            row("after-old", "v1:0123456789abcdef"),
            row("after-new", "v2:0123456789abcdef"),
        ],
        ..History::default()
    };
    let found = served_by_new_version(&history);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].observed.starts_with(
            "request after-old, accepted 600 ms after the switch to v2, was answered by v1"
        ),
        "{}",
        found[0].observed
    );
    // No switch: nothing to judge.
    let mut quiet = history.clone();
    quiet.events.remove(1);
    assert!(served_by_new_version(&quiet).is_empty());
}
