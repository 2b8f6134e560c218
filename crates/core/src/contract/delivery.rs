//! What a worker receives: a job as the API put it on the queue, and one delivery of it (a first
//! delivery or a redelivery, counted). The queue itself (a Redis Stream in the contract, a
//! framework's broker for other systems) lives above the contract; these are the values every
//! runner and worker exchange.

/// What the API puts on the queue for one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobMessage {
    /// Stable idempotency key of the business request.
    pub idempotency_key: String,
    /// Job id (stable per idempotency key).
    pub job_id: String,
    /// The client's request id.
    pub request_id: String,
    /// The normalized input.
    pub input: String,
}

/// One delivery of a job to a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Stream entry id (what XACK takes).
    pub entry_id: String,
    /// The job.
    pub job: JobMessage,
    /// How many times this entry has been delivered, this one included.
    pub receive_count: u64,
}
