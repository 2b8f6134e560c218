//! A team's worker as the operating system sees it: the processes under its command, whatever
//! process groups or sessions its framework makes of them, and which of them owns the client end
//! of a connection racecert's proxy accepted. With it a crash fault kills the process that holds
//! a job (the one whose connection carries the job's model call), not the process group of the
//! command, which a framework that forks a child per job into a session of its own escapes.
//!
//! Read from /proc through the `procfs` crate: parent pids, each process's open descriptors, and
//! the kernel's TCP tables (the socket of an address pair is an inode a descriptor names).

use procfs::process::{FDTarget, Process, all_processes};
use std::collections::BTreeSet;
use std::net::SocketAddr;

/// The direct children of process `pid`.
pub fn children(pid: i32) -> Vec<i32> {
    parents()
        .into_iter()
        .filter(|(_, parent)| *parent == pid)
        .map(|(child, _)| child)
        .collect()
}

/// Process `root` and every process descended from it, by parent pid, root first: a child that
/// made itself a process group or session leader (`setsid`, `setpgid`) is still its parent's.
pub fn tree(root: i32) -> Vec<i32> {
    let parents = parents();
    let mut out = vec![root];
    let mut next = 0;
    while next < out.len() {
        let parent = out[next];
        out.extend(
            parents
                .iter()
                .filter(|(child, p)| *p == parent && !out.contains(child))
                .map(|(child, _)| *child)
                .collect::<Vec<_>>(),
        );
        next += 1;
    }
    out
}

/// Process `pid` for messages: its pid, parent and process group, and its command line (its
/// name when it has none: a kernel thread, a zombie). A child forked without an exec (a pool
/// child, a work horse) shows its parent's command line: the parent and group tell them apart.
pub fn describe(pid: i32) -> String {
    let Ok(process) = Process::new(pid) else {
        return format!("pid {pid} (gone)");
    };
    let stat = process.stat().ok();
    let line = process
        .cmdline()
        .ok()
        .map(|args| args.join(" "))
        .filter(|line| !line.is_empty())
        .or_else(|| stat.as_ref().map(|s| s.comm.clone()))
        .unwrap_or_default();
    match stat {
        Some(stat) => format!(
            "pid {pid} (parent {}, process group {}) `{line}`",
            stat.ppid, stat.pgrp
        ),
        None => format!("pid {pid} `{line}`"),
    }
}

/// The live processes whose environment holds `name=value`: a run's own processes, found even
/// after their parent died and they were handed to init (an orphaned child of a killed worker).
pub fn with_env(name: &str, value: &str) -> Vec<i32> {
    let Ok(processes) = all_processes() else {
        return Vec::new();
    };
    processes
        .flatten()
        .filter(|p| {
            p.environ().is_ok_and(|env| {
                env.get(std::ffi::OsStr::new(name))
                    .is_some_and(|v| v == std::ffi::OsStr::new(value))
            })
        })
        .map(|p| p.pid)
        .collect()
}

/// Every live process with its parent.
fn parents() -> Vec<(i32, i32)> {
    let Ok(processes) = all_processes() else {
        return Vec::new();
    };
    processes
        .flatten()
        .filter_map(|p| p.stat().ok().map(|stat| (stat.pid, stat.ppid)))
        .collect()
}

/// The processes among `candidates` that hold the client end of the TCP connections whose client
/// addresses are `clients` (as racecert's proxy saw each peer: the socket's local address). A
/// socket a process inherited across a fork is held by both, so both are named.
pub fn owners_of(clients: &[SocketAddr], candidates: &[i32]) -> Vec<i32> {
    let tables = [procfs::net::tcp(), procfs::net::tcp6()];
    let inodes: BTreeSet<u64> = tables
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| {
            clients
                .iter()
                .any(|c| same_endpoint(*c, entry.local_address))
        })
        .map(|entry| entry.inode)
        .filter(|inode| *inode != 0)
        .collect();
    if inodes.is_empty() {
        return Vec::new();
    }
    candidates
        .iter()
        .copied()
        .filter(|pid| {
            Process::new(*pid)
                .and_then(|p| p.fd())
                .map(|fds| {
                    fds.flatten().any(
                        |fd| matches!(fd.target, FDTarget::Socket(inode) if inodes.contains(&inode)),
                    )
                })
                .unwrap_or(false)
        })
        .collect()
}

/// Whether two socket addresses are one endpoint: an IPv4 client of a dual-stack listener shows
/// as `::ffff:a.b.c.d` on one side and `a.b.c.d` on the other.
fn same_endpoint(a: SocketAddr, b: SocketAddr) -> bool {
    let canonical = |addr: SocketAddr| (addr.ip().to_canonical(), addr.port());
    canonical(a) == canonical(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    #[test]
    fn the_owner_of_a_connection_is_found_by_its_client_address() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_accepted, peer) = listener.accept().unwrap();
        assert_eq!(peer, stream.local_addr().unwrap());
        let me = std::process::id() as i32;
        assert_eq!(owners_of(&[peer], &[me, 1]), vec![me]);
        // Another connection's address names nobody.
        let other = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        drop(other);
        assert!(owners_of(&["127.0.0.1:1".parse().unwrap()], &[me]).is_empty());
    }

    #[test]
    fn a_child_in_a_session_of_its_own_is_still_in_the_tree() {
        // The shell's children: one in its process group, one that made a session of its own.
        let mut shell = Command::new("sh")
            .args(["-c", "sleep 30 & setsid sleep 30 & wait"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let pid = shell.id() as i32;
        let started = Instant::now();
        let mut found = Vec::new();
        while started.elapsed() < Duration::from_secs(5) {
            found = tree(pid);
            if found.len() >= 3 {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let children = children(pid);
        let shown = describe(pid);
        for child in tree(pid).into_iter().skip(1) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = shell.kill();
        let _ = shell.wait();
        assert_eq!(found.first(), Some(&pid));
        assert!(
            shown.starts_with(&format!(
                "pid {pid} (parent {}, process group ",
                std::process::id()
            )) && shown.ends_with("`sh -c sleep 30 & setsid sleep 30 & wait`"),
            "{shown}"
        );
        assert!(found.len() >= 3, "the shell and both sleeps: {found:?}");
        assert!(
            children.len() >= 2,
            "both sleeps are the shell's: {children:?}"
        );
    }

    #[test]
    fn an_ipv4_peer_of_a_dual_stack_socket_is_one_endpoint() {
        let v4: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:5000".parse().unwrap();
        assert!(same_endpoint(v4, mapped));
        assert!(!same_endpoint(v4, "127.0.0.1:5001".parse().unwrap()));
    }
}
