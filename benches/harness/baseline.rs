//! Section 3 of the harness benchmark: a free-running stress test with random sleeps, "of the
//! kind teams write by hand", given the wall-clock budget exploration needed per defect.
//!
//! The random sleeps of the baseline are the point of the baseline (that is how such tests find
//! races, when they do); nothing else here sleeps to synchronise.

use super::{DETECTION_SEEDS, Detection, MIN_BUDGET, invariant_names, is_cache_defect};
use racecert::check::{Invariant, Violation, check};
use racecert::contract::checkpoint::Checkpoints;
use racecert::contract::defect::{Defect, Defects};
use racecert::contract::log::LogSink;
use racecert::contract::log::Status;
use racecert::env::TestBed;
use racecert::history::{Event, EventKind, History, SubmittedRequest, read_jobs, read_rows};
use racecert::reference::Pipeline;
use racecert::reference::queue::Queue;
use racecert::reference::submit::InferenceRequest;
use racecert::reference::worker::Worker;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;
use tokio::task::JoinSet;

/// Seeds of the baseline.
const BASELINE_SEEDS: u64 = 3;
/// Budget of the baseline's calibration on the correct worker.
const CALIBRATION_BUDGET: Duration = Duration::from_secs(5);
/// A longer budget for defects the baseline missed on every seed, to tell "too little time" from
/// "cannot reach the race".
const EXTENDED_BUDGET: Duration = Duration::from_secs(15);
const EXTENDED_SEED: u64 = 100;

/// Baseline: concurrent submissions of one request.
const IDENTICAL_REQUESTS: usize = 4;
/// Baseline (cache defects): other request ids with the same input, spread over a round.
const SAME_INPUT_REQUESTS: usize = 6;
/// Baseline (cache defects): the window in which submissions and the cutover happen.
const CACHE_ROUND_WINDOW: Duration = Duration::from_millis(600);
/// Baseline: longest random sleep between two polls of a worker.
const MAX_POLL_PAUSE_MS: u64 = 40;
/// Baseline: how long a round may wait for its jobs to end terminal and its deliveries to be
/// acknowledged (a declined delivery comes back after the 1.5 s visibility timeout).
const SETTLE_CAP: Duration = Duration::from_secs(3);
const BASE_VISIBILITY: Duration = Duration::from_millis(1500);
const BASE_BACKEND_TIMEOUT: Duration = Duration::from_secs(1);
const BASE_LEASE: Duration = Duration::from_secs(2);
const BASE_WORKERS: [(&str, &str); 4] = [
    ("worker-a", "v1"),
    ("worker-b", "v1"),
    ("worker-c", "v2"),
    ("worker-d", "v2"),
];

/// What one baseline round saw.
struct Round {
    violations: Vec<Violation>,
    /// Deliveries handed out again after the visibility timeout (`retry_dispatched`): the only
    /// way a free-running round can overlap two attempts of one job.
    redeliveries: usize,
    /// Whether every job ended terminal with every delivery acknowledged before the cap.
    settled: bool,
    /// What was left when a round did not settle.
    unsettled: Option<String>,
    worker_errors: usize,
}

/// Something the coordinator of a round does at an offset from the round's start.
enum Action {
    Submit(String),
    Cutover,
    Invalidate,
}

async fn baseline_round(
    bed: &TestBed,
    defects: &Defects,
    cache_traffic: bool,
    namespace: &str,
    seed: u64,
) -> anyhow::Result<Round> {
    let mut rng = StdRng::seed_from_u64(seed);
    let pipeline = Pipeline::on(bed, namespace, LogSink::default()).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = spawn_workers(&pipeline, defects, seed, &stop).await?;
    let plan = coordinator_plan(&mut rng, cache_traffic);
    let requests = submit_round(&pipeline, defects, plan).await?;

    // End of the round: every job terminal and every delivery acknowledged, or the cap.
    let prefix = pipeline.keys.prefix().to_owned();
    let mut queue = Queue::open(pipeline.infra.redis.clone(), &pipeline.keys).await?;
    let settled = settle(&pipeline, &prefix, &requests, &mut queue).await?;
    stop.store(true, Ordering::SeqCst);
    let mut worker_errors = 0;
    while let Some(joined) = workers.join_next().await {
        worker_errors += joined?;
    }

    let history = round_history(bed, &pipeline, &prefix, requests).await?;
    let violations = check(&history, &Invariant::ALL);
    let redeliveries = history.with_status(Status::RetryDispatched).count();
    // A round that did not settle: say what was left, so a missed cap is told from a stuck job.
    let unsettled = if settled {
        None
    } else {
        let pending = queue.pending_count().await?;
        Some(unsettled_summary(&history, namespace, pending))
    };
    pipeline.infra.pg.close().await;
    Ok(Round {
        violations,
        redeliveries,
        settled,
        unsettled,
        worker_errors,
    })
}

/// Starts the round's free-running workers (mixed versions, seeded random sleeps between polls)
/// until `stop`; each task ends with its count of failed polls.
async fn spawn_workers(
    pipeline: &Pipeline,
    defects: &Defects,
    seed: u64,
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<JoinSet<usize>> {
    let mut workers = JoinSet::new();
    for (i, (id, version)) in BASE_WORKERS.iter().enumerate() {
        let config = pipeline
            .worker_config(id, version)
            .backend_timeout(BASE_BACKEND_TIMEOUT)
            .upstream_warn_after(BASE_BACKEND_TIMEOUT / 2)
            .visibility_timeout(BASE_VISIBILITY)
            .lease_ttl(BASE_LEASE)
            .defects(defects.clone())
            .seed(seed)
            .build()?;
        let worker: Worker = pipeline.worker(config, Checkpoints::free()).await?;
        let stop = stop.clone();
        let mut pauses = StdRng::seed_from_u64(seed.wrapping_mul(31).wrapping_add(i as u64 + 1));
        workers.spawn(async move {
            let mut errors = 0usize;
            while !stop.load(Ordering::SeqCst) {
                if worker.poll_once().await.is_err() {
                    errors += 1;
                }
                let pause = pauses.random_range(0..=MAX_POLL_PAUSE_MS);
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
            errors
        });
    }
    Ok(workers)
}

/// The coordinator's plan beyond the identical submissions at the start, in time order.
fn coordinator_plan(rng: &mut StdRng, cache_traffic: bool) -> Vec<(Duration, Action)> {
    // The coordinator's plan: N identical submissions at once, and for the cache defects the
    // same input under other request ids at random times, a cutover half way and the (late)
    // invalidation of the old cache entries a little after it.
    let mut plan: Vec<(Duration, Action)> = Vec::new();
    if cache_traffic {
        for r in 1..=SAME_INPUT_REQUESTS {
            let at = rng.random_range(0..CACHE_ROUND_WINDOW.as_millis() as u64);
            plan.push((
                Duration::from_millis(at),
                Action::Submit(format!("req-{r}")),
            ));
        }
        let half = CACHE_ROUND_WINDOW / 2;
        plan.push((half, Action::Cutover));
        let lag = rng.random_range(0..=CACHE_ROUND_WINDOW.as_millis() as u64 / 4);
        plan.push((half + Duration::from_millis(lag), Action::Invalidate));
    }
    plan.sort_by_key(|(at, _)| *at);
    plan
}

/// Submits the identical requests at once, carries out the plan on time, and returns the requests
/// the API took (one per idempotency key).
async fn submit_round(
    pipeline: &Pipeline,
    defects: &Defects,
    plan: Vec<(Duration, Action)>,
) -> anyhow::Result<Vec<SubmittedRequest>> {
    let started = tokio::time::Instant::now();
    let mut submissions = JoinSet::new();
    for _ in 0..IDENTICAL_REQUESTS {
        let mut api = pipeline.api.clone();
        submissions.spawn(async move {
            api.submit(&InferenceRequest {
                request_id: "req-0".into(),
                input: "input-0".into(),
            })
            .await
            .map(|s| ("req-0".to_string(), s.idempotency_key))
        });
    }
    let mut cutover = None;
    for (at, action) in plan {
        tokio::time::sleep_until(started + at).await;
        match action {
            Action::Submit(request_id) => {
                let mut api = pipeline.api.clone();
                submissions.spawn(async move {
                    api.submit(&InferenceRequest {
                        request_id: request_id.clone(),
                        input: "input-0".into(),
                    })
                    .await
                    .map(|s| (request_id, s.idempotency_key))
                });
            }
            Action::Cutover => cutover = Some(pipeline.cutover("v2", defects).await?),
            Action::Invalidate => {
                if let Some(cutover) = cutover.as_mut() {
                    pipeline.invalidate(cutover).await?;
                }
            }
        }
    }
    let mut requests: Vec<SubmittedRequest> = Vec::new();
    while let Some(joined) = submissions.join_next().await {
        let (request_id, idempotency_key) = joined??;
        if !requests
            .iter()
            .any(|r| r.idempotency_key == idempotency_key)
        {
            // Every request of the baseline has the same input.
            requests.push(SubmittedRequest {
                request_id,
                idempotency_key,
                input: "input-0".into(),
            });
        }
    }
    Ok(requests)
}

/// Waits (up to [`SETTLE_CAP`]) for every request's job to end terminal and every delivery to be
/// acknowledged; whether they did.
async fn settle(
    pipeline: &Pipeline,
    prefix: &str,
    requests: &[SubmittedRequest],
    queue: &mut Queue,
) -> anyhow::Result<bool> {
    let settle_deadline = tokio::time::Instant::now() + SETTLE_CAP;
    while tokio::time::Instant::now() < settle_deadline {
        let jobs = read_jobs(&pipeline.infra.pg, prefix).await?;
        let terminal = requests.iter().all(|r| {
            jobs.iter().any(|j| {
                j.idempotency_key == r.idempotency_key
                    && matches!(j.status.as_str(), "SUCCEEDED" | "FAILED" | "CANCELLED")
            })
        });
        if terminal && queue.pending_count().await? == 0 {
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(false)
}

/// The round's history as the checks read it: the workers' log lines, the backends' journals,
/// the audit trail and job rows.
async fn round_history(
    bed: &TestBed,
    pipeline: &Pipeline,
    prefix: &str,
    requests: Vec<SubmittedRequest>,
) -> anyhow::Result<History> {
    let events = pipeline
        .log
        .lines()
        .into_iter()
        .map(|line| Event {
            step: 0,
            at_ms: 0,
            kind: EventKind::Worker(line),
        })
        .collect();
    let mut journal = Vec::new();
    for version in bed.versions() {
        journal.extend(bed.backend(version)?.journal(Some(prefix)).await);
    }
    let (audit, jobs) = read_rows(&pipeline.infra.pg, prefix).await?;
    Ok(History {
        events,
        audit,
        journal,
        jobs,
        requests,
        lease_ttl_ms: Some(BASE_LEASE.as_millis() as u64),
        namespace: Some(prefix.to_owned()),
        wire_recorded: false,
        layout: racecert::contract::layout::KeyLayout::contract(prefix),
        ..History::default()
    })
}

/// What a round that did not settle left: its unacknowledged deliveries, and each job not
/// terminal with the trail of worker statuses on it.
fn unsettled_summary(history: &History, namespace: &str, pending: u64) -> String {
    let stuck: Vec<String> = history
        .jobs
        .iter()
        .filter(|j| !matches!(j.status.as_str(), "SUCCEEDED" | "FAILED" | "CANCELLED"))
        .map(|j| {
            let trail: Vec<String> = history
                .events
                .iter()
                .filter_map(|e| e.line())
                .filter(|line| line.get("idempotency_key") == Some(j.idempotency_key.as_str()))
                .map(|line| {
                    format!(
                        "{}:{}",
                        line.get("worker_id").unwrap_or("-"),
                        line.status().unwrap_or("-")
                    )
                })
                .collect();
            format!("{} {} [{}]", j.request_id, j.status, trail.join(" "))
        })
        .collect();
    format!(
        "{namespace}: {pending} deliveries unacknowledged; not terminal: {}",
        if stuck.is_empty() {
            "none".to_string()
        } else {
            stuck.join("; ")
        }
    )
}

/// One seed of the baseline: rounds until a violation or the budget is spent (a round started
/// within the budget runs to its end).
struct BaselineRun {
    rounds: u32,
    /// (round, seconds) of the first round with a violation.
    found: Option<(u32, f64)>,
    invariants: String,
    elapsed: f64,
    unsettled: u32,
    unsettled_details: Vec<String>,
    worker_errors: usize,
    redeliveries: usize,
    errors: Vec<String>,
}

fn baseline_seed(
    rt: &Runtime,
    bed: &TestBed,
    label: &str,
    defects: &Defects,
    cache_traffic: bool,
    seed: u64,
    budget: Duration,
) -> anyhow::Result<BaselineRun> {
    let started = Instant::now();
    let mut run = BaselineRun {
        rounds: 0,
        found: None,
        invariants: String::new(),
        elapsed: 0.0,
        unsettled: 0,
        unsettled_details: Vec::new(),
        worker_errors: 0,
        redeliveries: 0,
        errors: Vec::new(),
    };
    while started.elapsed() < budget {
        let round = run.rounds;
        let namespace = format!("{label}-base{seed}r{round}");
        let round_seed = seed.wrapping_mul(1_000_003).wrapping_add(u64::from(round));
        let result = rt.block_on(baseline_round(
            bed,
            defects,
            cache_traffic,
            &namespace,
            round_seed,
        ));
        run.rounds += 1;
        let result = match result {
            Ok(result) => result,
            // A round the harness could not run is not a finding: count it and go on.
            Err(err) => {
                run.errors.push(format!("round {round}: {err}"));
                continue;
            }
        };
        run.unsettled += u32::from(!result.settled);
        run.unsettled_details.extend(result.unsettled.clone());
        run.worker_errors += result.worker_errors;
        run.redeliveries += result.redeliveries;
        if !result.violations.is_empty() {
            run.found = Some((run.rounds, started.elapsed().as_secs_f64()));
            run.invariants = invariant_names(&result.violations);
            break;
        }
    }
    run.elapsed = started.elapsed().as_secs_f64();
    Ok(run)
}

pub(super) fn baseline(
    rt: &Runtime,
    bed: &TestBed,
    detections: &[Detection],
) -> anyhow::Result<()> {
    println!(
        "\n## 3. Baseline stress test: {} workers (2 on v1, 2 on v2, free running, sleeps 0-{MAX_POLL_PAUSE_MS} ms between polls),",
        BASE_WORKERS.len()
    );
    println!(
        "##    {IDENTICAL_REQUESTS} concurrent identical requests per round (+{SAME_INPUT_REQUESTS} same-input requests and a cutover to v2 half way for the cache defects),"
    );
    println!(
        "##    visibility {BASE_VISIBILITY:?}, backend timeout {BASE_BACKEND_TIMEOUT:?}, lease {BASE_LEASE:?}; invariants checked at the end of each round; seeds 0..{BASELINE_SEEDS}"
    );
    println!(
        "##    budget per seed = racecert's mean detection time, at least {MIN_BUDGET:?}; a round started within the budget runs to its end"
    );
    calibrate(rt, bed)?;

    println!(
        "{:<24} {:>7}  {:<58} {:>9} {:>9} {:>9}",
        "defect",
        "budget",
        "baseline per seed (yes/late: round/seconds)",
        "in budget",
        "+overrun",
        "racecert"
    );
    let mut never = Vec::new();
    for d in detections {
        if !baseline_row(rt, bed, d)? {
            never.push(d.defect);
        }
    }
    extended_baseline(rt, bed, never)
}

/// Calibration: the correct worker must not trip the baseline's own checks.
fn calibrate(rt: &Runtime, bed: &TestBed) -> anyhow::Result<()> {
    for (cache_traffic, what) in [(false, "plain rounds"), (true, "cutover rounds")] {
        let run = baseline_seed(
            rt,
            bed,
            if cache_traffic { "refcut" } else { "ref" },
            &Defects::none(),
            cache_traffic,
            0,
            CALIBRATION_BUDGET,
        )?;
        println!(
            "reference worker, {what:<14}: {} rounds in {:.2} s, {} (redeliveries {}, unsettled rounds {}, worker errors {})",
            run.rounds,
            run.elapsed,
            match run.found {
                Some((round, _)) => format!("FALSE ALARM in round {round}: {}", run.invariants),
                None => "no violation".into(),
            },
            run.redeliveries,
            run.unsettled,
            run.worker_errors
        );
        for error in &run.errors {
            println!("  round error: {error}");
        }
        for detail in &run.unsettled_details {
            println!("  unsettled round {detail}");
        }
    }
    Ok(())
}

/// One defect's row of the baseline table: every seed with racecert's budget for it. Whether the
/// baseline found the defect on any seed (budget overrun included).
fn baseline_row(rt: &Runtime, bed: &TestBed, d: &Detection) -> anyhow::Result<bool> {
    let budget = d.budget();
    let defects = Defects::of([d.defect]);
    let mut cells = Vec::new();
    let (mut in_budget, mut with_overrun) = (0, 0);
    let mut redeliveries = 0;
    let mut notes = BTreeSet::new();
    let mut details = Vec::new();
    for seed in 0..BASELINE_SEEDS {
        let run = baseline_seed(
            rt,
            bed,
            d.defect.name(),
            &defects,
            is_cache_defect(d.defect),
            seed,
            budget,
        )?;
        redeliveries += run.redeliveries;
        details.extend(run.unsettled_details.iter().cloned());
        let on_time = run
            .found
            .is_some_and(|(_, secs)| secs <= budget.as_secs_f64());
        in_budget += usize::from(on_time);
        with_overrun += usize::from(run.found.is_some());
        cells.push(match run.found {
            Some((round, secs)) => format!(
                "s{seed}:{} r{round}/{secs:.2}s",
                if on_time { "yes" } else { "late" },
            ),
            None => format!("s{seed}:no {}r/{:.1}s", run.rounds, run.elapsed),
        });
        if !run.invariants.is_empty() {
            notes.insert(run.invariants.clone());
        }
        if run.unsettled > 0 {
            notes.insert(format!("s{seed}: {} unsettled round(s)", run.unsettled));
        }
        if let Some(first) = run.errors.first() {
            notes.insert(format!(
                "s{seed}: {} round error(s), first: {first}",
                run.errors.len()
            ));
        }
    }
    println!(
        "{:<24} {:>6.2}s  {:<58} {:>7}/{:<1} {:>7}/{:<1} {:>6}/{:<2}  redeliveries {redeliveries}{}{}",
        d.defect.name(),
        budget.as_secs_f64(),
        cells.join("  "),
        in_budget,
        BASELINE_SEEDS,
        with_overrun,
        BASELINE_SEEDS,
        d.detected(),
        DETECTION_SEEDS,
        if notes.is_empty() { "" } else { "; " },
        notes.into_iter().collect::<Vec<_>>().join("; ")
    );
    for detail in details {
        println!("  unsettled round {detail}");
    }
    Ok(with_overrun > 0)
}

/// Is a miss a matter of time? Give the baseline a much longer budget where it always missed.
fn extended_baseline(rt: &Runtime, bed: &TestBed, never: Vec<Defect>) -> anyhow::Result<()> {
    if !never.is_empty() {
        println!(
            "extended baseline, seed {EXTENDED_SEED}, budget {EXTENDED_BUDGET:?}, for the defects it missed on every seed:"
        );
    }
    for defect in never {
        let run = baseline_seed(
            rt,
            bed,
            &format!("{}-ext", defect.name()),
            &Defects::of([defect]),
            is_cache_defect(defect),
            EXTENDED_SEED,
            EXTENDED_BUDGET,
        )?;
        println!(
            "{:<24} {} rounds in {:.1} s: {} (redeliveries {}, worker errors {}, round errors {})",
            defect.name(),
            run.rounds,
            run.elapsed,
            match run.found {
                Some((round, secs)) => {
                    format!("found in round {round} at {secs:.2} s: {}", run.invariants)
                }
                None => "no violation".into(),
            },
            run.redeliveries,
            run.worker_errors,
            run.errors.len()
        );
        for detail in &run.unsettled_details {
            println!("  unsettled round {detail}");
        }
    }
    Ok(())
}
