//! Foundation benchmark: prints image build time, test-bed start time with images present, the
//! round trip of a Redis GET and a Postgres UPDATE, direct vs through the fault proxy, and how
//! long the `redis-restart` fault takes.
//!
//! `cargo bench --bench foundation` (images already present: the build is measured with the base
//! image cached), `cargo bench --bench foundation -- --cold` to delete every racecert image
//! first and measure a first build from nothing (debootstrap included), or
//! `cargo bench --bench foundation -- --skip-build` to leave the images alone (they are shared
//! with whoever else uses this engine) and measure the bed only. Numbers, not assertions:
//! results go to BENCHMARKS.md by hand, with this command.

use racecert::env::images::{self, BOOTSTRAP_BASE, ImageConfig, Service};
use racecert::env::{Target, TestBed};
use sqlx::Connection;
use std::time::{Duration, Instant};

const BED_STARTS: usize = 5;
const REDIS_OPS: usize = 5_000;
const PG_OPS: usize = 2_000;
const WARMUP: usize = 200;
const RESTARTS: usize = 10;

struct Stats {
    mean: Duration,
    p50: Duration,
    p99: Duration,
}

fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    Stats {
        mean,
        p50: at(0.50),
        p99: at(0.99),
    }
}

fn us(d: Duration) -> String {
    format!("{:.0} us", d.as_secs_f64() * 1e6)
}

async fn redis_gets(url: &str) -> anyhow::Result<Stats> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let _: () = redis::cmd("SET")
        .arg("bench:key")
        .arg("value")
        .query_async(&mut conn)
        .await?;
    let mut samples = Vec::with_capacity(REDIS_OPS);
    for i in 0..WARMUP + REDIS_OPS {
        let started = Instant::now();
        let _: String = redis::cmd("GET")
            .arg("bench:key")
            .query_async(&mut conn)
            .await?;
        if i >= WARMUP {
            samples.push(started.elapsed());
        }
    }
    Ok(stats(samples))
}

async fn pg_updates(url: &str) -> anyhow::Result<Stats> {
    let mut conn = sqlx::PgConnection::connect(url).await?;
    sqlx::query(
        "INSERT INTO inference_jobs (idempotency_key, request_id, job_id) VALUES ('bench:key', 'r', 'j')
         ON CONFLICT DO NOTHING",
    )
    .execute(&mut conn)
    .await?;
    let mut samples = Vec::with_capacity(PG_OPS);
    for i in 0..WARMUP + PG_OPS {
        let started = Instant::now();
        sqlx::query("UPDATE inference_jobs SET attempt = $2 WHERE idempotency_key = $1")
            .bind("bench:key")
            .bind(i as i32)
            .execute(&mut conn)
            .await?;
        if i >= WARMUP {
            samples.push(started.elapsed());
        }
    }
    Ok(stats(samples))
}

struct Restarts {
    mean: Duration,
    p50: Duration,
    max: Duration,
}

/// Times the `redis-restart` fault as a case sees it: from the call until it returns (the bed
/// waits until Redis answers through its proxy), with a key written before each restart that
/// must be gone after it, so a restart that loses nothing is not mistaken for a fast one.
async fn redis_restarts(bed: &TestBed) -> anyhow::Result<Restarts> {
    let client = redis::Client::open(bed.redis_url())?;
    let mut samples = Vec::with_capacity(RESTARTS);
    for _ in 0..RESTARTS {
        let mut conn = client.get_multiplexed_async_connection().await?;
        let _: () = redis::cmd("SET")
            .arg("bench:lease")
            .arg("token")
            .query_async(&mut conn)
            .await?;
        let took = bed.restart(Target::Redis).await?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        let survived: bool = redis::cmd("EXISTS")
            .arg("bench:lease")
            .query_async(&mut conn)
            .await?;
        anyhow::ensure!(!survived, "a key survived the Redis restart");
        samples.push(took);
    }
    let max = samples.iter().max().copied().unwrap_or_default();
    let s = stats(samples);
    Ok(Restarts {
        mean: s.mean,
        p50: s.p50,
        max,
    })
}

fn compare(what: &str, direct: &Stats, proxied: &Stats) {
    let overhead = |d: Duration, p: Duration| (p.as_secs_f64() / d.as_secs_f64() - 1.0) * 100.0;
    println!(
        "{what:<22} direct  mean {:>7} p50 {:>7} p99 {:>7}",
        us(direct.mean),
        us(direct.p50),
        us(direct.p99)
    );
    println!(
        "{what:<22} proxied mean {:>7} p50 {:>7} p99 {:>7}   proxy adds {:+.0}% (mean), {:+.0}% (p50)",
        us(proxied.mean),
        us(proxied.p50),
        us(proxied.p99),
        overhead(direct.mean, proxied.mean),
        overhead(direct.p50, proxied.p50)
    );
}

fn main() -> anyhow::Result<()> {
    let cold = std::env::args().any(|a| a == "--cold");
    let skip_build = std::env::args().any(|a| a == "--skip-build");
    let config = ImageConfig::from_env()?;
    println!("racecert foundation benchmark (2-core machine; single client, sequential)");

    if cold {
        for service in Service::ALL {
            let _ = std::process::Command::new("docker")
                .args(["rmi", "-f", &config.get(service).to_string()])
                .output();
        }
        let _ = std::process::Command::new("docker")
            .args(["rmi", "-f", BOOTSTRAP_BASE])
            .output();
    }
    if !skip_build {
        let started = Instant::now();
        let outcomes = images::ensure_images(&config, &Service::ALL, !cold)?;
        println!(
            "image build ({}): {:.1?} total",
            if cold {
                "cold: debootstrap + all images"
            } else {
                "rebuild, base cached"
            },
            started.elapsed()
        );
        for outcome in &outcomes {
            println!(
                "  {:<10} {:<36} {:.1?}",
                outcome.service.name(),
                outcome.action,
                outcome.elapsed
            );
        }
    }

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut starts = Vec::new();
        for _ in 0..BED_STARTS {
            let bed = TestBed::builder().start().await?;
            starts.push(bed.startup_time());
            bed.shutdown().await;
        }
        let s = stats(starts.clone());
        println!(
            "test-bed start, images present ({BED_STARTS} runs): mean {:.2?} p50 {:.2?} max {:.2?}",
            s.mean,
            s.p50,
            starts.iter().max().copied().unwrap_or_default()
        );

        let bed = TestBed::builder().start().await?;
        println!(
            "services ({} network): redis {} postgres {}",
            bed.network()
                .map(|network| network.to_string())
                .unwrap_or_else(|| "external".to_owned()),
            bed.redis_direct_url(),
            bed.database_direct_url()
        );
        let direct = redis_gets(&bed.redis_direct_url()).await?;
        let proxied = redis_gets(&bed.redis_url()).await?;
        compare(&format!("redis GET x{REDIS_OPS}"), &direct, &proxied);
        let direct = pg_updates(&bed.database_direct_url()).await?;
        let proxied = pg_updates(&bed.database_url()).await?;
        compare(&format!("postgres UPDATE x{PG_OPS}"), &direct, &proxied);
        let restarts = redis_restarts(&bed).await?;
        println!(
            "redis restart x{RESTARTS}      mean {:.1?} p50 {:.1?} max {:.1?} (fault call, ready through the proxy)",
            restarts.mean,
            restarts.p50,
            restarts.max
        );
        bed.shutdown().await;
        anyhow::Ok(())
    })?;
    Ok(())
}
