//! A team's own worker, certified by racecert end to end.
//!
//! `TeamWorker` is written against the contract only (lease key, jobs table, backend API, log
//! fields): it takes the lease, moves the job to IN_PROGRESS with a new generation, calls its
//! backend and commits a fenced final write. It reports its checkpoints so racecert's controller
//! can interleave it with other workers. `main` starts a test bed, runs the shipped
//! `lease-expiry` suite against it, and prints the verdict; `--unfenced` drops the fence from the
//! final write, and racecert finds the late overwrite and shrinks it to a short schedule.
//!
//! ```sh
//! cargo run --example custom_worker             # passes
//! cargo run --example custom_worker -- --unfenced  # caught: at-most-one-final-write, ...
//! ```

use racecert::contract::checkpoint::{Checkpoint, Checkpoints, Directive};
use racecert::contract::delivery::Delivery;
use racecert::contract::log::LogSink;
use racecert::contract::log::{Level, Status};
use racecert::contract::worker::{BackendEndpoint, Infra};
use racecert::contract::worker::{BoxFuture, WorkerContext, WorkerFactory, WorkerUnderTest};
use racecert::contract::{CONSUMER_GROUP, InferRequest, InferResponse, Keys};
use racecert::env::TestBed;
use racecert::runner::controlled::Controller;
use racecert::runner::explore::{ExploreConfig, explore};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug)]
struct TeamWorker {
    id: String,
    version: String,
    backend: BackendEndpoint,
    infra: Infra,
    keys: Keys,
    checkpoints: Checkpoints,
    log: LogSink,
    fenced: bool,
    lease_ttl_ms: u64,
    leases: AtomicU64,
}

impl TeamWorker {
    /// Logs with the contract's fields, so racecert's checkers see what it did.
    fn log(&self, delivery: &Delivery, word: Status) {
        let field = |k: &str, v: String| (k.to_owned(), v);
        self.log.emit(
            Level::Info,
            vec![
                field("request_id", delivery.job.request_id.clone()),
                field("job_id", delivery.job.job_id.clone()),
                field("idempotency_key", delivery.job.idempotency_key.clone()),
                field("attempt", delivery.receive_count.to_string()),
                field("worker_id", self.id.clone()),
                field("model_version", self.version.clone()),
                field("backend_endpoint", self.backend.name.clone()),
                field("cache_key", "-".into()),
                field("queue_receive_count", delivery.receive_count.to_string()),
                field("status", word.to_string()),
            ],
        );
    }

    /// `false` when the controller crashed us here.
    async fn at(&self, checkpoint: Checkpoint) -> bool {
        self.checkpoints.reached(&self.id, checkpoint).await == Directive::Continue
    }

    async fn run(&self, delivery: Delivery) -> racecert::Result<()> {
        let key = delivery.job.idempotency_key.clone();
        let token = format!(
            "{}:{}",
            self.id,
            self.leases.fetch_add(1, Ordering::Relaxed)
        );
        let mut redis = self.infra.redis.clone();
        if !self.at(Checkpoint::Received).await {
            return Ok(());
        }
        let acquired: Option<String> = redis::cmd("SET")
            .arg(self.keys.lease(&key))
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(self.lease_ttl_ms)
            .query_async(&mut redis)
            .await?;
        if acquired.is_none() {
            self.log(&delivery, Status::DuplicateSkipped);
            return Ok(());
        }
        self.log(&delivery, Status::LeaseAcquired);
        if !self.at(Checkpoint::AfterLease).await {
            return Ok(());
        }
        let generation: Option<i64> = sqlx::query_scalar(
            "UPDATE inference_jobs SET status = 'IN_PROGRESS', lease_token = $2,
                 generation = generation + 1, worker_id = $3, model_version = $4
             WHERE idempotency_key = $1 AND status IN ('PENDING', 'IN_PROGRESS')
             RETURNING generation",
        )
        .bind(&key)
        .bind(&token)
        .bind(&self.id)
        .bind(&self.version)
        .fetch_optional(&self.infra.pg)
        .await?;
        let mut queue = racecert::reference::queue::Queue::open(redis.clone(), &self.keys).await?;
        let Some(generation) = generation else {
            queue.ack(&delivery.entry_id).await?;
            return Ok(());
        };
        if !self.at(Checkpoint::BeforeBackendCall).await {
            return Ok(());
        }
        self.log(&delivery, Status::InferenceStarted);
        let answer: InferResponse = self
            .infra
            .http
            .post(format!("{}/v1/infer", self.backend.url))
            .json(&InferRequest {
                input: delivery.job.input.clone(),
                idempotency_key: key.clone(),
                attempt: delivery.receive_count as u32,
                worker_id: self.id.clone(),
            })
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(|e| racecert::Error::Backend(e.to_string()))?
            .json()
            .await
            .map_err(|e| racecert::Error::Backend(e.to_string()))?;
        if !self.at(Checkpoint::BeforeFinalWrite).await {
            return Ok(());
        }
        let fence = if self.fenced {
            "AND status = 'IN_PROGRESS' AND lease_token = $2 AND generation < $3"
        } else {
            ""
        };
        let written = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE inference_jobs SET status = 'SUCCEEDED', output = $4, model_version = $5,
                 generation = $3, lease_token = $2, completed_at = clock_timestamp()
             WHERE idempotency_key = $1 {fence}"
        )))
        .bind(&key)
        .bind(&token)
        .bind(generation + 1)
        .bind(&answer.output)
        .bind(&answer.model_version)
        .execute(&self.infra.pg)
        .await?
        .rows_affected();
        self.log(
            &delivery,
            if written == 1 {
                Status::InferenceSucceeded
            } else {
                Status::LateWriteRejected
            },
        );
        if !self.at(Checkpoint::BeforeAck).await {
            return Ok(());
        }
        queue.ack(&delivery.entry_id).await?;
        let _: i64 = redis::Script::new(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
        )
        .key(self.keys.lease(&key))
        .arg(&token)
        .invoke_async(&mut redis)
        .await?;
        self.log(&delivery, Status::LeaseReleased);
        Ok(())
    }
}

impl WorkerUnderTest for TeamWorker {
    fn id(&self) -> &str {
        &self.id
    }

    fn model_version(&self) -> &str {
        &self.version
    }

    fn process(&self, delivery: Delivery) -> BoxFuture<'_, racecert::Result<()>> {
        Box::pin(async move {
            let result = self.run(delivery).await;
            // Tell the controller this delivery is over, whichever way it ended.
            let _ = self.checkpoints.reached(&self.id, Checkpoint::Done).await;
            result
        })
    }
}

#[derive(Debug)]
struct TeamFactory {
    fenced: bool,
}

impl WorkerFactory for TeamFactory {
    fn start<'a>(
        &'a self,
        ctx: WorkerContext<'a>,
    ) -> BoxFuture<'a, racecert::Result<Arc<dyn WorkerUnderTest>>> {
        Box::pin(async move {
            let backend = ctx
                .backends
                .get(&ctx.spec.version)
                .cloned()
                .ok_or_else(|| {
                    racecert::Error::Config(format!("no backend for {}", ctx.spec.version))
                })?;
            Ok(Arc::new(TeamWorker {
                id: ctx.spec.id.clone(),
                version: ctx.spec.version.clone(),
                backend,
                infra: ctx.infra,
                keys: ctx.keys,
                checkpoints: ctx.checkpoints,
                log: ctx.log,
                fenced: self.fenced,
                lease_ttl_ms: ctx.lease_ttl.as_millis() as u64,
                leases: AtomicU64::new(0),
            }) as Arc<dyn WorkerUnderTest>)
        })
    }
}

fn main() -> anyhow::Result<()> {
    let fenced = !std::env::args().any(|a| a == "--unfenced");
    let runtime = tokio::runtime::Runtime::new()?;
    let bed = runtime.block_on(TestBed::builder().start())?;
    let mut suite = racecert::suite::builtin()
        .into_iter()
        .find(|s| s.name == "lease-expiry")
        .expect("shipped suite");
    suite.settings.factory = Arc::new(TeamFactory { fenced });
    let seed = 11;
    let outcome = (|| -> anyhow::Result<bool> {
        let controller = runtime.block_on(Controller::new(&bed, suite.settings.clone()))?;
        let config = ExploreConfig {
            cases: 128,
            seed,
            ..ExploreConfig::default()
        };
        let report = runtime.block_on(explore(&controller, &suite.space, &config))?;
        match &report.found {
            None => {
                println!(
                    "TeamWorker passed suite {} ({} cases, {:.1?}); consumer group {CONSUMER_GROUP}",
                    suite.name, report.cases_run, report.elapsed
                );
                Ok(true)
            }
            Some(found) => {
                println!(
                    "{}",
                    racecert::report::counterexample_text(
                        found,
                        seed,
                        "cargo run --example custom_worker -- --unfenced"
                    )
                );
                Ok(false)
            }
        }
    })();
    runtime.block_on(bed.shutdown());
    if !outcome? {
        std::process::exit(1);
    }
    Ok(())
}
