//! Checkpoints: named points in a worker's flow where a harness can hold the worker, let it go
//! on, or crash it. A worker calls [`Checkpoints::reached`] at each point; with no harness attached
//! that is a no-op, so production code pays nothing. A [`Gate`] attached to a worker parks it at
//! every checkpoint until the harness says what to do: this is how the controller makes workers
//! advance one step at a time in the order a schedule gives.
//!
//! A gate also makes a worker's call timeouts happen when the schedule says ([`Deadlines`]): a
//! backend slowed past the worker's timeout by a fault expires the worker's wait the moment it
//! receives the call, so an upstream timeout costs a round trip, not the timeout's wall time.

use crate::{Error, Result};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// A named point in the worker's flow (ordered as the flow passes them).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Checkpoint {
    /// A delivery was received from the queue.
    Received,
    /// The lease was acquired (or, with the dedupe defect, skipped).
    AfterLease,
    /// The job was moved to IN_PROGRESS with a new generation.
    AfterTake,
    /// The cache was read (hit or miss).
    AfterCacheRead,
    /// About to call the model backend.
    BeforeBackendCall,
    /// The backend answered.
    AfterBackendCall,
    /// About to write the cache.
    BeforeCacheWrite,
    /// About to commit the final write.
    BeforeFinalWrite,
    /// The final write was attempted (accepted or rejected).
    AfterFinalWrite,
    /// About to acknowledge the delivery.
    BeforeAck,
    /// About to release the lease.
    BeforeRelease,
    /// The delivery is fully processed.
    Done,
}

impl Checkpoint {
    /// Every checkpoint, in flow order.
    pub const ALL: [Checkpoint; 12] = [
        Checkpoint::Received,
        Checkpoint::AfterLease,
        Checkpoint::AfterTake,
        Checkpoint::AfterCacheRead,
        Checkpoint::BeforeBackendCall,
        Checkpoint::AfterBackendCall,
        Checkpoint::BeforeCacheWrite,
        Checkpoint::BeforeFinalWrite,
        Checkpoint::AfterFinalWrite,
        Checkpoint::BeforeAck,
        Checkpoint::BeforeRelease,
        Checkpoint::Done,
    ];

    /// snake_case name for logs and schedules.
    pub fn name(self) -> &'static str {
        match self {
            Checkpoint::Received => "received",
            Checkpoint::AfterLease => "after_lease",
            Checkpoint::AfterTake => "after_take",
            Checkpoint::AfterCacheRead => "after_cache_read",
            Checkpoint::BeforeBackendCall => "before_backend_call",
            Checkpoint::AfterBackendCall => "after_backend_call",
            Checkpoint::BeforeCacheWrite => "before_cache_write",
            Checkpoint::BeforeFinalWrite => "before_final_write",
            Checkpoint::AfterFinalWrite => "after_final_write",
            Checkpoint::BeforeAck => "before_ack",
            Checkpoint::BeforeRelease => "before_release",
            Checkpoint::Done => "done",
        }
    }
}

impl fmt::Display for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a parked worker is told to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Directive {
    /// Go on to the next checkpoint.
    Continue,
    /// Stop processing here as if the process died: nothing is cleaned up (lease held, delivery
    /// unacknowledged, job IN_PROGRESS).
    Crash,
}

/// A worker parked at a checkpoint, waiting for its directive.
#[derive(Debug)]
pub struct Arrival {
    /// The worker.
    pub worker: String,
    /// Where it is parked.
    pub at: Checkpoint,
    reply: oneshot::Sender<Directive>,
}

impl Arrival {
    /// Lets the worker go on to its next checkpoint.
    pub fn proceed(self) {
        let _ = self.reply.send(Directive::Continue);
    }

    /// Crashes the worker here.
    pub fn crash(self) {
        let _ = self.reply.send(Directive::Crash);
    }
}

type Senders = Arc<Mutex<HashMap<String, mpsc::UnboundedSender<Arrival>>>>;

/// Call timeouts a harness makes happen: [`Deadlines::expire`] ends the current (or next) wait of
/// a worker for a slow call at once, as if its timeout had run out. Time-driven events come from
/// the schedule, not the clock, like a lease TTL or a visibility timeout in the controlled runner.
#[derive(Clone, Default)]
pub struct Deadlines {
    inner: Arc<DeadlineState>,
}

#[derive(Default)]
struct DeadlineState {
    /// Workers whose wait is to end (sticky until a wait consumes it).
    expired: Mutex<HashSet<String>>,
    notify: tokio::sync::Notify,
}

impl fmt::Debug for Deadlines {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Deadlines").finish_non_exhaustive()
    }
}

impl Deadlines {
    /// Ends `worker`'s wait for its call now (or its next wait, if it is not waiting yet).
    pub fn expire(&self, worker: &str) {
        self.inner
            .expired
            .lock()
            .expect("poisoned")
            .insert(worker.to_owned());
        self.inner.notify.notify_waiters();
    }

    /// Whether both are the same deadlines.
    pub fn same_as(&self, other: &Deadlines) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Resolves when `worker`'s wait is expired, and consumes the expiry.
    pub async fn expired(&self, worker: &str) {
        loop {
            let notified = self.inner.notify.notified();
            tokio::pin!(notified);
            // Registered before the check, so an expiry between the two is not missed.
            notified.as_mut().enable();
            if self.inner.expired.lock().expect("poisoned").remove(worker) {
                return;
            }
            notified.await;
        }
    }
}

/// The worker side: call [`Checkpoints::reached`] at every checkpoint.
#[derive(Clone, Default)]
pub struct Checkpoints {
    gated: Option<Senders>,
    deadlines: Option<Deadlines>,
}

impl fmt::Debug for Checkpoints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpoints")
            .field("gated", &self.gated.is_some())
            .finish()
    }
}

impl Checkpoints {
    /// `worker` starts a call: an expiry left from an earlier call (one that ended on its own
    /// first) does not end this one.
    pub fn calling(&self, worker: &str) {
        if let Some(deadlines) = &self.deadlines {
            deadlines
                .inner
                .expired
                .lock()
                .expect("poisoned")
                .remove(worker);
        }
    }

    /// Resolves when the harness expires `worker`'s wait for a call ([`Deadlines`]); never
    /// without a harness, so a worker's own timeout is all that ends its wait.
    pub async fn call_expired(&self, worker: &str) {
        match &self.deadlines {
            Some(deadlines) => deadlines.expired(worker).await,
            None => std::future::pending().await,
        }
    }
}

impl Checkpoints {
    /// No harness: every checkpoint passes at once.
    pub fn free() -> Checkpoints {
        Checkpoints::default()
    }

    /// Reports that `worker` reached `at`, and waits for the harness's directive if a gate holds
    /// this worker. A gate that went away counts as a crash: the harness is gone, nothing may
    /// proceed unobserved.
    pub async fn reached(&self, worker: &str, at: Checkpoint) -> Directive {
        let Some(senders) = &self.gated else {
            return Directive::Continue;
        };
        let sender = senders.lock().expect("poisoned").get(worker).cloned();
        let Some(sender) = sender else {
            return Directive::Continue;
        };
        let (reply, answer) = oneshot::channel();
        let arrival = Arrival {
            worker: worker.to_owned(),
            at,
            reply,
        };
        if sender.send(arrival).is_err() {
            return Directive::Crash;
        }
        answer.await.unwrap_or(Directive::Crash)
    }
}

/// The harness side: parks gated workers at every checkpoint.
pub struct Gate {
    senders: Senders,
    deadlines: Deadlines,
    receivers: Mutex<HashMap<String, Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Arrival>>>>>,
    /// How long to wait for a worker to reach its next checkpoint before calling it stuck.
    patience: Duration,
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("patience", &self.patience)
            .finish()
    }
}

impl Default for Gate {
    fn default() -> Self {
        Gate::new(Duration::from_secs(20))
    }
}

impl Gate {
    /// A gate that reports a worker as stuck if it does not reach its next checkpoint within
    /// `patience` (a deadlock detector, not a timing assumption).
    pub fn new(patience: Duration) -> Gate {
        Gate {
            senders: Arc::new(Mutex::new(HashMap::new())),
            deadlines: Deadlines::default(),
            receivers: Mutex::new(HashMap::new()),
            patience,
        }
    }

    /// The worker-side handle; workers registered with [`Gate::hold`] park at every checkpoint.
    pub fn checkpoints(&self) -> Checkpoints {
        Checkpoints {
            gated: Some(self.senders.clone()),
            deadlines: Some(self.deadlines.clone()),
        }
    }

    /// The call deadlines of the gated workers (for the fault that slows their backends).
    pub fn deadlines(&self) -> Deadlines {
        self.deadlines.clone()
    }

    /// Parks `worker` at each of its checkpoints from now on.
    pub fn hold(&self, worker: &str) {
        let (tx, rx) = mpsc::unbounded_channel();
        self.senders
            .lock()
            .expect("poisoned")
            .insert(worker.to_owned(), tx);
        self.receivers
            .lock()
            .expect("poisoned")
            .insert(worker.to_owned(), Arc::new(tokio::sync::Mutex::new(rx)));
    }

    /// Lets `worker` run freely again. A checkpoint it is parked at and that the harness has
    /// taken stays parked until answered; an arrival nobody has taken yet (the worker reached a
    /// checkpoint while the schedule was holding one of its round trips) goes on at once, and so
    /// does one sent by a worker that looked the gate up just before this call.
    pub fn free(&self, worker: &str) {
        self.senders.lock().expect("poisoned").remove(worker);
        let Some(receiver) = self.receivers.lock().expect("poisoned").remove(worker) else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let mut receiver = receiver.lock().await;
                    // Ends when the last sender (the map's, gone now, or a worker's clone) drops.
                    while let Some(arrival) = receiver.recv().await {
                        arrival.proceed();
                    }
                });
            }
            // No runtime, so no worker can be on its way: what is queued is all there is.
            Err(_) => {
                if let Ok(mut receiver) = receiver.try_lock() {
                    while let Ok(arrival) = receiver.try_recv() {
                        arrival.proceed();
                    }
                }
            }
        }
    }

    /// Waits until `worker` parks at its next checkpoint.
    pub async fn next(&self, worker: &str) -> Result<Arrival> {
        let receiver = self
            .receivers
            .lock()
            .expect("poisoned")
            .get(worker)
            .cloned()
            .ok_or_else(|| Error::other(format!("worker {worker} is not held by this gate")))?;
        let mut receiver = receiver.lock().await;
        match tokio::time::timeout(self.patience, receiver.recv()).await {
            Ok(Some(arrival)) => Ok(arrival),
            Ok(None) => Err(Error::other(format!("worker {worker}: gate closed"))),
            Err(_) => Err(Error::other(format!(
                "worker {worker} reached no checkpoint within {:?} (stuck or finished)",
                self.patience
            ))),
        }
    }

    /// Lets `worker` run until it parks at `at`, and returns it parked there. Fails if the
    /// worker finishes ([`Checkpoint::Done`]) first.
    pub async fn run_to(&self, worker: &str, at: Checkpoint) -> Result<Arrival> {
        loop {
            let arrival = self.next(worker).await?;
            if arrival.at == at {
                return Ok(arrival);
            }
            if arrival.at == Checkpoint::Done {
                arrival.proceed();
                return Err(Error::other(format!(
                    "worker {worker} finished without reaching {at}"
                )));
            }
            arrival.proceed();
        }
    }

    /// Lets `worker` run to the end of its delivery.
    pub async fn finish(&self, worker: &str) -> Result<()> {
        self.run_to(worker, Checkpoint::Done).await?.proceed();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn free_checkpoints_pass_and_held_workers_park_until_told() {
        assert_eq!(
            Checkpoints::free().reached("w", Checkpoint::Received).await,
            Directive::Continue
        );
        let gate = Gate::new(Duration::from_secs(5));
        gate.hold("w1");
        let cps = gate.checkpoints();
        let worker = tokio::spawn(async move {
            let mut seen = Vec::new();
            for cp in [
                Checkpoint::Received,
                Checkpoint::AfterLease,
                Checkpoint::Done,
            ] {
                let directive = cps.reached("w1", cp).await;
                seen.push((cp, directive));
                if directive == Directive::Crash {
                    break;
                }
            }
            // An ungated worker never parks.
            assert_eq!(
                cps.reached("w2", Checkpoint::Received).await,
                Directive::Continue
            );
            seen
        });
        let parked = gate.run_to("w1", Checkpoint::AfterLease).await.unwrap();
        assert_eq!(parked.at, Checkpoint::AfterLease);
        parked.crash();
        let seen = worker.await.unwrap();
        assert_eq!(
            seen,
            vec![
                (Checkpoint::Received, Directive::Continue),
                (Checkpoint::AfterLease, Directive::Crash)
            ]
        );
    }

    #[tokio::test]
    async fn freeing_a_worker_lets_an_arrival_nobody_took_go_on() {
        let gate = Gate::default();
        gate.hold("w1");
        let cps = gate.checkpoints();
        let worker = tokio::spawn(async move {
            [
                cps.reached("w1", Checkpoint::AfterLease).await,
                cps.reached("w1", Checkpoint::Done).await,
            ]
        });
        // The worker parks with nobody taking its arrival, as when a schedule held one of its
        // round trips and the worker reached a checkpoint after the schedule stopped looking.
        tokio::time::sleep(Duration::from_millis(50)).await;
        gate.free("w1");
        let seen = tokio::time::timeout(Duration::from_secs(5), worker)
            .await
            .expect("a freed worker must not stay parked")
            .unwrap();
        assert_eq!(seen, [Directive::Continue, Directive::Continue]);
    }
}
