//! Diagnosis of the seed's log and of logs of other shapes.

use super::*;

fn races(log: &str) -> Vec<Race> {
    let mut races: Vec<Race> = analyse(log.as_bytes(), None)
        .findings
        .iter()
        .map(|f| f.race)
        .collect();
    races.dedup();
    races
}

#[test]
fn the_seed_log_tells_the_seed_story() {
    let analysis = analyse(seed_log().as_bytes(), None);
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
    assert_eq!(
        races(seed_log()),
        vec![
            Race::MultipleWorkers,
            Race::LateWrite,
            Race::VersionSkew,
            Race::RetryWhileRunning
        ]
    );
    let late = analysis
        .findings
        .iter()
        .find(|f| f.race == Race::LateWrite)
        .unwrap();
    assert_eq!(
        late.lines,
        vec![5, 6, 7],
        "the overwrite line proves it too"
    );
    let retry = analysis
        .findings
        .iter()
        .find(|f| f.race == Race::RetryWhileRunning)
        .unwrap();
    assert!(
        retry
            .explanation
            .contains("timed out waiting upstream, line 3"),
        "{}",
        retry.explanation
    );

    let (workers, schedule) = synthesize(&analysis.reconstruction, "req-91").unwrap();
    assert_eq!(
        workers
            .iter()
            .map(|w| (w.id.as_str(), w.version.as_str()))
            .collect::<Vec<_>>(),
        vec![("worker-a", "v1"), ("worker-c", "v2")]
    );
    assert_eq!(
        schedule.steps,
        vec![
            Step::Run {
                worker: 0,
                to: Checkpoint::AfterBackendCall
            },
            Step::Fault(Fault::ExpireLease { request: 0 }),
            Step::Run {
                worker: 1,
                to: Checkpoint::Done
            },
            Step::Run {
                worker: 0,
                to: Checkpoint::Done
            },
        ]
    );
}

#[test]
fn json_lines_and_shuffled_fields_give_the_same_diagnosis() {
    let json: String = seed_log()
        .lines()
        .map(|l| parse::parse_line(l).unwrap().to_json() + "\n")
        .collect();
    assert_eq!(races(&json), races(seed_log()));
    let shuffled: String = seed_log()
        .lines()
        .map(|l| {
            let line = parse::parse_line(l).unwrap();
            let mut fields = line.fields.clone();
            fields.reverse();
            LogLine { fields, ..line }.to_logfmt() + "\n"
        })
        .collect();
    assert_eq!(races(&shuffled), races(seed_log()));
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
    let analysis = analyse(log.as_bytes(), None);
    assert_eq!(races(log), vec![Race::CrossVersionCache]);
    assert_eq!(analysis.findings[0].request_id, "req-2");
    assert_eq!(analysis.findings[0].lines, vec![1, 4]);
    assert_eq!(analysis.reconstruction.cutovers.len(), 1);
    let (workers, schedule) = synthesize(&analysis.reconstruction, "req-2").unwrap();
    assert_eq!(workers.len(), 2);
    assert_eq!(schedule.requests.len(), 2);
    assert_eq!(
        schedule.steps,
        vec![
            Step::Run {
                worker: 0,
                to: Checkpoint::Done
            },
            Step::Fault(Fault::Cutover { to: "v2".into() }),
            Step::Run {
                worker: 1,
                to: Checkpoint::Done
            },
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
    assert_eq!(
        races(log),
        vec![Race::MultipleWorkers, Race::RetryWhileRunning]
    );
    let analysis = analyse(log.as_bytes(), None);
    let (_, schedule) = synthesize(&analysis.reconstruction, "req-5").unwrap();
    // No timeout, no expiry: the retry meets a held lease.
    assert!(
        !schedule.steps.iter().any(|s| matches!(s, Step::Fault(_))),
        "{:?}",
        schedule.steps
    );
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
        let _ = analysis.text();
    }
}
