//! The plane a fault lands on ([`Plane`]): what a runner can do to the services and workers of
//! its case, the primitives [`apply`](super::apply) composes faults from.

use super::*;

/// What a fault needs from the case it lands in: primitive operations on the case's services and
/// workers. Each runner gives its own (workers parked at checkpoints, free-running tasks, worker
/// processes); [`apply`] decides what to do with them.
pub trait Plane: Send {
    /// The id of worker `worker` (indices wrap around the case's workers).
    fn worker_id(&self, worker: usize) -> String;
    /// The workers' backend timeout: an upstream timeout delays the backend past it.
    fn backend_timeout(&self) -> Duration;
    /// The idempotency key of the case's request `request` (None: no such request).
    fn request_key(&self, request: usize) -> Option<String> {
        let _ = request;
        None
    }
    /// Deletes the lease of `key` now; whether one was held.
    fn expire_lease(&mut self, key: &str) -> impl Future<Output = Result<bool>> + Send {
        let _ = key;
        async { Err(unsupported("expiring a lease")) }
    }
    /// Restarts Redis and waits until it answers again.
    fn restart_redis(&mut self) -> impl Future<Output = Result<()>> + Send {
        async { Err(unsupported("restarting Redis")) }
    }
    /// Cuts (`cut`) or heals the case's link to `target`.
    fn set_link(
        &mut self,
        target: PartitionTarget,
        cut: bool,
    ) -> impl Future<Output = Result<()>> + Send {
        let _ = (target, cut);
        async { Err(unsupported("cutting a link")) }
    }
    /// Switches the active model version; returns the previous one.
    fn cutover(&mut self, to: &str) -> impl Future<Output = Result<Option<String>>> + Send {
        let _ = to;
        async { Err(unsupported("a cutover")) }
    }
    /// Runs the last cutover's late cache invalidation; how many entries it deleted (None: there
    /// was nothing to invalidate).
    fn invalidate_cache(&mut self) -> impl Future<Output = Result<Option<u64>>> + Send {
        async { Err(unsupported("a cache invalidation")) }
    }
    /// Delays `version`'s backend answers by `delay` for the case (until healed).
    fn slow_backend(
        &mut self,
        version: &str,
        delay: Duration,
    ) -> impl Future<Output = Result<()>> + Send {
        let _ = (version, delay);
        async { Err(unsupported("slowing a backend")) }
    }
    /// Makes `version`'s backend answer the case normally again.
    fn recover_backend(&mut self, version: &str) -> impl Future<Output = Result<()>> + Send {
        let _ = version;
        async { Err(unsupported("recovering a backend")) }
    }
    /// Fails `version`'s next `calls` backend calls of the case with HTTP `status`.
    fn fail_backend(
        &mut self,
        version: &str,
        status: u16,
        calls: u64,
    ) -> impl Future<Output = Result<()>> + Send {
        let _ = (version, status, calls);
        async { Err(unsupported("failing a backend")) }
    }
    /// Crashes worker `worker` where it is; returns where it was (a checkpoint, if known), or
    /// None when it had nothing in hand to crash.
    fn crash_worker(
        &mut self,
        worker: usize,
    ) -> impl Future<Output = Result<Option<Option<String>>>> + Send {
        let _ = worker;
        async { Err(unsupported("crashing a worker")) }
    }
    /// Pauses worker `worker` for up to `pause`, then resumes it; how long it really stayed
    /// paused (a runner may wake it early), or None when the runner cannot pause.
    fn pause_worker(
        &mut self,
        worker: usize,
        pause: Duration,
    ) -> impl Future<Output = Result<Option<Duration>>> + Send {
        let _ = (worker, pause);
        async { Ok(None) }
    }
    /// Undoes every lasting fault: links healed, backends answering normally.
    fn heal_all(&mut self) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }

    /// Whether faults of `kind` can apply here; why not, if they cannot (the fault is then
    /// recorded as not applicable, never as applied). By default every kind but the framework
    /// ones, which only a team's system has.
    fn can_apply(&self, kind: FaultKind) -> std::result::Result<(), String> {
        if kind.is_framework() {
            Err(format!(
                "{kind} is a framework's own fault: it applies to a team's system"
            ))
        } else {
            Ok(())
        }
    }

    /// Lets the delivery of the job worker `worker` holds outlive the visibility timeout while its
    /// call runs, then has another worker sweep (restore) it.
    /// Returns what was done, in a phrase, or None when the worker had nothing to hit; called
    /// only when [`Plane::can_apply`] allows [`FaultKind::VisibilityOutlived`].
    fn outlive_visibility(
        &mut self,
        worker: usize,
    ) -> impl Future<Output = Result<Option<String>>> + Send {
        async move { Err(not_here(FaultKind::VisibilityOutlived, worker)) }
    }

    /// Ages the delivery worker `worker` holds in the broker's unacked index, then has another
    /// worker sweep (restore) it.
    /// Returns what was done, in a phrase, or None when the worker had nothing to hit; called
    /// only when [`Plane::can_apply`] allows [`FaultKind::ForcedRestore`].
    fn force_restore(
        &mut self,
        worker: usize,
    ) -> impl Future<Output = Result<Option<String>>> + Send {
        async move { Err(not_here(FaultKind::ForcedRestore, worker)) }
    }

    /// SIGKILLs the pool child of worker `worker` running the job.
    /// Returns what was done, in a phrase, or None when the worker had nothing to hit; called
    /// only when [`Plane::can_apply`] allows [`FaultKind::KillPoolChild`].
    fn kill_pool_child(
        &mut self,
        worker: usize,
    ) -> impl Future<Output = Result<Option<String>>> + Send {
        async move { Err(not_here(FaultKind::KillPoolChild, worker)) }
    }

    /// SIGKILLs the process of worker `worker` whose connection holds the job's model call
    /// (whatever its process group), restarting the worker if that was its main process.
    /// Returns what was done, in a phrase, or None when no process held the call; called only
    /// when [`Plane::can_apply`] allows [`FaultKind::KillHolder`].
    fn kill_holder(
        &mut self,
        worker: usize,
    ) -> impl Future<Output = Result<Option<String>>> + Send {
        async move { Err(not_here(FaultKind::KillHolder, worker)) }
    }

    /// SIGKILLs worker `worker`'s main process mid-job and restarts it under the same name.
    /// Returns what was done, in a phrase, or None when the worker had nothing to hit; called
    /// only when [`Plane::can_apply`] allows [`FaultKind::KillMain`].
    fn kill_main(&mut self, worker: usize) -> impl Future<Output = Result<Option<String>>> + Send {
        async move { Err(not_here(FaultKind::KillMain, worker)) }
    }

    /// Sends worker `worker` its stop signal (warm shutdown) mid-job, then restarts it.
    /// Returns what was done, in a phrase, or None when the worker had nothing to hit; called
    /// only when [`Plane::can_apply`] allows [`FaultKind::WarmShutdown`].
    fn warm_shutdown(
        &mut self,
        worker: usize,
    ) -> impl Future<Output = Result<Option<String>>> + Send {
        async move { Err(not_here(FaultKind::WarmShutdown, worker)) }
    }

    /// Stops worker `worker` mid-job past its heartbeat deadline, until another worker took the
    /// job; then resumes it.
    /// Returns what was done, in a phrase, or None when the worker had nothing to hit; called
    /// only when [`Plane::can_apply`] allows [`FaultKind::HeartbeatMiss`].
    fn miss_heartbeats(
        &mut self,
        worker: usize,
    ) -> impl Future<Output = Result<Option<String>>> + Send {
        async move { Err(not_here(FaultKind::HeartbeatMiss, worker)) }
    }

    /// Lets the delivery worker `worker` reserved (prefetched) behind a slow task outlive the
    /// visibility timeout, then has another worker sweep (restore) it.
    /// Returns what was done, in a phrase, or None when the worker had nothing to hit; called
    /// only when [`Plane::can_apply`] allows [`FaultKind::PrefetchRestore`].
    fn restore_prefetched(
        &mut self,
        worker: usize,
    ) -> impl Future<Output = Result<Option<String>>> + Send {
        async move { Err(not_here(FaultKind::PrefetchRestore, worker)) }
    }

    /// Submits the request worker `worker` holds again, with the same key, while its first
    /// attempt runs (an API resubmitting after its own client timed out).
    /// Returns what was done, in a phrase, or None when the worker had nothing to hit; called
    /// only when [`Plane::can_apply`] allows [`FaultKind::ApiResubmission`].
    fn resubmit(&mut self, worker: usize) -> impl Future<Output = Result<Option<String>>> + Send {
        async move { Err(not_here(FaultKind::ApiResubmission, worker)) }
    }

    /// Holds the model's answer to worker `worker`'s call past the worker's own timeout, so its
    /// timeout path (its retry, its failure write) runs while the call may still complete.
    /// Returns what was done, in a phrase, or None when the worker had nothing to hit; called
    /// only when [`Plane::can_apply`] allows [`FaultKind::UpstreamTimeout`] aimed at a worker
    /// ([`Fault::Framework`]); racecert's own beds slow a version instead
    /// ([`Fault::UpstreamTimeout`]).
    fn outlast_model_timeout(
        &mut self,
        worker: usize,
    ) -> impl Future<Output = Result<Option<String>>> + Send {
        async move { Err(not_here(FaultKind::UpstreamTimeout, worker)) }
    }

    /// Holds the model's answer to worker `worker`'s call past the framework's time limit for
    /// the job, below the worker's own timeout, so that the limit interrupts the attempt as the
    /// answer arrives. Returns what was done, in a phrase, or None when the worker had nothing
    /// to hit; called only when [`Plane::can_apply`] allows [`FaultKind::TimeLimit`].
    fn exceed_time_limit(
        &mut self,
        worker: usize,
    ) -> impl Future<Output = Result<Option<String>>> + Send {
        async move { Err(not_here(FaultKind::TimeLimit, worker)) }
    }

    /// Cuts worker `worker`'s own database link mid-call, across the end of its model call (so
    /// the write the answer leads to meets the cut), then heals it.
    /// Returns what was done, in a phrase, or None when the worker had nothing to hit; called
    /// only when [`Plane::can_apply`] allows [`FaultKind::Partition`] aimed at a worker
    /// ([`Fault::Framework`]); racecert's own beds cut a service for every worker
    /// ([`Fault::Partition`]).
    fn partition_worker(
        &mut self,
        worker: usize,
    ) -> impl Future<Output = Result<Option<String>>> + Send {
        async move { Err(not_here(FaultKind::Partition, worker)) }
    }

    /// Replaces worker `worker` mid-job as an orchestrator does (its stop signal, a grace period,
    /// SIGKILL if it is still running, then its replacement) while a new job waits in the queue.
    /// Returns what was done, in a phrase, or None when the worker had nothing to hit; called
    /// only when [`Plane::can_apply`] allows [`FaultKind::Drain`].
    fn drain(&mut self, worker: usize) -> impl Future<Output = Result<Option<String>>> + Send {
        async move { Err(not_here(FaultKind::Drain, worker)) }
    }

    /// Switches what worker `worker`'s model URL reaches to the next version while the worker
    /// runs (its call in flight answered by the old one), then gives it a request.
    /// Returns what was done, in a phrase, or None when the worker had nothing to hit; called
    /// only when [`Plane::can_apply`] allows [`FaultKind::BackendSwitch`].
    fn switch_backend(
        &mut self,
        worker: usize,
    ) -> impl Future<Output = Result<Option<String>>> + Send {
        async move { Err(not_here(FaultKind::BackendSwitch, worker)) }
    }

    /// Rolls the next version out while worker `worker` (of the old one) holds a request: the
    /// switch mid-call, the old worker replaced as the system's rollout says, then the same
    /// input submitted again as a new request for the new version. With `late_invalidation`
    /// the team's cache invalidation step runs only after the new version served it.
    /// Returns what was done, in a phrase, or None when the worker had nothing to hit; called
    /// only when [`Plane::can_apply`] allows [`FaultKind::Cutover`] (or
    /// [`FaultKind::CacheInvalidationLag`]) aimed at a worker ([`Fault::Framework`]);
    /// racecert's own beds switch the active version instead ([`Fault::Cutover`]).
    fn roll_out(
        &mut self,
        worker: usize,
        late_invalidation: bool,
    ) -> impl Future<Output = Result<Option<String>>> + Send {
        let _ = late_invalidation;
        async move { Err(not_here(FaultKind::Cutover, worker)) }
    }
}

/// A plane asked for what it said it cannot do ([`Plane::can_apply`] lied): a harness bug.
fn unsupported(what: &str) -> crate::Error {
    crate::Error::other(format!("{what} is not supported by this runner"))
}

fn not_here(kind: FaultKind, worker: usize) -> crate::Error {
    crate::Error::other(format!(
        "{kind} at worker #{worker}: this plane has no framework faults"
    ))
}
