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
