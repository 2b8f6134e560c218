//! Stopping a run: SIGINT and SIGTERM sent to `racecert certify`, `run`, `replay`, `env up` and
//! `certify --worker-cmd` in the middle of their work. Each must exit 130 / 143, say it was
//! interrupted (certify: a partial report marked so), and leave nothing: no container labelled
//! with its pid, no process carrying its environment (worker process groups included). A second
//! signal exits at once, and what it leaves is reaped. Output goes to pipes here, so none of it
//! may carry ANSI colour codes; `--color always` must, which shows the check can see them.

use racecert::env::{TestBed, reaper};
use racecert::report::Report;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

crate::tests!(
    certify_stops_on_sigint_and_sigterm_and_leaves_nothing,
    run_stops_on_sigint_and_sigterm_and_leaves_nothing,
    replay_stops_on_sigint_and_sigterm_and_leaves_nothing,
    env_up_stops_on_sigint_and_sigterm_and_leaves_nothing,
    certify_worker_cmd_stops_on_sigint_and_sigterm_and_leaves_nothing,
    a_second_signal_exits_at_once_and_the_leftovers_are_reaped,
    piped_output_has_no_colour_unless_asked_for,
);

const SIGINT: i32 = 2;
const SIGTERM: i32 = 15;
/// Environment variable naming one signalled run: inherited by every worker the run starts, so
/// processes of the run can be found after it is gone, whatever their process group.
const MARK: &str = "RACECERT_SIGNAL_TEST_RUN";

/// One racecert process under test, its output read on threads as it comes.
struct Run {
    child: Child,
    mark: String,
    stdout: std::thread::JoinHandle<String>,
    stderr_lines: std::sync::mpsc::Receiver<String>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Run {
    fn start(name: &str, args: &[&str]) -> anyhow::Result<Run> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let mark = format!(
            "{}-{name}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let mut child = Command::new(env!("CARGO_BIN_EXE_racecert"))
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env_remove("REDIS_URL")
            .env_remove("DATABASE_URL")
            .env_remove("TOXIPROXY_URL")
            .env_remove("NO_COLOR")
            .env_remove("RUST_LOG")
            .env(MARK, &mark)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let mut out = child.stdout.take().expect("piped");
        let stdout = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = out.read_to_string(&mut text);
            text
        });
        let err = child.stderr.take().expect("piped");
        let (tx, stderr_lines) = std::sync::mpsc::channel();
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let all = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let mut all = all.lock().expect("poisoned");
                all.push_str(&line);
                all.push('\n');
                let _ = tx.send(line);
            }
        });
        Ok(Run {
            child,
            mark,
            stdout,
            stderr_lines,
            stderr,
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for a stderr line containing `needle` (the run got that far).
    fn wait_for(&self, needle: &str, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr_lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return Ok(()),
                Ok(_) => {}
                Err(_) => anyhow::bail!(
                    "no {needle:?} on stderr within {limit:?}:\n{}",
                    self.stderr.lock().expect("poisoned")
                ),
            }
        }
    }

    /// Waits until a process of this run other than racecert itself (a worker) is alive.
    fn wait_for_worker(&self, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if marked_processes(&self.mark)
                .iter()
                .any(|(pid, _)| *pid != self.pid())
            {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        anyhow::bail!("no worker process of the run within {limit:?}")
    }

    fn signal(&self, signal: i32) -> anyhow::Result<()> {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()?;
        anyhow::ensure!(status.success(), "kill -{signal} {} failed", self.pid());
        Ok(())
    }

    /// Waits for the exit (bounded: a run that ignores the signal fails the test) and returns
    /// the exit code with everything it printed.
    fn finish(mut self, limit: Duration) -> anyhow::Result<(Option<i32>, String, String)> {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                anyhow::bail!(
                    "racecert did not exit within {limit:?} of the signal:\n{}",
                    self.stderr.lock().expect("poisoned")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let stdout = self.stdout.join().unwrap_or_default();
        // The stderr reader ends with the pipe; give it a moment to take the last lines.
        std::thread::sleep(Duration::from_millis(100));
        let stderr = self.stderr.lock().expect("poisoned").clone();
        Ok((status.code(), stdout, stderr))
    }
}

/// Processes (pid, command line) whose environment carries this run's mark.
fn marked_processes(mark: &str) -> Vec<(u32, String)> {
    let needle = format!("{MARK}={mark}");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let environ = std::fs::read(entry.path().join("environ")).ok()?;
            environ
                .split(|b| *b == 0)
                .any(|var| var == needle.as_bytes())
                .then(|| {
                    let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
                    (pid, String::from_utf8_lossy(&cmdline).replace('\0', " "))
                })
        })
        // A zombie has no environment left to read, so it is not counted: it holds nothing.
        .collect()
}

/// Containers labelled with `pid` as their owner.
fn containers_of(pid: u32) -> anyhow::Result<Vec<String>> {
    Ok(reaper::list_managed()?
        .into_iter()
        .filter(|c| c.owner.pid == pid)
        .map(|c| format!("{} ({})", c.name, c.service))
        .collect())
}

fn has_ansi(text: &str) -> bool {
    text.contains('\x1b')
}

/// Everything that must hold after a run was stopped by `signal`.
fn check_stopped(
    what: &str,
    signal: i32,
    pid: u32,
    mark: &str,
    outcome: &(Option<i32>, String, String),
) -> anyhow::Result<()> {
    let (code, stdout, stderr) = outcome;
    let name = if signal == SIGINT {
        "SIGINT"
    } else {
        "SIGTERM"
    };
    anyhow::ensure!(
        *code == Some(128 + signal),
        "{what}: {name} must exit {}, got {code:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        128 + signal
    );
    anyhow::ensure!(
        stderr.contains(&format!("racecert: {name}: stopping")),
        "{what}: the stop is not announced on stderr:\n{stderr}"
    );
    let containers = containers_of(pid)?;
    anyhow::ensure!(
        containers.is_empty(),
        "{what} after {name}: containers left: {containers:?}"
    );
    let processes = marked_processes(mark);
    anyhow::ensure!(
        processes.is_empty(),
        "{what} after {name}: processes left: {processes:?}"
    );
    anyhow::ensure!(
        !has_ansi(stdout) && !has_ansi(stderr),
        "{what}: output to a pipe carries ANSI codes:\n{stdout}\n{stderr}"
    );
    Ok(())
}

/// The point of a run at which the signal is sent.
#[derive(Clone, Copy)]
enum MidRun {
    /// Its containers exist: the test bed is starting (a short run could end before its bed is
    /// announced, so this is the moment that is always mid-run).
    BedStarting,
    /// Its test bed is up and it has begun its work.
    BedUp,
    /// A worker process of its fleet is alive.
    WorkerAlive,
}

impl Run {
    fn wait_until(&self, point: MidRun) -> anyhow::Result<()> {
        match point {
            MidRun::BedStarting => {
                let deadline = Instant::now() + Duration::from_secs(300);
                while Instant::now() < deadline {
                    if !containers_of(self.pid())?.is_empty() {
                        return Ok(());
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                anyhow::bail!("no container of the run within 300s")
            }
            MidRun::BedUp => self.wait_for("test bed up", Duration::from_secs(300)),
            MidRun::WorkerAlive => {
                self.wait_for("test bed up", Duration::from_secs(300))?;
                self.wait_for_worker(Duration::from_secs(60))
            }
        }
    }
}

/// Starts `args`, waits until the run is at `point`, sends `signal`, and checks the stop.
/// Returns stdout for command-specific checks.
fn signal_mid_run(what: &str, args: &[&str], signal: i32, point: MidRun) -> anyhow::Result<String> {
    let run = Run::start(what, args)?;
    let (pid, mark) = (run.pid(), run.mark.clone());
    let ready = run.wait_until(point);
    if let Err(err) = ready {
        let _ = run.signal(9);
        let _ = run.finish(Duration::from_secs(10));
        let _ = reaper::reap(false);
        return Err(err.context(format!("{what}: never got mid-run")));
    }
    run.signal(signal)?;
    let outcome = run.finish(Duration::from_secs(120))?;
    check_stopped(what, signal, pid, &mark, &outcome)?;
    Ok(outcome.1)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("racecert-signals-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(f).await?
}

async fn certify_stops_on_sigint_and_sigterm_and_leaves_nothing(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    blocking(|| {
        for signal in [SIGINT, SIGTERM] {
            let out = scratch(&format!("certify-{signal}"));
            let out_str = out.display().to_string();
            // More cases than can run before the signal: it always lands mid-exploration.
            let stdout = signal_mid_run(
                "certify",
                &[
                    "certify",
                    "--suite",
                    "suites/full-rollout.toml",
                    "--cases",
                    "5000",
                    "--out",
                    &out_str,
                ],
                signal,
                MidRun::BedUp,
            )?;
            let report = Report::read(&out.join("report.json"))?;
            let name = if signal == SIGINT {
                "SIGINT"
            } else {
                "SIGTERM"
            };
            anyhow::ensure!(
                report.interrupted.as_deref() == Some(name),
                "the partial report must be marked interrupted by {name}: {:?}",
                report.interrupted
            );
            anyhow::ensure!(
                report.suites.iter().all(|s| s.cases_run < 5000),
                "the run went on to the end"
            );
            anyhow::ensure!(
                stdout.contains(&format!("certification INTERRUPTED by {name}")),
                "the summary must say it was interrupted:\n{stdout}"
            );
            let junit = std::fs::read_to_string(out.join("junit.xml"))?;
            anyhow::ensure!(!junit.is_empty() && out.join("report.html").is_file());
        }
        Ok(())
    })
    .await
}

async fn run_stops_on_sigint_and_sigterm_and_leaves_nothing(bed: &TestBed) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    blocking(|| {
        for signal in [SIGINT, SIGTERM] {
            let stdout = signal_mid_run(
                "run",
                &["run", "suites/full-rollout.toml", "--seed", "7"],
                signal,
                MidRun::BedUp,
            )?;
            anyhow::ensure!(
                !stdout.contains("every invariant held over"),
                "an interrupted exploration must not claim a full pass:\n{stdout}"
            );
        }
        Ok(())
    })
    .await
}

async fn replay_stops_on_sigint_and_sigterm_and_leaves_nothing(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    blocking(|| {
        let log = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/incidents/celery-visibility-timeout.log"
        );
        for signal in [SIGINT, SIGTERM] {
            let stdout = signal_mid_run("replay", &["replay", log], signal, MidRun::BedStarting)?;
            anyhow::ensure!(
                stdout.contains("replay interrupted by"),
                "replay must say it was interrupted after its diagnosis:\n{stdout}"
            );
        }
        Ok(())
    })
    .await
}

async fn env_up_stops_on_sigint_and_sigterm_and_leaves_nothing(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    blocking(|| {
        for signal in [SIGINT, SIGTERM] {
            signal_mid_run("env up", &["env", "up"], signal, MidRun::BedUp)?;
        }
        Ok(())
    })
    .await
}

async fn certify_worker_cmd_stops_on_sigint_and_sigterm_and_leaves_nothing(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    blocking(|| {
        let worker = format!("{} worker", env!("CARGO_BIN_EXE_racecert"));
        for signal in [SIGINT, SIGTERM] {
            let out = scratch(&format!("worker-cmd-{signal}"));
            let out_str = out.display().to_string();
            signal_mid_run(
                "certify --worker-cmd",
                &[
                    "certify",
                    "--worker-cmd",
                    &worker,
                    "--rounds",
                    "50",
                    "--out",
                    &out_str,
                ],
                signal,
                MidRun::WorkerAlive,
            )?;
            let report = Report::read(&out.join("report.json"))?;
            anyhow::ensure!(
                report.interrupted.is_some(),
                "the partial report must be marked interrupted"
            );
        }
        Ok(())
    })
    .await
}

async fn a_second_signal_exits_at_once_and_the_leftovers_are_reaped(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    blocking(|| {
        let run = Run::start("twice", &["env", "up"])?;
        let pid = run.pid();
        run.wait_for("test bed up", Duration::from_secs(300))?;
        run.signal(SIGINT)?;
        // The second only once the first is taken: two signals at once may arrive as one.
        run.wait_for("racecert: SIGINT: stopping", Duration::from_secs(30))?;
        run.signal(SIGINT)?;
        let (code, _, stderr) = run.finish(Duration::from_secs(60))?;
        anyhow::ensure!(
            code == Some(130) && stderr.contains("exiting at once"),
            "a second SIGINT must exit 130 at once, got {code:?}:\n{stderr}"
        );
        // Whatever the first signal's cleanup had not removed yet belongs to a dead owner now:
        // the next start (here, the reaper it runs) removes it.
        reaper::reap(false)?;
        let left = containers_of(pid)?;
        anyhow::ensure!(left.is_empty(), "left after reaping: {left:?}");
        Ok(())
    })
    .await
}

async fn piped_output_has_no_colour_unless_asked_for(_bed: &TestBed) -> anyhow::Result<()> {
    blocking(|| {
        let dir = scratch("colour");
        let input = dir.join("shard.json");
        std::fs::write(&input, serde_json::to_string(&Report::new(None))?)?;
        let input = input.display().to_string();
        let merge = |color: Option<&str>, no_color: bool| -> anyhow::Result<String> {
            let mut command = Command::new(env!("CARGO_BIN_EXE_racecert"));
            if let Some(color) = color {
                command.args(["--color", color]);
            }
            command
                .args(["report", "merge", &input, "--out"])
                .arg(dir.join("merged"))
                .env_remove("NO_COLOR");
            if no_color {
                command.env("NO_COLOR", "1");
            }
            let output = command.output()?;
            // An empty certification exercised nothing: INCONCLUSIVE (exit 4), never PASSED.
            anyhow::ensure!(output.status.code() == Some(4), "{output:?}");
            Ok(format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ))
        };
        for (color, no_color) in [
            (None, false),
            (Some("auto"), false),
            (Some("never"), false),
            (Some("auto"), true),
        ] {
            let text = merge(color, no_color)?;
            anyhow::ensure!(
                text.contains("certification INCONCLUSIVE") && !has_ansi(&text),
                "--color {color:?} (NO_COLOR {no_color}) to a pipe: {text:?}"
            );
        }
        let forced = merge(Some("always"), false)?;
        anyhow::ensure!(
            has_ansi(&forced),
            "--color always must colour even a pipe: {forced:?}"
        );
        Ok(())
    })
    .await
}
