//! The readers of platform shapes, each on records written from the shape's own documentation:
//! orchestrator prefixes, journald, OTLP, Loki, Grafana, CSV; the team's own names (`--field`);
//! and what the parser says about lines it could not use.

use super::super::*;

fn read(text: &str) -> Parsed {
    read_with(text, &Options::default())
}

fn read_with(text: &str, options: &Options) -> Parsed {
    // A tiny buffer: lines cross buffer boundaries everywhere.
    parse_reader(
        std::io::BufReader::with_capacity(5, text.as_bytes()),
        options,
    )
    .expect("a byte slice reads")
}

fn only(parsed: &Parsed) -> &LogLine {
    assert_eq!(parsed.lines.len(), 1, "{parsed:#?}");
    &parsed.lines[0].line
}

#[test]
fn kubectl_prefixes_name_the_pod_with_or_without_timestamps() {
    let parsed = read(
        "[pod/infer-v1-7c9d8f6b5-kq2xz/worker] {\"msg\":\"job received\",\"request_id\":\"r-1\",\"ts\":1786434010.25}\n\
         [pod/infer-v1-7c9d8f6b5-kq2xz/worker] 2026-08-11T07:40:02.100733Z {\"msg\":\"job acked\",\"request_id\":\"r-1\"}\n",
    );
    assert!(parsed.malformed.is_empty(), "{parsed:#?}");
    let [first, second] = parsed.lines.as_slice() else {
        panic!("{parsed:#?}")
    };
    assert_eq!(
        first.line.get("worker_id"),
        Some("infer-v1-7c9d8f6b5-kq2xz")
    );
    assert_eq!(first.line.ts, "2026-08-11T07:40:10.250Z");
    assert_eq!(second.line.ts, "2026-08-11T07:40:02.100Z");
    assert_eq!(second.line.status_word(), Some(Status::Acked));
    assert_eq!(
        parsed.shapes,
        vec![("kubectl logs --prefix › JSON".to_owned(), 2)]
    );
}

#[test]
fn stern_prefixes_are_told_from_a_lines_own_words() {
    let parsed = read(
        "\x1b[32minfer-celery-7f9c6d5b8-h2kzt\x1b[0m \x1b[36mworker\x1b[0m [2026-08-12 09:00:05,002: INFO/MainProcess] Task tasks.infer[t-1] received\n\
         worker-0 app level=info msg=\"job received\" request_id=r-2\n\
         job received request_id=r-3 worker_id=w-9\n",
    );
    assert!(parsed.malformed.is_empty(), "{parsed:#?}");
    let workers: Vec<Option<&str>> = parsed
        .lines
        .iter()
        .map(|l| l.line.get("worker_id"))
        .collect();
    assert_eq!(
        workers,
        vec![
            Some("infer-celery-7f9c6d5b8-h2kzt"),
            Some("worker-0"),
            Some("w-9")
        ]
    );
    assert_eq!(parsed.lines[0].line.get("job_id"), Some("t-1"));
    assert_eq!(
        parsed.lines[2].line.status_word(),
        Some(Status::JobReceived),
        "two leading words without a digit are no pod and container"
    );
}

#[test]
fn journald_entries_read_their_message_and_where_it_ran() {
    let parsed = read(concat!(
        r#"{"__CURSOR":"s=1;i=2","__REALTIME_TIMESTAMP":"1786441202512930","PRIORITY":"4","_PID":"2211","_HOSTNAME":"gpu-a","SYSLOG_IDENTIFIER":"infer-worker","_COMM":"python3","MESSAGE":"request_id=r-31 attempt=1 status=timeout_waiting_upstream"}"#,
        "\n",
        r#"{"__REALTIME_TIMESTAMP":"1786441202512931","_HOSTNAME":"gpu-b","MESSAGE":[106,111,98,32,97,99,107,101,100,32,114,101,113,117,101,115,116,95,105,100,61,114,45,51,50,255]}"#,
        "\n",
    ));
    assert!(parsed.malformed.is_empty(), "{parsed:#?}");
    let line = &parsed.lines[0].line;
    assert_eq!(line.ts, "2026-08-11T09:40:02.512Z");
    assert_eq!(line.level, Level::Warn);
    assert_eq!(line.get("worker_id"), Some("gpu-a"));
    assert_eq!(line.get("process"), Some("2211"));
    assert_eq!(line.status_word(), Some(Status::TimeoutWaitingUpstream));
    let bytes = &parsed.lines[1].line;
    assert_eq!(bytes.status_word(), Some(Status::Acked));
    assert_eq!(bytes.get("request_id"), Some("r-32\u{fffd}"));
}

#[test]
fn an_otlp_batch_is_numbered_record_by_record() {
    let parsed = read(concat!(
        r#"{"resourceLogs":[{"resource":{"attributes":[{"key":"host.name","value":{"stringValue":"node-a"}},{"key":"k8s.pod.name","value":{"stringValue":"pod-a-1"}},{"key":"process.pid","value":{"intValue":"77"}}]},"scopeLogs":[{"scope":{},"logRecords":["#,
        r#"{"timeUnixNano":"1786437600100000000","severityText":"WARN","body":{"stringValue":"cache miss"},"attributes":[{"key":"request.id","value":{"stringValue":"q-1"}},{"key":"attempt","value":{"intValue":"2"}}]},"#,
        r#"{"timeUnixNano":"0","observedTimeUnixNano":"1786437600200000000","body":{"kvlistValue":{"values":[{"key":"event","value":{"stringValue":"result stored"}},{"key":"request_id","value":{"stringValue":"q-1"}}]}}}"#,
        r#"]}]}]}"#,
        "\nts=2026-08-13T10:00:00Z request_id=q-2 status=cache_hit\n",
    ));
    assert!(parsed.malformed.is_empty(), "{parsed:#?}");
    let numbers: Vec<usize> = parsed.lines.iter().map(|l| l.line_no).collect();
    assert_eq!(numbers, vec![1, 2, 3]);
    assert_eq!(
        parsed.containers,
        vec![Container {
            line: 1,
            first: 1,
            records: 2,
            shape: "OTLP JSON"
        }]
    );
    let miss = &parsed.lines[0].line;
    assert_eq!(
        miss.get("worker_id"),
        Some("pod-a-1"),
        "the pod before its node"
    );
    assert_eq!(miss.get("process"), Some("77"));
    assert_eq!(miss.get("attempt"), Some("2"));
    assert_eq!(miss.level, Level::Warn);
    assert_eq!(miss.ts, "2026-08-11T08:40:00.100Z");
    let stored = &parsed.lines[1].line;
    assert_eq!(stored.status_word(), Some(Status::InferenceSucceeded));
    assert_eq!(stored.get("request_id"), Some("q-1"));
    assert_eq!(stored.ts, "2026-08-11T08:40:00.200Z");
}

#[test]
fn loki_responses_push_bodies_logcli_lines_and_grafana_frames() {
    let pretty = r#"{
  "status": "success",
  "data": {
    "resultType": "streams",
    "result": [
      {
        "stream": {"pod": "p-1", "app": "w"},
        "values": [
          ["1786444809400000000", "level=info msg=\"result stored\" request_id=o-1"],
          ["1786444800000000000", "{\"msg\":\"job received\",\"request_id\":\"o-1\"}"]
        ]
      }
    ]
  }
}
"#;
    let parsed = read(pretty);
    assert!(parsed.malformed.is_empty(), "{parsed:#?}");
    let seen: Vec<(usize, &str, Option<&str>)> = parsed
        .lines
        .iter()
        .map(|l| (l.line_no, l.line.ts.as_str(), l.line.get("worker_id")))
        .collect();
    assert_eq!(
        seen,
        vec![
            (1, "2026-08-11T10:40:09.400Z", Some("p-1")),
            (2, "2026-08-11T10:40:00.000Z", Some("p-1"))
        ]
    );
    assert_eq!(parsed.shapes, vec![("Loki query response".to_owned(), 1)]);

    let push = read(
        r#"{"streams":[{"stream":{"host":"h-9"},"values":[["1786444800000000000","request_id=o-2 status=acked"]]}]}"#,
    );
    assert_eq!(only(&push).get("worker_id"), Some("h-9"));
    let logcli = read(
        r#"{"labels":{"container":"worker","pod":"p-3"},"line":"request_id=o-3 status=job_received","timestamp":"2026-08-13T12:00:00.5+02:00"}"#,
    );
    assert_eq!(only(&logcli).get("worker_id"), Some("p-3"));
    assert_eq!(only(&logcli).ts, "2026-08-13T10:00:00.500Z");
    let frames = read(
        r#"{"results":{"A":{"frames":[{"schema":{"fields":[{"name":"labels","type":"other"},{"name":"Time","type":"time"},{"name":"Line","type":"string"},{"name":"tsNs","type":"string"},{"name":"id","type":"string"}]},"data":{"values":[[{"pod":"p-4"},{"pod":"p-5"}],[1786444800000,1786444801000],["request_id=o-4 status=job_received","request_id=o-4 status=inference_succeeded"],["1786444800000000000","1786444801000000000"],["a","b"]]}}]}}}"#,
    );
    let rows: Vec<(usize, Option<&str>, Option<Status>)> = frames
        .lines
        .iter()
        .map(|l| (l.line_no, l.line.get("worker_id"), l.line.status_word()))
        .collect();
    assert_eq!(
        rows,
        vec![
            (1, Some("p-4"), Some(Status::JobReceived)),
            (2, Some("p-5"), Some(Status::InferenceSucceeded))
        ]
    );
}

#[test]
fn csv_exports_with_quoted_multi_line_messages_and_label_columns() {
    let parsed = read(
        "\u{feff}Time,labels,Line\n\
         2026-08-13T10:00:00.120Z,\"{pod=\"\"p-1\"\", app=\"\"w\"\"}\",\"received job request_id=p-5\"\n\
         2026-08-13T10:00:01.000Z,\"{pod=\"\"p-2\"\"}\",\"result stored request_id=p-5 note=\"\"two\n\
         lines\"\"\"\n\
         2026-08-13T10:00:02.000Z,\"{pod=\"\"p-2\"\"}\",\"an unclosed \"\"quote\n",
    );
    let rows: Vec<(usize, Option<&str>, Option<Status>)> = parsed
        .lines
        .iter()
        .map(|l| (l.line_no, l.line.get("worker_id"), l.line.status_word()))
        .collect();
    assert_eq!(
        rows,
        vec![
            (2, Some("p-1"), Some(Status::JobReceived)),
            (3, Some("p-2"), Some(Status::InferenceSucceeded))
        ]
    );
    assert_eq!(parsed.lines[1].line.get("note"), Some("two\nlines"));
    assert_eq!(
        parsed
            .malformed
            .iter()
            .map(|m| (m.line_no, m.reason.as_str()))
            .collect::<Vec<_>>(),
        vec![(5, "a CSV row whose quoted field is never closed")]
    );
}

#[test]
fn nested_camel_case_fields_and_the_teams_own_names() {
    let line = r#"{"timestamp":"2026-08-11T07:40:02.1Z","level":"INFO","fields":{"message":"job acked","requestId":"inv-551","workerId":"w-3"},"ctx":{"rid":"other"},"error":{"message":"cache hit"}}"#;
    let parsed = read(line);
    let read_line = only(&parsed);
    assert_eq!(read_line.get("request_id"), Some("inv-551"));
    assert_eq!(read_line.get("worker_id"), Some("w-3"));
    assert_eq!(
        read_line.status_word(),
        Some(Status::Acked),
        "the record's own message before a nested error's"
    );
    let found: Vec<(&str, &str)> = parsed
        .found
        .iter()
        .map(|f| (f.field, f.key.as_str()))
        .collect();
    assert!(
        found.contains(&("request_id", "fields.requestId")),
        "{found:?}"
    );
    assert!(found.contains(&("status", "fields.message")), "{found:?}");

    let mapped: FieldMap = "request_id=ctx.rid".parse().unwrap();
    let options = Options {
        fields: vec![mapped, "worker_id = fields.requestId".parse().unwrap()],
        ..Options::default()
    };
    let parsed = read_with(line, &options);
    let mapped_line = only(&parsed);
    assert_eq!(mapped_line.get("request_id"), Some("other"));
    assert_eq!(mapped_line.get("worker_id"), Some("inv-551"));
}

#[test]
fn a_bad_field_flag_says_what_is_wrong() {
    let err = "request=ctx.rid".parse::<FieldMap>().unwrap_err();
    assert!(
        err.starts_with("--field \"request=ctx.rid\": \"request\" is not a field racecert reads; NAME is one of request_id, job_id,"),
        "{err}"
    );
    assert_eq!(
        "request_id".parse::<FieldMap>().unwrap_err(),
        "--field \"request_id\": expected NAME=PATH (e.g. request_id=ctx.rid)"
    );
    assert!(
        "request_id="
            .parse::<FieldMap>()
            .unwrap_err()
            .contains("PATH after '=' is empty")
    );
}

#[test]
fn epoch_timestamps_in_every_unit_and_zones_written_out() {
    let at = |s: &str| read_timestamp(s).map(format_timestamp);
    let want = Some("2026-08-13T12:00:00.123Z".to_owned());
    for text in [
        "1786622400.123",
        "1786622400123",
        "1786622400123456",
        "1786622400123456789",
        "2026-08-13T14:00:00.123+02:00",
        "2026-08-13 12:00:00.123 +0000 UTC",
        "2026-08-13 12:00:00.123 UTC",
    ] {
        assert_eq!(at(text), want, "{text}");
    }
    assert_eq!(at("99999999999999999999999"), None);
}

#[test]
fn unusable_lines_are_shown_as_they_looked() {
    let mut bytes = b"{\"msg\":\"healthcheck ok\",\"path\":\"/healthz\"}\n".to_vec();
    bytes.extend_from_slice(b"request_id=r-1 status=acked \xff\xfe tail\n");
    bytes.extend_from_slice(b"{\"request_id\":\"r-1\",\"status\":\"ack");
    let parsed = parse(&bytes);
    assert_eq!(parsed.unrelated, 1);
    assert_eq!(
        parsed.unrelated_samples[0].text,
        "{\"msg\":\"healthcheck ok\",\"path\":\"/healthz\"}"
    );
    let malformed: Vec<(usize, &str, &str)> = parsed
        .malformed
        .iter()
        .map(|m| (m.line_no, m.reason.as_str(), m.text.as_str()))
        .collect();
    assert_eq!(
        malformed,
        vec![
            (
                2,
                "not UTF-8 text (an invalid byte at column 29)",
                "request_id=r-1 status=acked \u{fffd}\u{fffd} tail"
            ),
            (
                3,
                "invalid JSON: EOF while parsing a string at line 1 column 33",
                "{\"request_id\":\"r-1\",\"status\":\"ack"
            ),
        ]
    );
}

#[test]
fn a_truncated_pretty_document_is_one_malformed_record() {
    let parsed = read("{\n  \"status\": \"success\",\n  \"data\": {\n");
    assert_eq!(parsed.lines_read, 3);
    let malformed: Vec<(usize, &str)> = parsed
        .malformed
        .iter()
        .map(|m| (m.line_no, m.reason.as_str()))
        .collect();
    assert_eq!(
        malformed,
        vec![(
            1,
            "a JSON document that ends at line 3 before it closes (a download cut short?)"
        )],
        "{parsed:#?}"
    );
}

/// An array cut short keeps the records before the cut, each at the line it starts on.
#[test]
fn a_truncated_array_keeps_its_whole_records() {
    let parsed = read(
        "[\n  {\"request_id\": \"r-1\", \"status\": \"acked\"},\n  {\n    \"request_id\": \"r-2\",\n",
    );
    let lines: Vec<usize> = parsed.lines.iter().map(|l| l.line_no).collect();
    assert_eq!(lines, vec![2]);
    assert_eq!(parsed.malformed[0].line_no, 1);
    assert_eq!(parsed.lines_read, 4);
}

/// A JSON-lines log whose first line was cut: that line is malformed, the lines after it are
/// read one by one as ever.
#[test]
fn a_cut_first_line_of_json_lines_leaves_the_rest_readable() {
    let parsed = read(
        "{\"request_id\": \"r-1\", \"sta\n{\"request_id\": \"r-2\", \"status\": \"acked\"}\nrequest_id=r-3 status=acked\n",
    );
    let lines: Vec<(usize, Option<&str>)> = parsed
        .lines
        .iter()
        .map(|l| (l.line_no, l.line.get("request_id")))
        .collect();
    assert_eq!(
        lines,
        vec![(2, Some("r-2")), (3, Some("r-3"))],
        "{parsed:#?}"
    );
    assert_eq!(parsed.malformed.len(), 1, "{parsed:#?}");
    assert_eq!(parsed.malformed[0].line_no, 1);
    assert_eq!(parsed.lines_read, 3);
}

#[test]
fn lines_over_the_limit_are_measured_and_skipped() {
    let mut text = "x".repeat(MAX_LINE + 1);
    text.push_str("\nrequest_id=r-1 status=acked\n");
    let parsed = read(&text);
    assert_eq!(parsed.lines.len(), 1);
    assert_eq!(parsed.lines[0].line_no, 2);
    assert_eq!(
        parsed.malformed[0].reason,
        format!("line of {} bytes exceeds {MAX_LINE}", MAX_LINE + 1)
    );
}

#[test]
fn only_one_requests_lines_are_kept_when_asked() {
    let log = "request_id=a job_id=ja status=job_received\n\
               job_id=ja status=inference_succeeded\n\
               request_id=b job_id=jb status=job_received\n\
               job_id=jz status=acked\n\
               worker_id=w status=worker_lost\n\
               request_id=c cache_key=inf:1 status=cache_miss\n";
    let options = Options {
        only: Some("a".into()),
        ..Options::default()
    };
    let kept: Vec<usize> = read_with(log, &options)
        .lines
        .iter()
        .map(|l| l.line_no)
        .collect();
    assert_eq!(kept, vec![1, 2, 4, 5, 6]);
    let capped = Options {
        keep: 2,
        ..Options::default()
    };
    let parsed = read_with(log, &capped);
    assert_eq!((parsed.lines.len(), parsed.not_kept), (2, 4));
}

/// Lines of every platform shape, to be mutated.
const SHAPES: &[&str] = &[
    r#"{"__REALTIME_TIMESTAMP":"1786441202512930","PRIORITY":"4","_PID":"2211","_HOSTNAME":"gpu-a","MESSAGE":"request_id=r-31 status=acked"}"#,
    r#"{"resourceLogs":[{"resource":{"attributes":[{"key":"k8s.pod.name","value":{"stringValue":"p"}}]},"scopeLogs":[{"logRecords":[{"timeUnixNano":"1786437600100000000","body":{"stringValue":"cache miss"},"attributes":[{"key":"request.id","value":{"stringValue":"q-1"}}]}]}]}]}"#,
    r#"{"streams":[{"stream":{"host":"h-9"},"values":[["1786444800000000000","request_id=o-2 status=acked"]]}]}"#,
    r#"{"labels":{"pod":"p-3"},"line":"request_id=o-3 status=job_received","timestamp":"2026-08-13T12:00:00Z"}"#,
    r#"[pod/infer-v1-7c9d8f6b5-kq2xz/worker] 2026-08-11T07:40:02.1Z {"msg":"job acked","request_id":"r-1"}"#,
    "infer-celery-7f9c6d5b8-h2kzt worker [2026-08-12 09:00:05,002: INFO/MainProcess] Task tasks.infer[t-1] received",
    "time,host,message",
    "2026-08-13T10:00:00.120Z,worker-1,\"received job request_id=p-5\"",
    "{",
    "  \"data\": {\"resultType\": \"streams\", \"result\": [",
];

fn mutated_shape() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
    use proptest::prelude::*;
    (
        proptest::sample::select(SHAPES.to_vec()),
        proptest::collection::vec((any::<u16>(), 0u8..4, any::<u8>()), 0..6),
    )
        .prop_map(|(line, edits)| {
            let mut bytes = line.as_bytes().to_vec();
            for (at, kind, byte) in edits {
                let at = usize::from(at) % (bytes.len() + 1);
                match kind {
                    0 => bytes.insert(at, byte),
                    1 if at < bytes.len() => {
                        bytes.remove(at);
                    }
                    2 => bytes.truncate(at),
                    _ if at < bytes.len() => bytes[at] = byte,
                    _ => {}
                }
            }
            bytes
        })
}

proptest::proptest! {
    #[test]
    fn platform_shapes_mutated_and_cut_anywhere_never_panic(
        lines in proptest::collection::vec(mutated_shape(), 1..10),
        capacity in 1usize..64,
    ) {
        let input = lines.join(&b'\n');
        let parsed = parse_reader(std::io::BufReader::with_capacity(capacity, &input[..]), &Options::default())
            .expect("a byte slice reads");
        let count = input.split(|b| *b == b'\n').count();
        proptest::prop_assert!(parsed.lines_read <= count);
        proptest::prop_assert_eq!(parsed.bytes, input.len() as u64);
        for malformed in &parsed.malformed {
            proptest::prop_assert!(malformed.line_no >= 1 && malformed.line_no <= count);
            proptest::prop_assert!(!malformed.reason.is_empty());
        }
    }
}

#[test]
fn a_viewers_download_puts_the_time_before_each_json_record() {
    let parsed = read("2026-08-11T07:40:02.100Z\t{\"msg\":\"job acked\",\"request_id\":\"r-1\"}\n");
    let line = only(&parsed);
    assert_eq!(line.ts, "2026-08-11T07:40:02.100Z");
    assert_eq!(line.status_word(), Some(Status::Acked));
}
