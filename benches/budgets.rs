//! Budget benchmark: what a certification run's time buys. `cargo bench --bench budgets` (or
//! `-- floor throughput detection` for some sections). It prints numbers and asserts nothing:
//!
//! 1. `floor`: the round-trip floor, the cases per second of the smallest case there is (one
//!    request that one worker takes through its whole flow: submit, receive, lease, take, cache
//!    read, backend call, fenced write, ack, release, then the drain and the history read back).
//!    Every case makes at least these round trips, so no suite can beat it. What a case costs the
//!    services is counted where it is answered (Redis commands by name, Postgres transactions),
//!    harness and workers together.
//! 2. `throughput`: cases per second of every shipped suite as `explore` runs them (seed 0, the
//!    default concurrency), each suite's ratio to the floor, its CPU, and what the services
//!    answered a case.
//! 3. `detection`: per named defect, the cases and seconds an exploration of its suite needs to
//!    meet the first failing case (no shrinking), seeds 0..10.
//! 4. `default`: per named defect, whether its suite, explored as a default `certify` explores it
//!    (seeds 1..=10, shrinking on), catches it for the right reason. What "default" means is the
//!    side's: `RACECERT_BENCH_DEFAULT=cases:64` (a fixed case count, before budgets) or
//!    `budget:7.5` (seconds: the suite's share of the default 60 s budget of the 8 suites).
//!
//! It uses only library API that racecert had before time budgets (commit b64dc10), so the same
//! file measures both sides of BENCHMARKS.md's "Time budgets" section in one sitting
//! (`scripts/bench-budgets.sh` copies it into the before tree, without the global allocator where
//! that side's binary has none).

use racecert::contract::checkpoint::Checkpoint;
use racecert::contract::defect::{Defect, Defects};
use racecert::env::TestBed;
use racecert::runner::controlled::Controller;
use racecert::runner::explore::{ExploreConfig, explore};
use racecert::schedule::{RequestSpec, Schedule, Step};
use racecert::suite::{Suite, builtin};
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

/// The racecert binary's allocator (`src/main.rs`), so the bench measures what `certify` runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Cases of the floor measurement.
const FLOOR_CASES: usize = 200;
/// Cases per suite for throughput.
const THROUGHPUT_CASES: u32 = 300;
/// Seeds of the detection measurement.
const DETECTION_SEEDS: u64 = 10;
/// Cases an exploration may use to find a defect.
const DETECTION_CASES: u32 = 2000;

fn suite(name: &str) -> anyhow::Result<Suite> {
    builtin()
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| anyhow::anyhow!("no built-in suite {name}"))
}

/// The smallest case: one request, worker #0 takes it to done.
fn floor_schedule() -> Schedule {
    Schedule {
        requests: vec![RequestSpec {
            request_id: "req-0".into(),
            input: "input-0".into(),
        }],
        steps: vec![Step::Run {
            worker: 0,
            to: Checkpoint::Done,
        }],
    }
}

/// Cases per second of the floor schedule at `concurrency` cases in flight, and the mean latency
/// of one case.
fn floor_at(rt: &Runtime, bed: &TestBed, concurrency: usize) -> anyhow::Result<(f64, Duration)> {
    use futures::StreamExt;
    let suite = suite("lease-expiry")?;
    let controller = rt.block_on(Controller::new(bed, suite.settings.clone()))?;
    let schedule = floor_schedule();
    // Warm the pooled links first: a suite's first cases open them.
    for _ in 0..concurrency {
        rt.block_on(controller.run(&schedule))?;
    }
    let started = Instant::now();
    let latencies: Vec<anyhow::Result<Duration>> = rt.block_on(
        futures::stream::iter(0..FLOOR_CASES)
            .map(|_| async {
                let at = Instant::now();
                let result = controller.run(&schedule).await?;
                anyhow::ensure!(
                    result.violations.is_empty(),
                    "the floor case broke an invariant"
                );
                Ok(at.elapsed())
            })
            .buffer_unordered(concurrency)
            .collect(),
    );
    let elapsed = started.elapsed();
    let mut total = Duration::ZERO;
    for latency in latencies {
        total += latency?;
    }
    Ok((
        FLOOR_CASES as f64 / elapsed.as_secs_f64(),
        total / FLOOR_CASES as u32,
    ))
}

fn floor(rt: &Runtime, bed: &TestBed) -> anyhow::Result<f64> {
    let concurrency = ExploreConfig::default().concurrency;
    println!(
        "\n## 1. Round-trip floor: the smallest case ({FLOOR_CASES} runs; one request, one worker to done)"
    );
    let before = answered(rt, bed);
    let (one, latency) = floor_at(rt, bed, 1)?;
    let after = answered(rt, bed);
    println!(
        "floor x1: {one:.1} cases/s, mean {:.2} ms a case\n  {}",
        ms(latency),
        // The warm-up cases count too.
        answered_a_case(&before, &after, FLOOR_CASES + 1)
    );
    let (k, latency) = floor_at(rt, bed, concurrency)?;
    println!(
        "floor x{concurrency} (default): {k:.1} cases/s, mean {:.2} ms a case",
        ms(latency)
    );
    Ok(k)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// CPU time this process used so far (user + system, from /proc: 100 ticks a second).
fn cpu_self() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command's closing parenthesis: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let fields: Vec<u64> = rest
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let ticks = fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// CPU time each running container used so far, by name (cgroup v1 `cpuacct.usage`, or v2
/// `cpu.stat`); empty where neither is readable.
fn cpu_containers() -> Vec<(String, Duration)> {
    let Ok(out) = std::process::Command::new("docker")
        .args([
            "ps",
            "--no-trunc",
            "--format",
            "{{.ID}} {{.Label \"racecert.service\"}}",
        ])
        .output()
    else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let (id, name) = line.split_once(' ')?;
            let v1 = format!("/sys/fs/cgroup/cpuacct/docker/{id}/cpuacct.usage");
            let v2 = format!("/sys/fs/cgroup/system.slice/docker-{id}.scope/cpu.stat");
            let nanos = match std::fs::read_to_string(v1) {
                Ok(text) => text.trim().parse::<u64>().ok()?,
                Err(_) => {
                    let text = std::fs::read_to_string(v2).ok()?;
                    let usec = text
                        .lines()
                        .find_map(|l| l.strip_prefix("usage_usec "))?
                        .trim()
                        .parse::<u64>()
                        .ok()?;
                    usec * 1000
                }
            };
            Some((name.to_owned(), Duration::from_nanos(nanos)))
        })
        .collect()
}

/// Postgres sessions (connections) opened so far in the bed's database.
fn pg_sessions(rt: &Runtime, bed: &TestBed) -> i64 {
    rt.block_on(async {
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&bed.database_url())
            .await
            .ok()?;
        sqlx::query_scalar::<_, i64>(
            "SELECT sessions FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(&mut conn)
        .await
        .ok()
    })
    .unwrap_or(-1)
}

/// What the services have answered so far: Redis commands by name (`INFO commandstats`) and
/// Postgres transactions (each statement a worker or the harness sends outside a transaction is
/// one), both read directly, not through the proxy.
#[derive(Debug, Default, Clone)]
struct Answered {
    redis: std::collections::BTreeMap<String, u64>,
    pg_xacts: i64,
}

fn answered(rt: &Runtime, bed: &TestBed) -> Answered {
    rt.block_on(async {
        let mut out = Answered::default();
        if let Ok(client) = redis::Client::open(bed.redis_direct_url())
            && let Ok(mut conn) = client.get_multiplexed_async_connection().await
            && let Ok(info) = redis::cmd("INFO")
                .arg("commandstats")
                .query_async::<String>(&mut conn)
                .await
        {
            // cmdstat_get:calls=12,usec=...
            for line in info.lines() {
                let Some((name, rest)) = line.strip_prefix("cmdstat_").and_then(|l| l.split_once(':')) else {
                    continue;
                };
                let calls = rest
                    .split(',')
                    .find_map(|f| f.strip_prefix("calls="))
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(0);
                out.redis.insert(name.to_owned(), calls);
            }
        }
        if let Ok(mut conn) =
            <sqlx::PgConnection as sqlx::Connection>::connect(&bed.database_direct_url()).await
        {
            out.pg_xacts = sqlx::query_scalar::<_, i64>(
                "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()",
            )
            .fetch_one(&mut conn)
            .await
            .unwrap_or(-1);
        }
        out
    })
}

/// What the services answered a case between two readings of [`answered`]: Redis commands by
/// name (a script's or a pipeline's count each, so commands are not round trips) and Postgres
/// transactions (autovacuum's included, so roughly).
fn answered_a_case(before: &Answered, after: &Answered, cases: usize) -> String {
    let per = |n: u64| n as f64 / cases.max(1) as f64;
    // A Redis process restart (the redis-restart suite's first case) starts its counters anew.
    let restarted = before
        .redis
        .iter()
        .any(|(name, calls)| after.redis.get(name).is_none_or(|now| now < calls));
    let postgres = format!(
        "postgres transactions {:.1}",
        // The reading itself is one transaction.
        (after.pg_xacts - before.pg_xacts - 1) as f64 / cases.max(1) as f64
    );
    if restarted {
        return format!(
            "answered a case: redis commands not counted (the server restarted in between); {postgres}"
        );
    }
    let mut by_name: Vec<(String, u64)> = after
        .redis
        .iter()
        .map(|(name, calls)| {
            (
                name.clone(),
                calls.saturating_sub(before.redis.get(name).copied().unwrap_or(0)),
            )
        })
        .filter(|(name, calls)| *calls > 0 && name != "info")
        .collect();
    by_name.sort_by_key(|(_, calls)| std::cmp::Reverse(*calls));
    let total: u64 = by_name.iter().map(|(_, c)| c).sum();
    let named: Vec<String> = by_name
        .iter()
        .map(|(name, calls)| format!("{name} {:.2}", per(*calls)))
        .collect();
    format!(
        "answered a case: redis commands {:.1} ({}); {postgres}",
        per(total),
        named.join(", "),
    )
}

/// Where one suite's cases spent CPU: this process, each container, and Postgres sessions.
fn costs(
    cases: u32,
    self_before: Duration,
    containers_before: &[(String, Duration)],
    sessions_before: i64,
    rt: &Runtime,
    bed: &TestBed,
) -> String {
    let per_case = |d: Duration| d.as_secs_f64() * 1e3 / f64::from(cases.max(1));
    let mut parts = vec![format!(
        "racecert {:.1}",
        per_case(cpu_self().saturating_sub(self_before))
    )];
    for (name, now) in cpu_containers() {
        if let Some((_, before)) = containers_before.iter().find(|(n, _)| *n == name) {
            parts.push(format!(
                "{name} {:.1}",
                per_case(now.saturating_sub(*before))
            ));
        }
    }
    let sessions = pg_sessions(rt, bed) - sessions_before - 1;
    format!(
        "CPU ms a case: {}; postgres sessions a case {:.2}",
        parts.join(", "),
        sessions as f64 / f64::from(cases.max(1))
    )
}

fn throughput(rt: &Runtime, bed: &TestBed, floor: Option<f64>) -> anyhow::Result<()> {
    // RACECERT_BENCH_CONCURRENCY and RACECERT_BENCH_SUITES (comma-separated names) narrow the
    // section for an investigation; by default every suite at the default concurrency.
    let concurrency = std::env::var("RACECERT_BENCH_CONCURRENCY")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(ExploreConfig::default().concurrency);
    let only: Option<Vec<String>> = std::env::var("RACECERT_BENCH_SUITES")
        .ok()
        .map(|s| s.split(',').map(|n| n.trim().to_owned()).collect());
    println!(
        "\n## 2. Cases per second through `explore` ({THROUGHPUT_CASES} cases, seed 0, x{concurrency}); ratio = suite / floor; CPU per case by process"
    );
    println!(
        "{:<24} {:>9} {:>7} {:>8} {:>7}",
        "suite", "cases/s", "cases", "seconds", "ratio"
    );
    let mut names: Vec<String> = builtin()
        .into_iter()
        .map(|s| s.name)
        .filter(|n| only.as_ref().is_none_or(|o| o.contains(n)))
        .collect();
    names.sort();
    for name in names {
        let suite = suite(&name)?;
        let controller = rt.block_on(Controller::new(bed, suite.settings.clone()))?;
        let config = ExploreConfig {
            cases: THROUGHPUT_CASES,
            seed: 0,
            concurrency,
            ..ExploreConfig::default()
        };
        let answered_before = answered(rt, bed);
        let (self_before, containers_before, sessions_before) =
            (cpu_self(), cpu_containers(), pg_sessions(rt, bed));
        let report = rt.block_on(explore(&controller, &suite.space, &config))?;
        let spent = costs(
            report.cases_run,
            self_before,
            &containers_before,
            sessions_before,
            rt,
            bed,
        );
        let trips = answered_a_case(
            &answered_before,
            &answered(rt, bed),
            report.cases_run as usize,
        );
        let secs = report.elapsed.as_secs_f64();
        let rate = f64::from(report.cases_run) / secs;
        let ratio = floor.map_or("-".to_owned(), |f| format!("{:.2}", rate / f));
        let verdict = if report.found.is_some() {
            "  UNEXPECTED failure"
        } else {
            ""
        };
        println!(
            "{name:<24} {rate:>9.1} {:>7} {secs:>8.2} {ratio:>7}{verdict}\n{:<24} {spent}\n{:<24} {trips}",
            report.cases_run, "", ""
        );
    }
    Ok(())
}

fn detection(rt: &Runtime, bed: &TestBed) -> anyhow::Result<()> {
    println!(
        "\n## 3. Cases to the first failing case per defect (seeds 0..{DETECTION_SEEDS}, <= {DETECTION_CASES} cases, no shrinking)"
    );
    println!(
        "{:<28} {:<24} {:>8} {:>10} {:>9} {:>8} {:>7}",
        "defect", "suite", "detected", "mean cases", "max cases", "mean s", "max s"
    );
    for defect in Defect::ALL {
        let name = racecert::suite::catching(defect).suite;
        let suite = suite(name)?.with_defects(Defects::of([defect]));
        let controller = rt.block_on(Controller::new(bed, suite.settings.clone()))?;
        let mut found = Vec::new();
        for seed in 0..DETECTION_SEEDS {
            let config = ExploreConfig {
                cases: DETECTION_CASES,
                seed,
                max_shrink_iters: 0,
                ..ExploreConfig::default()
            };
            match rt.block_on(explore(&controller, &suite.space, &config)) {
                Ok(report) => found.push(report.found.map(|c| c.found_after)),
                Err(err) => {
                    println!("  {} seed {seed}: harness error: {err}", defect.name());
                    found.push(None);
                }
            }
        }
        let hits: Vec<(u32, Duration)> = found.iter().flatten().copied().collect();
        let n = hits.len().max(1) as f64;
        let mean_cases = hits.iter().map(|(c, _)| f64::from(*c)).sum::<f64>() / n;
        let max_cases = hits.iter().map(|(c, _)| *c).max().unwrap_or(0);
        let mean_s = hits.iter().map(|(_, t)| t.as_secs_f64()).sum::<f64>() / n;
        let max_s = hits
            .iter()
            .map(|(_, t)| t.as_secs_f64())
            .fold(0.0, f64::max);
        println!(
            "{:<28} {name:<24} {:>5}/{DETECTION_SEEDS} {mean_cases:>10.1} {max_cases:>9} {mean_s:>8.2} {max_s:>7.2}",
            defect.name(),
            hits.len()
        );
        let per_seed: Vec<String> = found
            .iter()
            .map(|f| f.map_or("-".to_owned(), |(c, _)| c.to_string()))
            .collect();
        println!("    cases per seed: {}", per_seed.join(" "));
    }
    Ok(())
}

/// How a default `certify` explores a suite on this side (see the module docs).
fn default_run() -> anyhow::Result<(u32, Option<Duration>)> {
    let spec = std::env::var("RACECERT_BENCH_DEFAULT").unwrap_or_else(|_| "budget:7.5".into());
    match spec.split_once(':') {
        Some(("cases", n)) => Ok((n.parse()?, None)),
        Some(("budget", secs)) => Ok((u32::MAX, Some(Duration::from_secs_f64(secs.parse()?)))),
        _ => anyhow::bail!("RACECERT_BENCH_DEFAULT={spec:?}: expected cases:N or budget:SECONDS"),
    }
}

fn default_certify(rt: &Runtime, bed: &TestBed) -> anyhow::Result<()> {
    let (cases, budget) = default_run()?;
    println!(
        "\n## 4. Default certification per defect (seeds 1..={DETECTION_SEEDS}; cases {}, budget {:?}; shrinking on)",
        if cases == u32::MAX {
            "unbounded".to_owned()
        } else {
            cases.to_string()
        },
        budget
    );
    println!(
        "{:<28} {:<24} {:>8} {:>10} {:>9} {:>10}",
        "defect", "suite", "caught", "mean cases", "max cases", "mean s"
    );
    for defect in Defect::ALL {
        let catching = racecert::suite::catching(defect);
        let suite = suite(catching.suite)?.with_defects(Defects::of([defect]));
        let controller = rt.block_on(Controller::new(bed, suite.settings.clone()))?;
        let mut caught = Vec::new();
        let mut notes = Vec::new();
        for seed in 1..=DETECTION_SEEDS {
            let config = ExploreConfig {
                cases,
                seed,
                time_budget: budget,
                ..ExploreConfig::default()
            };
            let started = Instant::now();
            match rt.block_on(explore(&controller, &suite.space, &config)) {
                Ok(report) => match report.found {
                    Some(found) => {
                        let broken = found
                            .shrunk
                            .case
                            .violations
                            .iter()
                            .map(|v| v.invariant)
                            .collect();
                        let missing = catching.missing(&broken);
                        if missing.is_empty() {
                            caught.push((found.found_after.0, started.elapsed()));
                        } else {
                            notes.push(format!("seed {seed}: caught for another reason"));
                        }
                    }
                    None => notes.push(format!(
                        "seed {seed}: not caught in {} cases",
                        report.cases_run
                    )),
                },
                Err(err) => notes.push(format!("seed {seed}: harness error: {err}")),
            }
        }
        let n = caught.len().max(1) as f64;
        println!(
            "{:<28} {:<24} {:>5}/{DETECTION_SEEDS} {:>10.1} {:>9} {:>10.2}",
            defect.name(),
            catching.suite,
            caught.len(),
            caught.iter().map(|(c, _)| f64::from(*c)).sum::<f64>() / n,
            caught.iter().map(|(c, _)| *c).max().unwrap_or(0),
            caught.iter().map(|(_, t)| t.as_secs_f64()).sum::<f64>() / n,
        );
        for note in notes {
            println!("    {note}");
        }
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let wanted = |section: &str| args.is_empty() || args.iter().any(|a| a == section);
    println!("racecert budgets benchmark (numbers only, no assertions)");
    let started = Instant::now();
    // RACECERT_BENCH_WORKER_THREADS: the runtime's worker threads (tokio's default: one a core),
    // to see whether cross-thread wake-ups cost the cases anything.
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = std::env::var("RACECERT_BENCH_WORKER_THREADS")
        .ok()
        .and_then(|n| n.parse().ok())
    {
        builder.worker_threads(n);
    }
    let rt = builder.enable_all().build()?;
    let bed = rt.block_on(TestBed::builder().start())?;
    println!("test bed up in {:.2?}", bed.startup_time());
    let outcome = (|| -> anyhow::Result<()> {
        let floor = if wanted("floor") || wanted("throughput") {
            Some(floor(&rt, &bed)?)
        } else {
            None
        };
        if wanted("throughput") {
            throughput(&rt, &bed, floor)?;
        }
        if wanted("detection") {
            detection(&rt, &bed)?;
        }
        if wanted("default") {
            default_certify(&rt, &bed)?;
        }
        Ok(())
    })();
    rt.block_on(bed.shutdown());
    outcome?;
    println!("\ntotal {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}
