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

/// `gcloud logging read --format=json`: one pretty-printed array of LogEntry objects, newest
/// first; each record numbered by the line it starts on, its fields from `jsonPayload` and the
/// pod from `resource.labels`.
#[test]
fn a_gcloud_array_shows_the_late_write_of_the_old_version() {
    let analysis = expect(
        corpus!("late-write.gcloud.json"),
        &[
            (Cause::MultipleWorkers, "g-41", &[92, 210]),
            (Cause::LateWrite, "g-41", &[2, 32]),
            (Cause::VersionSkew, "g-41", &[92, 210]),
            (Cause::RetryWhileRunning, "g-41", &[92, 210]),
            (Cause::MultipleFinalWrites, "g-41", &[2, 32]),
            (Cause::NewJobIdPerRetry, "g-41", &[92, 210]),
        ],
    );
    assert_eq!(
        (analysis.lines, analysis.malformed.len()),
        (8, 0),
        "{}",
        analysis.text()
    );
    let text = analysis.text();
    assert!(text.contains("shapes: JSON array › JSON (8)"), "{text}");
    assert!(
        text.contains("worker_id <- `resource.labels.pod_name` (8 from line 2)"),
        "{text}"
    );
}

/// The same entries as compact JSON lines give the same diagnoses, record for record: the
/// pretty array's lines are where its records start.
#[test]
fn a_pretty_array_and_its_json_lines_give_the_same_diagnoses() {
    let pretty = corpus!("late-write.gcloud.json");
    let values: Vec<serde_json::Value> = serde_json::from_str(pretty).unwrap();
    let compact: String = values.iter().map(|v| format!("{v}\n")).collect();
    // Where each record of the pretty array starts (`json.dumps(indent=2)`: `  {`).
    let starts: Vec<usize> = pretty
        .lines()
        .enumerate()
        .filter(|(_, line)| *line == "  {")
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(starts.len(), values.len());
    let findings = |log: &str, number: &dyn Fn(usize) -> usize| {
        analyse(log.as_bytes(), None)
            .findings
            .iter()
            .map(|f| {
                let lines: Vec<usize> = f.lines.iter().map(|l| number(*l)).collect();
                (f.cause, f.request_id.clone(), lines)
            })
            .collect::<Vec<_>>()
    };
    let record_of = |line: usize| starts.iter().position(|s| *s == line).unwrap() + 1;
    assert_eq!(
        findings(pretty, &record_of),
        findings(&compact, &|line| line)
    );
    assert!(!findings(&compact, &|line| line).is_empty());
}

/// `aws logs filter-log-events`: one object, `{"events": [...]}`, each event's `message` the
/// application's own JSON line inside a string; the worker is the event's log stream.
#[test]
fn a_cloudwatch_export_reads_the_json_inside_each_message() {
    let analysis = expect(
        corpus!("double-write.cloudwatch.json"),
        &[
            (Cause::MultipleWorkers, "r-100", &[10, 38]),
            (Cause::RetryWhileRunning, "r-100", &[10, 38]),
            (Cause::MultipleFinalWrites, "r-100", &[59, 73]),
            (Cause::VisibilityTimeoutTooShort, "r-100", &[10, 38, 59]),
        ],
    );
    let text = analysis.text();
    assert!(
        text.contains("shapes: CloudWatch events › CloudWatch event (12)"),
        "{text}"
    );
    assert!(
        text.contains("request_id <- `message.req_id` (10 from line 10)"),
        "{text}"
    );
    assert!(
        text.contains("worker_id <- `logStreamName` (12 from line 3)"),
        "{text}"
    );
    assert_eq!(analysis.malformed.len(), 0);
}

/// An Elasticsearch `_search` response of Filebeat's ECS documents: the records are
/// `hits.hits[]._source`, the request's fields under `labels`.
#[test]
fn an_elasticsearch_search_response_shows_the_expired_lease() {
    let analysis = expect(
        corpus!("lease-expiry.es-search.json"),
        &[
            (Cause::MultipleWorkers, "r-200", &[17, 119]),
            (Cause::LateWrite, "r-200", &[221, 288]),
            (Cause::RetryWhileRunning, "r-200", &[17, 119]),
            (Cause::MultipleFinalWrites, "r-200", &[221, 288]),
            (Cause::LeaseTtlTooShort, "r-200", &[51, 153, 255, 288]),
        ],
    );
    let text = analysis.text();
    assert!(
        text.contains("shapes: Elasticsearch _search response › JSON (9)"),
        "{text}"
    );
    assert!(
        text.contains("worker_id <- `kubernetes.pod.name` (9 from line 17)"),
        "{text}"
    );
}

/// Loki's query API (`query_range`), each stream's values newest first, JSON lines inside:
/// the records numbered one after another from the document's first line.
#[test]
fn a_loki_query_response_of_json_lines_shows_the_new_id_retry() {
    let analysis = analyse(corpus!("new-id-retry.loki-query.json").as_bytes(), None);
    let found: Vec<(Cause, &str)> = analysis
        .findings
        .iter()
        .map(|f| (f.cause, f.request_id.as_str()))
        .collect();
    assert!(
        found.contains(&(Cause::NewJobIdPerRetry, "order-77"))
            && found.contains(&(Cause::MultipleFinalWrites, "order-77"))
            && found.contains(&(Cause::RetryWhileRunning, "order-77")),
        "{}",
        analysis.text()
    );
    assert_eq!(
        finding(&analysis, Cause::NewJobIdPerRetry).lines,
        vec![4, 7]
    );
    assert_eq!((analysis.lines, analysis.malformed.len()), (7, 0));
}

/// Docker's json-file driver: each line a record whose `log` is the program's own line (here
/// tracing's JSON), read as the record's fields under `log`.
#[test]
fn docker_json_file_lines_show_the_job_lost_after_an_early_ack() {
    let analysis = expect(
        corpus!("lost-job-oom.docker.json.log"),
        &[
            (Cause::LostJob, "inv-551", &[2, 3, 7]),
            (Cause::AckBeforeFinalWrite, "inv-551", &[3, 7]),
        ],
    );
    let text = analysis.text();
    assert!(text.contains("shapes: Docker json-file (8)"), "{text}");
    assert!(
        text.contains("request_id <- `log.fields.requestId` (5 from line 2)"),
        "{text}"
    );
    // The program's own timestamp, not the driver's.
    assert!(text.contains("ts <- `log.timestamp`"), "{text}");
}
