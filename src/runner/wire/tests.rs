//! Unit tests of the wire runner's pieces that need no test bed.

use super::case::{blocked_stream_readers, diverged};
use crate::runner::link_gate::{passes, uncounted};
use crate::wire::{RedisReply, Reply, Request, RoundTrip};

#[test]
fn a_divergence_names_its_step() {
    let recorded = vec![vec!["redis GET {ns}x".to_owned()], vec![], vec![]];
    let got = vec![vec!["redis SET {ns}x".to_owned()]];
    let divergence = diverged(&recorded, &got).expect("diverged");
    assert_eq!(divergence.step, 1);
    assert!(diverged(&recorded, &recorded).is_none());
}

#[test]
fn only_clients_blocked_in_a_stream_read_are_woken() {
    // Lines as Redis 7 prints them (fields trimmed for length).
    let clients = "\
id=7 addr=127.0.0.1:40112 laddr=127.0.0.1:6379 fd=9 name= age=3 idle=0 flags=b db=0 sub=0 psub=0 multi=-1 cmd=xreadgroup user=default
id=8 addr=127.0.0.1:40114 laddr=127.0.0.1:6379 fd=10 name= age=3 idle=0 flags=N db=0 sub=0 psub=0 multi=-1 cmd=xreadgroup user=default
id=9 addr=127.0.0.1:40116 laddr=127.0.0.1:6379 fd=11 name= age=3 idle=0 flags=b db=0 sub=0 psub=0 multi=-1 cmd=blpop user=default
id=10 addr=127.0.0.1:40118 laddr=127.0.0.1:6379 fd=12 name= age=3 idle=0 flags=N db=0 sub=0 psub=0 multi=-1 cmd=client|list user=default
";
    assert_eq!(blocked_stream_readers(clients), vec![7]);
    assert!(blocked_stream_readers("").is_empty());
}

#[test]
fn polls_that_got_nothing_and_setup_are_uncounted() {
    use crate::wire::RedisCommand;
    let trip = |name: &str, reply: RedisReply| RoundTrip {
        link: "l".into(),
        conn: 1,
        seq: 0,
        sent_us: 0,
        forwarded_us: Some(0),
        answered_us: Some(1),
        request: Request::Redis(RedisCommand {
            name: name.into(),
            args: vec![],
            argc: 0,
            keys: vec![],
            queued: false,
            truncated: false,
            pushed: Vec::new(),
        }),
        reply: Some(Reply::Redis(reply)),
    };
    assert!(uncounted(&trip("XREADGROUP", RedisReply::Nil)));
    assert!(!uncounted(&trip(
        "XREADGROUP",
        RedisReply::Array {
            len: 1,
            items: vec![]
        }
    )));
    let empty_claim = RedisReply::Array {
        len: 3,
        items: vec![
            RedisReply::Status("0-0".into()),
            RedisReply::Array {
                len: 0,
                items: vec![],
            },
        ],
    };
    assert!(uncounted(&trip("XAUTOCLAIM", empty_claim)));
    assert!(uncounted(&trip("PING", RedisReply::Status("PONG".into()))));
    assert!(!uncounted(&trip("SET", RedisReply::Status("OK".into()))));
    assert!(passes(&trip("HELLO", RedisReply::Nil).request));
    assert!(!passes(&trip("XACK", RedisReply::Int(1)).request));
}

fn set(key: &str) -> Request {
    Request::Redis(crate::wire::RedisCommand {
        name: "SET".into(),
        args: vec![key.into()],
        argc: 3,
        keys: vec![key.into()],
        queued: false,
        truncated: false,
        pushed: Vec::new(),
    })
}

/// A killed worker's held requests never reach their servers: the gate aborts them (and a gate
/// dropped with its worker's place does too), where a release forwards.
#[tokio::test]
async fn a_killed_workers_held_requests_are_aborted_never_forwarded() {
    use crate::runner::link_gate::Gate;
    use crate::wire::{Holder, Release};
    let gate = Gate::new("worker-a", "ns:", std::time::Duration::from_secs(4));
    let first = gate.before("redis", 1, 0, &[set("a")]).expect("held");
    let second = gate.before("redis", 1, 1, &[set("b")]).expect("held");
    gate.abort_held();
    assert_eq!(first.await, Release::Abort);
    assert_eq!(second.await, Release::Abort);

    let released = gate.before("redis", 2, 0, &[set("c")]).expect("held");
    gate.release(std::time::Duration::ZERO).await;
    assert_eq!(released.await, Release::Forward);

    let orphan = gate.before("redis", 3, 0, &[set("d")]).expect("held");
    drop(gate);
    assert_eq!(
        orphan.await,
        Release::Abort,
        "a dropped gate forwards nothing"
    );
}

/// A process on standby is held for half the longest hold, then loses its request (it sends
/// again, before its own patience runs out), and nothing it logs is recorded until it goes live;
/// once live, its held request has the longest hold again and is let go with a note after it.
#[tokio::test]
async fn a_spare_on_standby_is_aborted_at_half_the_longest_hold_and_recorded_once_live() {
    use crate::runner::link_gate::{Gate, Standby};
    use crate::wire::{Holder, Release};
    let max = std::time::Duration::from_millis(40);
    let standby = Standby::new();
    let gate = Gate::on_standby("worker-a", "ns:", max, standby.clone());
    assert!(!gate.is_live());
    let waited = std::time::Instant::now();
    let given_up = gate.before("redis", 1, 0, &[set("a")]).expect("held");
    assert_eq!(given_up.await, Release::Abort);
    assert!(waited.elapsed() >= max / 2);
    assert!(gate.timeouts.lock().expect("poisoned").is_empty());

    // Sent again, then again on another connection: only the newest is its own at go-live.
    let stale = gate.before("redis", 2, 0, &[set("a")]).expect("held");
    let newest = gate.before("redis", 3, 0, &[set("a")]).expect("held");
    let recorder = crate::history::Recorder::new();
    let line = crate::logs::parse_line(
        r#"{"ts":"2026-12-04T00:00:00Z","level":"warn","worker_id":"worker-a","status":"attempt_error"}"#,
    )
    .expect("a line");
    standby.line(&recorder, line.clone());
    assert_eq!(recorder.len(), 0, "not recorded on standby");
    gate.keep_newest();
    standby.go_live();
    assert!(gate.is_live());
    assert_eq!(stale.await, Release::Abort);
    standby.line(&recorder, line);
    assert_eq!(recorder.len(), 1, "recorded once live");
    assert_eq!(
        newest.await,
        Release::Forward,
        "live: let go at the longest hold"
    );
    assert_eq!(gate.timeouts.lock().expect("poisoned").len(), 1);
}
