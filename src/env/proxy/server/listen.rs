//! Listen addresses as Toxiproxy takes them: Go-style `:port`, host names, and port 0 resolved to
//! a concrete free port (below the kernel's ephemeral range) so a proxy keeps its port.

use std::net::SocketAddr;

use super::api::ApiError;

/// Where a proxy listens when the client gives no listen address: any free loopback port.
const DEFAULT_LISTEN: &str = "127.0.0.1:0";

/// Toxiproxy takes Go-style ":8080" for all interfaces; an empty listen means a free loopback port.
fn listen_spec(raw: &str) -> String {
    let raw = raw.trim();
    if raw.is_empty() {
        DEFAULT_LISTEN.to_owned()
    } else if raw.starts_with(':') {
        format!("0.0.0.0{raw}")
    } else {
        raw.to_owned()
    }
}

/// The addresses a listen spec may mean, IPv4 first (where "localhost" clients usually connect).
async fn lookup_listen(raw: &str) -> Result<Vec<SocketAddr>, ApiError> {
    let spec = listen_spec(raw);
    if let Ok(addr) = spec.parse::<SocketAddr>() {
        return Ok(vec![addr]);
    }
    let mut addrs: Vec<SocketAddr> = tokio::net::lookup_host(spec.as_str())
        .await
        .map_err(|err| ApiError::bad_request(format!("invalid listen address {raw:?}: {err}")))?
        .collect();
    addrs.sort_by_key(|addr| !addr.is_ipv4());
    Ok(addrs)
}

/// Ports this process's proxies own, listening or not. A proxy that is disabled, or restarted
/// to take a tap, has no listener for a moment; a probe of another proxy must not take its port
/// then (seen: "listen on 127.0.0.1:32583: Address already in use" when a proxy came back).
static OWNED: std::sync::Mutex<std::collections::BTreeSet<u16>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// Where racecert processes on this machine claim ports from each other: a file per port, held
/// locked while a proxy owns the port. A `cargo test` runs racecert's CLI beside its own test
/// beds, and one process's probe took the port another's proxy had released for a moment to
/// take a tap. The kernel drops the lock with its process, so a killed one leaves no claim. The
/// files stay (empty, one per port of the range at most): removing one while another process
/// waits on it would let two processes lock two files of one port.
fn claims_dir() -> std::path::PathBuf {
    std::env::temp_dir().join("racecert-ports")
}

/// A port a proxy owns until the claim is dropped (the proxy deleted, or moved to another port).
#[derive(Debug)]
pub(super) struct PortClaim {
    port: u16,
    /// The port's claim file, locked (None where the directory cannot be written: the claim
    /// then holds within this process only).
    _lock: Option<std::fs::File>,
}

impl PortClaim {
    /// Claims `port`; None if a proxy of this process, or of another racecert process, owns it.
    fn take(port: u16) -> Option<PortClaim> {
        if !OWNED.lock().expect("poisoned").insert(port) {
            return None;
        }
        let dir = claims_dir();
        let file = std::fs::create_dir_all(&dir).and_then(|()| {
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(dir.join(port.to_string()))
        });
        let lock = match file {
            Ok(file) => match file.try_lock() {
                Ok(()) => Some(file),
                Err(std::fs::TryLockError::WouldBlock) => {
                    OWNED.lock().expect("poisoned").remove(&port);
                    return None;
                }
                Err(std::fs::TryLockError::Error(_)) => None,
            },
            Err(_) => None,
        };
        Some(PortClaim { port, _lock: lock })
    }
}

impl Drop for PortClaim {
    fn drop(&mut self) {
        OWNED.lock().expect("poisoned").remove(&self.port);
    }
}

/// A concrete address to listen on, with the claim on its port when racecert picked it. Port 0
/// is resolved to a free port now, so that the proxy keeps its port across disable/enable and
/// reports where clients should connect.
pub(super) async fn resolve_listen(raw: &str) -> Result<(SocketAddr, Option<PortClaim>), ApiError> {
    let addr = lookup_listen(raw).await?.first().copied().ok_or_else(|| {
        ApiError::bad_request(format!("listen address {raw:?} resolves to nothing"))
    })?;
    if addr.port() != 0 {
        return Ok((addr, None));
    }
    // A disabled proxy has no listener, and the kernel hands ports of its ephemeral range to
    // outgoing connections: a port from that range can be gone when the proxy is enabled again
    // (seen under partitions, while clients reconnect in a loop). Ports just below the range
    // are never handed out that way.
    if let Some(range) = below_ephemeral_range() {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let span = range.end - range.start;
        // Each process walks the range from its own point (its pid, spread): racecert processes
        // side by side on one machine (shards, a `cargo test` beside a `certify`) would otherwise
        // probe the same ports in the same order, and one's probe-then-bind loses to another's.
        let offset = std::process::id().wrapping_mul(2_654_435_761) % span;
        let start = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for i in 0..span {
            let port = range.start + (offset.wrapping_add(start).wrapping_add(i) % span);
            let candidate = SocketAddr::new(addr.ip(), port as u16);
            let Some(claim) = PortClaim::take(port as u16) else {
                continue;
            };
            if let Ok(probe) = std::net::TcpListener::bind(candidate) {
                drop(probe);
                NEXT.store(start + i + 1, std::sync::atomic::Ordering::Relaxed);
                return Ok((candidate, Some(claim)));
            }
        }
    }
    std::net::TcpListener::bind(addr)
        .and_then(|probe| probe.local_addr())
        .map(|addr| {
            let claim = PortClaim::take(addr.port());
            (addr, claim)
        })
        .map_err(|err| ApiError::internal(format!("finding a free port on {addr}: {err}")))
}

/// Up to 8,000 ports just below the kernel's ephemeral port range (Linux), if it can be read.
fn below_ephemeral_range() -> Option<std::ops::Range<u32>> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let low: u32 = text.split_whitespace().next()?.parse().ok()?;
    let start = low.saturating_sub(8_000).max(10_000);
    (start < low).then_some(start..low)
}

/// Whether a listen spec names the address a proxy already has (port 0 never does).
pub(super) async fn listen_matches(raw: &str, current: SocketAddr) -> bool {
    lookup_listen(raw).await.is_ok_and(|addrs| {
        addrs
            .iter()
            .any(|addr| addr.port() != 0 && *addr == current)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_another_racecert_process_claimed_is_not_taken() {
        // Another process's claim: its own open of the port's file, locked (a lock is per open
        // file, so this stands for another process).
        let port = 9_999;
        std::fs::create_dir_all(claims_dir()).unwrap();
        let theirs = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(claims_dir().join(port.to_string()))
            .unwrap();
        theirs.lock().unwrap();
        assert!(PortClaim::take(port).is_none());
        // ... and it is free again once theirs ends.
        drop(theirs);
        let ours = PortClaim::take(port).expect("free again");
        assert!(PortClaim::take(port).is_none(), "ours, in this process");
        drop(ours);
        assert!(PortClaim::take(port).is_some());
    }
}
