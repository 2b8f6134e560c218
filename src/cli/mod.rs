//! The commands of the `racecert` binary, one module each, over the library: `src/main.rs` parses
//! the arguments ([`args`]) and makes one call here per command. What every command shares lives
//! in this module: the test bed's lifetime (removed whatever happens, a signal included), exit
//! codes, colour and progress bars, and turning SIGINT and SIGTERM into a clean stop (the run
//! ends at the next case or fault step, the containers and worker processes go, a partial report
//! marked as interrupted is written, and the exit code is 130 or 143; a second signal exits at
//! once, and the next start reaps what is left).
//!
//! - [`certify`]: `racecert certify` (suites, `--worker-cmd`, `--system`);
//! - [`run`]: `racecert run` (a suite's case, or any runner's schedule file);
//! - [`replay`]: `racecert replay` (incident logs, on the reference worker or a team's system);
//! - [`tools`]: images, the smoke scenario, a long-lived bed, clean-up, the proxy server, the
//!   reference worker as a process, report merging.

pub mod args;
pub mod certify;
pub mod replay;
pub mod run;
pub mod tools;

use crate::env::{TestBed, TestBedBuilder};
use crate::{Error, Result};
use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;

/// Exit code of a run that found nothing wrong but did not exercise everything it claims to
/// certify (a fault kind that never landed): neither a pass nor a failure.
pub const INCONCLUSIVE: u8 = 4;

/// Exit code of a replay whose worker sent other round trips than its file recorded: neither a
/// pass nor a failure.
pub const DIVERGED: u8 = 3;

/// Exit code when nothing in a log could be reconstructed, and of any error.
pub const NOTHING_RECONSTRUCTED: u8 = 2;

/// 130 after SIGINT, 143 after SIGTERM.
pub fn interrupted_code() -> ExitCode {
    ExitCode::from(128 + crate::interrupt::requested().unwrap_or(2) as u8)
}

/// The exit code of a verdict: 0 held, 1 failed; a signal's code if one stopped the run.
pub fn verdict_code(passed: bool) -> ExitCode {
    if crate::interrupt::requested().is_some() {
        interrupted_code()
    } else if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The exit code of a verdict: 0 PASSED, 1 FAILED, 4 INCONCLUSIVE; a signal's code if one
/// stopped the run.
pub fn verdict_exit(verdict: crate::check::Verdict) -> ExitCode {
    use crate::check::Verdict;
    if crate::interrupt::requested().is_some() {
        return interrupted_code();
    }
    match verdict {
        Verdict::Passed => ExitCode::SUCCESS,
        Verdict::Failed => ExitCode::FAILURE,
        Verdict::Inconclusive => ExitCode::from(INCONCLUSIVE),
    }
}

/// How `work` meets a signal: it stops itself at its next step and reports what it did (an
/// exploration, a fleet run), or it is dropped where it stands (a replay, the smoke scenario).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum OnSignal {
    /// The work stops itself at its next step.
    Finish,
    /// The work is dropped where it stands.
    Drop,
}

/// Runs `work` on a fresh test bed and removes the bed whatever happens, a signal included.
pub async fn with_bed<T>(
    on_signal: OnSignal,
    work: impl AsyncFnOnce(&TestBed) -> Result<T>,
) -> Result<T> {
    let bed = TestBedBuilder::from_env()?.start().await?;
    tracing::info!(bed = %bed.id(), elapsed = ?bed.startup_time(), "test bed up");
    let outcome = match on_signal {
        OnSignal::Finish => work(&bed).await,
        OnSignal::Drop => tokio::select! {
            outcome = work(&bed) => outcome,
            () = crate::interrupt::wait() => Err(Error::Interrupted(
                crate::interrupt::name(crate::interrupt::requested().unwrap_or(2)),
            )),
        },
    };
    bed.shutdown().await;
    outcome
}

/// Progress bars, one per named task, on stderr (drawn only on a terminal: indicatif hides them
/// elsewhere); a task of no known length (a time budget) shows a count.
pub type Bars = Arc<HashMap<String, indicatif::ProgressBar>>;

/// One progress bar per named task; `unit` names what is counted.
pub fn progress_bars(tasks: impl IntoIterator<Item = (String, Option<u64>)>, unit: &str) -> Bars {
    let bars = indicatif::MultiProgress::new();
    let style = |template: String| {
        indicatif::ProgressStyle::with_template(&template)
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> ")
    };
    let sized = style(format!(
        "{{prefix:<26}} [{{bar:30}}] {{pos:>4}}/{{len:4}} {unit} {{elapsed:>4}}"
    ));
    let open = style(format!("{{prefix:<26}} {{pos:>6}} {unit} {{elapsed:>4}}"));
    Arc::new(
        tasks
            .into_iter()
            .map(|(name, len)| {
                let bar = match len {
                    Some(len) => bars
                        .add(indicatif::ProgressBar::new(len))
                        .with_style(sized.clone()),
                    None => bars
                        .add(indicatif::ProgressBar::no_length())
                        .with_style(open.clone()),
                };
                bar.set_prefix(name.clone());
                (name, bar)
            })
            .collect(),
    )
}

/// One bar for one task: its `set` callback and a guard that finishes the bar when dropped.
pub fn one_bar(name: &str, len: Option<u64>, unit: &str) -> indicatif::ProgressBar {
    let bars = progress_bars([(name.to_owned(), len)], unit);
    bars[name].clone()
}

/// SIGINT and SIGTERM ask the run to stop cleanly; a second one exits at once.
pub fn stop_on_signals() -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt())
        .map_err(|err| Error::io("install the SIGINT handler", err))?;
    let mut terminate = signal(SignalKind::terminate())
        .map_err(|err| Error::io("install the SIGTERM handler", err))?;
    tokio::spawn(async move {
        loop {
            let number = tokio::select! {
                _ = interrupt.recv() => 2,
                _ = terminate.recv() => 15,
            };
            if crate::interrupt::request(number) {
                eprintln!(
                    "racecert: {}: stopping after the current step and cleaning up (send it again to exit at once)",
                    crate::interrupt::name(number)
                );
            } else {
                eprintln!("racecert: exiting at once; the next start removes what is left");
                std::process::exit(128 + number);
            }
        }
    });
    Ok(())
}

/// wiremock panics in the task of a connection whose request body never fully arrived (a worker
/// killed, paused past its timeout or cut off mid-request, which racecert does on purpose); the
/// runtime confines the panic to that one connection and the mock server keeps serving. Such a
/// panic gets one debug line instead of a backtrace that reads as if racecert had crashed; every
/// other panic goes to the default hook.
pub fn quiet_backend_connection_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        // The registry's copy (`.../wiremock-0.6.5/src/...`) or the patched one in the tree
        // (`vendor/wiremock/src/...`).
        let in_wiremock = info.location().is_some_and(|at| {
            let file = at.file();
            file.contains("/wiremock-") || file.contains("vendor/wiremock/")
        });
        if in_wiremock {
            let message = info
                .payload()
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| info.payload().downcast_ref::<&str>().copied())
                .unwrap_or("-");
            tracing::debug!(message, "a backend connection ended mid-request");
            return;
        }
        default(info);
    }));
}

/// Logs to stderr, coloured only if `ansi`. The proxy server logs every proxy it starts: useful
/// when it is the program (`proxy_program`), noise when it is embedded in a test bed; injected
/// partitions make sqlx and the proxy engine warn about every connection they cut: expected
/// noise.
pub fn init_tracing(proxy_program: bool, ansi: bool) {
    let default_filter = if proxy_program {
        "warn,racecert=info"
    } else {
        "warn,racecert=info,racecert::env::proxy::server=warn,sqlx=error,noxious=off"
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_filter.into()),
        )
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .init();
}

/// Writes `text` to `path`, naming the path if it cannot.
pub(crate) fn write_file(path: &std::path::Path, text: impl AsRef<[u8]>) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|err| Error::io_at(dir, err))?;
    }
    std::fs::write(path, text).map_err(|err| Error::io_at(path, err))
}

/// JSON of a report, for files and `--format json`.
pub(crate) fn json<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string_pretty(value).map_err(|err| Error::other(format!("JSON: {err}")))
}
