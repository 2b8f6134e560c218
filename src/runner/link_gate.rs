//! The gate of one worker's links: it holds each effectful request before it reaches its server
//! until the schedule releases it, records which requests were released (their fingerprints), and
//! lets set-up, health checks and empty queue polls pass.

use crate::wire::{Holder, RedisReply, Release, Reply, Request, RoundTrip, WireEvent};
use futures::FutureExt;
use futures::future::BoxFuture;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, oneshot};

/// Whether a request passes without holding: connection set-up, health checks, statements only
/// prepared. (Decided on the request alone: the reply is not known yet.)
pub(super) fn passes(request: &Request) -> bool {
    request.is_effectless()
}

fn is_poll(request: &Request) -> bool {
    matches!(request, Request::Redis(c) if c.name == "XAUTOCLAIM" || c.name == "XREADGROUP")
}

/// Whether a finished round trip decided nothing a schedule counts: effectless traffic, a queue
/// poll that got nothing, a consumer group created again (it exists).
pub(super) fn uncounted(trip: &RoundTrip) -> bool {
    if trip.is_effectless() {
        return true;
    }
    let Request::Redis(command) = &trip.request else {
        return false;
    };
    let reply = match &trip.reply {
        Some(Reply::Redis(reply)) => reply,
        _ => return false,
    };
    match command.name.as_str() {
        "XREADGROUP" => matches!(reply, RedisReply::Nil | RedisReply::Array { len: 0, .. }),
        "XAUTOCLAIM" => match reply {
            RedisReply::Array { items, .. } => {
                matches!(items.get(1), Some(RedisReply::Array { len: 0, .. }) | None)
            }
            RedisReply::Nil => true,
            _ => false,
        },
        "XGROUP" => matches!(reply, RedisReply::Error(e) if e.starts_with("BUSYGROUP")),
        _ => false,
    }
}

struct Held {
    link: String,
    conn: u64,
    first: u64,
    count: u64,
    fingerprint: String,
    poll: bool,
    release: oneshot::Sender<Release>,
    since: Instant,
}

#[derive(Default)]
struct GateState {
    /// Everything goes through (the drain).
    open: bool,
    held: VecDeque<Held>,
    done: HashMap<(String, u64, u64), RoundTrip>,
    /// When the worker last completed a counted round trip.
    progress: Option<Instant>,
    /// Per-case names replaced in fingerprints (a case's idempotency keys by `{req#i}`), so a
    /// case's fingerprints are the same whichever run it is.
    aliases: Vec<(String, String)>,
}

/// One worker's holder: holds its effectful requests until the scheduler releases them.
pub(super) struct Gate {
    pub(super) worker: String,
    /// The key namespace of the case (elided in fingerprints).
    namespace: Mutex<String>,
    pub(super) max_hold: Duration,
    state: Mutex<GateState>,
    pub(super) changed: Notify,
    pub(super) timeouts: Arc<Mutex<Vec<String>>>,
    /// Set for the gate of a process started ahead of need: until it goes live, its requests are
    /// held for half the longest hold at most and nothing it does is recorded.
    standby: Option<Arc<Standby>>,
}

/// Whether a process started ahead of need (to replace a worker the schedule kills, so that its
/// interpreter's start costs the case nothing) is live yet. Until it is, its gate holds its
/// requests for half the longest hold and then aborts them (the process sends again,
/// before its own socket timeout gives up on them), and nothing it does or logs is recorded: its
/// waiting is no part of any case (its output keeps it).
#[derive(Default)]
pub(crate) struct Standby {
    live: std::sync::atomic::AtomicBool,
}

impl Standby {
    pub(crate) fn new() -> Arc<Standby> {
        Arc::new(Standby::default())
    }

    pub(crate) fn is_live(&self) -> bool {
        self.live.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Records `line` once live.
    pub(crate) fn line(
        &self,
        recorder: &crate::history::Recorder,
        line: crate::contract::log::LogLine,
    ) {
        if self.is_live() {
            recorder.line(line);
        }
    }

    /// From now on everything is recorded.
    pub(crate) fn go_live(&self) {
        self.live.store(true, std::sync::atomic::Ordering::Release);
    }
}

impl Gate {
    pub(super) fn new(worker: &str, namespace: &str, max_hold: Duration) -> Arc<Gate> {
        Gate::with(worker, namespace, max_hold, None)
    }

    /// The gate of a process on `standby`: until the process goes live, a hold that outlasts half
    /// the longest hold is aborted.
    pub(super) fn on_standby(
        worker: &str,
        namespace: &str,
        max_hold: Duration,
        standby: Arc<Standby>,
    ) -> Arc<Gate> {
        Gate::with(worker, namespace, max_hold, Some(standby))
    }

    fn with(
        worker: &str,
        namespace: &str,
        max_hold: Duration,
        standby: Option<Arc<Standby>>,
    ) -> Arc<Gate> {
        Arc::new(Gate {
            worker: worker.to_owned(),
            namespace: Mutex::new(namespace.to_owned()),
            max_hold,
            state: Mutex::new(GateState::default()),
            changed: Notify::new(),
            timeouts: Arc::default(),
            standby,
        })
    }

    /// Whether what passes this gate is recorded (not a process on standby).
    pub(super) fn is_live(&self) -> bool {
        self.standby
            .as_ref()
            .is_none_or(|standby| standby.is_live())
    }

    /// The process behind this gate was killed: the requests it held never reach their servers
    /// (their connections end), as the process died before sending them.
    pub(super) fn abort_held(&self) {
        let mut state = self.lock();
        for held in state.held.drain(..) {
            let _ = held.release.send(Release::Abort);
        }
    }

    /// Before a spare goes live: only its newest held request is its own next one. Older ones
    /// were given up (their connection dropped, or the process sent again after a timeout):
    /// they are forgotten, and aborted if still held, without a note (nothing was scheduled).
    pub(super) fn keep_newest(&self) {
        let mut state = self.lock();
        state.held.retain(|held| !held.release.is_closed());
        let stale = state.held.len().saturating_sub(1);
        for held in state.held.drain(..stale) {
            let _ = held.release.send(Release::Abort);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().expect("poisoned")
    }

    pub(super) fn print_with(&self, aliases: &[(String, String)], request: &Request) -> String {
        let namespace = self.namespace.lock().expect("poisoned").clone();
        let mut print = request.fingerprint(Some(&namespace)).0;
        for (name, alias) in aliases {
            print = print.replace(name.as_str(), alias);
        }
        print
    }

    /// A request's fingerprint in this case.
    pub(super) fn print(&self, request: &Request) -> String {
        let aliases = self.lock().aliases.clone();
        self.print_with(&aliases, request)
    }

    /// The case's key namespace from now on (a gate of pooled links serves case after case:
    /// its connections, and their round trips' numbering, outlive each case).
    pub(super) fn rename(&self, namespace: &str) {
        *self.namespace.lock().expect("poisoned") = namespace.to_owned();
    }

    /// Forgets the last case: finished trips, progress, timeouts; `aliases` name this one's.
    pub(super) fn begin(&self, aliases: Vec<(String, String)>) {
        let mut state = self.lock();
        state.done.clear();
        state.progress = None;
        state.aliases = aliases;
        self.timeouts.lock().expect("poisoned").clear();
    }

    /// Holds again (between cases).
    pub(super) fn close(&self) {
        self.lock().open = false;
    }

    pub(super) fn trip(&self, event: &WireEvent) {
        let trip = &event.trip;
        {
            let mut state = self.lock();
            if !uncounted(trip) {
                state.progress = Some(Instant::now());
            }
            // Only requests held while closed are waited for (an open gate holds nothing).
            if !state.open {
                state
                    .done
                    .insert((trip.link.clone(), trip.conn, trip.seq), trip.clone());
            }
        }
        self.changed.notify_waiters();
    }

    /// The oldest live held request (dropping those whose hold ended without us): its
    /// fingerprint and whether it is a queue poll.
    pub(super) fn front(&self, notes: &mut Vec<String>) -> Option<(String, bool)> {
        let mut state = self.lock();
        while let Some(held) = state.held.front() {
            if held.release.is_closed() {
                let held = state.held.pop_front().expect("front");
                notes.push(format!(
                    "{}'s held `{}` went on without the schedule after {} ms (its hold ended: \
                     the longest hold, or the worker's own timeout)",
                    self.worker,
                    held.fingerprint,
                    held.since.elapsed().as_millis()
                ));
                continue;
            }
            return Some((held.fingerprint.clone(), held.poll));
        }
        None
    }

    /// Waits up to `wait` for a live held request.
    pub(super) async fn arrival(
        &self,
        wait: Duration,
        notes: &mut Vec<String>,
    ) -> Option<(String, bool)> {
        let deadline = Instant::now() + wait;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(front) = self.front(notes) {
                return Some(front);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, notified).await.is_err() {
                return self.front(notes);
            }
        }
    }

    /// Releases the oldest held request and waits up to `answer` for its round trips; `None` if
    /// they did not all finish (the worker is blocked), else the finished trips.
    pub(super) async fn release(&self, answer: Duration) -> Option<Vec<RoundTrip>> {
        let (link, conn, first, count) = {
            let mut state = self.lock();
            let held = state.held.pop_front()?;
            let _ = held.release.send(Release::Forward);
            (held.link, held.conn, held.first, held.count)
        };
        let deadline = Instant::now() + answer;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let state = self.lock();
                let trips: Vec<RoundTrip> = (first..first + count)
                    .filter_map(|seq| state.done.get(&(link.clone(), conn, seq)).cloned())
                    .collect();
                if trips.len() as u64 == count {
                    return Some(trips);
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, notified).await.is_err() {
                return None;
            }
        }
    }

    /// Lets everything through from now on, the held requests first.
    pub(super) fn open(&self) {
        let mut state = self.lock();
        state.open = true;
        for held in state.held.drain(..) {
            let _ = held.release.send(Release::Forward);
        }
    }

    pub(super) fn progress(&self) -> Option<Instant> {
        self.lock().progress
    }
}

impl Holder for Gate {
    fn holding(&self, link: &str) -> bool {
        let state = self.lock();
        !state.open && state.held.iter().any(|held| held.link == link)
    }

    fn before(
        &self,
        link: &str,
        conn: u64,
        first: u64,
        requests: &[Request],
    ) -> Option<BoxFuture<'static, Release>> {
        let mut state = self.lock();
        if state.open || requests.iter().all(passes) {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        let fingerprint = requests
            .iter()
            .map(|r| self.print_with(&state.aliases, r))
            .collect::<Vec<_>>()
            .join(" + ");
        state.held.push_back(Held {
            link: link.to_owned(),
            conn,
            first,
            count: requests.len() as u64,
            fingerprint: fingerprint.clone(),
            poll: requests.first().is_some_and(is_poll),
            release: tx,
            since: Instant::now(),
        });
        drop(state);
        self.changed.notify_waiters();
        let (max, timeouts, worker) = (self.max_hold, self.timeouts.clone(), self.worker.clone());
        let standby = self.standby.clone();
        Some(
            async move {
                let mut rx = rx;
                loop {
                    // On standby a hold lasts half the longest: a spare then goes live with its
                    // request's client still patient for a while.
                    let on_standby = standby.as_ref().is_some_and(|s| !s.is_live());
                    let window = if on_standby { max / 2 } else { max };
                    match tokio::time::timeout(window, &mut rx).await {
                        Ok(Ok(release)) => return release,
                        // The gate let go of it unanswered (dropped with a killed worker's
                        // place): it was never sent.
                        Ok(Err(_)) => return Release::Abort,
                        // A process still on standby is not kept waiting past its own patience:
                        // it loses the connection and sends again.
                        Err(_) if standby.as_ref().is_some_and(|s| !s.is_live()) => {
                            return Release::Abort;
                        }
                        // It went live meanwhile: the longest hold counts from now.
                        Err(_) if on_standby => continue,
                        Err(_) => {
                            timeouts.lock().expect("poisoned").push(format!(
                                "{worker}'s `{fingerprint}` held past the longest hold ({} ms): \
                                 let go",
                                max.as_millis()
                            ));
                            return Release::Forward;
                        }
                    }
                }
            }
            .boxed(),
        )
    }
}
