//! The incident corpus in the shapes teams' platforms export (tracing JSON, `kubectl logs
//! --prefix`, OTLP JSON, `stern` over Celery, journald JSON, a Loki query response, a CSV export,
//! `docker compose logs`), each written from its format's documentation, each with its exact
//! diagnosis: the race, the request, the lines, and nothing for the clean requests beside it.

use super::*;

/// A fixture of the corpus (this file sits one directory deeper than `fixture!`'s).
macro_rules! corpus {
    ($name:literal) => {
        include_str!(concat!("../../../tests/fixtures/incidents/", $name))
    };
}

/// The first log: tracing's JSON format, the event's fields nested under `fields` in
/// camelCase; the job is acknowledged on receipt and its worker is OOM-killed mid-call.
#[test]
fn nested_camel_case_json_shows_the_job_lost_after_an_early_ack() {
    let analysis = expect(
        corpus!("lost-job-oom.tracing.json.log"),
        &[
            (Cause::LostJob, "inv-551", &[2, 3, 7]),
            (Cause::AckBeforeFinalWrite, "inv-551", &[3, 7]),
        ],
    );
    assert_eq!(
        (analysis.lines, analysis.unrelated, analysis.malformed.len()),
        (8, 0, 0)
    );
    assert_eq!(
        finding(&analysis, Cause::LostJob).explanation,
        "request inv-551 was received by w-3 (v2) at line 2 and never finished: its delivery was \
         acknowledged at line 3 and its worker was lost at line 7, and no attempt wrote a result \
         or failed"
    );
    let text = analysis.text();
    assert!(
        text.contains("request_id <- `fields.requestId` (5 from line 2)"),
        "{text}"
    );
}

/// The second log: `kubectl logs --prefix` over zap's JSON (epoch-second timestamps), the
/// old worker told to stop after the rollout started and still taking a new request.
#[test]
fn kubectl_prefixed_json_shows_the_draining_old_worker() {
    let analysis = expect(
        corpus!("imperfect-drain.kubectl.log"),
        &[(Cause::ImperfectDrain, "r-701", &[3, 4, 7])],
    );
    assert_eq!(analysis.unrelated, 1, "`shutdown complete` says nothing");
    assert_eq!(
        finding(&analysis, Cause::ImperfectDrain).explanation,
        "infer-v1-7c9d8f6b5-kq2xz (v1) took request r-701 at line 7, after its own stop signal at \
         line 4, and a request first seen at line 7, after the cutover to v2 at line 3: old \
         workers still received jobs after the rollout started (imperfect drain)"
    );
    let plan = plan_of(&analysis, Cause::ImperfectDrain);
    assert_eq!(plan.shape, Shape::CutoverMidFlight);
    assert_eq!(workers(&plan), vec![("infer-v1-7c9d8f6b5-kq2xz", "v1")]);
    assert_eq!(
        defects_for(plan.cause, plan.shape),
        vec![Defect::RereadActiveVersion]
    );
}

/// The third log: OTLP JSON from the collector's file exporter, one batch per line; the
/// new version's pod is answered from an entry the old version's pod filled under a key that
/// names no version.
#[test]
fn otlp_json_shows_a_stale_cache_across_versions() {
    let analysis = expect(
        corpus!("stale-cache.otlp.jsonl"),
        &[
            (Cause::CrossVersionCache, "q-42", &[1, 5]),
            (Cause::UnversionedCacheKey, "q-42", &[1, 5]),
        ],
    );
    assert_eq!(
        analysis
            .reading
            .containers
            .iter()
            .map(|c| (c.line, c.first, c.records))
            .collect::<Vec<_>>(),
        vec![(1, 1, 3), (3, 5, 4)]
    );
    assert!(
        finding(&analysis, Cause::CrossVersionCache)
            .explanation
            .starts_with("infer-v2-6d8c7b9f4-m4n8w on v2 got a cache hit on inf:7d1e (line 5), an entry filled by infer-v1-7c9d8f6b5-kq2xz on v1 for request q-41"),
        "{}",
        finding(&analysis, Cause::CrossVersionCache).explanation
    );
    assert!(
        analysis
            .text()
            .contains("line 3 holds 4 records (OTLP JSON), numbered 5 to 8")
    );
}

/// The fourth log: two Celery workers' output merged by `stern`, each with its own
/// `ForkPoolWorker-1`; the visibility timeout ran out and both wrote.
#[test]
fn two_celery_workers_merged_by_stern_are_two_final_writes_by_two_workers() {
    let analysis = expect(
        corpus!("two-celery-workers.stern.log"),
        &[
            (Cause::MultipleWorkers, "req-88", &[5, 11]),
            (Cause::RetryWhileRunning, "req-88", &[5, 11]),
            (Cause::MultipleFinalWrites, "req-88", &[13, 14]),
            (Cause::VisibilityTimeoutTooShort, "req-88", &[5, 10, 11, 13]),
        ],
    );
    assert!(analysis.malformed.is_empty(), "{}", analysis.text());
    let story = analysis.reconstruction.request("req-88").unwrap();
    assert_eq!(
        story
            .attempts
            .iter()
            .map(|a| (a.attempt, a.who(), a.write_line()))
            .collect::<Vec<_>>(),
        vec![
            (
                1,
                "celery@infer-celery-7f9c6d5b8-h2kzt/ForkPoolWorker-1 (v2)".to_owned(),
                Some(13)
            ),
            (
                2,
                "celery@infer-celery-7f9c6d5b8-p9xqm/ForkPoolWorker-1 (v2)".to_owned(),
                Some(14)
            ),
        ]
    );
    assert!(
        finding(&analysis, Cause::MultipleFinalWrites)
            .explanation
            .contains("has 2 final writes (lines 13, 14)")
    );
    assert_eq!(
        analysis.reading.shapes,
        vec![("stern › Celery".to_owned(), 14)]
    );
}

/// The same two workers with nothing to tell their lines apart (no prefix, no banner): the
/// replay says so, and still counts the two writes instead of merging them into one attempt.
#[test]
fn interleaved_workers_without_a_prefix_are_ambiguous_not_merged() {
    let log: String = corpus!("two-celery-workers.stern.log")
        .lines()
        .map(|l| {
            let (_, rest) = l.split_once(" worker ").expect("a stern prefix");
            format!("{rest}\n")
        })
        .collect();
    let analysis = analyse(log.as_bytes(), None);
    let writes = finding(&analysis, Cause::MultipleFinalWrites);
    assert_eq!(writes.lines, vec![13, 14]);
    assert!(
        analysis
            .reading
            .ambiguous
            .iter()
            .any(|(line, worker)| *line == 14 && worker.contains("p9xqm")),
        "{:?}",
        analysis.reading.ambiguous
    );
    assert!(
        analysis.text().contains("attribution ambiguous on"),
        "{}",
        analysis.text()
    );
}

/// journald's export of two hosts' services: the seed's race, read from `MESSAGE`, the worker
/// from `_HOSTNAME` and its process from `_PID`.
#[test]
fn journald_json_shows_the_seed_race_across_two_hosts() {
    let analysis = expect(
        corpus!("retry-overlap.journald.json"),
        &[
            (Cause::MultipleWorkers, "r-31", &[1, 4]),
            (Cause::LateWrite, "r-31", &[8, 9]),
            (Cause::VersionSkew, "r-31", &[1, 4]),
            (Cause::RetryWhileRunning, "r-31", &[1, 4]),
            (Cause::MultipleFinalWrites, "r-31", &[8, 9]),
            (Cause::VisibilityTimeoutTooShort, "r-31", &[1, 4, 9]),
        ],
    );
    assert!(
        finding(&analysis, Cause::MultipleWorkers)
            .explanation
            .ends_with("gpu-a/2211, gpu-b/3087")
    );
    assert_eq!(
        analysis.reading.shapes,
        vec![("journald JSON".to_owned(), 9)]
    );
}

/// A Loki query response as `curl | jq` prints it: one document, streams newest first.
#[test]
fn a_loki_response_shows_the_late_write_in_time_order() {
    let analysis = expect(
        corpus!("late-write.loki.json"),
        &[
            (Cause::MultipleWorkers, "o-17", &[4, 9]),
            (Cause::LateWrite, "o-17", &[1, 7]),
            (Cause::RetryWhileRunning, "o-17", &[4, 9]),
            (Cause::MultipleFinalWrites, "o-17", &[1, 7]),
            (Cause::VisibilityTimeoutTooShort, "o-17", &[1, 4, 9]),
        ],
    );
    assert_eq!(
        analysis.reading.containers,
        vec![parse::Container {
            line: 1,
            first: 1,
            records: 9,
            shape: "Loki query response"
        }]
    );
}

/// A CSV export (timestamp, host, level, message): the host column names the worker.
#[test]
fn a_csv_export_shows_the_visibility_timeout_double_write() {
    let analysis = expect(
        corpus!("double-write.export.csv"),
        &[
            (Cause::MultipleWorkers, "p-5", &[2, 7]),
            (Cause::RetryWhileRunning, "p-5", &[2, 7]),
            (Cause::MultipleFinalWrites, "p-5", &[10, 11]),
            (Cause::VisibilityTimeoutTooShort, "p-5", &[2, 7, 10]),
        ],
    );
    assert_eq!((analysis.unrelated, analysis.malformed.len()), (1, 0));
    assert!(
        finding(&analysis, Cause::VisibilityTimeoutTooShort)
            .explanation
            .ends_with("The queue's visibility timeout (~30.0 s) is shorter than the processing time (41.8 s)")
    );
}

/// `docker compose logs` over JSON with epoch-millisecond timestamps: a rollout done right (the
/// old worker finishes what it took before its stop signal, the new one takes the rest, cache
/// keys carry the version). Nothing is invented.
#[test]
fn a_clean_rollout_in_compose_logs_has_no_diagnosis() {
    let analysis = expect(corpus!("clean-rollout.compose.log"), &[]);
    assert_eq!(analysis.reconstruction.requests.len(), 3);
    assert_eq!(analysis.reconstruction.cutovers.len(), 1);
    assert!(
        analysis
            .reconstruction
            .marks
            .iter()
            .any(|m| m.status == Status::StopRequested && m.line == 4)
    );
}

/// Every fixture of the corpus, in every shape, reads without a malformed line, and every
/// request that a fixture names as clean stays without a diagnosis.
#[test]
fn the_corpus_reads_cleanly_and_clean_requests_stay_clean() {
    let corpus: [(&str, &str, &[&str]); 8] = [
        (
            "lost-job-oom",
            corpus!("lost-job-oom.tracing.json.log"),
            &["inv-552"],
        ),
        (
            "imperfect-drain",
            corpus!("imperfect-drain.kubectl.log"),
            &["r-700", "r-702"],
        ),
        ("otlp", corpus!("stale-cache.otlp.jsonl"), &["q-41", "q-43"]),
        (
            "stern",
            corpus!("two-celery-workers.stern.log"),
            &["req-89"],
        ),
        (
            "journald",
            corpus!("retry-overlap.journald.json"),
            &["r-32"],
        ),
        ("loki", corpus!("late-write.loki.json"), &["o-18"]),
        ("csv", corpus!("double-write.export.csv"), &["p-6"]),
        (
            "compose",
            corpus!("clean-rollout.compose.log"),
            &["c-1", "c-2", "c-3"],
        ),
    ];
    for (name, log, clean) in corpus {
        let analysis = analyse(log.as_bytes(), None);
        assert!(analysis.malformed.is_empty(), "{name}: {}", analysis.text());
        for request in clean {
            assert!(
                analysis.reconstruction.request(request).is_some(),
                "{name}: {request} not read"
            );
            assert!(
                !analysis.findings.iter().any(|f| f.request_id == *request),
                "{name}: {request} is clean: {}",
                analysis.text()
            );
        }
    }
}
