//! Celery's worker format: `[2026-06-26 10:15:21,104: INFO/MainProcess] Task tasks.infer[ID]
//! received`, `succeeded in 12.3s: ..`, `raised unexpected: ..`, `retry: Retry in 5s`, `Restoring N
//! unacknowledged message(s)`, `celery@host ready.`, task-logger lines (`tasks.infer[ID]: ..`),
//! and the start banner. A Celery task id is the job id; the worker is Celery's hostname (from
//! the banner or the `ready` line of the same stream), else the stream's prefix or host, with
//! the pool process kept under `process`: pool process names (`ForkPoolWorker-1`) repeat across
//! workers, so they never name a worker alone.
//!
//! Two workers' output interleaved in one stream with nothing to tell them apart (a second
//! hostname becomes ready with no banner between, so the lines that follow may be either's) is
//! said, not guessed: such lines carry `attribution=ambiguous` and a worker naming both.

use super::Reader;
use super::fields::{Meaning, Raw, field_value, meaning};
use super::logfmt::logfmt_fields;
use racecert_core::contract::log::Status;
use regex::Regex;
use std::sync::LazyLock;

/// Celery's line format, as a regex: the oracle [`celery_line`] is tested against.
#[cfg(test)]
static CELERY_LINE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^\[([0-9]{4}-[0-9]{2}-[0-9]{2}[ T][0-9]{2}:[0-9]{2}:[0-9]{2}(?:[,.][0-9]+)?): ([A-Za-z]+)/([^\]]+)\]\s?(.*)$",
    )
    .expect("valid regex")
});

/// A Celery worker line cut into its parts: `[TIMESTAMP: LEVEL/PROCESS] MESSAGE`.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct CeleryLine<'a> {
    pub ts: &'a str,
    pub level: &'a str,
    pub process: &'a str,
    pub message: &'a str,
}

/// Cuts a Celery worker line (`[2026-06-26 10:15:21,104: INFO/MainProcess] message`), or
/// `None`. By hand rather than by a regex with captures: every line of a Celery log comes here,
/// and capture groups cost a backtracking search per line (a tenth of a replay's time).
pub(super) fn celery_line(body: &str) -> Option<CeleryLine<'_>> {
    let (head, rest) = body.strip_prefix('[')?.split_once(']')?;
    let (ts, who) = head.split_once(": ")?;
    let (level, process) = who.split_once('/')?;
    let stamp = ts.as_bytes();
    let digits = |range: std::ops::Range<usize>| stamp[range].iter().all(u8::is_ascii_digit);
    let shaped = stamp.len() >= 19
        && digits(0..4)
        && stamp[4] == b'-'
        && digits(5..7)
        && stamp[7] == b'-'
        && digits(8..10)
        && matches!(stamp[10], b' ' | b'T')
        && digits(11..13)
        && stamp[13] == b':'
        && digits(14..16)
        && stamp[16] == b':'
        && digits(17..19)
        && match stamp.get(19) {
            None => true,
            Some(b',' | b'.') => stamp.len() > 20 && digits(20..stamp.len()),
            Some(_) => false,
        };
    if !shaped
        || level.is_empty()
        || !level.bytes().all(|b| b.is_ascii_alphabetic())
        || process.is_empty()
    {
        return None;
    }
    let message = match rest.chars().next() {
        Some(c) if c.is_whitespace() => &rest[c.len_utf8()..],
        _ => rest,
    };
    Some(CeleryLine {
        ts,
        level,
        process,
        message,
    })
}

pub(super) static CELERY_BANNER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"-+ (\S+@\S+) v\d").expect("valid regex"));
static CELERY_READY: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^(\S+@\S+) ready\.?$").expect("valid regex"));
static CELERY_TASK: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^(?:Task ([^\s\[]+)\[([^\]\s]+)\] (.*)|Received task: ([^\s\[]+)\[([^\]\s]+)\].*)$",
    )
    .expect("valid regex")
});
static CELERY_SUCCEEDED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^succeeded in ([0-9.eE+-]+)s(?::\s?(.*))?$").expect("valid regex")
});
static CELERY_RETRY_IN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"Retry in ([0-9.]+)s").expect("valid regex"));
static CELERY_RESTORING: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^Restoring (\d+) unacknowledged message").expect("valid regex"));
static CELERY_TASK_LOGGER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^([^\s\[]+)\[([^\]\s]+)\]: (.*)$").expect("valid regex"));

impl Reader<'_> {
    /// A banner names the worker whose output follows in this stream: a file of several
    /// workers' output concatenated, each behind its banner, is attributed without doubt.
    pub(super) fn celery_banner(&mut self, stream: &str, hostname: &str) {
        self.hostnames
            .insert(stream.to_owned(), hostname.to_owned());
        self.ambiguous.remove(stream);
        self.banner_names = Some(hostname.to_owned());
    }

    /// A Celery worker line: timestamp, level, process, message.
    pub(super) fn celery(
        &mut self,
        source: Option<&str>,
        ts: &str,
        level: &str,
        process: &str,
        message: &str,
    ) -> Raw {
        let key = source.unwrap_or("").to_owned();
        if let Some(captures) = CELERY_READY.captures(message) {
            let hostname = captures[1].to_owned();
            let announced = self.banner_names.take();
            match self.hostnames.get(&key) {
                // Another worker became ready in the same stream with no banner of its own:
                // the lines from here on may be either worker's.
                Some(other) if *other != hostname && announced.as_deref() != Some(&hostname) => {
                    let both = self.ambiguous.entry(key.clone()).or_default();
                    for name in [other.clone(), hostname.clone()] {
                        if !both.contains(&name) {
                            both.push(name);
                        }
                    }
                }
                _ => {}
            }
            self.hostnames.insert(key.clone(), hostname);
        }
        let ambiguous = self.ambiguous.get(&key).map(|names| names.join("|"));
        let known = ambiguous.clone().or_else(|| {
            self.hostnames
                .get(&key)
                .cloned()
                .or_else(|| source.map(str::to_owned))
        });
        let mut fields = vec![("process".to_owned(), process.to_owned())];
        if CELERY_READY.is_match(message) {
            fields.push((
                "status".to_owned(),
                Status::WorkerStarted.as_str().to_owned(),
            ));
        } else if !celery_message(message, &mut fields) {
            fields.push(("msg".to_owned(), message.to_owned()));
        }
        if ambiguous.is_some() && !CELERY_READY.is_match(message) {
            fields.push(("attribution".to_owned(), "ambiguous".to_owned()));
        }
        // The process that logged the line is Celery's worker, whatever name the task's own
        // message gives it (`worker_id=pod-7` of an app setting): Celery's own lines of the same
        // attempt (`received`, `succeeded in`) carry the hostname, and one attempt must have one
        // worker. The task's name for it stays, as `logged_worker_id`.
        if known.is_some() {
            for (key, _) in fields.iter_mut() {
                if matches!(meaning(key), Some(Meaning::Field("worker_id"))) {
                    *key = "logged_worker_id".to_owned();
                }
            }
        }
        let worker = known
            .or_else(|| field_value(&fields, "worker_id"))
            .unwrap_or_else(|| "celery".to_owned());
        Raw {
            ts: Some(ts.to_owned()),
            level: Some(level.to_owned()),
            fields,
            worker: Some(worker),
            process: None,
        }
    }
}

/// Reads a Celery message (from a Celery line, or the `message` of a JSON-formatted Celery log)
/// into fields; false if it is none of Celery's known messages.
pub(super) fn celery_message(message: &str, fields: &mut Vec<(String, String)>) -> bool {
    let mut push = |k: &str, v: &str| fields.push((k.to_owned(), v.to_owned()));
    if let Some(captures) = CELERY_TASK.captures(message) {
        let (name, id, rest) = match (captures.get(1), captures.get(2), captures.get(4)) {
            (Some(name), Some(id), _) => (
                name.as_str(),
                id.as_str(),
                captures.get(3).map_or("", |m| m.as_str()),
            ),
            (_, _, Some(name)) => (
                name.as_str(),
                captures.get(5).map_or("", |m| m.as_str()),
                "received",
            ),
            _ => return false,
        };
        push("task_name", name);
        push("job_id", id);
        if rest == "received" {
            push("status", Status::JobReceived.as_str());
        } else if let Some(succeeded) = CELERY_SUCCEEDED.captures(rest) {
            push("status", Status::InferenceSucceeded.as_str());
            push("write", "result_store");
            push("runtime_s", &succeeded[1]);
            if let Some(result) = succeeded.get(2) {
                push("result", result.as_str());
            }
        } else if let Some(error) = rest.strip_prefix("raised unexpected:") {
            push("status", Status::JobFailed.as_str());
            push("error", error.trim());
        } else if let Some(reason) = rest.strip_prefix("retry:") {
            push("status", Status::RetryScheduled.as_str());
            if let Some(countdown) = CELERY_RETRY_IN.captures(reason) {
                push("countdown_s", &countdown[1]);
            }
            push("reason", reason.trim());
        } else {
            push("status", rest);
        }
        return true;
    }
    if let Some(captures) = CELERY_RESTORING.captures(message) {
        push("status", Status::DeliveriesRestored.as_str());
        push("restored", &captures[1]);
        return true;
    }
    if let Some(captures) = CELERY_TASK_LOGGER.captures(message) {
        push("task_name", &captures[1]);
        push("job_id", &captures[2]);
        // A task's own message may carry key=value pairs; bare words are its message.
        match logfmt_fields(&captures[3]) {
            Ok((pairs, bare)) => {
                fields.extend(pairs);
                if !bare.is_empty() {
                    let words: Vec<String> = bare.into_iter().map(|(_, w)| w).collect();
                    fields.push(("msg".to_owned(), words.join(" ")));
                }
            }
            Err(_) => fields.push(("msg".to_owned(), captures[3].to_owned())),
        }
        return true;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn by_regex(body: &str) -> Option<CeleryLine<'_>> {
        let captures = CELERY_LINE.captures(body)?;
        let group = |i| captures.get(i).map_or("", |m| m.as_str());
        Some(CeleryLine {
            ts: group(1),
            level: group(2),
            process: group(3),
            message: group(4),
        })
    }

    #[test]
    fn celery_lines_are_cut_into_their_parts() {
        let line =
            "[2026-06-26 10:15:21,104: INFO/ForkPoolWorker-1] Task tasks.infer[c-1] received";
        assert_eq!(
            celery_line(line),
            Some(CeleryLine {
                ts: "2026-06-26 10:15:21,104",
                level: "INFO",
                process: "ForkPoolWorker-1",
                message: "Task tasks.infer[c-1] received",
            })
        );
        assert_eq!(
            celery_line("[2026-06-26T10:15:21: W/p]").unwrap().message,
            ""
        );
        for text in [
            "[2026-06-26 10:15:21,: INFO/p] x",
            "[2026-06-26 10:15:2: INFO/p] x",
            "[2026-06-26 10:15:21: INFO/] x",
            "[2026-06-26 10:15:21: IN FO/p] x",
            "[2026-06-26 10:15:21 INFO/p] x",
            "2026-06-26 10:15:21: INFO/p] x",
        ] {
            assert_eq!(celery_line(text), None, "{text}");
        }
    }

    proptest! {
        /// The hand-written cut agrees with the format's regex on lines assembled from the
        /// pieces of Celery lines and of near misses.
        #[test]
        fn the_cut_agrees_with_the_regex(parts in proptest::collection::vec(
            proptest::sample::select(vec![
                "[", "]", "2026-06-26", " ", "T", "10:15:21", ",104", ".5", ",", ": ", ":",
                "INFO", "/", "MainProcess", "ForkPoolWorker-1", "Task", "\t", "\u{a0}", "é",
                "9", "-", "x", "]]", "[2026-06-26 10:15:21,104: INFO/MainProcess] ",
            ]),
            0..12,
        )) {
            let body = parts.concat();
            prop_assert_eq!(celery_line(&body), by_regex(&body), "{:?}", body);
        }
    }
}
