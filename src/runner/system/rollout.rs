//! The rollout faults of a system case, as the system file's `[rollout]` says the team does it:
//! `drain` (the worker holding a job replaced while the next job arrives), `cutover` /
//! `cache-invalidation-lag` (the switch to the next version while the old one holds a request,
//! the old worker replaced, then the same input asked of the new version, with the team's
//! invalidation step where it runs or late) and `backend-switch` (what a shared model URL
//! reaches switched under a running worker). Each records what the invariants judge: the
//! switch, every stop signal, the invalidation.

use super::case::CaseCtx;
use super::fleet::with_path;
use super::now_ms;
use crate::Result;
use crate::env::backends::{Behaviour, release_all};
use crate::history::Observation;
use crate::system::fill_shell;
use crate::system::rollout::{Invalidate, InvalidateAt};
use nix::sys::signal::kill;
use nix::unistd::Pid;
use redis::AsyncCommands;
use std::time::{Duration, Instant};
use tokio::process::Command;

/// How long a grace period outlasts the job in hand when the file sets none: the job ends
/// within it (a worker that drains exits), and a worker that took the next job is still in
/// that job's model call when the grace runs out.
const GRACE_AFTER_CALL: Duration = Duration::from_secs(2);

/// How long an invalidation command may run.
const INVALIDATE_BOUND: Duration = Duration::from_secs(30);

impl CaseCtx<'_, '_> {
    /// The grace period of a worker told to stop now: the file's, or the job in hand's
    /// remaining model call + [`GRACE_AFTER_CALL`].
    fn grace(&self) -> Duration {
        self.system.rollout.grace.unwrap_or_else(|| {
            let call_ends = self.aim.call_started.unwrap_or_else(Instant::now) + self.aim.slow;
            call_ends.saturating_duration_since(Instant::now()) + GRACE_AFTER_CALL
        })
    }

    /// Sends worker `index` the rollout's stop signal and records it; None when it has no
    /// process to signal.
    fn signal_stop(&mut self, index: usize, why: &str) -> Option<Instant> {
        let pid = self.fleet.workers[index].main_pid()?;
        let signal = self.system.rollout.stop_signal;
        let _ = kill(Pid::from_raw(pid), signal);
        let id = self.fleet.workers[index].id.clone();
        self.observations.push((
            now_ms(),
            Observation::Stopping {
                worker: id.clone(),
                signal: signal.as_str().to_owned(),
            },
        ));
        self.note(
            &id,
            &id,
            format!("{} (its stop signal: {why}) mid-job", signal.as_str()),
            "fault",
        );
        Some(Instant::now())
    }

    /// Waits out the grace period begun at `signalled`; a worker still running at its end is
    /// killed, as an orchestrator does. Returns whether it had to be.
    async fn end_grace(&mut self, index: usize, signalled: Instant, grace: Duration) -> bool {
        let until = signalled + grace;
        while !self.fleet.exited(index) && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let killed = !self.fleet.exited(index);
        if killed {
            self.fleet.kill(index).await;
            let id = self.fleet.workers[index].id.clone();
            self.note(
                &id,
                &id,
                "grace period over, still running: SIGKILL",
                "fault",
            );
        }
        killed
    }

    /// Starts worker `index`, the new version's, as the rollout's replacement.
    async fn start_replacement(&mut self, index: usize) -> Result<()> {
        self.fleet.start(index).await?;
        let id = self.fleet.workers[index].id.clone();
        self.note(&id, &id, "started: the replacement", "message");
        Ok(())
    }

    /// Records the rollout's switch from `from` to `to`, now: requests accepted from here (and
    /// the file's mixed window) belong to `to`.
    fn record_switch(&mut self, from: &str, to: &str) {
        let window = self
            .system
            .rollout
            .served_by_new_version
            .unwrap_or_default();
        self.observations.push((
            now_ms(),
            Observation::Switched {
                from: from.to_owned(),
                to: to.to_owned(),
                window_ms: window.as_millis() as u64,
            },
        ));
    }

    /// Sets the active-version key (if the file has one) to `version`'s value.
    pub(super) async fn set_active(&mut self, version: &str) -> Result<()> {
        let rollout = &self.system.rollout;
        let Some(key) = rollout.active_key.clone() else {
            return Ok(());
        };
        let value = rollout.active_value(version).to_owned();
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(&value)
            .query_async(self.rd)
            .await?;
        self.note("racecert", "redis", format!("SET {key} {value}"), "message");
        Ok(())
    }

    /// Runs the team's invalidation step for a rollout away from `from`, and records it.
    async fn invalidate(&mut self, from: &str, when: &str) -> Result<()> {
        let Some(step) = self.system.rollout.invalidate.clone() else {
            return Ok(());
        };
        let detail = match step {
            Invalidate::Keys(patterns) => {
                let mut deleted = 0usize;
                for pattern in &patterns {
                    let pattern = pattern.replace("{version}", from);
                    let keys: Vec<String> = {
                        let mut iter = self.rd.scan_match::<_, String>(&pattern).await?;
                        let mut keys = Vec::new();
                        while let Some(key) = futures::StreamExt::next(&mut iter).await {
                            keys.push(key?);
                        }
                        keys
                    };
                    if !keys.is_empty() {
                        let n: usize = redis::cmd("DEL").arg(&keys).query_async(self.rd).await?;
                        deleted += n;
                    }
                }
                format!("{} deleted ({deleted} key(s))", patterns.join(", "))
            }
            Invalidate::Command(template) => {
                let command = self
                    .team_command(
                        &template,
                        &[("version", from)],
                        "rollout.invalidate_command",
                        "invalidation command",
                        INVALIDATE_BOUND,
                    )
                    .await?;
                format!("`{command}` ran")
            }
        };
        self.observations.push((
            now_ms(),
            Observation::Invalidated {
                detail: detail.clone(),
            },
        ));
        self.note(
            "racecert",
            "redis",
            format!("cache invalidation ({when}): {detail}"),
            "fault",
        );
        Ok(())
    }

    /// Whether `request` has a final write in the audit trail.
    async fn final_written(&mut self, request: &str) -> Result<bool> {
        let finals: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM racecert_audit WHERE request_key = $1 AND new_status = ANY($2)",
        )
        .bind(request)
        .bind(&self.system.results.terminal)
        .fetch_one(&mut *self.pg)
        .await?;
        Ok(finals > 0)
    }

    /// Runs a command of the team's (its submit or invalidation step) with `sh -c` in the
    /// workers' directory, with the submitter's links as `{redis_url}` and `{database_url}`;
    /// a failure is the file's error at `field`. Returns the command as run.
    pub(super) async fn team_command(
        &mut self,
        template: &str,
        values: &[(&str, &str)],
        field: &str,
        what: &str,
        bound: Duration,
    ) -> Result<String> {
        let (command, output) = self
            .run_team_command(template, values, field, what, bound)
            .await?;
        if !output.status.success() {
            return Err(crate::Error::Config(format!(
                "{}: {what} `{command}` failed ({}):\n{}",
                self.system.place(field),
                output.status,
                super::tail(&String::from_utf8_lossy(&output.stderr), 20)
            )));
        }
        Ok(command)
    }

    /// Runs one of the team's commands as [`CaseCtx::team_command`] does, and returns how it
    /// ended whatever it was: for a command whose failure is the system's answer (an API that
    /// refuses a duplicate request), not the file's error. Only a command that cannot run or
    /// outlives `bound` is an error.
    pub(super) async fn run_team_command(
        &mut self,
        template: &str,
        values: &[(&str, &str)],
        field: &str,
        what: &str,
        bound: Duration,
    ) -> Result<(String, std::process::Output)> {
        let system = self.system;
        // The submitter's own links (its writes are its own on the wire).
        let submitter = self
            .fleet
            .submitter
            .as_ref()
            .unwrap_or(&self.fleet.workers[0]);
        let redis_url = with_path(submitter.links.redis_url(), &self.redis_db.to_string());
        let database_url = with_path(submitter.links.database_url(), &self.database);
        let venv = self.venv.clone();
        let mut all = vec![
            ("venv", venv.as_str()),
            ("redis_url", redis_url.as_str()),
            ("database_url", database_url.as_str()),
            ("model_url", submitter.model_url.as_str()),
            ("worker_id", submitter.id.as_str()),
            ("model_version", submitter.version.as_str()),
        ];
        all.extend_from_slice(values);
        let settings = self.system.settings_values();
        all.extend(settings.iter().map(|(name, value)| (*name, value.as_str())));
        let command = fill_shell(template, &all);
        let run = Command::new("sh")
            .arg("-c")
            .arg(&command)
            .current_dir(&system.start.workdir)
            .envs(submitter.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .kill_on_drop(true)
            .output();
        let output = match tokio::time::timeout(bound, run).await {
            Ok(output) => {
                output.map_err(|err| crate::Error::io(format!("{what} `{command}`"), err))?
            }
            Err(_) => {
                return Err(crate::Error::Config(format!(
                    "{}: {what} `{command}` ran longer than {bound:?}",
                    system.place(field)
                )));
            }
        };
        Ok((command, output))
    }
}

/// `drain`: the stop signal to the worker holding the request, mid-job; the next job
/// submitted; the grace period; SIGKILL if it is still running; then its replacement (the other
/// worker, the next version), started once the old one is gone, as a rolling update without
/// surge does.
pub(super) async fn drain(ctx: &mut CaseCtx<'_, '_>, worker: usize) -> Result<Option<String>> {
    let grace = ctx.grace();
    let Some(signalled) = ctx.signal_stop(worker, "drain") else {
        return Ok(None);
    };
    // The rollout begins with the stop signal: from here requests belong to the next version.
    let other = ctx.aim.other;
    let (from, to) = (
        ctx.fleet.workers[worker].version.clone(),
        ctx.fleet.workers[other].version.clone(),
    );
    if from != to {
        ctx.record_switch(&from, &to);
    }
    let next_id = format!("{}-next", ctx.prefix);
    let next_input = format!("{} next job", ctx.prefix);
    ctx.judged_too.push((next_id.clone(), next_input.clone()));
    ctx.companions.push(next_input.clone());
    ctx.submit(&next_id, &next_input).await?;
    let killed = ctx.end_grace(worker, signalled, grace).await;
    release_all(std::mem::take(&mut ctx.aim.slow_guards)).await;
    if other != worker {
        ctx.start_replacement(other).await?;
    }
    Ok(Some(format!(
        "{} mid-job, the next job submitted, grace {} ms{}, then the replacement",
        ctx.system.rollout.stop_signal.as_str(),
        grace.as_millis(),
        if killed {
            ", then SIGKILL (still running)"
        } else {
            " (it exited within it)"
        }
    )))
}

/// `cutover` (and, with `late`, `cache-invalidation-lag`): while `worker` (the old version)
/// is in the request's model call, the rollout switches to the next version (its active key,
/// the invalidation step if it runs at the switch); the new worker starts (before the old one
/// is told to stop with surge, after it is gone without); the old one gets its stop signal and
/// grace; the invalidation step runs where the file says, or, late, only after the new version
/// answered; and the same input is submitted again as a request of its own, accepted after the
/// switch. A cache the old attempt filled (or filled again after an early invalidation) is what
/// that request meets.
pub(super) async fn roll_out(
    ctx: &mut CaseCtx<'_, '_>,
    worker: usize,
    late: bool,
) -> Result<Option<String>> {
    let rollout = &ctx.system.rollout;
    let (surge, at) = (rollout.surge, rollout.invalidate_at);
    let new = ctx.aim.other;
    let Some((_, input)) = ctx.aim.request.clone() else {
        return Ok(None);
    };
    if new == worker || ctx.fleet.workers[new].version == ctx.fleet.workers[worker].version {
        return Ok(None);
    }
    let from = ctx.fleet.workers[worker].version.clone();
    let to = ctx.fleet.workers[new].version.clone();
    // The switch, while the old version's call is in flight.
    ctx.set_active(&to).await?;
    ctx.record_switch(&from, &to);
    ctx.note(
        "racecert",
        "racecert",
        format!("rollout: {from} -> {to}, the old version's call in flight"),
        "fault",
    );
    if !late && at == InvalidateAt::Switch {
        ctx.invalidate(&from, "at the switch").await?;
    }
    if surge {
        ctx.start_replacement(new).await?;
    }
    let grace = ctx.grace();
    let Some(signalled) = ctx.signal_stop(worker, "rollout") else {
        return Ok(None);
    };
    let killed = ctx.end_grace(worker, signalled, grace).await;
    release_all(std::mem::take(&mut ctx.aim.slow_guards)).await;
    if !surge {
        ctx.start_replacement(new).await?;
    }
    if !late && at == InvalidateAt::Drained {
        ctx.invalidate(&from, "once the old workers are gone")
            .await?;
    }
    // The same input, a request of its own, accepted after the switch.
    let after = format!("{}-after", ctx.prefix);
    ctx.judged_too.push((after.clone(), input.clone()));
    ctx.submit(&after, &input).await?;
    if late {
        // The invalidation comes only once the new version answered it (or could not).
        let bound = Instant::now() + ctx.system.model_timeout + Duration::from_secs(10);
        while Instant::now() < bound && !ctx.final_written(&after).await? {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        ctx.invalidate(&from, "late: after the new version answered")
            .await?;
    }
    Ok(Some(format!(
        "switch {from} -> {to} mid-call, {}{}, grace {} ms{}, then {after} with the same input{}",
        if surge {
            "the new worker started first"
        } else {
            "the new worker started once the old was gone"
        },
        match (&ctx.system.rollout.invalidate, late) {
            (None, _) => String::new(),
            (Some(_), true) => ", invalidation held back".to_owned(),
            (Some(_), false) => format!(", invalidation at {}", at.name()),
        },
        grace.as_millis(),
        if killed {
            ", SIGKILL (still running)"
        } else {
            " (it exited within it)"
        },
        if late {
            ", then the invalidation, late"
        } else {
            ""
        }
    )))
}

/// `backend-switch`: the workers share one model URL, and the rollout switches the backend
/// behind it (a load balancer's target, a DNS name) while `worker`, of the old version, is in
/// the request's model call. That call was taken by the old backend and is answered by it; from
/// the switch on, the URL reaches the next version. The worker is not replaced: a request
/// submitted once its call ended goes to it, and it may still record the version it was started
/// with.
pub(super) async fn switch_backend(
    ctx: &mut CaseCtx<'_, '_>,
    worker: usize,
) -> Result<Option<String>> {
    let new = ctx.aim.other;
    let from = ctx.fleet.workers[worker].version.clone();
    let to = ctx.fleet.workers[new].version.clone();
    let Some(position) = ctx.system.versions.iter().position(|(v, _)| *v == from) else {
        return Ok(None);
    };
    if new == worker || from == to || position >= ctx.backends.len() {
        return Ok(None);
    }
    // The switch: what the old URL reaches answers as the next version, for this case's calls
    // from now on (the call in flight was computed by the old one when it arrived).
    let serve = ctx.backends[position]
        .program(
            &ctx.prefix,
            Behaviour::Serve {
                version: to.clone(),
            },
        )
        .await?;
    ctx.set_active(&to).await?;
    ctx.record_switch(&from, &to);
    let id = ctx.fleet.workers[worker].id.clone();
    ctx.note(
        &format!("model {from}"),
        &id,
        format!("backend switch: its URL now reaches {to}; the call in flight stays {from}'s"),
        "fault",
    );
    // Once the call in flight ended, the running worker gets a request of the new version's.
    let call_ends = ctx.aim.call_started.unwrap_or_else(Instant::now) + ctx.aim.slow;
    tokio::time::sleep_until((call_ends + Duration::from_millis(500)).into()).await;
    let after = format!("{}-after", ctx.prefix);
    let input = format!("{} after the switch", ctx.prefix);
    ctx.judged_too.push((after.clone(), input.clone()));
    ctx.submit(&after, &input).await?;
    // The switch holds until that request is answered (or cannot be).
    let bound = Instant::now() + ctx.system.model_timeout + Duration::from_secs(10);
    while Instant::now() < bound && !ctx.final_written(&after).await? {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    serve.release().await;
    Ok(Some(format!(
        "the model URL of {id} switched from {from} to {to} mid-call, then {after} submitted to it"
    )))
}
