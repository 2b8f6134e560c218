//! Whether a second attempt of a request was the queue delivering the job again, the evidence a
//! visibility-timeout cause needs. Two attempts overlapping say only that the request ran twice:
//! the API resubmitting after its own timeout (often under a new job id) overlaps the same way,
//! and is a retry of the API's, not a redelivery by the queue.

use crate::contract::log::Status;
use crate::replay::story::{Attempt, Reconstruction, RequestStory};

/// Whether the log shows the queue redelivered `first`'s job to `second`: the second receipt
/// says so (a receive count above 1, a redelivered flag), a restore sweep ("Restoring N
/// unacknowledged message(s)") came between the two, or a worker received the same job again
/// (the same job id; with none logged, the request id stands for the message). A resubmission by
/// the request's submitter in between makes a same-id receipt the API's retry instead, and a new
/// job id a new job, unless the worker said it took a redelivery (`retry_dispatched`).
pub(super) fn redelivered(
    reconstruction: &Reconstruction,
    story: &RequestStory,
    first: &Attempt,
    second: &Attempt,
) -> bool {
    let (from, to) = (first.start(), second.start());
    if second.events.iter().any(|e| e.redelivered) {
        return true;
    }
    if reconstruction
        .marks
        .iter()
        .any(|m| m.status == Status::DeliveriesRestored && m.seq > from && m.seq < to)
    {
        return true;
    }
    let resubmitted = story
        .other
        .iter()
        .any(|e| e.submits && e.seq > from && e.seq < to);
    if resubmitted {
        return false;
    }
    let (earlier, later) = (job_ids(first), job_ids(second));
    if earlier.is_empty() || later.is_empty() {
        return true;
    }
    later.iter().any(|id| earlier.contains(id)) || second.find(Status::RetryDispatched).is_some()
}

fn job_ids(attempt: &Attempt) -> Vec<&str> {
    attempt
        .events
        .iter()
        .filter_map(|e| e.job_id.as_deref())
        .collect()
}
