//! Stopping a run on SIGINT or SIGTERM: the binary records the first signal here, and the long
//! loops (exploration, fleet runs) look at it between cases and fault steps, stop starting new
//! work, clean up (containers, worker process groups) and report what they did as interrupted.
//! A second signal is the binary's business: it exits at once, and the next start reaps what is
//! left.

use std::sync::atomic::{AtomicI32, Ordering};

/// The first signal received (0: none).
static SIGNAL: AtomicI32 = AtomicI32::new(0);
static NOTIFY: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Records that the run must stop because of signal `signal` (e.g. 2 for SIGINT, 15 for
/// SIGTERM). Returns false if a stop was already requested.
pub fn request(signal: i32) -> bool {
    let first = SIGNAL
        .compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok();
    NOTIFY.notify_waiters();
    first
}

/// The signal that asked the run to stop, if any.
pub fn requested() -> Option<i32> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        signal => Some(signal),
    }
}

/// Resolves once a stop has been requested.
pub async fn wait() {
    loop {
        let notified = NOTIFY.notified();
        if requested().is_some() {
            return;
        }
        notified.await;
    }
}

/// The signal's usual name, for reports.
pub fn name(signal: i32) -> String {
    match signal {
        2 => "SIGINT".to_owned(),
        15 => "SIGTERM".to_owned(),
        other => format!("signal {other}"),
    }
}
