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

use super::super::Status;
use super::Reader;
use super::fields::{Meaning, Raw, field_value, meaning};
use super::logfmt::logfmt_fields;
use regex::Regex;
use std::sync::LazyLock;

pub(super) static CELERY_LINE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^\[(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[,.]\d+)?): ([A-Za-z]+)/([^\]]+)\]\s?(.*)$",
    )
    .expect("valid regex")
});
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
