//! How long reading an incident log takes: 100,000 lines of seed-shaped stories in logfmt, JSON
//! and Celery's format, parsed, reconstructed and diagnosed. Ignored by default; measure in a
//! release build:
//!
//! `cargo test --release --lib replay::bench -- --ignored --nocapture`

use super::*;
use std::time::{Duration, Instant};

/// Lines of the benchmark log.
const LINES: usize = 100_000;

/// A log of at least `lines` lines: one story per request, rotating through the formats, every
/// request with its own ids and cache key.
fn big_log(lines: usize) -> String {
    let seed: Vec<&str> = seed_log().lines().collect();
    let json: Vec<String> = seed
        .iter()
        .map(|l| parse::parse_line(l).expect("the seed parses").to_json())
        .collect();
    let mut out = String::with_capacity(lines * 200);
    let mut written = 0;
    let mut i = 0usize;
    while written < lines {
        let rename = |line: &str| {
            line.replace("req-91", &format!("req-{i}"))
                .replace("job-441", &format!("job-{i}"))
                .replace("inf:abc", &format!("inf:{i:x}"))
        };
        match i % 3 {
            0 => {
                for line in &seed {
                    out.push_str(&rename(line));
                    out.push('\n');
                }
                written += seed.len();
            }
            1 => {
                for line in &json {
                    out.push_str(&rename(line));
                    out.push('\n');
                }
                written += json.len();
            }
            _ => {
                let host = i % 4;
                out.push_str(&format!(
                    "host-{host}  | [2026-06-26 10:15:21,104: INFO/MainProcess] Task tasks.infer[c-{i}] received\n\
                     host-{host}  | [2026-06-26 10:15:21,180: INFO/ForkPoolWorker-1] tasks.infer[c-{i}]: calling model backend model_version=v2 request_id=creq-{i}\n\
                     host-{host}  | [2026-06-26 10:15:33,110: INFO/ForkPoolWorker-1] Task tasks.infer[c-{i}] succeeded in 12.00s: None\n"
                ));
                written += 3;
            }
        }
        i += 1;
    }
    out
}

#[test]
#[ignore = "a measurement: run in a release build with --ignored --nocapture"]
fn a_hundred_thousand_lines() {
    let log = big_log(LINES);
    let started = Instant::now();
    let parsed = parse::parse(log.as_bytes());
    let parsing = started.elapsed();
    let reconstruction = reconstruct(&parsed);
    let reconstructing = started.elapsed() - parsing;
    let findings = diagnose(&reconstruction);
    let total = started.elapsed();
    let diagnosing = total - parsing - reconstructing;
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
    println!(
        "replay bench: {} lines ({} MB): parse {}, reconstruct {}, diagnose {}, total {} \
         ({} requests, {} findings, {} malformed)",
        log.lines().count(),
        log.len() / 1_000_000,
        ms(parsing),
        ms(reconstructing),
        ms(diagnosing),
        ms(total),
        reconstruction.requests.len(),
        findings.len(),
        parsed.malformed.len()
    );
    assert!(parsed.malformed.is_empty());
    assert!(log.lines().count() >= LINES);
    // Every seed-shaped story is diagnosed as the seed is.
    let late = findings
        .iter()
        .filter(|f| f.cause == Cause::LateWrite)
        .count();
    let seed_shaped = reconstruction
        .requests
        .iter()
        .filter(|r| r.request_id.starts_with("req-"))
        .count();
    assert_eq!(late, seed_shaped);
}
