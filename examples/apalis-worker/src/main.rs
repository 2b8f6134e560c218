//! An inference worker written the way a team writes it on apalis 1.0 with the Postgres backend.
//!
//! ```text
//! apalis-worker [--fenced]          run one worker (naive handler unless --fenced)
//! apalis-worker submit ID INPUT     enqueue one job with apalis' own sink and exit
//! ```
//!
//! Both handlers create the request's row in `predictions`, call the model (KServe v2) and store
//! its output. The naive one ends with a plain `UPDATE ... WHERE request_id = $1`: when apalis
//! runs a job twice (its worker missed heartbeats, so another worker requeued the job while the
//! first one was still running) both attempts write, last writer wins. The fenced one takes an
//! epoch before the model call and writes only while that epoch is still the row's, and registers
//! each process under its own apalis worker name (`WORKER_NAME.pid`), so a restart that reuses
//! `WORKER_NAME` does not strand the jobs the previous process held.
//!
//! Configuration is read from the environment only: `DATABASE_URL`, `MODEL_URL`, `MODEL_NAME`,
//! `MODEL_VERSION`, `WORKER_NAME`, `QUEUE` (default `inference`), `HEARTBEAT_S` and
//! `MISSED_HEARTBEATS` (apalis' `Config::default()`: 30 s and 10), `MODEL_TIMEOUT_S` (30);
//! `CACHE_PREFIX`, `CACHE_TTL_S` and `REDIS_URL` for the result cache ([`cache`]); and
//! `IGNORE_SIGTERM=1`, the drain bug of `draining.toml`: a SIGTERM handler of the team's own that
//! flushes metrics and carries on, so the worker keeps taking jobs until its SIGKILL.

mod cache;
mod model;
mod store;

use std::{env, process::ExitCode, sync::Arc, time::Duration};

use apalis::prelude::*;
use apalis_postgres::{Config, PgPool, PostgresStorage};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::model::Model;

/// The job the team's API enqueues: one inference request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InferenceRequest {
    /// The business key of the request (the key column of `predictions`).
    pub request_id: String,
    /// The text sent to the model.
    pub input: String,
}

/// What every handler invocation shares: the pool, the model client, the worker's identity.
#[derive(Debug)]
struct App {
    pool: PgPool,
    model: Model,
    cache: Option<cache::Cache>,
    worker: String,
    version: String,
}

impl App {
    /// The model's output for `input`, through the result cache when there is one.
    async fn infer(&self, step: &Step<'_>, input: &str) -> Result<String, BoxDynError> {
        let Some(cache) = &self.cache else {
            return self.model.infer(input).await;
        };
        let key = cache.key(input);
        if let Some(hit) = cache.get(&key).await? {
            step.info("cache_hit", None);
            return Ok(hit);
        }
        let output = self.model.infer(input).await?;
        cache.put(&key, &output).await?;
        Ok(output)
    }
}

type Shared = Data<Arc<App>>;

/// The fields of one log line: the seed's names, so a diagnosis can join lines across workers.
struct Step<'a> {
    app: &'a App,
    job: &'a InferenceRequest,
    job_id: &'a TaskId,
    attempt: usize,
}

impl Step<'_> {
    fn info(&self, status: &str, generation: Option<i32>) {
        info!(
            request_id = %self.job.request_id,
            job_id = %self.job_id,
            attempt = self.attempt,
            worker_id = %self.app.worker,
            model_version = %self.app.version,
            backend_endpoint = %self.app.model.endpoint(),
            generation,
            status,
        );
    }

    fn warn(&self, status: &str, generation: Option<i32>, error: Option<&str>) {
        warn!(
            request_id = %self.job.request_id,
            job_id = %self.job_id,
            attempt = self.attempt,
            worker_id = %self.app.worker,
            model_version = %self.app.version,
            backend_endpoint = %self.app.model.endpoint(),
            generation,
            status,
            error,
        );
    }

    fn received(&self) {
        // apalis counts a requeue by a heartbeat timeout as an attempt: attempt > 1 is a retry.
        let status = if self.attempt > 1 {
            "retry_dispatched"
        } else {
            "job_received"
        };
        self.info(status, None);
    }
}

/// The naive handler: model call, then an unconditional final write.
async fn infer_naive(
    job: InferenceRequest,
    job_id: TaskId,
    attempt: Attempt,
    app: Shared,
) -> Result<(), BoxDynError> {
    let step = Step {
        app: &app,
        job: &job,
        job_id: &job_id,
        attempt: attempt.current(),
    };
    step.received();
    store::ensure_row(&app.pool, &job).await?;
    step.info("inference_started", None);
    match app.infer(&step, &job.input).await {
        Ok(output) => {
            store::write_naive(
                &app.pool,
                &job.request_id,
                &output,
                &app.version,
                &app.worker,
            )
            .await?;
            step.info("inference_succeeded", None);
        }
        Err(error) => {
            // The failure is the request's outcome; apalis retrying would only repeat the call.
            step.warn("upstream_failed", None, Some(&error.to_string()));
            store::fail_naive(&app.pool, &job.request_id, &app.worker).await?;
        }
    }
    Ok(())
}

/// The fenced handler: an epoch taken before the model call guards the final write.
async fn infer_fenced(
    job: InferenceRequest,
    job_id: TaskId,
    attempt: Attempt,
    app: Shared,
) -> Result<(), BoxDynError> {
    let step = Step {
        app: &app,
        job: &job,
        job_id: &job_id,
        attempt: attempt.current(),
    };
    step.received();
    store::ensure_row(&app.pool, &job).await?;
    let Some(epoch) = store::take(&app.pool, &job.request_id, &app.worker).await? else {
        step.info("already_completed", None);
        return Ok(());
    };
    step.info("job_taken", Some(epoch));
    step.info("inference_started", Some(epoch));
    let written = match app.infer(&step, &job.input).await {
        Ok(output) => {
            store::write_fenced(&app.pool, &job.request_id, epoch, &output, &app.version).await?
        }
        Err(error) => {
            step.warn("upstream_failed", Some(epoch), Some(&error.to_string()));
            store::fail_fenced(&app.pool, &job.request_id, epoch).await?;
            return Ok(());
        }
    };
    if written {
        step.info("inference_succeeded", Some(epoch));
    } else {
        step.warn("late_write_rejected", Some(epoch), None);
        step.warn("discarded_late_result", Some(epoch), None);
    }
    Ok(())
}

fn var(name: &str, default: &str) -> String {
    env::var(name).unwrap_or_else(|_| default.to_owned())
}

fn seconds(name: &str, default: &str) -> Result<Duration, BoxDynError> {
    let text = var(name, default);
    let value: f64 = text.parse().map_err(|e| format!("{name}={text:?}: {e}"))?;
    Ok(Duration::from_secs_f64(value))
}

fn apalis_config() -> Result<Config, BoxDynError> {
    let missed = var("MISSED_HEARTBEATS", "10");
    let missed: usize = missed
        .parse()
        .map_err(|e| format!("MISSED_HEARTBEATS={missed:?}: {e}"))?;
    Ok(Config::default()
        .queue(var("QUEUE", "inference"))
        .heartbeat_interval(seconds("HEARTBEAT_S", "30")?)
        .missed_heartbeats(missed))
}

async fn connect() -> Result<PgPool, BoxDynError> {
    let url = env::var("DATABASE_URL").map_err(|_| "DATABASE_URL is not set")?;
    let pool = PgPool::connect(&url).await?;
    // apalis' own tables and functions (schema `apalis`); the migrator holds an advisory lock, so
    // workers starting together are fine.
    PostgresStorage::setup(&pool).await?;
    Ok(pool)
}

async fn run_worker(fenced: bool) -> Result<(), BoxDynError> {
    let pool = connect().await?;
    let app = Arc::new(App {
        model: Model::new(
            &var("MODEL_URL", "http://127.0.0.1:8080"),
            &var("MODEL_NAME", "inference-model"),
            seconds("MODEL_TIMEOUT_S", "30")?,
        )?,
        worker: var("WORKER_NAME", "worker-a"),
        version: var("MODEL_VERSION", "v1"),
        cache: cache::Cache::from_env().await?,
        pool: pool.clone(),
    });
    let config = apalis_config()?;
    info!(
        worker_id = %app.worker,
        model_version = %app.version,
        queue = %config.queue,
        heartbeat_s = config.heartbeat_interval.as_secs_f64(),
        missed_heartbeats = config.missed_heartbeats,
        handler = if fenced { "fenced" } else { "naive" },
        status = "worker_starting",
    );
    let backend = PostgresStorage::<InferenceRequest>::new(&pool)
        .with_config(config)
        .with_pubsub();
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let ignore_sigterm = var("IGNORE_SIGTERM", "") == "1";
    let stop = async move {
        sigterm.recv().await;
        // The drain bug (draining.toml): a handler of the team's own takes SIGTERM to flush
        // metrics and never stops the worker.
        while ignore_sigterm {
            warn!(status = "sigterm_received", "SIGTERM received: metrics flushed");
            sigterm.recv().await;
        }
        Ok::<(), std::io::Error>(())
    };
    // apalis recovers a dead worker's jobs only once its name stops heartbeating. A restarted
    // process that reuses the name heartbeats for it, so the jobs it held stay Running forever
    // (a rolling restart loses them). The fenced variant names each process instance apart;
    // the naive one uses the name as given, as most deployments do.
    let instance = if fenced {
        format!("{}.{}", app.worker, std::process::id())
    } else {
        app.worker.clone()
    };
    let worker = app.worker.clone();
    let builder = WorkerBuilder::new(instance)
        .backend(backend)
        .data(app.clone())
        .on_event(move |ctx, event| log_event(&worker, ctx, event));
    if fenced {
        builder.build(infer_fenced).run_until(stop).await?;
    } else {
        builder.build(infer_naive).run_until(stop).await?;
    }
    Ok(())
}

/// Worker lifecycle lines: readiness (racecert's start-up wait) and handler errors.
fn log_event(worker: &str, ctx: &WorkerContext, event: &Event) {
    match event {
        Event::Start => info!(
            worker_id = %worker,
            apalis_worker = %ctx.name(),
            status = "worker_ready"
        ),
        Event::Error(error) => warn!(
            worker_id = %worker,
            apalis_worker = %ctx.name(),
            %error,
            status = "job_error"
        ),
        _ => {}
    }
}

async fn submit(request_id: String, input: String) -> Result<(), BoxDynError> {
    let pool = connect().await?;
    let mut backend = PostgresStorage::<InferenceRequest>::new(&pool).with_config(apalis_config()?);
    backend.push(InferenceRequest { request_id, input }).await?;
    Ok(())
}

const USAGE: &str = "usage: apalis-worker [--fenced] | apalis-worker submit REQUEST_ID INPUT";

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_target(false)
        .init();
    let args: Vec<String> = env::args().skip(1).collect();
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] => run_worker(false).await,
        ["--fenced"] => run_worker(true).await,
        ["submit", id, input] => submit((*id).to_owned(), (*input).to_owned()).await,
        _ => Err(USAGE.into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("apalis-worker: {e}");
            ExitCode::FAILURE
        }
    }
}
