//! Reconstruction: an incident log's lines grouped per request into attempts (who ran it, on which
//! version, what each did, in order), plus the lines that concern no single request: cutovers,
//! cache invalidations, worker starts, losses and restore sweeps.
//!
//! Lines are put in time order first (timestamp, then line number; a line without a timestamp
//! takes its predecessor's), so logs concatenated per host tell one story. A request is named by
//! its request id, else by the request id another line gave its job id or idempotency key, else by
//! that key or job id (a Celery task id). An attempt is one worker's execution: a logged attempt
//! number pins it; without one, a second receive of the same job is a redelivery (a new attempt)
//! and other lines join the worker's attempt still running.
//!
//! Roles come from what the lines say: a process whose lines for a request only submit it (submit,
//! enqueue, accept, wait, time out waiting, resubmit; never a receipt, a model call or a write) is
//! its submitter, the API, not a worker: its lines stay with the request, in no attempt.

use crate::contract::log::{LogLine, Status};
use crate::logs::{Parsed, ParsedLine, canonical_field, words};
use serde::Serialize;
use std::collections::{HashMap, HashSet};

/// One line of a story.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Event {
    /// 1-based line number in the log.
    pub line: usize,
    /// Timestamp as normalised (RFC 3339 UTC) or as written when unreadable.
    pub ts: String,
    /// The timestamp in milliseconds since the epoch, if readable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub millis: Option<i64>,
    /// Rank in time order among all lines of the log.
    #[serde(skip)]
    pub seq: usize,
    /// The status word, or the raw status text when it is none of the vocabulary's.
    pub status: String,
    /// The status word, if the status is one.
    #[serde(skip)]
    pub word: Option<Status>,
    /// Whether the line is a final write (`write=result_store`, `inference_succeeded`,
    /// `late_success`, Celery's `succeeded`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub final_write: bool,
    /// Whether the line is a framework's "the task returned" (Celery's `succeeded in`): a final
    /// write only when its attempt logged no write of its own.
    #[serde(skip)]
    pub returned: bool,
    /// Whether the line says the submitter's side of the request (`submitted`, `enqueued`,
    /// `resubmitted`): the API sending the job, not a worker running it.
    #[serde(skip)]
    pub submits: bool,
    /// Whether the line says the queue had delivered it before (a receive count above 1, a
    /// redelivered flag).
    #[serde(skip)]
    pub redelivered: bool,
    /// Job id on this line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    /// Idempotency key on this line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Cache key on this line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_key: Option<String>,
    /// Version of a cache entry served on this line (`served_model_version`,
    /// `cached_model_version`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub served_version: Option<String>,
}

impl Event {
    /// Whether the line says the attempt executed the job (took it, read the cache, called the
    /// backend, wrote or failed): a dispatch alone is not an execution.
    pub fn executes(&self) -> bool {
        self.final_write
            || self.word.is_some_and(|w| {
                w.is_working()
                    || matches!(
                        w,
                        Status::JobFailed
                            | Status::UpstreamFailed
                            | Status::RetryScheduled
                            | Status::LateWriteRejected
                    )
            })
    }

    /// Whether the line ends its attempt (a write, a failure, a rejection, a skip).
    pub fn ends_attempt(&self) -> bool {
        self.final_write
            || self.word.is_some_and(|w| {
                matches!(
                    w,
                    Status::UpstreamFailed
                        | Status::JobFailed
                        | Status::RetryScheduled
                        | Status::LateWriteRejected
                        | Status::DuplicateSkipped
                        | Status::AlreadyCompleted
                        | Status::VersionDeclined
                        | Status::AttemptError
                        | Status::WorkerLost
                )
            })
    }

    /// Whether the line ends the job for good (a final write, a recorded failure, a job found
    /// already terminal).
    pub fn ends_job(&self) -> bool {
        self.final_write
            || self
                .word
                .is_some_and(|w| matches!(w, Status::JobFailed | Status::AlreadyCompleted))
    }

    /// Whether its status is `status`.
    pub fn is(&self, status: Status) -> bool {
        self.word == Some(status)
    }
}

/// One attempt of a request: one worker's execution of one delivery.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Attempt {
    /// Attempt number (as logged, else in order of receipt).
    pub attempt: u32,
    /// Worker that ran it.
    pub worker_id: String,
    /// The worker's process that executed it (e.g. Celery's `ForkPoolWorker-1`), if logged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<String>,
    /// Model version it ran with.
    pub model_version: Option<String>,
    /// Backend it called.
    pub backend_endpoint: Option<String>,
    /// Cache key it used.
    pub cache_key: Option<String>,
    /// Its lines, in time order.
    pub events: Vec<Event>,
    /// The number its lines logged, if any (`attempt` counts receipts when the app's own number
    /// does not: Celery's `retries + 1` stays 1 on a redelivery).
    #[serde(skip)]
    pub logged: Option<u32>,
}

impl Attempt {
    /// Its first line.
    pub fn first_line(&self) -> usize {
        self.events.first().map_or(0, |e| e.line)
    }

    /// Its first line's rank in time order.
    pub fn start(&self) -> usize {
        self.events.first().map_or(0, |e| e.seq)
    }

    /// When it started, in milliseconds, if logged.
    pub fn start_millis(&self) -> Option<i64> {
        self.events.first().and_then(|e| e.millis)
    }

    /// Its first line with `status`.
    pub fn find(&self, status: Status) -> Option<&Event> {
        self.events.iter().find(|e| e.is(status))
    }

    /// Its (first) final write.
    pub fn write(&self) -> Option<&Event> {
        self.events.iter().find(|e| e.final_write)
    }

    /// Line of its result write, if any.
    pub fn write_line(&self) -> Option<usize> {
        self.write().map(|e| e.line)
    }

    /// Line of its upstream-timeout warning or upstream failure, if any.
    pub fn timed_out(&self) -> Option<usize> {
        self.events
            .iter()
            .find(|e| e.is(Status::TimeoutWaitingUpstream) || e.is(Status::UpstreamFailed))
            .map(|e| e.line)
    }

    /// The line that ended it, if any.
    pub fn end(&self) -> Option<&Event> {
        self.events.iter().find(|e| e.ends_attempt())
    }

    /// Whether it executed the job.
    pub fn executed(&self) -> bool {
        self.events.iter().any(Event::executes)
    }

    /// Who executed it: the worker, and its process when logged (`host/ForkPoolWorker-1`).
    pub fn executor(&self) -> String {
        match &self.process {
            Some(process) => format!("{}/{process}", self.worker_id),
            None => self.worker_id.clone(),
        }
    }

    /// `worker-a (v1)`, for explanations.
    pub fn who(&self) -> String {
        format!(
            "{} ({})",
            self.executor(),
            self.model_version
                .as_deref()
                .unwrap_or("version not logged")
        )
    }
}

/// One request and its attempts.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RequestStory {
    /// Request id (or the idempotency key or job id that stands for it).
    pub request_id: String,
    /// Whether a line named the request id itself (not only a job id or key).
    #[serde(skip)]
    pub named: bool,
    /// Attempts in order of their first line.
    pub attempts: Vec<Attempt>,
    /// Lines about the request that belong to no attempt (e.g. `overwrite_detected`, the
    /// submitter's lines).
    pub other: Vec<Event>,
    /// Processes that only submitted the request (the API: submit, wait, resubmit): not workers,
    /// their lines are under `other`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub submitters: Vec<String>,
}

impl RequestStory {
    /// Every event of the request, attempts' and others', in time order.
    pub fn events(&self) -> Vec<(&Event, Option<&Attempt>)> {
        let mut all: Vec<(&Event, Option<&Attempt>)> = self
            .attempts
            .iter()
            .flat_map(|a| a.events.iter().map(move |e| (e, Some(a))))
            .chain(self.other.iter().map(|e| (e, None)))
            .collect();
        all.sort_by_key(|(e, _)| e.seq);
        all
    }
}

/// A logged cutover: the active model version switched.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CutoverLine {
    /// The line.
    pub line: usize,
    /// Rank in time order.
    #[serde(skip)]
    pub seq: usize,
    /// When, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub millis: Option<i64>,
    /// The version before, if logged.
    pub from: Option<String>,
    /// The version after, if logged.
    pub to: Option<String>,
}

/// A line about a worker or the queue, not about one request: a start, a loss, a restore sweep,
/// a cache invalidation.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Mark {
    /// The line.
    pub line: usize,
    /// Rank in time order.
    #[serde(skip)]
    pub seq: usize,
    /// When, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub millis: Option<i64>,
    /// The worker it concerns, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_id: Option<String>,
    /// What happened.
    pub status: Status,
}

/// Every request found, plus the lines about no single request.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, Default)]
pub struct Reconstruction {
    /// Per request, in order of first appearance in time.
    pub requests: Vec<RequestStory>,
    /// Logged cutovers, in time order.
    pub cutovers: Vec<CutoverLine>,
    /// Cache invalidations, worker starts and losses, restore sweeps, in time order.
    pub marks: Vec<Mark>,
}

impl Reconstruction {
    /// The story of a request.
    pub fn request(&self, request_id: &str) -> Option<&RequestStory> {
        self.requests.iter().find(|r| r.request_id == request_id)
    }

    /// The first mark with `status` for `worker` ranked strictly between `after` and `before`.
    pub fn mark_between(
        &self,
        worker: &str,
        statuses: &[Status],
        after: usize,
        before: usize,
    ) -> Option<&Mark> {
        self.marks.iter().find(|m| {
            m.seq > after
                && m.seq < before
                && statuses.contains(&m.status)
                && m.worker_id.as_deref() == Some(worker)
        })
    }
}

/// The lines' ranks in time order (timestamp, then line number; a line without a readable
/// timestamp takes its predecessor's).
fn time_order(lines: &[ParsedLine]) -> Vec<usize> {
    let mut last = None;
    let keys: Vec<(Option<i64>, usize)> = lines
        .iter()
        .map(|l| {
            if l.millis.is_some() {
                last = l.millis;
            }
            (last, l.line_no)
        })
        .collect();
    let mut order: Vec<usize> = (0..lines.len()).collect();
    order.sort_by_key(|&i| keys[i]);
    order
}

fn field<'a>(line: &'a LogLine, key: &str) -> Option<&'a str> {
    line.get(key).filter(|v| !v.is_empty() && *v != "-")
}

/// The request a line concerns: its request id, else the request another line gave its job id or
/// idempotency key, else that key or job id.
fn request_of<'a>(line: &'a LogLine, owner: &HashMap<&'a str, &'a str>) -> Option<&'a str> {
    field(line, "request_id")
        .or_else(|| field(line, "job_id").and_then(|j| owner.get(j).copied()))
        .or_else(|| field(line, "idempotency_key").and_then(|k| owner.get(k).copied()))
        .or_else(|| field(line, "idempotency_key"))
        .or_else(|| field(line, "job_id"))
}

/// The line as an event ranked `seq`; `submitted` is the submission word it says, if any.
fn event_of(parsed: &ParsedLine, seq: usize, submitted: Option<&str>) -> Event {
    let ParsedLine {
        line_no,
        line,
        millis,
    } = parsed;
    let word = line.status_word();
    let status = line.status().or(submitted).unwrap_or("-");
    Event {
        line: *line_no,
        ts: line.ts.clone(),
        millis: *millis,
        seq,
        status: status.to_owned(),
        word,
        final_write: final_write(line),
        returned: line.get("runtime_s").is_some(),
        submits: submitted.is_some(),
        redelivered: says_redelivered(line),
        job_id: field(line, "job_id").map(str::to_owned),
        idempotency_key: field(line, "idempotency_key").map(str::to_owned),
        cache_key: field(line, "cache_key").map(str::to_owned),
        served_version: field(line, "served_model_version")
            .or_else(|| field(line, "cached_model_version"))
            .map(str::to_owned),
    }
}

fn final_write(line: &LogLine) -> bool {
    line.status_word().is_some_and(Status::is_final_write)
        || line.get("write") == Some("result_store")
}

/// Groups the lines into stories.
pub fn reconstruct(parsed: &Parsed) -> Reconstruction {
    // Which request a job id or idempotency key belongs to, from lines that name both.
    let mut owner: HashMap<&str, &str> = HashMap::new();
    for ParsedLine { line, .. } in &parsed.lines {
        if let Some(request) = field(line, "request_id") {
            for key in ["job_id", "idempotency_key"] {
                if let Some(id) = field(line, key) {
                    owner.entry(id).or_insert(request);
                }
            }
        }
    }
    let said: Vec<Option<&str>> = parsed
        .lines
        .iter()
        .map(|l| submission_word(&l.line))
        .collect();
    let submitters = submitters(parsed, &owner, &said);
    let mut reconstruction = Reconstruction::default();
    let mut index: HashMap<String, usize> = HashMap::new();
    for (seq, i) in time_order(&parsed.lines).into_iter().enumerate() {
        let ParsedLine {
            line_no,
            line,
            millis,
        } = &parsed.lines[i];
        let event = event_of(&parsed.lines[i], seq, said[i]);
        let word = event.word;
        let worker = field(line, "worker_id");
        let request_id = field(line, "request_id");
        let request = request_of(line, &owner);
        match word {
            Some(Status::Cutover) => {
                reconstruction.cutovers.push(CutoverLine {
                    line: *line_no,
                    seq,
                    millis: *millis,
                    from: field(line, "previous_model_version").map(str::to_owned),
                    to: field(line, "new_model_version").map(str::to_owned),
                });
                continue;
            }
            Some(
                status @ (Status::CacheInvalidated
                | Status::WorkerStarted
                | Status::WorkerLost
                | Status::StopRequested
                | Status::DeliveriesRestored),
            ) if request.is_none() || status == Status::CacheInvalidated => {
                reconstruction.marks.push(Mark {
                    line: *line_no,
                    seq,
                    millis: *millis,
                    worker_id: worker.map(str::to_owned),
                    status,
                });
                continue;
            }
            _ => {}
        }
        let Some(request) = request else {
            continue;
        };
        let position = *index.entry(request.to_owned()).or_insert_with(|| {
            reconstruction.requests.push(RequestStory {
                request_id: request.to_owned(),
                named: false,
                attempts: Vec::new(),
                other: Vec::new(),
                submitters: Vec::new(),
            });
            reconstruction.requests.len() - 1
        });
        let story = &mut reconstruction.requests[position];
        story.named |= request_id.is_some();
        let number: Option<u32> = line.get("attempt").and_then(|a| a.trim().parse().ok());
        let Some(worker) = worker else {
            // A line with no worker joins the attempt its number names, else the request.
            match number.and_then(|n| story.attempts.iter_mut().find(|a| a.attempt == n)) {
                Some(attempt) => attempt.events.push(event),
                None => story.other.push(event),
            }
            continue;
        };
        // The submitter's lines (the API's) are about the request, not an execution of it: no
        // attempt, so no diagnosis about workers counts the API as one.
        if submitters.contains(&(request, worker)) {
            if !story.submitters.iter().any(|s| s == worker) {
                story.submitters.push(worker.to_owned());
            }
            story.other.push(event);
            continue;
        }
        join_attempt(story, line, worker, number, event);
    }
    for story in &mut reconstruction.requests {
        story.attempts.sort_by_key(Attempt::start);
    }
    reconstruction
}

/// Puts a worker's line into its attempt (see [`attempt_for`]), filling what the attempt had not
/// logged yet.
fn join_attempt(
    story: &mut RequestStory,
    line: &LogLine,
    worker: &str,
    number: Option<u32>,
    mut event: Event,
) {
    let process = field(line, "process").filter(|p| *p != "MainProcess");
    let ambiguous = line.get("attribution") == Some("ambiguous");
    // Celery's `succeeded in N s` says when the execution it ends began.
    let ran_from = line
        .get("runtime_s")
        .and_then(|r| r.trim().parse::<f64>().ok())
        .filter(|r| r.is_finite() && *r >= 0.0)
        .zip(event.millis)
        .map(|(runtime, at)| at - (runtime * 1000.0).round() as i64);
    let returned = (event.returned && !ambiguous).then_some(ran_from);
    let at = attempt_for(story, worker, number, process, event.word, returned);
    let attempt = &mut story.attempts[at];
    let fill = |slot: &mut Option<String>, value: Option<&str>| {
        if slot.is_none() {
            *slot = value.map(str::to_owned);
        }
    };
    fill(&mut attempt.process, process);
    fill(&mut attempt.model_version, field(line, "model_version"));
    fill(
        &mut attempt.backend_endpoint,
        field(line, "backend_endpoint"),
    );
    fill(&mut attempt.cache_key, field(line, "cache_key"));
    // One attempt stores its result once. Celery's `succeeded in` (the task returned) is that
    // write only when the task logged none of its own: after a `write=result_store` line of
    // the same attempt it is the same write, not a second one.
    let returned = |e: &Event| e.final_write && e.returned;
    if event.final_write {
        if event.returned {
            event.final_write = !attempt.events.iter().any(|e| e.final_write);
        } else if let Some(earlier) = attempt.events.iter_mut().find(|e| returned(e)) {
            earlier.final_write = false;
        }
    }
    attempt.events.push(event);
}

/// Words that put a line on the submitter's side of a request: it sent the job, or sent it again.
/// (Waiting for the result, or timing out waiting, is said by both sides: it decides nothing.)
const SUBMISSION_WORDS: &[&str] = &[
    "submit",
    "submits",
    "submitted",
    "submitting",
    "resubmit",
    "resubmits",
    "resubmitted",
    "resubmitting",
    "enqueue",
    "enqueues",
    "enqueued",
    "enqueuing",
    "enqueueing",
    "queued",
    "accepted",
    "published",
];

/// The submission word a line's status or message says (`submitted`, `enqueued`, `resubmitted`,
/// `jobSubmitted`), if any; not a queue's own re-enqueue (`Re-enqueued N orphaned tasks`), which
/// is a redelivery.
fn submission_word(line: &LogLine) -> Option<&'static str> {
    let texts = line.fields.iter().filter(|(key, _)| {
        let tail = key.rsplit('.').next().unwrap_or(key);
        key == "status_text" || canonical_field(tail) == Some("status")
    });
    for (_, text) in texts {
        // Cheap refusal first, without a copy: every line of a log comes here.
        let has = |stem: &str| {
            text.as_bytes()
                .windows(stem.len())
                .any(|w| w.eq_ignore_ascii_case(stem.as_bytes()))
        };
        if !["submit", "queue", "accepted", "published"]
            .into_iter()
            .any(has)
        {
            continue;
        }
        let mut previous = String::new();
        for word in words(text) {
            if previous != "re"
                && let Some(found) = SUBMISSION_WORDS.iter().find(|w| **w == word)
            {
                return Some(found);
            }
            previous = word;
        }
    }
    None
}

/// Whether the line says the queue delivered it before: a receive count above 1 (SQS's
/// `ApproximateReceiveCount`, a `delivery_count`) or a redelivered flag (AMQP's, kombu's
/// `delivery_info.redelivered`).
fn says_redelivered(line: &LogLine) -> bool {
    let count = line
        .get("queue_receive_count")
        .and_then(|c| c.trim().parse::<u64>().ok());
    count.is_some_and(|c| c > 1)
        || line.fields.iter().any(|(key, value)| {
            let tail: String = key
                .rsplit('.')
                .next()
                .unwrap_or(key)
                .chars()
                .filter(char::is_ascii_alphanumeric)
                .map(|c| c.to_ascii_lowercase())
                .collect();
            matches!(
                tail.as_str(),
                "redelivered" | "isredelivered" | "redelivery"
            ) && matches!(
                value.trim().to_ascii_lowercase().as_str(),
                "true" | "1" | "yes"
            )
        })
}

/// The submitters of each request, as (request, worker): a process whose lines for the request
/// say it submitted it (or resubmitted it) and never that it executed it (no receipt, no cache,
/// no model call, no write; waiting, or timing out waiting, for the result is either side's).
/// Decided from what the lines say, never from the process's name: an API pod is a submitter
/// because it only submits.
fn submitters<'a>(
    parsed: &'a Parsed,
    owner: &HashMap<&'a str, &'a str>,
    said: &[Option<&str>],
) -> HashSet<(&'a str, &'a str)> {
    let mut sides: HashMap<(&str, &str), (bool, bool)> = HashMap::new();
    for (ParsedLine { line, .. }, said) in parsed.lines.iter().zip(said) {
        let (Some(request), Some(worker)) = (request_of(line, owner), field(line, "worker_id"))
        else {
            continue;
        };
        let submits = said.is_some();
        let works = final_write(line)
            || line
                .status_word()
                .is_some_and(|w| !submits && w != Status::TimeoutWaitingUpstream);
        let side = sides.entry((request, worker)).or_default();
        side.0 |= submits;
        side.1 |= works;
    }
    sides
        .into_iter()
        .filter(|(_, (submits, works))| *submits && !*works)
        .map(|(pair, _)| pair)
        .collect()
}

/// The attempt a worker's line belongs to, created if need be. `returned` is set for a
/// framework's "the task returned" line (Celery's `succeeded in N s`), with when the execution it
/// ends began, if the line says.
fn attempt_for(
    story: &mut RequestStory,
    worker: &str,
    number: Option<u32>,
    process: Option<&str>,
    word: Option<Status>,
    returned: Option<Option<i64>>,
) -> usize {
    let next = story.attempts.iter().map(|a| a.attempt).max().unwrap_or(0) + 1;
    let create = |number: u32, story: &mut RequestStory| {
        story.attempts.push(Attempt {
            attempt: number,
            worker_id: worker.to_owned(),
            process: None,
            model_version: None,
            backend_endpoint: None,
            cache_key: None,
            events: Vec::new(),
            logged: None,
        });
        story.attempts.len() - 1
    };
    // A process runs one attempt at a time: a line of a process belongs to the attempt running
    // on it (several deliveries may be open on one worker at once: prefetched ones wait).
    let running_on = |story: &RequestStory| {
        process.and_then(|p| {
            story.attempts.iter().position(|a| {
                a.worker_id == worker && a.end().is_none() && a.process.as_deref() == Some(p)
            })
        })
    };
    if let Some(number) = number {
        if let Some(i) = running_on(story) {
            story.attempts[i].logged.get_or_insert(number);
            return i;
        }
        // A framework's own lines carry no number (Celery's `received`) and opened this worker's
        // running attempt; the task's lines that follow, numbered by the app (Celery's
        // `retries + 1` stays 1 on a redelivery), belong to it, on the same process if known.
        // Several such attempts open at once (prefetched deliveries) run in order of receipt.
        let unnumbered = story.attempts.iter().position(|a| {
            a.worker_id == worker
                && a.logged.is_none()
                && a.end().is_none()
                && (process.is_none() || a.process.is_none() || a.process.as_deref() == process)
        });
        let same = |a: &Attempt| a.worker_id == worker && a.logged.unwrap_or(a.attempt) == number;
        let numbered = story
            .attempts
            .iter()
            .rposition(|a| same(a) && a.end().is_none())
            .or_else(|| story.attempts.iter().rposition(same));
        let i = unnumbered
            .or(numbered)
            .unwrap_or_else(|| create(number, story));
        story.attempts[i].logged = Some(number);
        return i;
    }
    let mine: Vec<usize> = (0..story.attempts.len())
        .filter(|&i| story.attempts[i].worker_id == worker)
        .collect();
    let open: Vec<usize> = mine
        .iter()
        .copied()
        .filter(|&i| story.attempts[i].end().is_none())
        .collect();
    if word.is_some_and(Status::is_receive) {
        // A receive opens a new attempt, unless this worker's running attempt has not received yet
        // (its lines came first, e.g. a cache line logged before the receive).
        return match open.last() {
            Some(&i)
                if !story.attempts[i]
                    .events
                    .iter()
                    .any(|e| e.word.is_some_and(Status::is_receive)) =>
            {
                i
            }
            _ => create(next, story),
        };
    }
    let takes = |a: &Attempt| returned.is_none_or(|from| may_return(a, from));
    if let Some(process) = process {
        let on = |i: usize| story.attempts[i].process.as_deref() == Some(process);
        if let Some(&i) = open.iter().find(|&&i| on(i) && takes(&story.attempts[i])) {
            return i;
        }
        // Celery's `succeeded in` comes after the task's own last line ended the attempt: it is
        // that attempt's, the last one that ran on this process (not when the worker is two
        // workers that cannot be told apart: their process names repeat).
        if returned.is_some()
            && let Some(&i) = mine
                .iter()
                .rev()
                .find(|&&i| on(i) && takes(&story.attempts[i]))
        {
            return i;
        }
        if let Some(&i) = open
            .iter()
            .find(|&&i| story.attempts[i].process.is_none() && takes(&story.attempts[i]))
        {
            return i;
        }
    }
    if let Some(from) = returned {
        return returned_to(story, &open, &mine, from).unwrap_or_else(|| create(next, story));
    }
    if let Some(&i) = open.first().or(mine.last()) {
        return i;
    }
    create(next, story)
}

/// Whether a framework's "the task returned" line whose execution began at `from` can end
/// `attempt`: a task returns once per execution (Celery logs one `succeeded in N s` for each),
/// and the attempt must have been received by the time that execution began.
fn may_return(attempt: &Attempt, from: Option<i64>) -> bool {
    !attempt.events.iter().any(|e| e.returned)
        && from.is_none_or(|from| {
            attempt
                .start_millis()
                .is_none_or(|start| start <= from + RETURN_SLACK_MS)
        })
}

/// The attempt a "the task returned" line ends when no attempt on its process can: one of its
/// worker's (`open`, then `mine` latest first), else, when none of those can have run it, the
/// line bears another worker's name (output merged by time, a second worker's banner in
/// between) and ends the attempt of any worker that had received the task by then: an open one,
/// the latest received.
fn returned_to(
    story: &RequestStory,
    open: &[usize],
    mine: &[usize],
    from: Option<i64>,
) -> Option<usize> {
    let takes = |i: usize| may_return(&story.attempts[i], from);
    let own = open
        .iter()
        .chain(mine.iter().rev())
        .copied()
        .find(|&i| takes(i));
    own.or_else(|| {
        (0..story.attempts.len())
            .filter(|&i| takes(i))
            .max_by_key(|&i| (story.attempts[i].end().is_none(), story.attempts[i].start()))
    })
}

/// How far a `succeeded in N s` may put its execution's start before its receipt: the runtime is
/// rounded as printed, the receipt logged just before the execution.
const RETURN_SLACK_MS: i64 = 1_000;
