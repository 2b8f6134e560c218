//! The reference worker as a standalone program (`racecert worker`), configured by the
//! contract's environment variables, so the external mode is exercised on a known worker. It
//! receives from the stream itself (visibility timeout included), logs logfmt to stdout, and on
//! SIGTERM drains: it stops taking jobs, finishes the one in hand and exits 0.

use crate::contract::Keys;
use crate::contract::checkpoint::Checkpoints;
use crate::contract::defect::{Defect, Defects};
use crate::contract::log::{Echo, LogSink};
use crate::contract::worker::{BackendEndpoint, Infra};
use crate::reference::queue::Queue;
use crate::reference::worker::{Worker, WorkerConfig};
use crate::{Error, Result};
use std::time::Duration;

/// The contract's environment, as a worker process receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerEnv {
    /// `RACECERT_WORKER_ID`.
    pub worker_id: String,
    /// `RACECERT_MODEL_VERSION`.
    pub model_version: String,
    /// `RACECERT_REDIS_URL`.
    pub redis_url: String,
    /// `RACECERT_DATABASE_URL`.
    pub database_url: String,
    /// `RACECERT_BACKEND_URL`.
    pub backend_url: String,
    /// `RACECERT_BACKEND_ENDPOINT`.
    pub backend_endpoint: String,
    /// `RACECERT_KEY_PREFIX` (may be empty).
    pub key_prefix: String,
    /// `RACECERT_LEASE_TTL_MS`.
    pub lease_ttl: Duration,
    /// `RACECERT_VISIBILITY_TIMEOUT_MS`.
    pub visibility_timeout: Duration,
    /// `RACECERT_BACKEND_TIMEOUT_MS`.
    pub backend_timeout: Duration,
    /// `RACECERT_DEFECTS` (comma-separated; reference worker only).
    pub defects: Defects,
}

impl WorkerEnv {
    /// The variables, for a child process.
    pub fn vars(&self) -> Vec<(&'static str, String)> {
        let ms = |d: Duration| d.as_millis().to_string();
        vec![
            ("RACECERT_WORKER_ID", self.worker_id.clone()),
            ("RACECERT_MODEL_VERSION", self.model_version.clone()),
            ("RACECERT_REDIS_URL", self.redis_url.clone()),
            ("RACECERT_DATABASE_URL", self.database_url.clone()),
            ("RACECERT_BACKEND_URL", self.backend_url.clone()),
            ("RACECERT_BACKEND_ENDPOINT", self.backend_endpoint.clone()),
            ("RACECERT_KEY_PREFIX", self.key_prefix.clone()),
            (
                "RACECERT_STREAM",
                format!("{}{}", self.key_prefix, crate::contract::JOB_STREAM),
            ),
            (
                "RACECERT_CONSUMER_GROUP",
                crate::contract::CONSUMER_GROUP.to_owned(),
            ),
            ("RACECERT_LEASE_TTL_MS", ms(self.lease_ttl)),
            (
                "RACECERT_VISIBILITY_TIMEOUT_MS",
                ms(self.visibility_timeout),
            ),
            ("RACECERT_BACKEND_TIMEOUT_MS", ms(self.backend_timeout)),
            (
                "RACECERT_DEFECTS",
                self.defects
                    .iter()
                    .map(|d| d.name())
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        ]
    }

    /// Reads the variables of this process; a missing or bad one is named.
    pub fn from_env() -> Result<WorkerEnv> {
        let var = |name: &str| -> Result<String> {
            std::env::var(name)
                .map_err(|_| Error::Config(format!("{name} is not set (see docs/contract.md)")))
        };
        let ms = |name: &str| -> Result<Duration> {
            let value = var(name)?;
            value
                .parse::<u64>()
                .ok()
                .filter(|v| *v > 0)
                .map(Duration::from_millis)
                .ok_or_else(|| {
                    Error::Config(format!(
                        "{name}={value:?}: expected a positive number of milliseconds"
                    ))
                })
        };
        let defects = std::env::var("RACECERT_DEFECTS").unwrap_or_default();
        let defects = defects
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(|d| d.parse::<Defect>())
            .collect::<Result<Vec<_>>>()?;
        Ok(WorkerEnv {
            worker_id: var("RACECERT_WORKER_ID")?,
            model_version: var("RACECERT_MODEL_VERSION")?,
            redis_url: var("RACECERT_REDIS_URL")?,
            database_url: var("RACECERT_DATABASE_URL")?,
            backend_url: var("RACECERT_BACKEND_URL")?,
            backend_endpoint: var("RACECERT_BACKEND_ENDPOINT")?,
            key_prefix: std::env::var("RACECERT_KEY_PREFIX").unwrap_or_default(),
            lease_ttl: ms("RACECERT_LEASE_TTL_MS")?,
            visibility_timeout: ms("RACECERT_VISIBILITY_TIMEOUT_MS")?,
            backend_timeout: ms("RACECERT_BACKEND_TIMEOUT_MS")?,
            defects: Defects::of(defects),
        })
    }
}

/// Runs the reference worker until SIGTERM (drain) or until it declines a version it does not
/// serve (it drains then too).
pub async fn run(env: WorkerEnv) -> Result<()> {
    let keys = match env.key_prefix.strip_suffix(':') {
        Some(namespace) if !namespace.is_empty() => Keys::namespaced(namespace),
        _ if env.key_prefix.is_empty() => Keys::root(),
        _ => {
            return Err(Error::Config(format!(
                "RACECERT_KEY_PREFIX={:?} must be empty or end with ':'",
                env.key_prefix
            )));
        }
    };
    let infra = Infra::connect(&env.redis_url, &env.database_url).await?;
    let config = WorkerConfig::builder(
        &env.worker_id,
        &env.model_version,
        [(
            env.model_version.clone(),
            BackendEndpoint {
                name: env.backend_endpoint.clone(),
                url: env.backend_url.clone(),
            },
        )],
    )
    .lease_ttl(env.lease_ttl)
    .visibility_timeout(env.visibility_timeout)
    .backend_timeout(env.backend_timeout)
    .upstream_warn_after(env.backend_timeout / 2)
    .defects(env.defects.clone())
    // The harness may hand a lease or visibility timeout shorter than a call on purpose (the
    // seed's "visibility timeout shorter than inference time"): take it, and say so.
    .accept_timing_faults()
    // A restarted process must not reuse its predecessor's lease tokens.
    .seed(u64::from(std::process::id()) ^ (jiff::Timestamp::now().as_nanosecond() as u64))
    .build()?;
    let log = LogSink::new(Echo::Logfmt);
    let worker = Worker::new(
        config,
        infra.clone(),
        keys.clone(),
        Checkpoints::free(),
        log,
    )
    .await?;
    let mut queue = Queue::open(infra.redis.clone(), &keys).await?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|err| Error::io("install the SIGTERM handler", err))?;
    loop {
        if worker.is_draining() {
            return Ok(());
        }
        tokio::select! {
            _ = terminate.recv() => {
                // Drain: nothing is in hand between deliveries.
                return Ok(());
            }
            received = queue.receive(worker.id(), env.visibility_timeout) => {
                match received {
                    Ok(Some(delivery)) => {
                        // The delivery is finished before SIGTERM is looked at again.
                        if let Err(err) = worker.process(delivery).await {
                            println!(
                                "{} WARN worker_id={} model_version={} status=attempt_error error={:?}",
                                crate::contract::log::timestamp_now(),
                                env.worker_id,
                                env.model_version,
                                err.to_string()
                            );
                        }
                    }
                    Ok(None) => tokio::time::sleep(Duration::from_millis(20)).await,
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        }
    }
}
