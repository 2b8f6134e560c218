//! Certifying workers on their own stack from a system description: the Celery example as a team
//! wrote it (its own tables, variables and OpenAI-style model API), provisioned in a virtual
//! environment by racecert itself. The naive task is caught by each real Celery fault that can
//! catch it; the fenced one passes every Celery fault; files that cannot work fail with the place.

use racecert::env::TestBed;
use racecert::fault::FaultKind;
use racecert::runner::system::{SystemOutcome, SystemSettings, run_system};
use racecert::system::System;
use racecert::system::rollout::Invalidate;
use std::path::{Path, PathBuf};
use std::time::Duration;

crate::tests!(
    celery_naive_is_caught_by_restores_and_a_pool_child_kill,
    celery_fenced_passes_every_celery_fault,
    system_files_that_cannot_work_fail_naming_the_place,
    celery_prefetch_restore_catches_naive_and_fenced_passes,
    celery_incident_log_replays_on_the_team_system,
    celery_lock_takeover_is_caught_on_the_wire_by_its_lock_keys,
    apalis_example_certifies_itself_from_its_own_cargo_test_and_its_files,
    celery_fenced_but_acked_loses_a_job_when_its_pool_child_is_killed,
    celery_submitted_by_the_teams_own_command_with_spaces_in_the_input,
    celery_retry_after_an_upstream_timeout_or_a_resubmission_writes_twice_and_fenced_passes,
    the_apalis_examples_lock_file_holds_racecerts_dependencies,
    celery_a_worker_that_keeps_consuming_after_its_stop_signal_is_caught_and_fenced_drains,
    celery_a_rollout_serves_an_unversioned_cache_entry_across_versions,
    celery_a_late_invalidation_is_caught_and_the_versioned_cache_passes_every_rollout_fault,
    celery_a_stale_cache_incident_log_replays_on_the_team_system,
    celery_a_backend_switch_under_a_running_worker_is_caught_where_the_row_keeps_its_own_version,
    rq_a_crash_kills_the_work_horse_that_holds_the_job_on_a_framework_without_a_preset,
    dramatiq_a_worker_paused_past_its_heartbeat_writes_twice_and_the_safe_actor_passes,
    dramatiq_a_timed_out_actor_without_retries_loses_its_job_and_one_retrying_at_once_passes,
    dramatiq_the_time_limit_drops_a_late_answer_the_safe_actor_retries_and_the_lost_one_loses_it,
    celery_a_late_attempt_retrying_its_refused_write_for_ever_is_a_stuck_delivery,
);

fn example(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(file)
}

fn settings(faults: &[FaultKind]) -> SystemSettings {
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
                racecert::runner::system::sequence_text(c)
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
        FaultKind::ForcedRestore,
        FaultKind::KillPoolChild,
        FaultKind::VisibilityOutlived,
        FaultKind::ApiResubmission,
        FaultKind::Partition,
    ];
    let outcome = run_system(bed, &system, &settings(&faults)).await?;
    let text = summary(&outcome);
    anyhow::ensure!(outcome.cases.len() == 5, "five cases ran:\n{text}");
    let invariants = |n: usize| -> Vec<&str> {
        outcome.cases[n]
            .violations
            .iter()
            .map(|v| v.invariant.name())
            .collect()
    };
    // A restored delivery, or the request submitted again, runs again while the first attempt
    // still runs: both write, the slower (older model) last.
    for (n, again) in [
        (0, "its message delivered again"),
        (2, "its message delivered again"),
        (3, "the request submitted again"),
    ] {
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
            .filter(|w| w.new_status == "SUCCEEDED")
            .filter_map(|w| w.writer.clone())
            .collect();
        anyhow::ensure!(
            writers.len() == 2,
            "the two final writes come from two workers' wires:\n{text}"
        );
        // The diagram draws both model calls from the wire, the second as what made it.
        let calls: Vec<&str> = case
            .diagram
            .iter()
            .filter(|a| a.label.starts_with("model call"))
            .map(|a| a.label.as_str())
            .collect();
        anyhow::ensure!(
            calls
                == [
                    "model call (attempt 1)".to_owned(),
                    format!("model call (attempt 2: {again})")
                ],
            "both attempts' model calls are drawn: {calls:?}\n{text}"
        );
        anyhow::ensure!(case.landed, "case {} landed:\n{text}", case.number);
    }
    // A killed pool child's message is acked by Celery (no reject_on_worker_lost): lost. So is
    // one whose final UPDATE a partition cut: psycopg raises, Celery acks the failed task.
    for n in [1, 4] {
        anyhow::ensure!(
            invariants(n) == ["no-lost-job"] && outcome.cases[n].landed,
            "case {} ({}) must lose the job:\n{text}",
            n + 1,
            outcome.cases[n].fault
        );
    }
    anyhow::ensure!(
        outcome.cases[4]
            .diagram
            .iter()
            .any(|a| a.label.starts_with("UPDATE inference_results")
                && a.label.ends_with("its connection ended first")),
        "the diagram shows the final UPDATE the partition cut, from the wire:\n{text}"
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
        FaultKind::ForcedRestore,
        FaultKind::VisibilityOutlived,
        FaultKind::KillPoolChild,
        FaultKind::KillMain,
        FaultKind::WarmShutdown,
        FaultKind::Partition,
    ];
    let outcome = run_system(bed, &system, &settings(&faults)).await?;
    let text = summary(&outcome);
    // PASSED: every invariant held and every fault landed on its target, from the evidence.
    anyhow::ensure!(
        outcome.passed() && outcome.cases.len() == faults.len(),
        "the fenced task must pass every fault, each landed:\n{text}\n{}",
        racecert::report::system::system_text(&outcome, &example("celery-worker/fenced.toml"))
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

/// The two faults every system has besides its framework's: a model call that outlives the
/// worker's own timeout (the app's retry or failure path runs while the model still computes)
/// and the API submitting the request again while its first attempt runs. The retrying task
/// (Celery `autoretry_for` on upstream errors, FAILED written first) writes FAILED, then its
/// retry SUCCEEDED over it; resubmitted, it runs twice and writes twice. The fenced task writes
/// once under both. Both faults land on every run, judged from the wire: the first call never
/// answered (the worker hung up), the second submission acted on by a worker.
async fn celery_retry_after_an_upstream_timeout_or_a_resubmission_writes_twice_and_fenced_passes(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let faults = [FaultKind::UpstreamTimeout, FaultKind::ApiResubmission];
    let retrying = System::load(&example("celery-worker/retrying.toml"))?;
    let outcome = run_system(bed, &retrying, &settings(&faults)).await?;
    let text = summary(&outcome);
    anyhow::ensure!(outcome.cases.len() == 2, "two cases ran:\n{text}");
    for case in &outcome.cases {
        let broke: Vec<&str> = case.violations.iter().map(|v| v.invariant.name()).collect();
        anyhow::ensure!(
            case.landed && broke == ["at-most-one-final-write"] && case.final_writes == 2,
            "case {} ({}) landed and wrote twice:\n{text}",
            case.number,
            case.fault
        );
    }
    let timed_out = &outcome.cases[0];
    let statuses: Vec<&str> = timed_out
        .writes
        .iter()
        .map(|w| w.new_status.as_str())
        .filter(|s| *s != "PENDING")
        .collect();
    anyhow::ensure!(
        statuses == ["FAILED", "SUCCEEDED"],
        "the timed-out attempt wrote FAILED, its retry SUCCEEDED over it: {statuses:?}\n{text}"
    );
    anyhow::ensure!(
        timed_out.diagram.iter().any(|a| a.label
            == "model call (attempt 1), never answered: the worker hung up (its timeout) or died first"),
        "the diagram shows the call the worker hung up on:\n{text}"
    );
    let fenced = System::load(&example("celery-worker/fenced.toml"))?;
    let outcome = run_system(bed, &fenced, &settings(&faults)).await?;
    let text = summary(&outcome);
    anyhow::ensure!(
        outcome.passed()
            && outcome
                .cases
                .iter()
                .all(|c| c.landed && c.final_writes == 1),
        "the fenced task passes both, each landed, one final write each:\n{text}"
    );
    Ok(())
}

/// `drain`: the worker holding the request is told to stop (SIGTERM) mid-job while the next job
/// waits, then killed at the end of its grace period and replaced. Celery's warm shutdown
/// finishes the job and takes nothing more (the replacement runs the next job). The draining
/// variant's own SIGTERM handler keeps the consumer going: the wire shows it taking the next job
/// after its stop signal (drain-discipline), and the SIGKILL at the end of the grace period
/// strands that job in `unacked` (no-lost-job; no-stuck-delivery: the broker still holds it
/// after the drain).
async fn celery_a_worker_that_keeps_consuming_after_its_stop_signal_is_caught_and_fenced_drains(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let draining = System::load(&example("celery-worker/draining.toml"))?;
    let outcome = run_system(bed, &draining, &settings(&[FaultKind::Drain])).await?;
    let text = summary(&outcome);
    let case = outcome.cases.first().context_or(&text)?;
    let broke: std::collections::BTreeSet<&str> =
        case.violations.iter().map(|v| v.invariant.name()).collect();
    anyhow::ensure!(
        case.landed && broke == ["drain-discipline", "no-lost-job", "no-stuck-delivery"].into(),
        "the draining worker took the next job after its stop signal and lost it:\n{text}"
    );
    let drain = case
        .violations
        .iter()
        .find(|v| v.invariant.name() == "drain-discipline")
        .context_or(&text)?;
    anyhow::ensure!(
        drain.observed.starts_with("worker-a took request")
            && drain.observed.contains("-next")
            && drain.evidence.len() == 2,
        "the evidence is the stop signal and worker-a's first round trip on the next job: {drain:#?}"
    );
    let fenced = System::load(&example("celery-worker/fenced.toml"))?;
    let outcome = run_system(bed, &fenced, &settings(&[FaultKind::Drain])).await?;
    let text = summary(&outcome);
    anyhow::ensure!(
        outcome.passed() && outcome.cases[0].landed && outcome.cases[0].model_calls == 1,
        "Celery's warm shutdown drains: the job in hand ends, the replacement runs the next:\n{text}"
    );
    Ok(())
}

/// `cutover`: the rollout to v2 while the v1 worker is in the request's model call (the new
/// worker started first, the old one told to stop and drained), then the same input asked as a
/// request of its own. A cache key without the version serves v2 the entry v1 wrote, judged on
/// the wire (the `GET` and the version its answer names), on the final row and on when the
/// request was accepted.
async fn celery_a_rollout_serves_an_unversioned_cache_entry_across_versions(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let stale = System::load(&example("celery-worker/stale-cache.toml"))?;
    let outcome = run_system(bed, &stale, &settings(&[FaultKind::Cutover])).await?;
    let text = summary(&outcome);
    let case = outcome.cases.first().context_or(&text)?;
    let broke: std::collections::BTreeSet<&str> =
        case.violations.iter().map(|v| v.invariant.name()).collect();
    anyhow::ensure!(
        case.landed
            && broke
                == [
                    "no-stale-cache-read",
                    "result-names-its-version",
                    "served-by-new-version"
                ]
                .into(),
        "the v2 worker was served v1's cached output:\n{text}"
    );
    let read = case
        .violations
        .iter()
        .find(|v| v.invariant.name() == "no-stale-cache-read")
        .context_or(&text)?;
    anyhow::ensure!(
        read.observed
            .starts_with("worker-b running as v2 read a v1 output from cache key cache:")
            && read.evidence.iter().any(|e| e.contains("GET cache:")),
        "the evidence is worker-b's GET on the wire: {read:#?}"
    );
    Ok(())
}

/// Deleting the cache once the old workers are gone passes the cutover and fails when that
/// step runs late (`cache-invalidation-lag`). The key with the version passes both rollout faults
/// (`cutover`, `drain`), each landed.
async fn celery_a_late_invalidation_is_caught_and_the_versioned_cache_passes_every_rollout_fault(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let invalidating = System::load(&example("celery-worker/invalidating.toml"))?;
    let faults = [FaultKind::Cutover, FaultKind::CacheInvalidationLag];
    let outcome = run_system(bed, &invalidating, &settings(&faults)).await?;
    let text = summary(&outcome);
    anyhow::ensure!(outcome.cases.len() == 2, "two cases ran:\n{text}");
    let (cutover, late) = (&outcome.cases[0], &outcome.cases[1]);
    anyhow::ensure!(
        cutover.landed && cutover.violations.is_empty() && cutover.model_calls == 2,
        "invalidated once the old workers were gone, the new version computes its own:\n{text}"
    );
    anyhow::ensure!(
        late.landed
            && late
                .violations
                .iter()
                .any(|v| v.invariant.name() == "no-stale-cache-read"),
        "invalidated late, the new version is served the old entry:\n{text}"
    );

    // The same step as a command of the team's, on time: the cutover passes, the command's own
    // deletes seen on the wire. A command that fails is the file's error, at its line.
    let mut commanded = invalidating.clone();
    commanded.rollout.invalidate = Some(Invalidate::Command(
        "{venv}/bin/python flush_cache.py {redis_url} 'cache:*'".into(),
    ));
    let outcome = run_system(bed, &commanded, &settings(&[FaultKind::Cutover])).await?;
    let text = summary(&outcome);
    anyhow::ensure!(
        outcome.passed() && outcome.cases[0].landed && outcome.cases[0].model_calls == 2,
        "invalidated by the team's command once the old workers were gone:\n{text}"
    );
    commanded.rollout.invalidate = Some(Invalidate::Command("false".into()));
    let err = run_system(bed, &commanded, &settings(&[FaultKind::Cutover]))
        .await
        .expect_err("a failing invalidation command is an error");
    anyhow::ensure!(
        err.to_string()
            .contains("invalidation command `false` failed"),
        "{err}"
    );

    let cached = System::load(&example("celery-worker/cached.toml"))?;
    let faults = [FaultKind::Cutover, FaultKind::Drain];
    let outcome = run_system(bed, &cached, &settings(&faults)).await?;
    let text = summary(&outcome);
    anyhow::ensure!(
        outcome.passed() && outcome.cases.len() == 2 && outcome.cases.iter().all(|c| c.landed),
        "a cache key with the version passes both rollout faults, each landed:\n{text}"
    );
    Ok(())
}

/// `backend-switch`: the workers share one model URL and the rollout switches the backend behind
/// it while a v1 worker runs; its next request is answered by v2. The task that records the
/// version the model answered with passes (landed); the same task recording the worker's own
/// `MODEL_VERSION` writes v1 over v2's output.
async fn celery_a_backend_switch_under_a_running_worker_is_caught_where_the_row_keeps_its_own_version(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let mut system = System::load(&example("celery-worker/backend-switch.toml"))?;
    let faults = [FaultKind::BackendSwitch];
    let outcome = run_system(bed, &system, &settings(&faults)).await?;
    let text = summary(&outcome);
    anyhow::ensure!(
        outcome.passed() && outcome.cases.len() == 1 && outcome.cases[0].landed,
        "recording the answering version passes, the switch landed:\n{text}"
    );
    anyhow::ensure!(
        system.start.env.remove("VERSION_FROM_ANSWER").is_some(),
        "the file sets VERSION_FROM_ANSWER"
    );
    let outcome = run_system(bed, &system, &settings(&faults)).await?;
    let text = summary(&outcome);
    let case = outcome.cases.first().context_or(&text)?;
    let skew = case
        .violations
        .iter()
        .find(|v| v.invariant.name() == "result-names-its-version")
        .context_or(&text)?;
    anyhow::ensure!(
        case.landed
            && skew
                .observed
                .contains("record names v1 but the output was produced by v2"),
        "the worker's own version over the switched backend's output: {skew:#?}\n{text}"
    );
    Ok(())
}

/// `racecert replay LOG --system FILE` of a stale-cache incident (a v2 worker answering with v1's
/// cached output after a cutover, as a team's JSON logs show it): the cache cause is re-created
/// by `cutover` on the team's system, reproduced on the stale-cache variant and prevented by the
/// versioned cache.
async fn celery_a_stale_cache_incident_log_replays_on_the_team_system(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let log = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/incidents/stale-cache.nested.log");
    let log_arg = log.display().to_string();
    for (file, code, verdict) in [
        (
            "celery-worker/stale-cache.toml",
            1,
            "REPRODUCED on the team's worker",
        ),
        (
            "celery-worker/cached.toml",
            0,
            "prevented by the team's worker",
        ),
    ] {
        let file_arg = example(file).display().to_string();
        let out = racecert_cli(&["replay", &log_arg, "--system", &file_arg])?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        anyhow::ensure!(
            out.status.code() == Some(code)
                && stdout.contains(verdict)
                && stdout.contains("cutover"),
            "replay {log_arg} --system {file_arg}: exit {:?}\n{stdout}\n{stderr}",
            out.status.code()
        );
    }
    Ok(())
}

/// The apalis example's system files build it with `cargo build --locked`, and its own test
/// builds racecert as a dependency from that lock file: a dependency added to racecert and not to
/// the example's lock breaks both for a newcomer. Resolving it `--locked` says so in seconds.
async fn the_apalis_examples_lock_file_holds_racecerts_dependencies(
    _bed: &TestBed,
) -> anyhow::Result<()> {
    let out = std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()))
        .args([
            "metadata",
            "--locked",
            "--format-version",
            "1",
            "--manifest-path",
        ])
        .arg(example("apalis-worker/Cargo.toml"))
        .stdout(std::process::Stdio::null())
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "examples/apalis-worker/Cargo.lock is out of date with racecert's dependencies (run `cargo build` \
         without --locked in examples/apalis-worker and commit its Cargo.lock):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// `[keys]`: the locked task keeps its table right (the epoch fence), so every check on the
/// table passes; its lock does not hold, and only the recorded Redis round trips show it. A
/// restored delivery takes the lock over with a `SET` without `NX` while the first attempt still
/// runs: lease-discipline, with both workers' `SET`s as evidence.
async fn celery_lock_takeover_is_caught_on_the_wire_by_its_lock_keys(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let system = System::load(&example("celery-worker/locked.toml"))?;
    let outcome = run_system(bed, &system, &settings(&[FaultKind::ForcedRestore])).await?;
    let text = summary(&outcome);
    let case = outcome.cases.first().context_or(&text)?;
    let broke: Vec<&str> = case.violations.iter().map(|v| v.invariant.name()).collect();
    anyhow::ensure!(
        broke == ["lease-discipline"] && case.final_writes == 1 && case.model_calls == 2,
        "the restored delivery ran (two model calls), the fence kept one final write, and the \
         lock takeover is the one violation:\n{text}"
    );
    let violation = &case.violations[0];
    let lock = format!("lock:{}", case.request);
    anyhow::ensure!(
        violation.observed.contains("overwrote the live lease")
            && violation.observed.contains(&lock)
            && violation.evidence.len() == 2
            && violation
                .evidence
                .iter()
                .all(|e| e.starts_with("wire worker-") && e.contains("SET") && e.contains(&lock)),
        "the evidence is the two SETs on the wire, the holder's and the overwriting one:\n{:#?}",
        violation
    );
    Ok(())
}

async fn system_files_that_cannot_work_fail_naming_the_place(bed: &TestBed) -> anyhow::Result<()> {
    // A fault the file puts out of scope is refused before a test bed comes up.
    let out = racecert_cli(&[
        "certify",
        "--system",
        "examples/celery-worker/fenced.toml",
        "--fault",
        "backend-switch",
    ])?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    anyhow::ensure!(
        out.status.code() == Some(2)
            && stderr.contains("backend_switch is not set")
            && !stdout.contains("bringing the test bed up"),
        "exit {:?}\n{stdout}\n{stderr}",
        out.status.code()
    );
    let path = example("celery-worker/naive.toml");
    let text = std::fs::read_to_string(&path)?;
    let mut quick = settings(&[FaultKind::ForcedRestore]);
    quick.startup_deadline = Duration::from_secs(8);
    // The error a variant of the file ends its run with, checked for every part it must name.
    let refused = async |variant: String, parts: &[&str]| -> anyhow::Result<()> {
        let system = System::parse(&variant, &path)?;
        let err = run_system(bed, &system, &quick)
            .await
            .unwrap_err()
            .to_string();
        anyhow::ensure!(parts.iter().all(|part| err.contains(part)), "{err}");
        Ok(())
    };

    // A column the table does not have.
    refused(
        text.replace("output = \"output\"", "output = \"result\""),
        &[
            "naive.toml:41:10",
            "no column \"result\"",
            "request_id, input, status",
        ],
    )
    .await?;

    // A command that exits at once: its status and stderr.
    let command_line = text
        .lines()
        .find(|l| l.starts_with("command = "))
        .expect("a command line");
    refused(
        text.replace(
            command_line,
            "command = \"echo cannot import tasks >&2; exit 3\"",
        ),
        &[
            "naive.toml:10:11",
            "exited (exit status: 3)",
            "cannot import tasks",
        ],
    )
    .await?;

    // A setup (a build) that fails: its own line, its status and stderr, before any worker.
    refused(
        text.replace(
            command_line,
            &format!("{command_line}\nsetup = \"echo no toolchain here >&2; exit 4\""),
        ),
        &["naive.toml:11:9", "exit status: 4", "no toolchain here"],
    )
    .await?;

    // A `terminal` list naming no status the task writes: the file's error at that line, with
    // the status the task wrote its output with; not a lost job.
    refused(
        text.replace(
            "terminal = [\"SUCCEEDED\", \"FAILED\"]",
            "terminal = [\"DONE\"]",
        ),
        &[
            "naive.toml:40:12",
            "`terminal` = [\"DONE\"] matches no status",
            "stored an output set \"SUCCEEDED\"",
        ],
    )
    .await?;

    // A worker that says it is ready and never consumes: where the request is.
    refused(
        text.replace(
            command_line,
            "command = \"echo {worker_id}@racecert ready.; exec sleep 60\"",
        ),
        &[
            "no worker consumed request",
            "the queue \"celery\" holds 1 message(s)",
        ],
    )
    .await?;
    Ok(())
}

/// The apalis example, both ways a team describes it.
///
/// First its own `cargo test` (racecert as its dev-dependency, the system described with the
/// builder, a test bed of its own): its naive handler is caught, its fenced one certified. Run as
/// a team runs it, in the example's directory with none of this test's cargo variables (they would
/// make its build start over, or build into racecert's target).
///
/// Then its system files on this bed, the binary that build left in the example's target
/// directory: a worker stopped mid-call past its heartbeat deadline has its job requeued and run
/// by the other worker, and when it resumes the naive handler writes too; a crash followed by a
/// restart under the same worker name strands the job (the new process heartbeats for the old
/// one's name). The fenced handler (epoch fence, a name per process) passes both. The files'
/// `setup` (`cargo build`) is left out here: it would build the same binary a second time, with
/// other features (a dev-dependency unifies features in a test build), minutes for nothing;
/// `system_files_that_cannot_work_fail_naming_the_place` covers `setup`. Last, its rollout
/// files: the stale cache and the worker that keeps consuming are caught, the cached one passes.
async fn apalis_example_certifies_itself_from_its_own_cargo_test_and_its_files(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    // The example's build shares this build's target directory: its dependencies are racecert's
    // (one lock file's versions, the same profile), so most are built once, not twice (the
    // second build was most of this test's minutes). Cargo holds that directory's lock only
    // while it compiles, not while these tests run.
    let target = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .context_or("CARGO_TARGET_TMPDIR is a directory inside the target directory")?;
    apalis_example_cargo_test(target, started).await?;
    apalis_heartbeat_files(bed, target).await?;
    apalis_rollout_files(bed, target).await
}

/// Runs the apalis example's own `cargo test` in its directory, building into `target`: its
/// naive handler is caught, its fenced one certified.
async fn apalis_example_cargo_test(
    target: &Path,
    started: std::time::Instant,
) -> anyhow::Result<()> {
    let output = tokio::process::Command::new("cargo")
        .args(["test", "--locked", "--test", "certify"])
        .current_dir(example("apalis-worker"))
        .env_clear()
        .env("CARGO_TARGET_DIR", target)
        .envs(std::env::vars().filter(|(k, _)| {
            matches!(
                k.as_str(),
                "PATH"
                    | "HOME"
                    | "LANG"
                    | "CARGO_HOME"
                    | "RUSTUP_HOME"
                    | "TMPDIR"
                    | "XDG_CACHE_HOME"
                    | "DOCKER_HOST"
            ) || k.starts_with("RACECERT_")
        }))
        .kill_on_drop(true)
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let tail: String = {
        let lines: Vec<&str> = stderr.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    };
    eprintln!(
        "apalis example's cargo test: {:?} (build included)",
        started.elapsed()
    );
    anyhow::ensure!(
        output.status.success()
            && stdout.contains("test naive_handler_is_caught ... ok")
            && stdout.contains("test fenced_handler_is_certified ... ok"),
        "cargo test in examples/apalis-worker: {}\n{stdout}\n{tail}",
        output.status
    );
    Ok(())
}

/// One of the apalis example's system files, its `setup` left out and its command pointed at the
/// binary the example's `cargo test` built in `target`.
fn load_apalis_system(target: &Path, file: &str) -> anyhow::Result<System> {
    let mut system = System::load(&example(file))?;
    anyhow::ensure!(system.start.setup.is_some(), "{file} builds the example");
    system.start.setup = None;
    // The files name the binary their `setup` builds, in the example's own target
    // directory; the cargo test above built it in the shared one.
    const BUILT: &str = "./target/debug/apalis-worker";
    let command = &system.start.command;
    anyhow::ensure!(command.starts_with(BUILT), "{file} runs {BUILT}: {command}");
    let binary = target.join("debug/apalis-worker");
    system.start.command = command.replacen(BUILT, &binary.display().to_string(), 1);
    Ok(system)
}

/// The apalis naive and fenced files under a missed heartbeat and a same-name restart: the naive
/// handler writes twice and strands a job, the fenced one passes.
async fn apalis_heartbeat_files(bed: &TestBed, target: &Path) -> anyhow::Result<()> {
    let faults = [FaultKind::HeartbeatMiss, FaultKind::KillMain];
    let naive = load_apalis_system(target, "apalis-worker/naive.toml")?;
    let outcome = run_system(bed, &naive, &settings(&faults)).await?;
    let text = summary(&outcome);
    let invariants = |n: usize| -> Vec<&str> {
        outcome.cases[n]
            .violations
            .iter()
            .map(|v| v.invariant.name())
            .collect()
    };
    anyhow::ensure!(
        outcome.cases.len() == 2
            && invariants(0) == ["at-most-one-final-write"]
            && invariants(1) == ["no-lost-job", "no-stuck-delivery"],
        "naive: two final writes after missed heartbeats, a lost job (its row Running in apalis.jobs) after a same-name restart:\n{text}"
    );
    let fenced = load_apalis_system(target, "apalis-worker/fenced.toml")?;
    let outcome = run_system(bed, &fenced, &settings(&faults)).await?;
    let text = summary(&outcome);
    anyhow::ensure!(
        outcome.passed() && outcome.cases.len() == 2 && outcome.cases[0].model_calls == 2,
        "fenced: passes, the requeued job ran twice and wrote once:\n{text}"
    );
    Ok(())
}

/// The apalis rollout files: the stale cache and the draining worker caught, the cached one
/// passing.
async fn apalis_rollout_files(bed: &TestBed, target: &Path) -> anyhow::Result<()> {
    // The rollout files: a Redis result cache whose key lacks the version serves v2 the entry
    // v1 wrote; a SIGTERM handler of the team's own keeps the worker consuming; the versioned
    // cache passes both rollout faults, each landed.
    for (file, fault, broken, what) in [
        (
            "apalis-worker/stale-cache.toml",
            FaultKind::Cutover,
            "no-stale-cache-read",
            "the v2 worker is served v1's entry after the cutover",
        ),
        (
            "apalis-worker/draining.toml",
            FaultKind::Drain,
            "drain-discipline",
            "the worker takes the next job after its stop signal",
        ),
    ] {
        let outcome =
            run_system(bed, &load_apalis_system(target, file)?, &settings(&[fault])).await?;
        let text = summary(&outcome);
        anyhow::ensure!(
            outcome.cases.len() == 1
                && outcome.cases[0].landed
                && outcome.cases[0]
                    .violations
                    .iter()
                    .any(|v| v.invariant.name() == broken),
            "{file}: {what}:\n{text}"
        );
    }
    let cached = load_apalis_system(target, "apalis-worker/cached.toml")?;
    let faults = [FaultKind::Cutover, FaultKind::Drain];
    let outcome = run_system(bed, &cached, &settings(&faults)).await?;
    let text = summary(&outcome);
    anyhow::ensure!(
        outcome.passed() && outcome.cases.len() == 2 && outcome.cases.iter().all(|c| c.landed),
        "cached: passes both rollout faults, each landed:\n{text}"
    );
    Ok(())
}

/// prefetch > 1: worker-a runs with Celery's prefetch multiplier raised through the variable the
/// Celery CLI reads (`CELERY_WORKER_PREFETCH_MULTIPLIER`, the app's own setting is 1) and
/// reserves the request behind a slow task; the reserved delivery outlives the visibility timeout
/// without ever starting, a worker start's sweep restores it, and the request runs twice. The
/// naive task writes twice; the fenced one refuses the second run (its row is final).
async fn celery_prefetch_restore_catches_naive_and_fenced_passes(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let faults = [FaultKind::PrefetchRestore];
    let naive = System::load(&example("celery-worker/naive.toml"))?;
    let started = std::time::Instant::now();
    let outcome = run_system(bed, &naive, &settings(&faults)).await?;
    let text = summary(&outcome);
    eprintln!("naive prefetch-restore: {:?}\n{text}", started.elapsed());
    let case = outcome.cases.first().context_or(&text)?;
    let broke: Vec<&str> = case.violations.iter().map(|v| v.invariant.name()).collect();
    anyhow::ensure!(
        broke == ["at-most-one-final-write"] && case.final_writes == 2,
        "naive: the prefetched request runs twice and writes twice:\n{text}"
    );
    anyhow::ensure!(
        case.diagram.iter().any(|a| a
            .label
            .contains("reserved (prefetched) behind the slow task")),
        "the request was really held in the worker's prefetch:\n{text}"
    );
    anyhow::ensure!(
        outcome.log.iter().any(|l| l.worker == "worker-a"
            && l.line.contains("redelivered=true")
            && l.line.contains(&case.request)),
        "the second run is Celery's redelivery of the same message:\n{text}"
    );

    let fenced = System::load(&example("celery-worker/fenced.toml"))?;
    let started = std::time::Instant::now();
    let outcome = run_system(bed, &fenced, &settings(&faults)).await?;
    let text = summary(&outcome);
    eprintln!("fenced prefetch-restore: {:?}\n{text}", started.elapsed());
    let case = outcome.cases.first().context_or(&text)?;
    anyhow::ensure!(
        outcome.passed() && case.final_writes == 1,
        "fenced: one final write:\n{text}"
    );
    anyhow::ensure!(
        outcome
            .log
            .iter()
            .any(|l| l.line.contains(&case.request) && l.line.contains("redelivered=true")),
        "fenced: the restored delivery did run again (and found the row final):\n{text}"
    );
    Ok(())
}

trait ContextOr<T> {
    fn context_or(self, text: &str) -> anyhow::Result<T>;
}

impl<T> ContextOr<T> for Option<T> {
    fn context_or(self, text: &str) -> anyhow::Result<T> {
        self.ok_or_else(|| anyhow::anyhow!("no case ran:\n{text}"))
    }
}

fn racecert_cli(args: &[&str]) -> std::io::Result<std::process::Output> {
    std::process::Command::new(env!("CARGO_BIN_EXE_racecert"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("REDIS_URL")
        .env_remove("DATABASE_URL")
        .env_remove("TOXIPROXY_URL")
        .output()
}

/// `racecert replay LOG --system FILE`: the log the naive Celery workers wrote during a caught run
/// (Celery's own lines and the task's, as `docker compose logs` shows them) is diagnosed, and its
/// diagnoses are re-created with Celery's faults on the team's system: reproduced on the naive
/// task, prevented by the fenced one. A log with nothing to reconstruct exits 2; a system file
/// that cannot load is named with its line and column.
async fn celery_incident_log_replays_on_the_team_system(bed: &TestBed) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("racecert-sys-replay-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let naive_file = example("celery-worker/naive.toml");
    let fenced_file = example("celery-worker/fenced.toml");

    // The incident: a caught run of the naive example, its workers' log.
    let naive = System::load(&naive_file)?;
    let outcome = run_system(bed, &naive, &settings(&[FaultKind::ForcedRestore])).await?;
    anyhow::ensure!(
        !outcome.passed(),
        "the run must be caught:\n{}",
        summary(&outcome)
    );
    let log = racecert::report::system::workers_log(&outcome);
    let log_path = dir.join("incident.log");
    std::fs::write(&log_path, &log)?;
    let analysis = racecert::replay::analyse(log.as_bytes(), None);
    anyhow::ensure!(
        analysis.malformed.is_empty(),
        "every line of the workers' own output is read or skipped as a known shape:\n{}",
        analysis.text()
    );
    let causes: Vec<&str> = analysis.findings.iter().map(|f| f.cause.name()).collect();
    anyhow::ensure!(
        causes.contains(&"multiple-final-writes"),
        "the naive run's own log shows two final writes (diagnosed: {causes:?}):\n{}\n{log}",
        analysis.text()
    );

    // The CLI starts a test bed of its own; ours only needs to stay out of the way.
    let _shared = bed.shared().await;
    let log_arg = log_path.display().to_string();
    for (file, code, verdict) in [
        (&naive_file, 1, "REPRODUCED on the team's worker"),
        (&fenced_file, 0, "prevented by the team's worker"),
    ] {
        let started = std::time::Instant::now();
        let file_arg = file.display().to_string();
        let out = racecert_cli(&["replay", &log_arg, "--system", &file_arg])?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        eprintln!(
            "replay --system {}: exit {:?} in {:?}",
            file.display(),
            out.status.code(),
            started.elapsed()
        );
        anyhow::ensure!(
            out.status.code() == Some(code)
                && stdout.contains("cause multiple-final-writes")
                && stdout.contains(verdict)
                && stdout.contains("forced-restore"),
            "replay {} --system {}: exit {:?}\n{stdout}\n{stderr}",
            log_arg,
            file.display(),
            out.status.code()
        );
        if code == 1 {
            anyhow::ensure!(
                stdout.contains("replay: racecert replay --system")
                    && stdout.contains("sequence diagram of case"),
                "a reproduced diagnosis names its case's replay and diagram:\n{stdout}"
            );
        }
    }

    // Nothing to reconstruct: exit 2, said clearly.
    let empty = dir.join("banner.log");
    std::fs::write(
        &empty,
        "worker-a | celery@x ready? no: only a banner line\n",
    )?;
    let out = racecert_cli(&[
        "replay",
        &empty.display().to_string(),
        "--system",
        &naive_file.display().to_string(),
    ])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(
        out.status.code() == Some(2) && stderr.contains("nothing to replay"),
        "exit {:?}: {stderr}",
        out.status.code()
    );

    // A system file that cannot load: its file, line and column.
    let broken = dir.join("broken.toml");
    std::fs::write(
        &broken,
        std::fs::read_to_string(&naive_file)?.replace("[results]", "[results]\ncolour = 1"),
    )?;
    let out = racecert_cli(&[
        "replay",
        &log_arg,
        "--system",
        &broken.display().to_string(),
    ])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let results_line = std::fs::read_to_string(&broken)?
        .lines()
        .position(|l| l == "colour = 1")
        .map(|i| i + 1)
        .unwrap_or_default();
    anyhow::ensure!(
        out.status.code() != Some(0) && stderr.contains(&format!("broken.toml:{results_line}:1")),
        "exit {:?}: {stderr}",
        out.status.code()
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The fenced task without `reject_on_worker_lost`: every redelivery is fenced, but a pool child
/// killed mid-task has its message acked (Celery's default), so the job is lost. Only the kill of
/// the child holding the job shows it; the default run draws every kind of the preset in turn, so
/// it gets there.
async fn celery_fenced_but_acked_loses_a_job_when_its_pool_child_is_killed(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let system = System::load(&example("celery-worker/fenced-acked.toml"))?;
    let mut settings = SystemSettings::certify(1);
    settings.budget = Duration::from_secs(300);
    let outcome = run_system(bed, &system, &settings).await?;
    let text = summary(&outcome);
    let failing = outcome
        .first_failure()
        .ok_or_else(|| anyhow::anyhow!("the lost job was not found:\n{text}"))?;
    anyhow::ensure!(
        failing.fault == FaultKind::KillPoolChild
            && failing
                .violations
                .iter()
                .any(|v| v.invariant.name() == "no-lost-job")
            && failing.landed,
        "the pool child holding the job was killed and the job lost:\n{text}"
    );
    Ok(())
}

/// `[submit] command`: the example's own `submit.py`, as docs/systems.md writes it, unquoted,
/// after an INSERT of the row as a team's API does before enqueueing. The case's input has spaces
/// (`... hello world N`), which racecert quotes for the shell, so both get it as one argument;
/// the fenced task ends the request with one final write; the INSERT came through the
/// submitter's own links, so it is the submitter's, not a worker's. The restore faults, which
/// need the delivery's tag, land: racecert reads it from the message the command pushed.
async fn celery_submitted_by_the_teams_own_command_with_spaces_in_the_input(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let path = example("celery-worker/fenced.toml");
    let insert = "{venv}/bin/python -c \\\"import os, sys, psycopg; c = psycopg.connect(os.environ['DATABASE_URL']); c.execute('INSERT INTO inference_results (request_id, input) VALUES (%s, %s)', sys.argv[1:3]); c.commit()\\\" {request_id} {input}";
    let text = std::fs::read_to_string(&path)?.replace(
        "task = \"tasks.infer_fenced\"\nargs = { request_id = \"{request_id}\", input = \"{input}\" }   # sent as kwargs\nqueue = \"celery\"\n",
        &format!("command = \"{insert} && {{venv}}/bin/python submit.py {{request_id}} {{input}} --fenced\"\n"),
    );
    anyhow::ensure!(
        text.contains("submit.py {request_id}"),
        "the [submit] table was replaced"
    );
    let system = System::parse(&text, &path)?;
    let faults = [
        FaultKind::KillMain,
        FaultKind::ForcedRestore,
        FaultKind::PrefetchRestore,
    ];
    let outcome = run_system(bed, &system, &settings(&faults)).await?;
    let text = summary(&outcome);
    let case = outcome.cases.first();
    anyhow::ensure!(
        outcome.held() && outcome.cases.iter().all(|c| c.final_writes == 1),
        "each request submitted by the command ends with one final write:\n{text}"
    );
    // The command's LPUSH crossed racecert's proxy: the delivery tag the restores need was read
    // from the wire, so both land as they do with the preset's own message.
    for case in &outcome.cases[1..] {
        anyhow::ensure!(
            case.landed
                && case
                    .diagram
                    .iter()
                    .any(|a| a.label.contains("the submitter pushed message")),
            "case {} ({}) landed with the tag read from the submitter's push:\n{text}",
            case.number,
            case.fault
        );
    }
    let inserts: Vec<Option<&str>> = case
        .into_iter()
        .flat_map(|c| &c.writes)
        .filter(|w| w.operation == "INSERT")
        .map(|w| w.writer.as_deref())
        .collect();
    anyhow::ensure!(
        inserts == [Some(racecert::runner::system::SUBMITTER)],
        "the submitter's INSERT is its own: {inserts:?}\n{text}"
    );
    Ok(())
}

/// RQ, a framework racecert has no preset for (`framework = "custom"`), runs each job in a work
/// horse it forks into a process group of its own. `kill-holder` kills the process whose
/// connection holds the job's model call, the horse: landed. The naive job, enqueued without a
/// retry, is then lost (RQ moves it to its failed registry, the row stays RUNNING): FAILED by
/// `no-lost-job`. The safe one (RQ's `Retry`, an epoch on its final write, named in
/// `[fencing]`) is run again and ends once, with the fencing invariants judged by its epoch.
/// `kill-main`, the SIGKILL of the worker's process group, leaves the horse running: the run
/// says the process in the call survived it. The unguarded job (the epoch taken, not required
/// by its final write) is caught by the fencing invariant when the API submits again.
async fn rq_a_crash_kills_the_work_horse_that_holds_the_job_on_a_framework_without_a_preset(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let naive = System::load(&example("rq-worker/naive.toml"))?;
    let outcome = run_system(bed, &naive, &settings(&[FaultKind::KillHolder])).await?;
    let text = summary(&outcome);
    let case = outcome.cases.first().context_or("no case ran")?;
    anyhow::ensure!(
        case.fault == FaultKind::KillHolder
            && case.landed
            && case
                .violations
                .iter()
                .any(|v| v.invariant.name() == "no-lost-job"),
        "the naive job's horse was killed holding it and the job lost:\n{text}"
    );

    let safe = System::load(&example("rq-worker/safe.toml"))?;
    let outcome = run_system(
        bed,
        &safe,
        &settings(&[FaultKind::KillHolder, FaultKind::KillMain]),
    )
    .await?;
    let text = summary(&outcome);
    let holder = outcome
        .cases
        .iter()
        .find(|c| c.fault == FaultKind::KillHolder)
        .context_or("no kill-holder case")?;
    anyhow::ensure!(
        outcome.passed()
            && holder.landed
            && holder.final_writes == 1
            && !holder
                .not_judged
                .iter()
                .any(|i| i.name() == "no-non-owner-final-write"),
        "the safe job's horse was killed holding it, RQ's retry ended it once, fencing judged:\n{text}"
    );
    let main = outcome
        .cases
        .iter()
        .find(|c| c.fault == FaultKind::KillMain)
        .context_or("no kill-main case")?;
    anyhow::ensure!(
        main.effect
            .as_ref()
            .is_some_and(|e| e.to_string().contains("survived it")),
        "the group's SIGKILL left the horse in its own group running, and the run says so:\n{text}"
    );

    let unguarded = System::load(&example("rq-worker/unguarded.toml"))?;
    let outcome = run_system(bed, &unguarded, &settings(&[FaultKind::ApiResubmission])).await?;
    let text = summary(&outcome);
    anyhow::ensure!(
        outcome.cases.iter().any(|c| c
            .violations
            .iter()
            .any(|v| v.invariant.name() == "no-non-owner-final-write")),
        "the older attempt's final write under the newer attempt's epoch is caught:\n{text}"
    );

    // An API that stores the request first refuses it when it comes again: a protection the
    // run shows, not a configuration error.
    let path = example("rq-worker/safe.toml");
    let text = std::fs::read_to_string(&path)?.replace("--job safe\"", "--job safe --insert\"");
    anyhow::ensure!(text.contains("--insert"), "the submit command was replaced");
    let refusing = System::parse(&text, &path)?;
    let outcome = run_system(bed, &refusing, &settings(&[FaultKind::ApiResubmission])).await?;
    let report = racecert::report::system::system_text(&outcome, &path);
    let refused = outcome.cases.first().is_some_and(|c| {
        c.landed
            && c.effect
                .as_ref()
                .is_some_and(|e| e.to_string().contains("the API refused it"))
    });
    anyhow::ensure!(
        outcome.passed() && refused && report.contains("already accepted"),
        "the refused resubmission is the API's protection, shown in the report:\n{report}"
    );
    // No work horse outlives its run, not even one `kill-main` orphaned.
    let left: Vec<String> = procfs::process::all_processes()?
        .flatten()
        .filter_map(|p| p.cmdline().ok())
        .map(|args| args.join(" "))
        .filter(|line| line.contains("bin/rq worker inference"))
        .collect();
    anyhow::ensure!(left.is_empty(), "RQ processes left behind: {left:?}");
    Ok(())
}

/// The Dramatiq preset on Dramatiq's own Redis broker: racecert writes Dramatiq's message, and a
/// worker paused past its heartbeat timeout has its live message requeued by another worker's
/// maintenance pass. The naive actor then writes twice; the safe actor's epoch refuses the
/// paused attempt's late write, and a killed worker process's message comes back and ends once.
async fn dramatiq_a_worker_paused_past_its_heartbeat_writes_twice_and_the_safe_actor_passes(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let naive = System::load(&example("dramatiq-worker/naive.toml"))?;
    let outcome = run_system(bed, &naive, &settings(&[FaultKind::HeartbeatMiss])).await?;
    let text = summary(&outcome);
    let case = outcome.cases.first().context_or("no case ran")?;
    anyhow::ensure!(
        case.landed
            && case.model_calls == 2
            && case
                .violations
                .iter()
                .any(|v| v.invariant.name() == "at-most-one-final-write"),
        "the paused worker's message ran again elsewhere and both attempts wrote:\n{text}"
    );

    let safe = System::load(&example("dramatiq-worker/safe.toml"))?;
    let faults = [FaultKind::HeartbeatMiss, FaultKind::KillHolder];
    let outcome = run_system(bed, &safe, &settings(&faults)).await?;
    let text = summary(&outcome);
    anyhow::ensure!(
        outcome.passed()
            && outcome.cases.len() == 2
            && outcome
                .cases
                .iter()
                .all(|c| c.landed && c.model_calls == 2 && c.final_writes == 1),
        "each fault ran the message twice and the epoch let one attempt write:\n{text}"
    );
    let holder = &outcome.cases[1];
    anyhow::ensure!(
        holder.effect.as_ref().is_some_and(|e| {
            let shown = e.to_string();
            shown.contains("dramatiq") && shown.contains("the worker restarted")
        }),
        "the process killed was Dramatiq's worker process, and its main process exited:\n{text}"
    );
    Ok(())
}

/// Dramatiq's retries and a model call that outlasts the actor's own timeout: an actor with no
/// retries and no failure write loses the request (dead-lettered, its row RUNNING); the safe
/// actor whose HTTP client tries again at once (the second try held too) passes, its liveness
/// judged only once both held calls were answered.
async fn dramatiq_a_timed_out_actor_without_retries_loses_its_job_and_one_retrying_at_once_passes(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let lost = System::load(&example("dramatiq-worker/lost.toml"))?;
    let outcome = run_system(bed, &lost, &settings(&[FaultKind::UpstreamTimeout])).await?;
    let text = summary(&outcome);
    let case = outcome.cases.first().context_or("no case ran")?;
    anyhow::ensure!(
        case.landed
            && case.final_writes == 0
            && case
                .violations
                .iter()
                .any(|v| v.invariant.name() == "no-lost-job"),
        "the timed-out message was dead-lettered and its row left RUNNING:\n{text}"
    );

    let retrying = System::load(&example("dramatiq-worker/retry-at-once.toml"))?;
    let outcome = run_system(bed, &retrying, &settings(&[FaultKind::UpstreamTimeout])).await?;
    let text = summary(&outcome);
    let case = outcome.cases.first().context_or("no case ran")?;
    anyhow::ensure!(
        outcome.passed() && case.landed && case.model_calls >= 2 && case.final_writes == 1,
        "the try again at once was held too, and the request was judged once it ended:\n{text}"
    );
    Ok(())
}

/// Dramatiq's time limit firing in a model call: the call is answered after the actor's
/// `time_limit` passed (below its HTTP timeout), the `TimeLimit` middleware's exception reaches
/// the thread as the answer arrives, and the attempt drops it. The safe actor's retry writes
/// once; the lost actor (no retries, no failure write) leaves its row `RUNNING`.
async fn dramatiq_the_time_limit_drops_a_late_answer_the_safe_actor_retries_and_the_lost_one_loses_it(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let faults = [FaultKind::TimeLimit];
    let safe = System::load(&example("dramatiq-worker/safe.toml"))?;
    let outcome = run_system(bed, &safe, &settings(&faults)).await?;
    let text = summary(&outcome);
    let case = outcome.cases.first().context_or("no case ran")?;
    anyhow::ensure!(
        outcome.passed() && case.landed && case.model_calls == 2 && case.final_writes == 1,
        "the interrupted attempt dropped its answer and the retry wrote once:\n{text}"
    );
    let lost = System::load(&example("dramatiq-worker/lost.toml"))?;
    let outcome = run_system(bed, &lost, &settings(&faults)).await?;
    let text = summary(&outcome);
    let case = outcome.cases.first().context_or("no case ran")?;
    let broke: Vec<&str> = case.violations.iter().map(|v| v.invariant.name()).collect();
    anyhow::ensure!(
        case.landed && case.final_writes == 0 && broke.contains(&"no-lost-job"),
        "the interrupted message was dead-lettered and its row left RUNNING:\n{text}"
    );
    Ok(())
}

/// no-stuck-delivery from the broker's own record: the resuming task retries its refused final
/// write for ever (a new message a second later, each refused), so after a forced restore the
/// late attempt's message is still in the queue or kombu's `unacked` when the drain's bound
/// ends, though the row ended once and right. The fenced task, whose late attempt discards its
/// result and is acknowledged, passes with the invariant judged.
async fn celery_a_late_attempt_retrying_its_refused_write_for_ever_is_a_stuck_delivery(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let faults = [FaultKind::ForcedRestore];
    let resuming = System::load(&example("celery-worker/resuming.toml"))?;
    let outcome = run_system(bed, &resuming, &settings(&faults)).await?;
    let text = summary(&outcome);
    let case = outcome.cases.first().context_or(&text)?;
    let broke: Vec<&str> = case.violations.iter().map(|v| v.invariant.name()).collect();
    anyhow::ensure!(
        case.landed && broke == ["no-stuck-delivery"] && case.final_writes == 1,
        "the late attempt's message is held for ever, the row written once:\n{text}"
    );
    let stuck = &case.violations[0];
    anyhow::ensure!(
        stuck.observed.contains("the broker holds it in")
            && (stuck.observed.contains("unacked") || stuck.observed.contains("the queue")),
        "the verdict says where the broker holds it: {stuck:#?}"
    );
    let fenced = System::load(&example("celery-worker/fenced.toml"))?;
    let outcome = run_system(bed, &fenced, &settings(&faults)).await?;
    let text = summary(&outcome);
    anyhow::ensure!(
        outcome.passed()
            && outcome.cases[0].landed
            && !outcome.cases[0]
                .not_judged
                .iter()
                .any(|i| i.name() == "no-stuck-delivery"),
        "the fenced task passes with no-stuck-delivery judged:\n{text}"
    );
    Ok(())
}
