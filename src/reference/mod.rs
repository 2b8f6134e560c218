//! The reference inference pipeline from the seed, implemented correctly, with a switch per root
//! cause ([`defects`]) so the harness has real bugs to find.
//!
//! - [`submit`]: the API side (normalise, stable idempotency key, insert PENDING once, enqueue).
//! - [`queue`]: Redis Stream + consumer group, redelivery after the visibility timeout.
//! - [`worker`]: lease, fencing generation, version-aware cache, backend call, fenced final write.
//! - [`cutover`]: active-version pointer switch (and the defect's late invalidation).
//!
//! [`Pipeline`] wires them to a [`TestBed`] under one key namespace.

pub mod cutover;
pub mod process;
pub mod queue;
pub mod submit;
pub mod worker;

use crate::Result;
use crate::contract::checkpoint::Checkpoints;
use crate::contract::defect::Defects;
use crate::contract::log::LogSink;
use crate::contract::worker::{BackendEndpoint, Infra};
use crate::contract::{JobRow, Keys};
use crate::env::TestBed;
use queue::Queue;
use std::collections::BTreeMap;
use submit::Api;
use worker::{Worker, WorkerConfig, WorkerConfigBuilder};

/// The pipeline of one namespace on a test bed: API, queue, workers, log.
pub struct Pipeline {
    /// Key namespace of this pipeline.
    pub keys: Keys,
    /// Shared connections (through the proxies).
    pub infra: Infra,
    /// The API side.
    pub api: Api,
    /// Every log line of the pipeline.
    pub log: LogSink,
    backends: BTreeMap<String, BackendEndpoint>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("namespace", &self.keys.prefix())
            .finish()
    }
}

/// `model-backend-A` -> `model-a`: the seed's `backend_endpoint` spelling.
pub fn endpoint_name(backend: &str) -> String {
    backend.replace("backend-", "").to_lowercase()
}

/// Every version's backend endpoint on `bed`, through the bed's shared proxies.
pub fn backend_endpoints(bed: &TestBed) -> Result<BTreeMap<String, BackendEndpoint>> {
    bed.versions()
        .into_iter()
        .map(|version| {
            Ok((
                version.to_owned(),
                BackendEndpoint {
                    name: endpoint_name(bed.backend(version)?.name()),
                    url: bed.backend_url(version)?,
                },
            ))
        })
        .collect()
}

impl Pipeline {
    /// A pipeline on `bed` under `namespace`, every connection through the bed's proxies.
    pub async fn on(bed: &TestBed, namespace: &str, log: LogSink) -> Result<Pipeline> {
        let infra = Infra::connect(&bed.redis_url(), &bed.database_url()).await?;
        Pipeline::with_infra(
            infra,
            Keys::namespaced(namespace),
            backend_endpoints(bed)?,
            log,
        )
        .await
    }

    /// A pipeline over given connections and backend endpoints.
    pub async fn with_infra(
        infra: Infra,
        keys: Keys,
        backends: BTreeMap<String, BackendEndpoint>,
        log: LogSink,
    ) -> Result<Pipeline> {
        let queue = Queue::open(infra.redis.clone(), &keys).await?;
        Ok(Pipeline {
            api: Api::new(infra.pg.clone(), queue, keys.clone()),
            keys,
            infra,
            log,
            backends,
        })
    }

    /// A worker configuration for `worker_id` bound to `version`, with every backend endpoint.
    pub fn worker_config(&self, worker_id: &str, version: &str) -> WorkerConfigBuilder {
        WorkerConfig::builder(
            worker_id,
            version,
            self.backends.iter().map(|(v, e)| (v.clone(), e.clone())),
        )
    }

    /// Starts a worker.
    pub async fn worker(&self, config: WorkerConfig, checkpoints: Checkpoints) -> Result<Worker> {
        Worker::new(
            config,
            self.infra.clone(),
            self.keys.clone(),
            checkpoints,
            self.log.clone(),
        )
        .await
    }

    /// Switches the active version (see [`cutover`]).
    pub async fn cutover(&self, to: &str, defects: &Defects) -> Result<cutover::Cutover> {
        let mut redis = self.infra.redis.clone();
        cutover::cutover(&mut redis, &self.keys, to, defects, &self.log).await
    }

    /// Runs a cutover's late invalidation.
    pub async fn invalidate(&self, cutover: &mut cutover::Cutover) -> Result<u64> {
        let mut redis = self.infra.redis.clone();
        cutover.invalidate(&mut redis, &self.keys, &self.log).await
    }

    /// The stored job.
    pub async fn job(&self, idempotency_key: &str) -> Result<Option<JobRow>> {
        Ok(sqlx::query_as(
            "SELECT idempotency_key, request_id, status, generation, model_version, output, lease_token, worker_id
             FROM inference_jobs WHERE idempotency_key = $1",
        )
        .bind(idempotency_key)
        .fetch_optional(&self.infra.pg)
        .await?)
    }

    /// Every stored job of a request (more than one only when a retry got a new key).
    pub async fn jobs_of_request(&self, request_id: &str) -> Result<Vec<JobRow>> {
        Ok(sqlx::query_as(
            "SELECT idempotency_key, request_id, status, generation, model_version, output, lease_token, worker_id
             FROM inference_jobs WHERE request_id = $1 AND idempotency_key LIKE $2 ORDER BY idempotency_key",
        )
        .bind(request_id)
        .bind(format!("{}%", self.keys.prefix()))
        .fetch_all(&self.infra.pg)
        .await?)
    }

    /// Expires a lease now, as if its TTL had run out (schedules make time pass this way).
    pub async fn expire_lease(&self, idempotency_key: &str) -> Result<bool> {
        let mut redis = self.infra.redis.clone();
        let deleted: i64 = redis::cmd("DEL")
            .arg(self.keys.lease(idempotency_key))
            .query_async(&mut redis)
            .await?;
        Ok(deleted == 1)
    }

    /// Final writes (moves into SUCCEEDED) of a key, from the audit trail.
    pub async fn final_writes(
        &self,
        idempotency_key: &str,
    ) -> Result<Vec<(Option<i64>, i64, Option<String>)>> {
        Ok(sqlx::query_as(
            "SELECT old_generation, new_generation, new_model_version FROM inference_jobs_audit
             WHERE idempotency_key = $1 AND new_status = 'SUCCEEDED' ORDER BY audit_id",
        )
        .bind(idempotency_key)
        .fetch_all(&self.infra.pg)
        .await?)
    }
}

/// Starts reference workers for the harness, with the suite's defects and timeouts.
#[derive(Debug, Default, Clone, Copy)]
pub struct ReferenceFactory;

impl crate::contract::worker::WorkerFactory for ReferenceFactory {
    fn start<'a>(
        &'a self,
        ctx: crate::contract::worker::WorkerContext<'a>,
    ) -> crate::contract::worker::BoxFuture<
        'a,
        Result<std::sync::Arc<dyn crate::contract::worker::WorkerUnderTest>>,
    > {
        Box::pin(async move {
            let config = WorkerConfig::builder(
                &ctx.spec.id,
                &ctx.spec.version,
                ctx.backends.iter().map(|(v, e)| (v.clone(), e.clone())),
            )
            .backend_timeout(ctx.backend_timeout)
            .upstream_warn_after(ctx.backend_timeout / 2)
            // The harness receives on the worker's behalf and owns the visibility timeout; this
            // one only has to outlast a call.
            .visibility_timeout(ctx.lease_ttl.max(ctx.backend_timeout * 2))
            .lease_ttl(ctx.lease_ttl)
            .defects(ctx.defects)
            .seed(ctx.index as u64)
            .build()?;
            let worker = Worker::new(config, ctx.infra, ctx.keys, ctx.checkpoints, ctx.log).await?;
            Ok(std::sync::Arc::new(worker)
                as std::sync::Arc<
                    dyn crate::contract::worker::WorkerUnderTest,
                >)
        })
    }
}
