//! Certifying workers on their own stack from a system description: the Celery example as a team
//! wrote it (its own tables, variables and OpenAI-style model API), provisioned in a virtual
//! environment by racecert itself. The naive task is caught by each real Celery fault that can
//! catch it; the fenced one passes every Celery fault; files that cannot work fail with the place.

use racecert::env::TestBed;
use racecert::schedule::system::{SystemFault, SystemOutcome, SystemSettings, run_system};
use racecert::system::System;
use std::path::{Path, PathBuf};
use std::time::Duration;

crate::tests!(
    celery_naive_is_caught_by_restores_and_a_pool_child_kill,
    celery_fenced_passes_every_celery_fault,
    system_files_that_cannot_work_fail_naming_the_place,
    apalis_naive_is_caught_by_missed_heartbeats_and_fenced_passes,
);

fn example(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(file)
}

fn settings(faults: &[SystemFault]) -> SystemSettings {
    let mut settings = SystemSettings::certify(7);
    settings.faults = faults.to_vec();
    settings.cases = faults.len() as u32;
    settings.stop_at_first_failure = false;
    settings.budget = Duration::from_secs(300);
    settings
}

fn summary(outcome: &SystemOutcome) -> String {
    outcome
        .cases
        .iter()
        .map(|c| {
            format!(
                "case {} {}: {} final write(s), {} model call(s), violations {:?}\n{}",
                c.number,
                c.fault,
                c.final_writes,
                c.model_calls,
                c.violations.iter().map(|v| &v.observed).collect::<Vec<_>>(),
                racecert::schedule::system::sequence_text(c)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

async fn celery_naive_is_caught_by_restores_and_a_pool_child_kill(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let system = System::load(&example("celery-worker/naive.toml"))?;
    let faults = [
        SystemFault::ForcedRestore,
        SystemFault::KillPoolChild,
        SystemFault::VisibilityOutlived,
    ];
    let outcome = run_system(bed, &system, &settings(&faults)).await?;
    let text = summary(&outcome);
    anyhow::ensure!(outcome.cases.len() == 3, "three cases ran:\n{text}");
    let invariants = |n: usize| -> Vec<&str> {
        outcome.cases[n]
            .violations
            .iter()
            .map(|v| v.invariant.as_str())
            .collect()
    };
    // A restored delivery runs again while the first attempt still runs: both write, the slower
    // (older model) last.
    for n in [0, 2] {
        let case = &outcome.cases[n];
        anyhow::ensure!(
            invariants(n) == ["at-most-one-final-write"] && case.final_writes == 2,
            "case {} ({}) must show two final writes:\n{text}",
            case.number,
            case.fault
        );
        let writers: std::collections::BTreeSet<_> = case
            .writes
            .iter()
            .filter(|w| w.new_status.as_deref() == Some("SUCCEEDED"))
            .filter_map(|w| w.worker.clone())
            .collect();
        anyhow::ensure!(
            writers.len() == 2,
            "the two final writes come from two workers' wires:\n{text}"
        );
    }
    // A killed pool child's message is acked by Celery (no reject_on_worker_lost): lost.
    anyhow::ensure!(
        invariants(1) == ["no-lost-job"],
        "case 2 (kill-pool-child) must lose the job:\n{text}"
    );
    let report =
        racecert::report::system::system_text(&outcome, &example("celery-worker/naive.toml"));
    anyhow::ensure!(
        report.contains("replay: racecert replay --system")
            && report.contains("--case 1 --fault forced-restore")
            && report.contains("sequence diagram"),
        "the report names the counterexample and its replay:\n{report}"
    );
    anyhow::ensure!(
        outcome.startup_ms.len() == 2,
        "both workers' start-up times are measured"
    );
    Ok(())
}

async fn celery_fenced_passes_every_celery_fault(bed: &TestBed) -> anyhow::Result<()> {
    let system = System::load(&example("celery-worker/fenced.toml"))?;
    let faults = [
        SystemFault::ForcedRestore,
        SystemFault::VisibilityOutlived,
        SystemFault::KillPoolChild,
        SystemFault::KillMain,
        SystemFault::WarmShutdown,
    ];
    let outcome = run_system(bed, &system, &settings(&faults)).await?;
    let text = summary(&outcome);
    anyhow::ensure!(
        outcome.passed() && outcome.cases.len() == faults.len(),
        "the fenced task must pass every fault:\n{text}"
    );
    // The faults were real: each restore ran the task a second time, and the fence refused the
    // late write (one final write).
    for case in outcome.cases.iter().take(2) {
        anyhow::ensure!(
            case.model_calls == 2 && case.final_writes == 1,
            "case {} ({}) ran twice and wrote once:\n{text}",
            case.number,
            case.fault
        );
    }
    Ok(())
}

async fn system_files_that_cannot_work_fail_naming_the_place(bed: &TestBed) -> anyhow::Result<()> {
    let path = example("celery-worker/naive.toml");
    let text = std::fs::read_to_string(&path)?;
    let mut quick = settings(&[SystemFault::ForcedRestore]);
    quick.startup_deadline = Duration::from_secs(8);

    // A column the table does not have.
    let system = System::parse(
        &text.replace("output = \"output\"", "output = \"result\""),
        &path,
    )?;
    let err = run_system(bed, &system, &quick)
        .await
        .unwrap_err()
        .to_string();
    anyhow::ensure!(
        err.contains("naive.toml:41:10")
            && err.contains("no column \"result\"")
            && err.contains("request_id, input, status"),
        "{err}"
    );

    // A command that exits at once: its status and stderr.
    let command_line = text
        .lines()
        .find(|l| l.starts_with("command = "))
        .expect("a command line");
    let system = System::parse(
        &text.replace(
            command_line,
            "command = \"echo cannot import tasks >&2; exit 3\"",
        ),
        &path,
    )?;
    let err = run_system(bed, &system, &quick)
        .await
        .unwrap_err()
        .to_string();
    anyhow::ensure!(
        err.contains("naive.toml:10:11")
            && err.contains("exited (exit status: 3)")
            && err.contains("cannot import tasks"),
        "{err}"
    );

    // A worker that says it is ready and never consumes: where the request is.
    let system = System::parse(
        &text.replace(
            command_line,
            "command = \"echo {worker_id}@racecert ready.; exec sleep 60\"",
        ),
        &path,
    )?;
    let err = run_system(bed, &system, &quick)
        .await
        .unwrap_err()
        .to_string();
    anyhow::ensure!(
        err.contains("no worker consumed request")
            && err.contains("the queue \"celery\" holds 1 message(s)"),
        "{err}"
    );
    Ok(())
}

/// apalis: a worker stopped mid-call past its heartbeat deadline has its job requeued and run by
/// the other worker; when it resumes, the naive handler writes too. A crash followed by a restart
/// under the same worker name strands the job (the new process heartbeats for the old one's
/// name). The fenced handler (epoch fence, a name per process) passes both. The example builds
/// itself through the file's `setup` (its own Cargo.lock and target directory).
async fn apalis_naive_is_caught_by_missed_heartbeats_and_fenced_passes(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let faults = [SystemFault::HeartbeatMiss, SystemFault::KillMain];
    let mut naive_settings = settings(&faults);
    // The first start may build the example (setup is not counted, start-up is).
    naive_settings.startup_deadline = Duration::from_secs(120);
    let naive = System::load(&example("apalis-worker/naive.toml"))?;
    let outcome = run_system(bed, &naive, &naive_settings).await?;
    let text = summary(&outcome);
    let invariants = |n: usize| -> Vec<&str> {
        outcome.cases[n]
            .violations
            .iter()
            .map(|v| v.invariant.as_str())
            .collect()
    };
    anyhow::ensure!(
        outcome.cases.len() == 2
            && invariants(0) == ["at-most-one-final-write"]
            && invariants(1) == ["no-lost-job"],
        "naive: two final writes after missed heartbeats, a lost job after a same-name restart:\n{text}"
    );
    let fenced = System::load(&example("apalis-worker/fenced.toml"))?;
    let outcome = run_system(bed, &fenced, &naive_settings).await?;
    let text = summary(&outcome);
    anyhow::ensure!(
        outcome.passed() && outcome.cases.len() == 2 && outcome.cases[0].model_calls == 2,
        "fenced: passes, the requeued job ran twice and wrote once:\n{text}"
    );
    Ok(())
}
