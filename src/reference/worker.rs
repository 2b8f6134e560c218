//! The reference worker: the seed's safe flow (`processInferenceJob`), one delivery at a time.
//!
//! The flow follows the seed's `processInferenceJob`: `flow` lists its steps in order with their
//! checkpoints, each step a method with its defect switches next to what they change; the final
//! write's variants are in `write`.
//!
//! Per job: acquire the lease (skip as a duplicate if held) -> move the job to IN_PROGRESS with
//! the lease token and a new, strictly larger generation (fencing) -> version-aware cache key ->
//! on a hit, mark succeeded if still owner -> else call its backend through the proxy, cache the
//! result in its version's namespace, commit the final write with compare-and-set (status
//! IN_PROGRESS, lease token matches, generation larger than stored) -> ack after the commit ->
//! release the lease only if the token is still ours. A rejected write is logged
//! `late_write_rejected` and its result discarded.
//!
//! The worker is bound to one model version for its lifetime: its configuration is a snapshot
//! taken at start. Each [`Defect`] switches one of these protections off, faithfully re-creating
//! a root cause of the seed.

mod config;
mod write;
use crate::contract::checkpoint::{Checkpoint, Checkpoints, Directive};
use crate::contract::defect::{Defect, Defects};
use crate::contract::delivery::{Delivery, JobMessage};
use crate::contract::log::LogSink;
use crate::contract::log::{Level, Status};
use crate::contract::worker::{BackendEndpoint, Infra};
use crate::contract::{InferRequest, InferResponse, Keys, sha256_hex};
use crate::reference::queue::Queue;
use crate::{Error, Result};
pub use config::{WorkerConfig, WorkerConfigBuilder};
use rand::{RngExt, SeedableRng};
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// How processing one delivery ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The final write was accepted.
    Succeeded {
        /// Generation of the final write.
        generation: i64,
        /// Whether the output came from the cache.
        from_cache: bool,
    },
    /// The final write landed on a job another attempt had completed (unfenced defect only).
    Overwrote {
        /// Version of the result that was overwritten.
        previous_version: Option<String>,
    },
    /// The fenced final write was rejected; the result was discarded.
    LateWriteRejected,
    /// Another attempt holds the lease; skipped, not acknowledged.
    DuplicateSkipped,
    /// The job was already terminal.
    AlreadyCompleted,
    /// The active version is not this worker's: declined, not acknowledged; the worker drains.
    Declined,
    /// The backend call failed; the lease was released and the delivery left for redelivery.
    UpstreamFailed,
    /// A checkpoint crashed the worker here; nothing was cleaned up.
    Crashed(Checkpoint),
}

/// The fields every log line of one attempt carries.
#[derive(Debug, Clone)]
struct Attempt {
    request_id: String,
    job_id: String,
    key: String,
    attempt: u64,
    receive_count: u64,
    model_version: String,
    backend_endpoint: String,
    cache_key: String,
}

/// Why a flow step stopped early.
enum Stop {
    Crash(Checkpoint),
    Error(Error),
    /// The attempt ended before its final write (a duplicate, a declined job, a failed call):
    /// not an error, the delivery's outcome.
    Early(Outcome),
}

/// The lease an attempt holds: its key, our token in it, and the epoch drawn while holding it.
struct Lease {
    key: String,
    token: String,
    epoch: i64,
}

impl From<Error> for Stop {
    fn from(err: Error) -> Stop {
        Stop::Error(err)
    }
}
impl From<sqlx::Error> for Stop {
    fn from(err: sqlx::Error) -> Stop {
        Stop::Error(err.into())
    }
}
impl From<redis::RedisError> for Stop {
    fn from(err: redis::RedisError) -> Stop {
        Stop::Error(err.into())
    }
}

/// A reference worker.
pub struct Worker {
    config: WorkerConfig,
    infra: Infra,
    queue: Queue,
    keys: Keys,
    checkpoints: Checkpoints,
    log: LogSink,
    draining: AtomicBool,
    lease_seq: AtomicU64,
    token_epoch: u32,
    rng: Mutex<rand::rngs::StdRng>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("id", &self.config.worker_id)
            .field("version", &self.config.model_version)
            .finish()
    }
}

/// Compare-and-delete: release the lease only if it still holds our token.
const RELEASE_LEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0";

impl Worker {
    /// A worker on the queue of `keys`.
    pub async fn new(
        config: WorkerConfig,
        infra: Infra,
        keys: Keys,
        checkpoints: Checkpoints,
        log: LogSink,
    ) -> Result<Worker> {
        // No round trip to make the consumer group: whoever submits makes it (the API side, a
        // harness), and the first read that finds none makes it then.
        let queue = Queue::over(infra.redis.clone(), &keys);
        let seed = config.seed
            ^ u64::from_str_radix(&sha256_hex(&config.worker_id)[..16], 16).unwrap_or(0);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        Ok(Worker {
            token_epoch: rng.random(),
            rng: Mutex::new(rng),
            config,
            infra,
            queue,
            keys,
            checkpoints,
            log,
            draining: AtomicBool::new(false),
            lease_seq: AtomicU64::new(0),
        })
    }

    /// The worker id.
    pub fn id(&self) -> &str {
        &self.config.worker_id
    }

    /// Its configuration.
    pub fn config(&self) -> &WorkerConfig {
        &self.config
    }

    /// Stops taking new jobs; deliveries already received are finished.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Whether it is draining.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Receives the next delivery (a redelivery whose visibility timeout expired first), unless
    /// draining.
    pub async fn receive(&self) -> Result<Option<Delivery>> {
        if self.is_draining() {
            return Ok(None);
        }
        let mut queue = self.queue.clone();
        queue
            .receive(&self.config.worker_id, self.config.visibility_timeout)
            .await
    }

    /// Claims a delivered-but-unacknowledged job right away, as if its visibility timeout had
    /// expired: how a schedule makes a redelivery happen without waiting for the clock.
    pub async fn receive_redelivery(&self) -> Result<Option<Delivery>> {
        let mut queue = self.queue.clone();
        queue
            .claim_stale(&self.config.worker_id, Duration::ZERO)
            .await
    }

    /// Receives and processes one delivery; `None` when there was nothing to do.
    pub async fn poll_once(&self) -> Result<Option<Outcome>> {
        match self.receive().await? {
            Some(delivery) => Ok(Some(self.process(delivery).await?)),
            None => Ok(None),
        }
    }

    /// Processes deliveries until the queue has nothing for this worker.
    pub async fn run_until_idle(&self) -> Result<Vec<Outcome>> {
        let mut outcomes = Vec::new();
        while let Some(outcome) = self.poll_once().await? {
            outcomes.push(outcome);
        }
        Ok(outcomes)
    }

    fn log(&self, level: Level, attempt: &Attempt, status_word: Status, extra: &[(&str, String)]) {
        let mut fields = vec![
            ("request_id".to_owned(), attempt.request_id.clone()),
            ("job_id".to_owned(), attempt.job_id.clone()),
            ("idempotency_key".to_owned(), attempt.key.clone()),
            ("attempt".to_owned(), attempt.attempt.to_string()),
            ("worker_id".to_owned(), self.config.worker_id.clone()),
            ("model_version".to_owned(), attempt.model_version.clone()),
            (
                "backend_endpoint".to_owned(),
                attempt.backend_endpoint.clone(),
            ),
            ("cache_key".to_owned(), attempt.cache_key.clone()),
            (
                "queue_receive_count".to_owned(),
                attempt.receive_count.to_string(),
            ),
            ("status".to_owned(), status_word.as_str().to_owned()),
        ];
        fields.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
        self.log.emit(level, fields);
    }

    async fn checkpoint(&self, at: Checkpoint) -> std::result::Result<(), Stop> {
        match self.checkpoints.reached(&self.config.worker_id, at).await {
            Directive::Continue => Ok(()),
            Directive::Crash => Err(Stop::Crash(at)),
        }
    }

    /// The active-version pointer, if set.
    async fn active_version(&self) -> Result<Option<String>> {
        let mut redis = self.infra.redis.clone();
        Ok(redis.get(self.keys.active_version()).await?)
    }

    /// The version to use at a step: the bound one, or (re-read defect) whatever the pointer says
    /// right now.
    async fn step_version(&self) -> Result<String> {
        if self.config.defects.has(Defect::RereadActiveVersion) {
            Ok(self
                .active_version()
                .await?
                .unwrap_or_else(|| self.config.model_version.clone()))
        } else {
            Ok(self.config.model_version.clone())
        }
    }

    fn endpoint(&self, version: &str) -> Result<&BackendEndpoint> {
        self.config.backends.get(version).ok_or_else(|| {
            Error::Config(format!(
                "worker {} has no backend for version {version}",
                self.config.worker_id
            ))
        })
    }

    fn cache_key(&self, version: &str, input: &str) -> String {
        if self.config.defects.unversioned_cache() {
            // The seed's bug: the key is the input alone.
            format!("{}inf:{}", self.keys.prefix(), sha256_hex(input))
        } else {
            self.keys.cache(version, input)
        }
    }

    /// Processes one delivery through the whole flow. Errors from Redis, Postgres or the backend
    /// (partitions, restarts) end the attempt with an error and leave the delivery unacknowledged,
    /// so the queue redelivers it.
    pub async fn process(&self, delivery: Delivery) -> Result<Outcome> {
        let result = match self.flow(&delivery).await {
            Ok(outcome) | Err(Stop::Early(outcome)) => Ok(outcome),
            Err(Stop::Crash(at)) => {
                tracing::debug!(worker = %self.config.worker_id, %at, "crashed at checkpoint");
                return Ok(Outcome::Crashed(at));
            }
            Err(Stop::Error(err)) => Err(err),
        };
        // Every way out but a crash passes `Done`, so a harness waiting for a later checkpoint
        // learns at once that the delivery ended early (a duplicate, a failed call, an error).
        let _ = self
            .checkpoints
            .reached(&self.config.worker_id, Checkpoint::Done)
            .await;
        result
    }

    /// The flow, step by step in the seed's order; each step's checkpoints are where a harness
    /// can stop or crash it.
    async fn flow(&self, delivery: &Delivery) -> std::result::Result<Outcome, Stop> {
        let job = &delivery.job;
        let mut redis = self.infra.redis.clone();
        let mut queue = self.queue.clone();
        let version = self.config.model_version.clone();
        let mut attempt = self.receive_attempt(delivery, &version).await?;
        self.decline_other_version(&attempt, &version).await?;
        let lease = self.take_lease(&mut redis, &attempt).await?;
        self.checkpoint(Checkpoint::AfterLease).await?;
        let generation = self
            .take_job(&mut redis, &mut queue, delivery, &attempt, &lease, &version)
            .await?;
        self.log(
            Level::Info,
            &attempt,
            Status::JobTaken,
            &[("generation", generation.to_string())],
        );
        let mut acked = false;
        if self.config.defects.has(Defect::AckBeforeFinalWrite) {
            self.ack(&mut queue, delivery, &attempt).await?;
            acked = true;
        }
        self.checkpoint(Checkpoint::AfterTake).await?;
        let (output, from_cache) = self
            .produce_output(&mut redis, job, &mut attempt, &lease)
            .await?;
        let outcome = self
            .final_write(
                &mut redis, &attempt, &lease, generation, &output, from_cache,
            )
            .await?;
        self.checkpoint(Checkpoint::AfterFinalWrite).await?;
        self.checkpoint(Checkpoint::BeforeAck).await?;
        self.ack_if_finished(&mut queue, delivery, &attempt, &outcome, acked)
            .await?;
        self.checkpoint(Checkpoint::BeforeRelease).await?;
        self.release(&mut redis, &lease.key, &lease.token, &attempt)
            .await?;
        Ok(outcome)
    }

    /// The attempt's log fields, its `Received` checkpoint and first line; under the
    /// random-id-per-retry defect, the retry's fresh job.
    async fn receive_attempt(
        &self,
        delivery: &Delivery,
        version: &str,
    ) -> std::result::Result<Attempt, Stop> {
        let job = &delivery.job;
        let mut attempt = Attempt {
            request_id: job.request_id.clone(),
            job_id: job.job_id.clone(),
            key: job.idempotency_key.clone(),
            attempt: delivery.receive_count,
            receive_count: delivery.receive_count,
            backend_endpoint: self.endpoint(version)?.name.clone(),
            model_version: version.to_owned(),
            cache_key: "-".to_owned(),
        };
        self.checkpoint(Checkpoint::Received).await?;
        let received = if delivery.receive_count > 1 {
            Status::RetryDispatched
        } else {
            Status::JobReceived
        };
        self.log(Level::Info, &attempt, received, &[]);

        // The seed's "new random job id per retry": the retry becomes a job of its own.
        if self.config.defects.has(Defect::RandomIdPerRetry) && delivery.receive_count > 1 {
            let fresh: u64 = self.rng.lock().expect("poisoned").random();
            attempt.key = format!("{}idem-retry-{fresh:016x}", self.keys.prefix());
            attempt.job_id = format!("job-{fresh:012x}");
            sqlx::query(
                "INSERT INTO inference_jobs (idempotency_key, request_id, job_id) VALUES ($1, $2, $3)
                 ON CONFLICT DO NOTHING",
            )
            .bind(&attempt.key)
            .bind(&attempt.request_id)
            .bind(&attempt.job_id)
            .execute(&self.infra.pg)
            .await?;
        }
        Ok(attempt)
    }

    /// Stops with [`Outcome::Declined`] (and drains) when the active version is not this
    /// worker's.
    async fn decline_other_version(
        &self,
        attempt: &Attempt,
        version: &str,
    ) -> std::result::Result<(), Stop> {
        // Bound to its version for life: read the pointer once, explicitly, and decline a job
        // meant for another version (and drain) instead of switching mid-flight.
        if !self.config.defects.has(Defect::RereadActiveVersion)
            && let Some(active) = self.active_version().await?
            && active != version
        {
            self.drain();
            self.log(
                Level::Info,
                attempt,
                Status::VersionDeclined,
                &[("active_model_version", active)],
            );
            return Err(Stop::Early(Outcome::Declined));
        }
        Ok(())
    }

    /// Takes the job's lease and draws its epoch; stops with [`Outcome::DuplicateSkipped`] when
    /// another attempt holds it.
    async fn take_lease(
        &self,
        redis: &mut ConnectionManager,
        attempt: &Attempt,
    ) -> std::result::Result<Lease, Stop> {
        // The epoch tells two processes of one worker id apart (a restarted worker must never
        // reuse its predecessor's tokens); it comes from the seed, so in-process runs stay
        // deterministic.
        let token = format!(
            "{}:{:x}:{}",
            self.config.worker_id,
            self.token_epoch,
            self.lease_seq.fetch_add(1, Ordering::Relaxed)
        );
        let lease_key = self.keys.lease(&attempt.key);
        let mut take = redis::cmd("SET");
        take.arg(&lease_key).arg(&token);
        if !self.config.defects.has(Defect::LeaseWithoutNx) {
            take.arg("NX");
        }
        // The defect passes the milliseconds where seconds go.
        let unit = if self.config.defects.has(Defect::LeaseTtlInSeconds) {
            "EX"
        } else {
            "PX"
        };
        let acquired: Option<String> = take
            .arg(unit)
            .arg(self.config.lease_ttl.as_millis() as u64)
            .query_async(redis)
            .await?;
        if acquired.is_some() {
            self.log(
                Level::Info,
                attempt,
                Status::LeaseAcquired,
                &[("lease_token", token.clone())],
            );
        } else if !self.config.defects.has(Defect::RetryWithoutDedupe) {
            self.log(Level::Info, attempt, Status::DuplicateSkipped, &[]);
            return Err(Stop::Early(Outcome::DuplicateSkipped));
        }

        // The lease's epoch, drawn while holding it and confirmed after: holders of one lease
        // draw in the order they held it (an older holder's draw happened before its lease ran
        // out, a newer one's after it took the lease), so the take below admits only the newest,
        // however long an older one paused between its lease and its take.
        let epoch: i64 = sqlx::query_scalar(
            "INSERT INTO inference_lease_epochs (idempotency_key, epoch) VALUES ($1, 1)
             ON CONFLICT (idempotency_key)
             DO UPDATE SET epoch = inference_lease_epochs.epoch + 1
             RETURNING epoch",
        )
        .bind(&attempt.key)
        .fetch_one(&self.infra.pg)
        .await?;
        if acquired.is_some() {
            let holder: Option<String> = redis.get(&lease_key).await?;
            if holder.as_deref() != Some(token.as_str()) {
                self.log(
                    Level::Info,
                    attempt,
                    Status::DuplicateSkipped,
                    &[("reason", "lease lost before the take".to_owned())],
                );
                return Err(Stop::Early(Outcome::DuplicateSkipped));
            }
        }
        Ok(Lease {
            key: lease_key,
            token,
            epoch,
        })
    }

    /// Takes the job: IN_PROGRESS, our token, our epoch as its generation (strictly larger).
    /// Returns the generation; stops when a newer holder took the job or it is already
    /// terminal.
    async fn take_job(
        &self,
        redis: &mut ConnectionManager,
        queue: &mut Queue,
        delivery: &Delivery,
        attempt: &Attempt,
        lease: &Lease,
        version: &str,
    ) -> std::result::Result<i64, Stop> {
        let generation: Option<i64> = sqlx::query_scalar(
            "UPDATE inference_jobs
             SET status = 'IN_PROGRESS', lease_token = $2, generation = $6,
                 attempt = $3, worker_id = $4, model_version = $5, updated_at = clock_timestamp()
             WHERE idempotency_key = $1 AND status IN ('PENDING', 'IN_PROGRESS')
               AND generation < $6
             RETURNING generation",
        )
        .bind(&attempt.key)
        .bind(&lease.token)
        .bind(attempt.attempt as i32)
        .bind(&self.config.worker_id)
        .bind(version)
        .bind(lease.epoch)
        .fetch_optional(&self.infra.pg)
        .await?;
        if let Some(generation) = generation {
            return Ok(generation);
        }
        if !self.job_is_terminal(&attempt.key).await? {
            // A newer holder took the job: its delivery is not ours to acknowledge.
            self.log(
                Level::Info,
                attempt,
                Status::DuplicateSkipped,
                &[("reason", "a newer lease took the job".to_owned())],
            );
            self.release(redis, &lease.key, &lease.token, attempt)
                .await?;
            return Err(Stop::Early(Outcome::DuplicateSkipped));
        }
        self.log(Level::Info, attempt, Status::AlreadyCompleted, &[]);
        if !self.config.defects.has(Defect::NoAckWhenCompleted) {
            self.ack(queue, delivery, attempt).await?;
        }
        self.release(redis, &lease.key, &lease.token, attempt)
            .await?;
        Err(Stop::Early(Outcome::AlreadyCompleted))
    }

    /// The job's output and whether it came from the cache: read from its version's namespace,
    /// or (on a miss) produced by the backend and cached.
    async fn produce_output(
        &self,
        redis: &mut ConnectionManager,
        job: &JobMessage,
        attempt: &mut Attempt,
        lease: &Lease,
    ) -> std::result::Result<(String, bool), Stop> {
        let cache_version = self.step_version().await?;
        attempt.cache_key = self.cache_key(&cache_version, &job.input);
        let cached: Option<String> = redis.get(&attempt.cache_key).await?;
        match cached {
            Some(output) => {
                let served = crate::contract::output_version(&output)
                    .unwrap_or("-")
                    .to_owned();
                self.log(
                    Level::Info,
                    attempt,
                    Status::CacheHit,
                    &[("served_model_version", served)],
                );
                self.checkpoint(Checkpoint::AfterCacheRead).await?;
                Ok((output, true))
            }
            None => {
                self.log(Level::Info, attempt, Status::CacheMiss, &[]);
                self.checkpoint(Checkpoint::AfterCacheRead).await?;
                let output = self
                    .infer_and_cache(redis, job, attempt, lease, &cache_version)
                    .await?;
                Ok((output, false))
            }
        }
    }

    /// On a cache miss: calls the backend (stopping with [`Outcome::UpstreamFailed`] if the
    /// call fails) and caches its output.
    async fn infer_and_cache(
        &self,
        redis: &mut ConnectionManager,
        job: &JobMessage,
        attempt: &mut Attempt,
        lease: &Lease,
        cache_version: &str,
    ) -> std::result::Result<String, Stop> {
        self.checkpoint(Checkpoint::BeforeBackendCall).await?;
        let call_version = self.step_version().await?;
        let endpoint = self.endpoint(&call_version)?.clone();
        attempt.backend_endpoint = endpoint.name.clone();
        self.log(Level::Info, attempt, Status::InferenceStarted, &[]);
        let output = match self.call_backend(&endpoint, job, attempt).await {
            Ok(output) => output,
            Err(err) => {
                self.log(
                    Level::Warn,
                    attempt,
                    Status::UpstreamFailed,
                    &[("error", err.to_string())],
                );
                self.release(redis, &lease.key, &lease.token, attempt)
                    .await?;
                return Err(Stop::Early(Outcome::UpstreamFailed));
            }
        };
        self.checkpoint(Checkpoint::AfterBackendCall).await?;
        self.checkpoint(Checkpoint::BeforeCacheWrite).await?;
        // The defect caches under whatever version is live now, not the producer's.
        let write_key = if self.config.defects.has(Defect::CacheWriteActiveNamespace) {
            let live = self
                .active_version()
                .await?
                .unwrap_or_else(|| cache_version.to_owned());
            self.cache_key(&live, &job.input)
        } else {
            attempt.cache_key.clone()
        };
        let _: () = redis
            .set_ex(&write_key, &output, self.config.cache_ttl.as_secs().max(1))
            .await?;
        self.log(Level::Info, attempt, Status::CacheWritten, &[]);
        Ok(output)
    }

    /// Unless already acked, acks the delivery after the final write if the job is finished,
    /// else leaves it for redelivery.
    async fn ack_if_finished(
        &self,
        queue: &mut Queue,
        delivery: &Delivery,
        attempt: &Attempt,
        outcome: &Outcome,
        acked: bool,
    ) -> Result<()> {
        // The delivery is the job's, not the attempt's: a rejected late writer may ack only if
        // the job is finished. If the attempt that took over failed (its call timed out, it
        // crashed), acking here would drop the job's last delivery and lose it (found by the
        // upstream-timeout suite, seed 3).
        let finished = match outcome {
            Outcome::LateWriteRejected => self.job_is_terminal(&attempt.key).await?,
            _ => true,
        };
        if !acked && finished {
            self.ack(queue, delivery, attempt).await?;
        } else if !acked {
            self.log(Level::Info, attempt, Status::LeftForRedelivery, &[]);
        }
        Ok(())
    }

    async fn job_is_terminal(&self, idempotency_key: &str) -> Result<bool> {
        let status: Option<String> =
            sqlx::query_scalar("SELECT status FROM inference_jobs WHERE idempotency_key = $1")
                .bind(idempotency_key)
                .fetch_optional(&self.infra.pg)
                .await?;
        Ok(status.is_some_and(|s| matches!(s.as_str(), "SUCCEEDED" | "FAILED" | "CANCELLED")))
    }

    async fn call_backend(
        &self,
        endpoint: &BackendEndpoint,
        job: &JobMessage,
        attempt: &Attempt,
    ) -> Result<String> {
        self.checkpoints.calling(&self.config.worker_id);
        let request = self
            .infra
            .http
            .post(format!("{}/v1/infer", endpoint.url))
            .timeout(self.config.backend_timeout)
            .json(&InferRequest {
                input: job.input.clone(),
                idempotency_key: attempt.key.clone(),
                attempt: attempt.attempt as u32,
                worker_id: self.config.worker_id.clone(),
            })
            .send();
        tokio::pin!(request);
        // A harness may end the wait early, as the timeout would (see `Deadlines`): then the
        // warning and the timeout both happen now.
        let worker = &self.config.worker_id;
        let expired = || self.checkpoints.call_expired(worker);
        let response = tokio::select! {
            response = &mut request => Some(response),
            _ = tokio::time::sleep(self.config.upstream_warn_after) => None,
            _ = expired() => {
                self.log(Level::Warn, attempt, Status::TimeoutWaitingUpstream, &[]);
                return Err(self.timed_out(endpoint));
            }
        };
        let response = match response {
            Some(response) => response,
            None => {
                // The seed's worker warns and keeps waiting: the attempt is slow, not dead.
                self.log(Level::Warn, attempt, Status::TimeoutWaitingUpstream, &[]);
                tokio::select! {
                    response = &mut request => response,
                    _ = expired() => return Err(self.timed_out(endpoint)),
                }
            }
        };
        let answer: InferResponse = response
            .and_then(|r| r.error_for_status())
            .map_err(|e| Error::Backend(format!("{}: {e}", endpoint.name)))?
            .json()
            .await
            .map_err(|e| Error::Backend(format!("{}: bad answer: {e}", endpoint.name)))?;
        Ok(answer.output)
    }

    /// The error of a backend call that ran out of time.
    fn timed_out(&self, endpoint: &BackendEndpoint) -> Error {
        Error::Backend(format!(
            "{}: no answer within the {:?} timeout",
            endpoint.name, self.config.backend_timeout
        ))
    }

    async fn ack(&self, queue: &mut Queue, delivery: &Delivery, attempt: &Attempt) -> Result<()> {
        queue.ack(&delivery.entry_id).await?;
        self.log(Level::Info, attempt, Status::Acked, &[]);
        Ok(())
    }

    async fn release(
        &self,
        redis: &mut ConnectionManager,
        lease_key: &str,
        token: &str,
        attempt: &Attempt,
    ) -> Result<()> {
        let deleted: i64 = if self.config.defects.has(Defect::ReleaseWithoutTokenCheck) {
            redis.del(lease_key).await?
        } else {
            redis::Script::new(RELEASE_LEASE)
                .key(lease_key)
                .arg(token)
                .invoke_async(redis)
                .await?
        };
        let word = if deleted == 1 {
            Status::LeaseReleased
        } else {
            Status::LeaseLost
        };
        self.log(Level::Info, attempt, word, &[]);
        Ok(())
    }
}

impl crate::contract::worker::WorkerUnderTest for Worker {
    fn id(&self) -> &str {
        &self.config.worker_id
    }

    fn model_version(&self) -> &str {
        &self.config.model_version
    }

    fn process(
        &self,
        delivery: Delivery,
    ) -> crate::contract::worker::BoxFuture<'_, crate::Result<()>> {
        Box::pin(async move { Worker::process(self, delivery).await.map(|_| ()) })
    }

    fn is_draining(&self) -> bool {
        Worker::is_draining(self)
    }
}
