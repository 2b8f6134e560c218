//! Status words from free text: a status field or a message becomes one of the seed's [`Status`]
//! words when exactly one known phrasing names it (`served from cache`, `calling model backend`,
//! `Warm shutdown`, Sidekiq's `done`, ...). Kept apart from the readers because every shape (logfmt,
//! JSON, Celery, journald, OTLP, CSV) ends in the same question: what did this line say happened?

use racecert_core::contract::log::Status;

/// Messages that name a status only when they are the whole message: short words frameworks log
/// on their own (Sidekiq's `start`, `done` and `fail` lines carry the job id beside them), which
/// inside a longer sentence mean nothing in particular.
const WHOLE_MESSAGES: &[(&str, Status)] = &[
    ("start", Status::JobTaken),
    ("done", Status::InferenceSucceeded),
    ("fail", Status::JobFailed),
];

/// The status word a status or message names, if exactly one does: the word itself in any
/// spelling (`cache_hit`, `cache-hit`, `CacheHit`, `cache hit`), else a known phrasing
/// (`served from cache`, `calling model backend`, `message acknowledged`, ...). Of several
/// phrasings that match, the most specific (most words) wins; a tie between two statuses is
/// ambiguous and gives `None`.
pub fn status_of(text: &str) -> Option<Status> {
    // The word itself, as the seed and racecert's workers write it: no need to split.
    if let Some(status) = Status::ALL.into_iter().find(|s| s.as_str() == text) {
        return Some(status);
    }
    // A log says the same few messages over and over: remember the short ones (a message with
    // an id in it is long, or rare, and only costs a miss; the memory is cleared when full).
    if text.len() > CACHED_MESSAGE {
        return read_status(text);
    }
    CACHE.with(|cache| {
        if let Some(known) = cache.borrow().get(text) {
            return *known;
        }
        let status = read_status(text);
        let mut cache = cache.borrow_mut();
        if cache.len() >= CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(text.to_owned(), status);
        status
    })
}

/// Messages longer than this are not remembered.
const CACHED_MESSAGE: usize = 96;
/// Messages remembered at most.
const CACHE_ENTRIES: usize = 4096;

thread_local! {
    static CACHE: std::cell::RefCell<std::collections::HashMap<String, Option<Status>>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

fn read_status(text: &str) -> Option<Status> {
    let words = words(text);
    if words.is_empty() {
        return None;
    }
    if words.len() == 1
        && let Some((_, status)) = WHOLE_MESSAGES.iter().find(|(w, _)| *w == words[0])
    {
        return Some(*status);
    }
    if words.len() <= 4 {
        let joined = words.join("_");
        if let Some(status) = Status::ALL.into_iter().find(|s| s.as_str() == joined) {
            return Some(status);
        }
    }
    let mut best: Option<(usize, Status)> = None;
    let mut tied = false;
    for (status, phrasings) in PHRASINGS {
        for phrasing in *phrasings {
            if !phrasing.iter().all(|w| words.iter().any(|x| x == w)) {
                continue;
            }
            match best {
                Some((len, other)) if len == phrasing.len() && other != *status => tied = true,
                Some((len, _)) if len >= phrasing.len() => {}
                _ => {
                    best = Some((phrasing.len(), *status));
                    tied = false;
                }
            }
        }
    }
    if tied { None } else { best.map(|(_, s)| s) }
}

/// Known phrasings of each status word: every word of one phrasing must appear in the text (in
/// any order). Words are lower case; `words` splits camelCase and punctuation.
const PHRASINGS: &[(Status, &[&[&str]])] = &[
    (
        Status::JobReceived,
        &[&["received"], &["dequeued"], &["picked", "up"]],
    ),
    (
        Status::RetryDispatched,
        &[
            &["retry", "dispatched"],
            &["redelivered"],
            &["redelivery"],
            &["retry", "started"],
            &["retry", "received"],
        ],
    ),
    (
        Status::LeaseAcquired,
        &[
            &["lease", "acquired"],
            &["lock", "acquired"],
            &["acquired", "lease"],
            &["acquired", "lock"],
        ],
    ),
    (
        Status::DuplicateSkipped,
        &[
            &["duplicate"],
            &["already", "running"],
            &["already", "in", "progress"],
        ],
    ),
    (
        Status::AlreadyCompleted,
        &[
            &["already", "completed"],
            &["already", "succeeded"],
            &["already", "done"],
        ],
    ),
    (
        Status::JobTaken,
        &[&["job", "taken"], &["marked", "in", "progress"]],
    ),
    (Status::VersionDeclined, &[&["declined"]]),
    (
        Status::CacheHit,
        &[&["cache", "hit"], &["served", "from", "cache"]],
    ),
    (Status::CacheMiss, &[&["cache", "miss"]]),
    (
        Status::InferenceStarted,
        &[
            &["inference", "started"],
            &["started", "inference"],
            &["calling", "model"],
            &["calling", "backend"],
            &["model", "call", "started"],
        ],
    ),
    (
        Status::TimeoutWaitingUpstream,
        &[
            &["timeout", "waiting"],
            &["timed", "out", "waiting"],
            &["upstream", "timeout"],
            &["still", "waiting"],
        ],
    ),
    (
        Status::UpstreamFailed,
        &[
            &["upstream", "failed"],
            &["backend", "failed"],
            &["backend", "error"],
            &["inference", "failed"],
            &["model", "call", "failed"],
        ],
    ),
    (
        Status::CacheWritten,
        &[
            &["cache", "written"],
            &["cache", "set"],
            &["cached", "result"],
            &["wrote", "cache"],
        ],
    ),
    (
        Status::InferenceSucceeded,
        &[
            &["inference", "succeeded"],
            &["succeeded"],
            &["result", "stored"],
            &["result", "written"],
            &["wrote", "result"],
            &["completed", "successfully"],
            // Other frameworks' success lines: RQ's `Job OK (id)`, BullMQ's `completed` event.
            &["job", "ok"],
            &["completed"],
        ],
    ),
    (
        Status::LateSuccess,
        &[&["late", "success"], &["late", "result", "written"]],
    ),
    (
        Status::OverwriteDetected,
        &[&["overwrite"], &["overwrote"], &["overwritten"]],
    ),
    (
        Status::LateWriteRejected,
        &[
            &["late", "write", "rejected"],
            &["write", "rejected"],
            &["stale", "write", "rejected"],
        ],
    ),
    (Status::DiscardedLateResult, &[&["discarded"]]),
    (
        Status::Acked,
        &[
            &["acked"],
            &["acknowledged"],
            &["ack", "sent"],
            &["message", "deleted"],
        ],
    ),
    (Status::LeftForRedelivery, &[&["left", "for", "redelivery"]]),
    (
        Status::LeaseReleased,
        &[&["lease", "released"], &["lock", "released"]],
    ),
    (
        Status::LeaseLost,
        &[
            &["lease", "lost"],
            &["lock", "lost"],
            &["lease", "expired"],
            &["lock", "expired"],
        ],
    ),
    (Status::AttemptError, &[&["attempt", "error"]]),
    (
        Status::Cutover,
        &[
            &["cutover"],
            &["rollout", "started"],
            &["switched", "active"],
            &["active", "version", "switched"],
            &["traffic", "switched"],
        ],
    ),
    (
        Status::CacheInvalidated,
        &[
            &["cache", "invalidated"],
            &["cache", "invalidation", "finished"],
            &["cache", "invalidation", "done"],
            &["cache", "invalidation", "complete"],
            &["cache", "invalidation", "completed"],
            &["cache", "flushed"],
            &["cache", "purged"],
        ],
    ),
    (
        Status::WorkerStarted,
        &[
            &["worker", "started"],
            &["worker", "ready"],
            &["worker", "online"],
            &["starting", "worker"],
        ],
    ),
    (
        Status::WorkerLost,
        &[
            &["worker", "lost"],
            &["worker", "crashed"],
            &["worker", "killed"],
            &["exited", "prematurely"],
            &["exited", "with", "signal"],
            // The kernel's and Kubernetes' words for a process killed for its memory.
            &["oomkilled"],
            &["oom", "killed"],
            &["out", "of", "memory"],
        ],
    ),
    (
        Status::StopRequested,
        &[
            // Celery's `worker: Warm shutdown (MainProcess)`, a SIGTERM handler's own words,
            // a drain started by the rollout.
            &["warm", "shutdown"],
            &["cold", "shutdown"],
            &["sigterm"],
            &["received", "sigterm"],
            &["stop", "signal"],
            &["stop", "requested"],
            &["draining"],
            &["drain", "started"],
            &["graceful", "shutdown"],
            &["shutting", "down"],
        ],
    ),
    (
        Status::JobFailed,
        &[
            &["job", "failed"],
            &["task", "failed"],
            &["raised", "unexpected"],
        ],
    ),
    (
        Status::RetryScheduled,
        &[
            &["retry", "scheduled"],
            &["scheduling", "retry"],
            &["will", "retry"],
            &["retry", "in"],
        ],
    ),
    (
        Status::DeliveriesRestored,
        &[
            &["restoring", "unacknowledged"],
            &["restored", "unacknowledged"],
        ],
    ),
];

/// Lower-case words of a text: split at anything not alphanumeric and at camelCase humps. At
/// most 64 words: a status is said in the first few.
pub fn words(text: &str) -> Vec<String> {
    let mut words: Vec<String> = Vec::new();
    let mut current = String::new();
    let mut previous_lower = false;
    for c in text.chars() {
        if !c.is_alphanumeric() {
            if !current.is_empty() {
                words.push(std::mem::take(&mut current));
            }
            previous_lower = false;
        } else {
            if c.is_uppercase() && previous_lower && !current.is_empty() {
                words.push(std::mem::take(&mut current));
            }
            previous_lower = c.is_lowercase() || c.is_ascii_digit();
            current.extend(c.to_lowercase());
        }
        if words.len() >= 64 {
            return words;
        }
    }
    if !current.is_empty() {
        words.push(current);
    }
    words
}
