//! The harness end to end: controlled runs are deterministic, the reference worker passes every
//! shipped suite, every defect is caught and shrunk, and the seed's race shrinks to a handful of
//! steps.

use racecert::check::Invariant;
use racecert::contract::checkpoint::Checkpoint;
use racecert::contract::defect::{Defect, Defects};
use racecert::contract::log::Status;
use racecert::env::TestBed;
use racecert::fault::Fault;
use racecert::history::{EventKind, History};
use racecert::runner::controlled::{CaseSettings, Controller};
use racecert::runner::explore::{ExploreConfig, explore};
use racecert::schedule::{RequestSpec, Schedule, Step};
use racecert::suite::{Suite, builtin};
use std::collections::BTreeSet;

crate::tests!(
    a_chaos_run_of_the_reference_fleet_holds_every_invariant,
    the_same_schedule_gives_the_same_history,
    a_step_between_two_statements_splits_a_check_from_its_write,
    the_seed_race_is_caught_and_shrinks_to_at_most_six_steps,
    the_reference_worker_passes_every_suite,
    every_defect_is_caught_within_256_cases,
    running_cases_concurrently_finds_and_shrinks_the_same_failure,
);

/// The seed's race as a hand-written schedule.
fn seed_race() -> Schedule {
    Schedule {
        requests: vec![RequestSpec {
            request_id: "req-91".into(),
            input: "input-0".into(),
        }],
        steps: vec![
            Step::Run {
                worker: 0,
                to: Checkpoint::BeforeFinalWrite,
            },
            Step::Fault(Fault::ExpireLease { request: 0 }),
            Step::Run {
                worker: 1,
                to: Checkpoint::Done,
            },
        ],
    }
}

/// The seed's race as a suite: lease-expiry with the unfenced final write switched on.
fn unfenced_lease_expiry() -> Suite {
    builtin()
        .into_iter()
        .find(|s| s.name == "lease-expiry")
        .expect("shipped suite")
        .with_defects(Defects::of([Defect::UnfencedFinalWrite]))
}

/// Stream entry ids (`1795979661243-0`) are times: they differ between runs.
fn without_stream_ids(text: &str) -> String {
    text.split(' ')
        .map(|word| match word.split_once('-') {
            Some((ms, seq))
                if ms.len() >= 10
                    && ms.bytes().all(|b| b.is_ascii_digit())
                    && seq.bytes().all(|b| b.is_ascii_digit()) =>
            {
                "ID"
            }
            _ => word,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A history with what differs between runs removed: wall times, the case namespace, audit ids.
fn normalized(history: &History) -> Vec<String> {
    let strip = |s: &str| {
        s.split(':')
            .filter(|part| !part.starts_with('r') || !part.contains('c'))
            .collect::<Vec<_>>()
            .join(":")
    };
    let mut out: Vec<String> = history
        .events
        .iter()
        // Set-up and pool health checks depend on what the connections did before, not on the
        // schedule.
        .filter(|e| !matches!(&e.kind, EventKind::Wire(w) if w.trip.is_effectless()))
        .map(|e| match &e.kind {
            // A round trip as the worker sent it and the reply, without connection ids or times.
            EventKind::Wire(wire) => format!(
                "{} wire {} {}",
                e.step,
                wire.worker,
                without_stream_ids(&strip(&wire.trip.describe(history.namespace.as_deref())))
            ),
            EventKind::Worker(line) => format!(
                "{} {}",
                e.step,
                line.fields
                    .iter()
                    .filter(|(k, _)| k != "job_id")
                    .map(|(k, v)| format!("{k}={}", strip(v)))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            other => format!("{} {:?}", e.step, other)
                .replace(&history.requests[0].idempotency_key, "KEY"),
        })
        .collect();
    out.extend(history.audit.iter().map(|r| {
        format!(
            "{} {:?}->{} {:?}->{:?} {:?}",
            r.operation,
            r.old_status,
            r.new_status,
            r.old_generation,
            r.new_generation,
            r.new_lease_token
        )
    }));
    out
}

async fn the_same_schedule_gives_the_same_history(bed: &TestBed) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let controller = Controller::new(bed, CaseSettings::seed_pair()).await?;
    let first = controller.run(&seed_race()).await?;
    let second = controller.run(&seed_race()).await?;
    anyhow::ensure!(
        first.violations.is_empty(),
        "reference broke: {:?}",
        first.violations
    );
    let (a, b) = (normalized(&first.history), normalized(&second.history));
    anyhow::ensure!(
        a == b,
        "replaying a schedule changed its history:\n--- first\n{}\n--- second\n{}",
        a.join("\n"),
        b.join("\n")
    );
    anyhow::ensure!(
        first.history.with_status(Status::LateWriteRejected).count() == 1,
        "the late write must reach the fence:\n{}",
        first.history.timeline()
    );
    Ok(())
}

/// A worker held between the statements of its final write (no checkpoint is there): its
/// lease runs out and another worker finishes the job in between. Two statements (a check, then
/// an UPDATE keyed by the job alone) write over the other's result; the reference's one fenced
/// statement cannot be split, so the same schedule holds it before its acknowledgement instead.
async fn a_step_between_two_statements_splits_a_check_from_its_write(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let schedule = Schedule {
        requests: vec![RequestSpec {
            request_id: "req-0".into(),
            input: "input-0".into(),
        }],
        steps: vec![
            Step::Run {
                worker: 0,
                to: Checkpoint::BeforeFinalWrite,
            },
            Step::Trips {
                worker: 0,
                trips: 1,
            },
            Step::Fault(Fault::ExpireLease { request: 0 }),
            Step::Run {
                worker: 1,
                to: Checkpoint::Done,
            },
        ],
    };
    let safe = Controller::new(bed, CaseSettings::seed_pair()).await?;
    let result = safe.run(&schedule).await?;
    anyhow::ensure!(
        result.violations.is_empty(),
        "the reference broke {:?}:\n{}",
        result.violations,
        result.history.timeline()
    );
    let held = result.history.events.iter().any(|e| {
        matches!(&e.kind, EventKind::Harness(racecert::history::Observation::Held { before, .. })
            if before.contains("XACK"))
    });
    anyhow::ensure!(
        held,
        "the reference must be held before its acknowledgement:\n{}",
        result.history.timeline()
    );
    let mut settings = CaseSettings::seed_pair();
    settings.defects = Defects::of([Defect::ReadThenWrite]);
    let split = Controller::new(bed, settings).await?;
    let result = split.run(&schedule).await?;
    let broken: BTreeSet<Invariant> = result.violations.iter().map(|v| v.invariant).collect();
    anyhow::ensure!(
        broken.contains(&Invariant::AtMostOneFinalWrite)
            && broken.contains(&Invariant::NoNonOwnerFinalWrite),
        "read-then-write held between its statements must write twice, as a non-owner; broke \
         {broken:?}:\n{}",
        result.history.timeline()
    );
    Ok(())
}

async fn the_seed_race_is_caught_and_shrinks_to_at_most_six_steps(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let suite = unfenced_lease_expiry();
    let report = run_suite(bed, &suite, 256, 7).await?;
    let Some(found) = &report.found else {
        anyhow::bail!(
            "the unfenced final write was not caught in {} cases",
            report.cases_run
        );
    };
    eprintln!(
        "{}",
        racecert::report::counterexample_text(
            found,
            7,
            "cargo test --test integration -- harness::the_seed_race"
        )
    );
    anyhow::ensure!(
        found.shrunk.schedule.steps.len() <= 6,
        "shrunk schedule has {} steps",
        found.shrunk.schedule.steps.len()
    );
    let broken: BTreeSet<Invariant> = found
        .shrunk
        .case
        .violations
        .iter()
        .map(|v| v.invariant)
        .collect();
    // The late write is by a worker whose lease was taken over: the shrinker keeps whichever of
    // the two the smallest schedule still breaks.
    anyhow::ensure!(
        broken.contains(&Invariant::AtMostOneFinalWrite)
            || broken.contains(&Invariant::NoNonOwnerFinalWrite),
        "expected at-most-one-final-write or no-non-owner-final-write among {broken:?}"
    );
    Ok(())
}

async fn run_suite(
    bed: &TestBed,
    suite: &Suite,
    cases: u32,
    seed: u64,
) -> anyhow::Result<racecert::runner::explore::ExploreReport> {
    run_suite_with(
        bed,
        suite,
        cases,
        seed,
        ExploreConfig::default().concurrency,
    )
    .await
}

async fn run_suite_with(
    bed: &TestBed,
    suite: &Suite,
    cases: u32,
    seed: u64,
    concurrency: usize,
) -> anyhow::Result<racecert::runner::explore::ExploreReport> {
    let controller = Controller::new(bed, suite.settings.clone()).await?;
    // Reference runs replay (and record) the committed regression files; defect runs would only
    // record their expected failures.
    let regressions = suite.settings.defects.iter().next().is_none().then(|| {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("proptest-regressions")
            .join(format!("{}.txt", suite.name))
    });
    let config = ExploreConfig {
        cases,
        seed,
        regressions,
        concurrency,
        ..ExploreConfig::default()
    };
    let report = explore(&controller, &suite.space, &config).await?;
    Ok(report)
}

async fn the_reference_worker_passes_every_suite(bed: &TestBed) -> anyhow::Result<()> {
    let mut unreached = Vec::new();
    for suite in builtin() {
        let _guard = if suite.is_exclusive() {
            (None, Some(bed.exclusive().await))
        } else {
            (Some(bed.shared().await), None)
        };
        let report = run_suite(bed, &suite, 24, 1).await?;
        if let Some(found) = &report.found {
            anyhow::bail!(
                "suite {} failed on the reference worker:\n{}",
                suite.name,
                racecert::report::counterexample_text(
                    found,
                    1,
                    &format!("racecert run {} --seed 1", suite.name)
                )
            );
        }
        let landed: Vec<String> = report
            .coverage
            .faults
            .iter()
            .map(|(kind, (applied, landed))| format!("{kind} {landed}/{applied}"))
            .collect();
        eprintln!(
            "    suite {:<24} {} cases in {:.1?}, coverage: {}",
            suite.name,
            report.cases_run,
            report.elapsed,
            landed.join(", ")
        );
        // Every fault kind the suite lists must have landed on its target path in some case:
        // a fault that never reaches what it is for certifies nothing. (The search's aimed
        // schedules, one per kind, come first: a kind that needs an order of several steps, such
        // as `cache-invalidation-lag`, lands within the first cases.)
        for kind in &suite.space.faults {
            let (applied, hit) = report.coverage.faults.get(kind).copied().unwrap_or((0, 0));
            if hit == 0 {
                unreached.push(format!("{}: {kind} landed 0 of {applied}", suite.name));
            }
        }
    }
    anyhow::ensure!(
        unreached.is_empty(),
        "fault kinds that never reached their target path: {unreached:?}"
    );
    Ok(())
}

async fn every_defect_is_caught_within_256_cases(bed: &TestBed) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let mut missed = Vec::new();
    for defect in Defect::ALL {
        let catching = racecert::suite::catching(defect);
        let suite = builtin()
            .into_iter()
            .find(|s| s.name == catching.suite)
            .expect("shipped suite")
            .with_defects(Defects::of([defect]));
        let report = run_suite(bed, &suite, 256, 3).await?;
        if let Some(found) = &report.found {
            // Caught for the right reason: every invariant the defect is known to break.
            let broken: BTreeSet<Invariant> = found
                .shrunk
                .case
                .violations
                .iter()
                .map(|v| v.invariant)
                .collect();
            let absent = catching.missing(&broken);
            if !absent.is_empty() {
                missed.push(format!(
                    "{defect} broke {broken:?} but not {absent:?} (seed 3)"
                ));
            }
        }
        match &report.found {
            Some(found) => eprintln!(
                "    {defect:<24} caught by {} after {} case(s) in {:.1?}: {} ({} steps)",
                suite.name,
                found.found_after.0,
                found.found_after.1,
                found
                    .shrunk
                    .case
                    .violations
                    .iter()
                    .map(|v| v.invariant.name())
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect::<Vec<_>>()
                    .join(", "),
                found.shrunk.schedule.steps.len()
            ),
            None => missed.push(format!(
                "{defect} ({} cases of {})",
                report.cases_run, suite.name
            )),
        }
    }
    anyhow::ensure!(missed.is_empty(), "defects not caught: {missed:?}");
    Ok(())
}

async fn a_chaos_run_of_the_reference_fleet_holds_every_invariant(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let settings = racecert::runner::chaos::ChaosSettings::mixed_fleet(5);
    let result = racecert::runner::chaos::run_chaos(bed, &settings).await?;
    let faults = result
        .history
        .events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Fault { .. }))
        .count();
    let coverage: Vec<String> = result
        .coverage
        .faults
        .iter()
        .map(|(kind, (applied, landed))| format!("{kind} {landed}/{applied}"))
        .collect();
    eprintln!(
        "    chaos: {} events, {faults} faults, {} final writes, coverage: {}",
        result.history.events.len(),
        result
            .history
            .audit
            .iter()
            .filter(|r| r.is_final_write())
            .count(),
        coverage.join(", ")
    );
    anyhow::ensure!(faults > 3, "the chaos run injected only {faults} faults");
    anyhow::ensure!(
        result.violations.is_empty(),
        "the reference fleet broke under chaos (seed 5):\n{}\n{}",
        result
            .violations
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(""),
        result.history.timeline()
    );
    Ok(())
}

/// Cases run several at a time are screened in generation order: the failure found, its case
/// number and its shrunk schedule are those of a one-at-a-time run.
async fn running_cases_concurrently_finds_and_shrinks_the_same_failure(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let suite = unfenced_lease_expiry();
    let mut found = Vec::new();
    for concurrency in [1, 6] {
        let report = run_suite_with(bed, &suite, 256, 11, concurrency).await?;
        let Some(counterexample) = report.found else {
            anyhow::bail!("concurrency {concurrency}: the unfenced final write was not caught");
        };
        found.push((
            counterexample.found_after.0,
            counterexample.shrunk.schedule.to_string(),
            counterexample.shrunk.schedule.steps.len(),
        ));
    }
    eprintln!(
        "    found at case {} by both, shrunk to {} steps",
        found[0].0, found[0].2
    );
    anyhow::ensure!(
        found[0] == found[1],
        "one at a time: case {} shrunk to\n{}\nsix at a time: case {} shrunk to\n{}",
        found[0].0,
        found[0].1,
        found[1].0,
        found[1].1
    );
    Ok(())
}
