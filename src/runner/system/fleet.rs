//! The running system's processes: one worker per model version, each behind links of its own,
//! started with the file's command and environment, stopped by signals to its process group.

use super::{Lines, Wire, now_ms};
use crate::env::TestBed;
use crate::env::links::CaseLinks;
use crate::system::{System, fill, fill_shell};
use crate::wire::WireEvent;
use crate::{Error, Result};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// One worker of the fleet: its identity, its links, its current process.
pub(super) struct Worker {
    pub(super) id: String,
    pub(super) version: String,
    /// The start command, placeholders filled.
    pub(super) command: String,
    pub(super) env: Vec<(String, String)>,
    pub(super) links: CaseLinks,
    /// Its model's URL (its own proxy).
    pub(super) model_url: String,
    pub(super) child: Option<Child>,
    pub(super) starts: u32,
    /// Variables a case adds to the file's for this worker's next starts (the prefetch fault's
    /// multiplier); empty for the fleet as the file describes it.
    pub(super) extra_env: Vec<(String, String)>,
}

impl Worker {
    /// A worker (or the submitter) of `version` on `links`, not started, command and variables
    /// still to be filled ([`configure`]).
    pub(super) fn new(id: String, version: &str, links: CaseLinks) -> Worker {
        Worker {
            id,
            command: String::new(),
            version: version.to_owned(),
            env: Vec::new(),
            model_url: links.backend_url(version).unwrap_or_default(),
            links,
            child: None,
            starts: 0,
            extra_env: Vec::new(),
        }
    }

    pub(super) fn pid(&self) -> Option<i32> {
        self.child.as_ref().and_then(|c| c.id()).map(|p| p as i32)
    }

    /// The worker's main process: the child itself when the command was exec'ed, else the
    /// shell's first child.
    pub(super) fn main_pid(&self) -> Option<i32> {
        let pid = self.pid()?;
        if simple_command(&self.command) {
            Some(pid)
        } else {
            crate::env::procs::children(pid)
                .into_iter()
                .min()
                .or(Some(pid))
        }
    }

    pub(super) fn signal_group(&self, signal: Signal) {
        if let Some(pid) = self.pid() {
            let _ = kill(Pid::from_raw(-pid), signal);
        }
    }
}

/// The running system: its workers and what they printed and sent.
pub(super) struct Fleet<'a> {
    pub(super) system: &'a System,
    pub(super) ready: Option<String>,
    pub(super) workers: Vec<Worker>,
    /// With `[submit] command`: the submitter's own links and variables (the command runs with
    /// the workers' variables filled for these), so what it writes is attributed to it, not to
    /// a worker whose proxy it would otherwise share. Never started as a process.
    pub(super) submitter: Option<Worker>,
    pub(super) lines: Lines,
    pub(super) wire: Wire,
    pub(super) readers: Vec<tokio::task::JoinHandle<()>>,
    pub(super) deadline: Duration,
    /// The run's mark in each worker's environment ([`FLEET_ENV`]): what finds a worker's
    /// process that outlived its parent (a child in a group of its own, orphaned by a kill).
    pub(super) tag: String,
}

/// The variable that marks a run's worker processes.
pub(super) const FLEET_ENV: &str = "RACECERT_FLEET";

impl Fleet<'_> {
    /// Starts worker `index` and waits until it is ready: its `ready` line, else its first
    /// broker or database round trip. A process that exits first is an error naming the command
    /// and its stderr.
    pub(super) async fn start(&mut self, index: usize) -> Result<Duration> {
        let started = Instant::now();
        let worker = &mut self.workers[index];
        worker.starts += 1;
        let label = format!("{}#{}", worker.id, worker.starts);
        let mut command = self.command(index);
        let worker = &self.workers[index];
        let mut child = command.spawn().map_err(|err| {
            Error::io(
                format!(
                    "{}: start `{}` in {}",
                    self.system.place("start.command"),
                    worker.command,
                    self.system.start.workdir.display()
                ),
                err,
            )
        })?;
        self.read_output(&mut child, &label);
        let worker = &mut self.workers[index];
        worker.child = Some(child);
        let ready = self.ready.as_ref().map(|r| {
            fill(
                r,
                &[
                    ("worker_id", &worker.id),
                    ("model_version", &worker.version),
                ],
            )
        });
        self.wait_ready(index, started, &label, ready).await
    }

    /// The command that runs worker `index`: in its workdir, with only its own variables (and
    /// the run's mark), its output piped, in a process group of its own.
    fn command(&self, index: usize) -> Command {
        let worker = &self.workers[index];
        let mut command = Command::new("sh");
        command
            .arg("-c")
            // A simple command is exec'ed, so the child is the worker itself (its pool children
            // are the child's); a compound one runs as written.
            .arg(if simple_command(&worker.command) {
                format!("exec {}", worker.command)
            } else {
                worker.command.clone()
            })
            .current_dir(&self.system.start.workdir)
            .env_clear()
            .envs(
                ["PATH", "HOME", "LANG"]
                    .iter()
                    .filter_map(|k| std::env::var(k).ok().map(|v| (*k, v))),
            )
            .envs(worker.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .envs(
                worker
                    .extra_env
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str())),
            )
            .env(FLEET_ENV, &self.tag)
            // Its owner: the next start reaps it if this run is killed before it can.
            .env(
                crate::env::reaper::OWNER_ENV,
                crate::env::reaper::Owner::current().env_value(),
            )
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        command
    }

    /// Reads the child's stdout and stderr into the fleet's lines, each line under `label`.
    fn read_output(&mut self, child: &mut tokio::process::Child, label: &str) {
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        ]
        .into_iter()
        .flatten()
        {
            let (lines, label) = (self.lines.clone(), label.to_owned());
            self.readers.push(tokio::spawn(async move {
                let mut reader = BufReader::new(stream).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    lines
                        .lock()
                        .expect("poisoned")
                        .push((now_ms(), label.clone(), line));
                }
            }));
        }
    }

    /// Waits until worker `index` (started at `started`, its process `label`) is ready: the
    /// `ready` line, else its first broker or database round trip. Its exit first, or the
    /// deadline, is an error with its output.
    async fn wait_ready(
        &mut self,
        index: usize,
        started: Instant,
        label: &str,
        ready: Option<String>,
    ) -> Result<Duration> {
        let id = self.workers[index].id.clone();
        let shown = self.workers[index].command.clone();
        loop {
            let seen = match &ready {
                Some(ready) => self
                    .lines
                    .lock()
                    .expect("poisoned")
                    .iter()
                    .any(|(_, l, line)| *l == label && line.contains(ready.as_str())),
                None => self
                    .wire
                    .lock()
                    .expect("poisoned")
                    .iter()
                    .any(|(_, e)| e.worker == id && e.service != "postgres"),
            };
            if seen {
                return Ok(started.elapsed());
            }
            let worker = &mut self.workers[index];
            if let Some(status) = worker
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                // Let the readers take the last lines.
                tokio::time::sleep(Duration::from_millis(200)).await;
                return Err(Error::Config(format!(
                    "{}: worker {id} `{}` exited ({status}) before it was ready{}; its output:\n{}",
                    self.system.place("start.command"),
                    shown,
                    ready
                        .as_ref()
                        .map(|r| format!(" (no line containing {r:?})"))
                        .unwrap_or_default(),
                    self.output_of(label, 25)
                )));
            }
            if started.elapsed() > self.deadline || crate::interrupt::requested().is_some() {
                return Err(Error::Config(format!(
                    "{}: worker {id} `{}` was not ready within {:?}{}; its output:\n{}",
                    self.system.place("start.command"),
                    shown,
                    self.deadline,
                    ready
                        .as_ref()
                        .map(|r| format!(" (no line containing {r:?})"))
                        .unwrap_or_default(),
                    self.output_of(label, 25)
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The last `n` lines process `label` printed.
    pub(super) fn output_of(&self, label: &str, n: usize) -> String {
        let lines = self.lines.lock().expect("poisoned");
        let mine: Vec<&str> = lines
            .iter()
            .filter(|(_, l, _)| l == label)
            .map(|(_, _, line)| line.as_str())
            .collect();
        let tail = &mine[mine.len().saturating_sub(n)..];
        if tail.is_empty() {
            "  (nothing)".into()
        } else {
            tail.iter()
                .map(|l| format!("  {l}"))
                .collect::<Vec<_>>()
                .join("\n")
        }
    }

    /// Stops worker `index`: SIGCONT, SIGTERM, SIGKILL of its group after `grace`, then of
    /// every process of its tree still alive (a child in a group of its own outlives its
    /// group's signals).
    pub(super) async fn stop(&mut self, index: usize, grace: Duration) {
        let worker = &mut self.workers[index];
        let tree = worker
            .pid()
            .map(crate::env::procs::tree)
            .unwrap_or_default();
        worker.signal_group(Signal::SIGCONT);
        worker.signal_group(Signal::SIGTERM);
        if let Some(mut child) = worker.child.take() {
            if tokio::time::timeout(grace, child.wait()).await.is_err() {
                if let Some(pid) = child.id() {
                    let _ = kill(Pid::from_raw(-(pid as i32)), Signal::SIGKILL);
                }
                let _ = child.wait().await;
            }
            worker.child = Some(child);
        }
        worker.signal_group(Signal::SIGKILL);
        worker.child = None;
        for pid in tree {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }

    /// SIGKILLs every process of the run still alive after its workers were stopped: children a
    /// kill orphaned (handed to init, out of any worker's tree), found by [`FLEET_ENV`].
    /// Returns how many there were.
    pub(super) fn reap_strays(&self) -> usize {
        let strays = crate::env::procs::with_env(FLEET_ENV, &self.tag);
        for pid in &strays {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        strays.len()
    }

    /// SIGKILLs worker `index`'s process group and waits for its process to end.
    pub(super) async fn kill(&mut self, index: usize) {
        let worker = &mut self.workers[index];
        worker.signal_group(Signal::SIGKILL);
        if let Some(child) = worker.child.as_mut() {
            let _ = child.wait().await;
        }
    }

    /// Whether worker `index`'s process has exited.
    pub(super) fn exited(&mut self, index: usize) -> bool {
        self.workers[index]
            .child
            .as_mut()
            .is_none_or(|c| c.try_wait().ok().flatten().is_some())
    }
}

/// A command `exec` can replace the shell with: no list, pipe or subshell.
pub(super) fn simple_command(command: &str) -> bool {
    !command.contains([';', '&', '|', '\n', '(', '`'])
}

/// Replaces the path (and keeps the query) of a `scheme://authority/path?query` URL.
pub(super) fn with_path(url: &str, path: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let query = rest[authority_end..]
        .find('?')
        .map(|q| &rest[authority_end + q..])
        .unwrap_or("");
    format!("{scheme}://{}/{path}{query}", &rest[..authority_end])
}

/// Links of a worker's own (proxies in front of Redis, Postgres and its version's model), every
/// round trip recorded as its.
pub(super) async fn open_links(
    bed: &TestBed,
    wire: &Wire,
    id: &str,
    model: &(String, std::net::SocketAddr),
) -> Result<CaseLinks> {
    // Holdable: a partition holds the requests of one link (see `case::Blackhole`).
    let links = bed
        .links_to(std::slice::from_ref(model), true, true)
        .await?;
    let sink = wire.clone();
    links.record(
        id,
        Arc::new(move |event: WireEvent| {
            sink.lock().expect("poisoned").push((now_ms(), event));
        }),
    );
    Ok(links)
}

/// Fills a worker's command and environment from the file's placeholders and its links.
pub(super) fn configure(
    system: &System,
    worker: &mut Worker,
    redis_db: u64,
    database: &str,
    venv: &str,
) {
    let redis_url = with_path(worker.links.redis_url(), &redis_db.to_string());
    let database_url = with_path(worker.links.database_url(), database);
    let settings = system.settings_values();
    let mut values = vec![
        ("worker_id", worker.id.as_str()),
        ("model_version", worker.version.as_str()),
        ("redis_url", redis_url.as_str()),
        ("database_url", database_url.as_str()),
        ("model_url", worker.model_url.as_str()),
        ("venv", venv),
    ];
    values.extend(settings.iter().map(|(name, value)| (*name, value.as_str())));
    worker.env = system
        .start
        .env
        .iter()
        .map(|(k, v)| (k.clone(), fill(v, &values)))
        .collect();
    worker.command = fill_shell(&system.start.command, &values);
}
