//! `racecert`: the command line, a thin layer over the library. It parses and checks arguments
//! (clap), brings the test bed up, calls the library, prints what `racecert::report` renders, and
//! turns SIGINT and SIGTERM into a clean stop: the run ends at the next case or fault step, the
//! containers and worker processes go, a partial report marked as interrupted is written, and the
//! exit code is 130 or 143. A second signal exits at once (the next start reaps what is left).
//!
//! Why one file of ~850 lines: the clap definitions of every command and their argument checks,
//! each a few lines of wiring; rendering lives in `racecert::report`, logic in the library.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use racecert::contract::defect::{Defect, Defects};
use racecert::env::images::{self, ImageConfig, Service};
use racecert::env::{TestBed, TestBedBuilder, reaper};
use racecert::report::Report;
use racecert::schedule::explore::{DEFAULT_CONCURRENCY, ExploreConfig};
use racecert::schedule::file::ScheduleFile;
use racecert::schedule::system::{SystemFault, SystemSettings, run_system};
use racecert::suite::certify::{CertifyOptions, certify, parse_shard, replay_command, shard_of};
use racecert::suite::file::{self as suite_file, LoadedSuite};
use racecert::system::System;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// mimalloc, not glibc's malloc: a case allocates and frees many small buffers on several
/// threads (wire chunks, history events, connection buffers), and glibc's malloc took about 17% of
/// racecert's CPU in the budgets bench. Set here, not in the library, so that a crate that links
/// racecert keeps its own allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "racecert",
    version,
    about = "Certify inference workers against model-rollout races on real Redis, Postgres and a fault proxy"
)]
struct Cli {
    /// When to colour output: auto (only on a terminal, and never with NO_COLOR set), always,
    /// never.
    #[arg(long, value_enum, default_value = "auto", global = true)]
    color: ColorWhen,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum ColorWhen {
    Auto,
    Always,
    Never,
}

/// A time budget in seconds (fractions allowed), more than zero.
fn budget_arg(text: &str) -> std::result::Result<std::time::Duration, String> {
    let seconds: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !(seconds.is_finite() && seconds > 0.0) {
        return Err(format!("{text}: the budget must be more than 0 seconds"));
    }
    Ok(std::time::Duration::from_secs_f64(seconds))
}

/// Cases run at once: 1 to 64.
fn concurrency_arg() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64)
}

#[derive(Subcommand)]
enum Command {
    /// Certify the worker: run the suites (suites/*.toml, or those given) and write reports.
    /// Exits 0 only if every suite came out as expected.
    Certify {
        /// Suite files to run (default: every suites/*.toml, or the shipped ones).
        #[arg(long = "suite", value_name = "FILE")]
        suites: Vec<PathBuf>,
        /// Switch a defect on in the reference worker (repeatable).
        #[arg(long = "defect", value_name = "NAME")]
        defects: Vec<Defect>,
        /// A fixed number of cases per suite, for exact reproduction (no time budget; with
        /// --system: cases at most, within --budget).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        cases: Option<u32>,
        /// Total time budget in seconds, spent across the suites (default 60; a suite file's
        /// `time_budget_s` takes its own share). With --system: seconds of cases (start-up not
        /// counted; default 60).
        #[arg(long, value_name = "SECONDS", value_parser = budget_arg)]
        budget: Option<std::time::Duration>,
        /// Seed (overrides the suite files).
        #[arg(long)]
        seed: Option<u64>,
        /// Cases run at once (1: one at a time). Failures and shrinking are the same either way.
        #[arg(long, default_value_t = DEFAULT_CONCURRENCY, value_parser = concurrency_arg())]
        concurrency: usize,
        /// Run shard i of n (e.g. 2/4); merge shard reports with `racecert report merge`.
        #[arg(long, value_parser = shard_arg)]
        shard: Option<(u32, u32)>,
        /// Where report.json, junit.xml, report.html and counterexample schedules go.
        #[arg(long, default_value = "target/racecert")]
        out: PathBuf,
        /// Certify an external worker: the command starts one worker process under the
        /// contract's environment (docs/contract.md), e.g. "racecert worker".
        #[arg(long, value_name = "CMD", conflicts_with_all = ["suites", "shard", "cases", "budget"])]
        worker_cmd: Option<String>,
        /// Fleet runs for --worker-cmd (stops at the first violation).
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
        rounds: u32,
        /// Seconds of wire schedules for --worker-cmd before the fleet runs (0: fleet only).
        #[arg(long, default_value_t = 90, value_name = "SECS")]
        wire_budget: u64,
        /// Certify a worker racecert did not write, from its system description
        /// (docs/systems.md): its own framework, tables and model API.
        #[arg(long, value_name = "FILE", conflicts_with_all = ["suites", "shard", "worker_cmd", "defects"])]
        system: Option<PathBuf>,
        /// With --system: only these faults (repeatable; default: the framework's own).
        #[arg(long = "fault", value_name = "NAME", requires = "system")]
        faults: Vec<SystemFault>,
        /// With --system: run every case even after a failure.
        #[arg(long, requires = "system")]
        keep_going: bool,
    },
    /// Reproduce one case exactly (from its schedule file, or a suite's seed and case number) and
    /// print its timeline; with a suite alone, explore it until a failure.
    Run {
        /// Suite name or file.
        #[arg(required_unless_present = "schedule")]
        suite: Option<String>,
        /// A schedule file written for a counterexample: replays exactly that case.
        #[arg(long, value_name = "FILE", conflicts_with_all = ["suite", "seed", "case", "defects"])]
        schedule: Option<PathBuf>,
        /// Seed (default: the suite's).
        #[arg(long)]
        seed: Option<u64>,
        /// Case number, as a failure report prints it (default: explore until a failure).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        case: Option<u32>,
        /// Cases run at once (1: one at a time). Failures and shrinking are the same either way.
        #[arg(long, default_value_t = DEFAULT_CONCURRENCY, value_parser = concurrency_arg())]
        concurrency: usize,
        /// Defects to switch on (repeatable).
        #[arg(long = "defect", value_name = "NAME")]
        defects: Vec<Defect>,
        /// The worker command a wire schedule file (`racecert-wire-schedule/1`) is replayed
        /// with: one process per worker of the file, its round trips held as the file says.
        #[arg(long, value_name = "CMD", requires = "schedule")]
        worker_cmd: Option<String>,
    },
    /// Diagnose the races in production logs (logfmt, JSON or Celery lines) and reproduce each
    /// cause against the reference worker, with the defect it needs and then safe; with
    /// --system, on the team's own system with its framework's faults.
    Replay {
        /// The log file.
        #[arg(required_unless_present = "system")]
        file: Option<PathBuf>,
        /// A system description: with a log file, reproduce the log's diagnoses on that system
        /// with its framework's faults; without one, rerun one case of a system run (with --seed
        /// and --case, as its report prints).
        #[arg(long, value_name = "FILE", conflicts_with = "defects")]
        system: Option<PathBuf>,
        /// With --system: the run's seed.
        #[arg(long, default_value_t = 1, requires = "system")]
        seed: u64,
        /// With --system and no log file: the case number.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..), requires = "system", conflicts_with = "file")]
        case: Option<u32>,
        /// With --system and no log file: the case's fault (default: the one the seed draws).
        #[arg(long, value_name = "NAME", requires = "case")]
        fault: Option<SystemFault>,
        /// Only this request's causes (request id, idempotency key or job id).
        #[arg(long)]
        request: Option<String>,
        /// Defects to switch on in the reference worker for every cause, instead of each cause's
        /// own (repeatable).
        #[arg(long = "defect", value_name = "NAME")]
        defects: Vec<Defect>,
        /// Output format.
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
    /// Work with reports.
    Report {
        #[command(subcommand)]
        command: ReportCommand,
    },
    /// Bring the test bed up, run the smoke scenario, print what it did, tear it down.
    Smoke,
    /// Run the reference worker as a standalone process under the contract's environment
    /// (RACECERT_* variables, see docs/contract.md); logs logfmt to stdout, drains on SIGTERM.
    Worker,
    /// Build or list the service images (Redis, PostgreSQL, fault proxy).
    Images {
        #[command(subcommand)]
        command: ImagesCommand,
    },
    /// Manage a long-lived test bed.
    Env {
        #[command(subcommand)]
        command: EnvCommand,
    },
    /// Remove racecert containers left behind by killed runs.
    Clean {
        /// Also remove containers of runs that are still alive.
        #[arg(long)]
        all: bool,
    },
    /// The Toxiproxy-compatible fault proxy server.
    Proxy {
        #[command(subcommand)]
        command: ProxyCommand,
    },
}

fn shard_arg(text: &str) -> std::result::Result<(u32, u32), String> {
    parse_shard(text).map_err(|err| err.to_string())
}

#[derive(Subcommand)]
enum ImagesCommand {
    /// Build the images that are missing (all of them with --force).
    Build {
        /// Rebuild even if present.
        #[arg(long)]
        force: bool,
        /// Only these services.
        #[arg(long, value_enum)]
        only: Vec<ServiceArg>,
    },
    /// List the configured images and the images racecert built.
    List,
    /// Write the images to DIR/<service>.tar (docker save), for a CI cache.
    Save {
        /// Directory for the archives.
        dir: PathBuf,
        /// Only these services.
        #[arg(long, value_enum)]
        only: Vec<ServiceArg>,
    },
    /// Load the archives `images save` wrote in DIR (docker load); a missing DIR loads nothing.
    Load {
        /// Directory of the archives.
        dir: PathBuf,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum ServiceArg {
    Redis,
    Postgres,
    Toxiproxy,
}

impl From<ServiceArg> for Service {
    fn from(arg: ServiceArg) -> Service {
        match arg {
            ServiceArg::Redis => Service::Redis,
            ServiceArg::Postgres => Service::Postgres,
            ServiceArg::Toxiproxy => Service::Proxy,
        }
    }
}

#[derive(Subcommand)]
enum EnvCommand {
    /// Start a test bed, print its addresses, keep it up until Ctrl-C.
    Up,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
}

#[derive(Subcommand)]
enum ReportCommand {
    /// Join shard reports (report.json files) into one set of reports.
    Merge {
        /// report.json files of the shards.
        #[arg(required = true)]
        inputs: Vec<PathBuf>,
        /// Where the merged reports go.
        #[arg(long, default_value = "target/racecert")]
        out: PathBuf,
    },
}

#[derive(Subcommand)]
enum ProxyCommand {
    /// Serve Toxiproxy's HTTP API (used by the proxy image).
    Serve {
        /// Address to bind the API on.
        #[arg(long, default_value = "127.0.0.1")]
        host: std::net::IpAddr,
        /// Port of the API.
        #[arg(long, default_value_t = 8474)]
        port: u16,
    },
}

fn main() -> ExitCode {
    quiet_backend_connection_panics();
    let cli = Cli::parse();
    let color = cli.color;
    match real_main(cli, color) {
        Ok(code) => code,
        Err(err) => {
            // The whole chain, without repeating a cause that its error already quotes (an
            // I/O error names its path and then its cause); no backtrace for a user's mistake.
            let mut message = err.to_string();
            for cause in err.chain().skip(1) {
                let cause = cause.to_string();
                if !message.ends_with(&cause) {
                    message.push_str(": ");
                    message.push_str(&cause);
                }
            }
            eprintln!("racecert: error: {message}");
            match err.downcast_ref::<racecert::Error>() {
                Some(racecert::Error::Interrupted(_)) => interrupted_code(),
                _ => ExitCode::from(2),
            }
        }
    }
}

impl ColorWhen {
    /// Whether to colour what goes to a stream that `is_terminal` says is (or is not) a
    /// terminal: `auto` colours only a terminal, and never with `NO_COLOR` set to anything.
    fn colors(self, is_terminal: bool) -> bool {
        match self {
            ColorWhen::Always => true,
            ColorWhen::Never => false,
            ColorWhen::Auto => {
                is_terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
            }
        }
    }
}

/// wiremock panics in the task of a connection whose request body never fully arrived (a worker
/// killed, paused past its timeout or cut off mid-request, which racecert does on purpose); the
/// runtime confines the panic to that one connection and the mock server keeps serving. Such a
/// panic gets one debug line instead of a backtrace that reads as if racecert had crashed; every
/// other panic goes to the default hook.
fn quiet_backend_connection_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let in_wiremock = info
            .location()
            .is_some_and(|at| at.file().contains("/wiremock-"));
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

fn real_main(cli: Cli, color: ColorWhen) -> Result<ExitCode> {
    // The proxy server logs every proxy it starts: useful when it is the program, noise when it
    // is embedded in a test bed.
    let default_filter = match cli.command {
        Command::Proxy { .. } => "warn,racecert=info",
        // Injected partitions make sqlx and the proxy engine warn about every connection they
        // cut: expected noise.
        _ => "warn,racecert=info,racecert::env::proxy::server=warn,sqlx=error,noxious=off",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_filter.into()),
        )
        .with_ansi(color.colors(std::io::stderr().is_terminal()))
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    let stdout_color = color.colors(std::io::stdout().is_terminal());
    // Progress bars draw on stderr, and only on a terminal (indicatif hides them elsewhere);
    // they are plain text, so colour settings do not concern them.
    runtime.block_on(async move {
        stop_on_signals()?;
        run(cli.command, stdout_color).await
    })
}

/// SIGINT and SIGTERM ask the run to stop cleanly; a second one exits at once.
fn stop_on_signals() -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt()).context("install the SIGINT handler")?;
    let mut terminate = signal(SignalKind::terminate()).context("install the SIGTERM handler")?;
    tokio::spawn(async move {
        loop {
            let number = tokio::select! {
                _ = interrupt.recv() => 2,
                _ = terminate.recv() => 15,
            };
            if racecert::interrupt::request(number) {
                eprintln!(
                    "racecert: {}: stopping after the current step and cleaning up (send it again to exit at once)",
                    racecert::interrupt::name(number)
                );
            } else {
                eprintln!("racecert: exiting at once; the next start removes what is left");
                std::process::exit(128 + number);
            }
        }
    });
    Ok(())
}

/// 130 after SIGINT, 143 after SIGTERM.
fn interrupted_code() -> ExitCode {
    ExitCode::from(128 + racecert::interrupt::requested().unwrap_or(2) as u8)
}

fn verdict_code(passed: bool) -> ExitCode {
    if racecert::interrupt::requested().is_some() {
        interrupted_code()
    } else if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// How `work` meets a signal: it stops itself at its next step and reports what it did (an
/// exploration, a fleet run), or it is dropped where it stands (a replay, the smoke scenario).
#[derive(Clone, Copy, PartialEq, Eq)]
enum OnSignal {
    Finish,
    Drop,
}

/// Runs `work` on a fresh test bed and removes the bed whatever happens, a signal included.
async fn with_bed<T>(
    on_signal: OnSignal,
    work: impl AsyncFnOnce(&TestBed) -> Result<T>,
) -> Result<T> {
    let bed = TestBedBuilder::from_env()?.start().await?;
    tracing::info!(bed = %bed.id(), elapsed = ?bed.startup_time(), "test bed up");
    let outcome = match on_signal {
        OnSignal::Finish => work(&bed).await,
        OnSignal::Drop => tokio::select! {
            outcome = work(&bed) => outcome,
            () = racecert::interrupt::wait() => Err(racecert::Error::Interrupted(
                racecert::interrupt::name(racecert::interrupt::requested().unwrap_or(2)),
            )
            .into()),
        },
    };
    bed.shutdown().await;
    outcome
}

/// Suite files given, else every `suites/*.toml` here, else the shipped suites.
fn load_suites(paths: &[PathBuf]) -> Result<Vec<LoadedSuite>> {
    if !paths.is_empty() {
        return paths
            .iter()
            .map(|path| suite_file::load(path).map_err(anyhow::Error::from))
            .collect();
    }
    let dir = Path::new("suites");
    if dir.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("read {}", dir.display()))?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
            .collect();
        files.sort();
        if !files.is_empty() {
            return files
                .iter()
                .map(|path| suite_file::load(path).map_err(anyhow::Error::from))
                .collect();
        }
    }
    Ok(racecert::suite::shipped())
}

fn find_suite(name_or_path: &str) -> Result<LoadedSuite> {
    let path = Path::new(name_or_path);
    if path.is_file() {
        return Ok(suite_file::load(path)?);
    }
    let all = load_suites(&[])?;
    let names: Vec<String> = all.iter().map(|s| s.suite.name.clone()).collect();
    all.into_iter()
        .find(|s| s.suite.name == name_or_path)
        .with_context(|| {
            format!(
                "no suite file or suite named {name_or_path:?}; suites: {}",
                names.join(", ")
            )
        })
}

/// One progress bar per named task, on stderr (drawn only on a terminal); a task of no known
/// length (a time budget) shows a count.
fn progress_bars(
    tasks: impl IntoIterator<Item = (String, Option<u64>)>,
    unit: &str,
) -> std::sync::Arc<std::collections::HashMap<String, indicatif::ProgressBar>> {
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
    std::sync::Arc::new(
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

async fn certify_command(
    suites: Vec<LoadedSuite>,
    options: CertifyOptions,
    out: &Path,
    color: bool,
) -> Result<ExitCode> {
    println!(
        "racecert certify: {} suite(s){}; bringing the test bed up (images are built on first use)",
        suites.len(),
        options
            .shard
            .map(|(i, n)| format!(", shard {i}/{n}"))
            .unwrap_or_default()
    );
    let report = with_bed(OnSignal::Finish, async |bed: &TestBed| {
        println!("test bed up in {:.1?}", bed.startup_time());
        let bars = progress_bars(
            suites.iter().map(|s| {
                (
                    s.suite.name.clone(),
                    options.cases.or(s.suite.cases).map(u64::from),
                )
            }),
            "cases",
        );
        let progress = {
            let bars = bars.clone();
            move |suite: &str, done: u32| {
                if let Some(bar) = bars.get(suite) {
                    bar.set_position(u64::from(done));
                }
            }
        };
        let handle = tokio::runtime::Handle::current();
        let report =
            tokio::task::block_in_place(|| certify(&handle, bed, &suites, &options, progress));
        for bar in bars.values() {
            bar.finish();
        }
        Ok(report?)
    })
    .await?;
    report.write_all(out)?;
    print!("{}", report.terminal_with(color));
    println!(
        "reports: {0}/report.html, {0}/report.json, {0}/junit.xml",
        out.display()
    );
    Ok(verdict_code(report.passed()))
}

async fn certify_external_command(
    command: &str,
    rounds: u32,
    wire_budget: u64,
    seed: u64,
    defects: Defects,
    out: &Path,
    color: bool,
) -> Result<ExitCode> {
    println!(
        "racecert certify --worker-cmd {command:?}: wire schedules for up to {wire_budget} s, then \
         up to {rounds} fleet run(s); bringing the test bed up"
    );
    let (wire, outcome) = with_bed(OnSignal::Finish, async |bed: &TestBed| {
        let mut wire = None;
        if wire_budget > 0 {
            let mut search = racecert::schedule::wire::WireSearch::default_for(seed);
            search.budget = std::time::Duration::from_secs(wire_budget);
            let bars = progress_bars(
                [("external-wire".to_owned(), Some(u64::from(search.cases)))],
                "cases",
            );
            let bar = &bars["external-wire"];
            let schedules = out.join("schedules");
            let searched = racecert::suite::certify::certify_external_wire(
                bed,
                command,
                &search,
                &defects,
                Some(&schedules),
                |done| bar.set_position(u64::from(done)),
            )
            .await;
            bar.finish();
            // Stopped by a signal before a case ended: the partial report says so, with no
            // verdict of the wire search.
            let (outcome, report) = match searched {
                Err(racecert::Error::Interrupted(_)) => return Ok((None, None)),
                other => other?,
            };
            println!(
                "wire schedules: {} case(s) in {:.1} s ({:.1}/s), {} with a held worker that timed \
                 out; {}",
                report.cases,
                report.elapsed.as_secs_f64(),
                f64::from(report.cases) / report.elapsed.as_secs_f64().max(1e-3),
                report.timeouts,
                match &report.found {
                    Some(found) => format!(
                        "failure at case {} after {:.1} s, shrunk from {} to {} step(s) in {} run(s)",
                        found.case,
                        found.after.as_secs_f64(),
                        found.original.steps.len(),
                        found.shrunk.schedule.steps.len(),
                        found.shrink_runs
                    ),
                    None => "no failure".to_owned(),
                }
            );
            wire = Some(outcome);
        }
        if racecert::interrupt::requested().is_some() {
            return Ok((wire, None));
        }
        let bars = progress_bars([("external-fleet".to_owned(), Some(u64::from(rounds)))], "runs");
        let bar = &bars["external-fleet"];
        let outcome = racecert::suite::certify::certify_external(
            bed,
            command,
            rounds,
            seed,
            &defects,
            |done| bar.set_position(u64::from(done)),
        )
        .await;
        bar.finish();
        match outcome {
            Err(racecert::Error::Interrupted(_)) => Ok((wire, None)),
            other => Ok((wire, Some(other?))),
        }
    })
    .await?;
    let mut report = Report::new(None);
    // Which runner found what: one suite each.
    report.suites.extend(wire);
    report.suites.extend(outcome);
    report.interrupted = racecert::interrupt::requested().map(racecert::interrupt::name);
    report.write_all(out)?;
    print!("{}", report.terminal_with(color));
    println!(
        "reports: {0}/report.html, {0}/report.json, {0}/junit.xml (worker stdout/stderr in the HTML and JSON)",
        out.display()
    );
    Ok(verdict_code(report.passed()))
}

/// Exit code of a replay whose worker sent other round trips than its file recorded: neither a
/// pass nor a failure.
const DIVERGED: u8 = 3;

async fn run_wire_file(path: &Path, worker_cmd: Option<&str>) -> Result<ExitCode> {
    use racecert::schedule::wire::{WireScheduleFile, run_wire};
    let file = WireScheduleFile::read(path)?;
    let Some(command) = worker_cmd else {
        anyhow::bail!(
            "{} is a wire schedule file: replay it with --worker-cmd CMD (it was found with {:?})",
            path.display(),
            file.command
        );
    };
    let settings = file.settings(command);
    let outcome = with_bed(OnSignal::Finish, async |bed: &TestBed| {
        // A file written by hand carries no trace: nothing to diverge from.
        let expected = (!file.trace.is_empty()).then_some(file.trace.as_slice());
        Ok(run_wire(bed, &settings, &file.schedule, expected).await?)
    })
    .await?;
    print!(
        "{}",
        outcome.text(&format!(
            "wire schedule {} with {command:?}",
            path.display()
        ))
    );
    print!("{}", outcome.case.history.timeline());
    if outcome.divergence.is_some() {
        return Ok(ExitCode::from(DIVERGED));
    }
    Ok(verdict_code(outcome.case.violations.is_empty()))
}

/// `certify --system` and `replay --system`: a test bed, the system run, its reports.
async fn system_command(file: &Path, settings: SystemSettings, out: &Path) -> Result<ExitCode> {
    let system = System::load(file)?;
    println!(
        "racecert certify --system {}: {} ({}), up to {} case(s) in {:?}; bringing the test bed up",
        file.display(),
        system.name,
        system.framework.name(),
        settings.only_case.map_or(settings.cases, |_| 1),
        settings.budget
    );
    let bed = TestBedBuilder::from_env()?.start().await?;
    let outcome = run_system(&bed, &system, &settings).await;
    bed.shutdown().await;
    let outcome = outcome?;
    std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    let json = out.join("system-report.json");
    std::fs::write(&json, serde_json::to_string_pretty(&outcome)?)
        .with_context(|| format!("write {}", json.display()))?;
    let html = out.join("system-report.html");
    std::fs::write(&html, racecert::report::system::system_html(&outcome, file))
        .with_context(|| format!("write {}", html.display()))?;
    let log = out.join("workers.log");
    std::fs::write(&log, racecert::report::system::workers_log(&outcome))
        .with_context(|| format!("write {}", log.display()))?;
    print!("{}", racecert::report::system::system_text(&outcome, file));
    println!(
        "reports: {}, {}; the workers' log: {}",
        json.display(),
        html.display(),
        log.display()
    );
    Ok(verdict_code(outcome.passed()))
}

/// Exit code when nothing in the log could be reconstructed.
const NOTHING_RECONSTRUCTED: u8 = 2;

/// `replay LOG --system FILE`: the log's diagnoses, reproduced on the team's system with the
/// faults of its framework that re-create them.
async fn replay_on_system(
    file: &Path,
    system_file: &Path,
    seed: u64,
    request: Option<&str>,
    format: Format,
) -> Result<ExitCode> {
    // The description first: a file that cannot load is named with its line and column before
    // anything else happens.
    let system = System::load(system_file)?;
    let bytes = std::fs::read(file).with_context(|| format!("read {}", file.display()))?;
    let analysis = racecert::replay::analyse(&bytes, request);
    let print = |text: String, json: String| match format {
        Format::Text => print!("{text}"),
        Format::Json => println!("{json}"),
    };
    if analysis.reconstruction.requests.is_empty() {
        print(analysis.text(), serde_json::to_string_pretty(&analysis)?);
        eprintln!(
            "{}: nothing to replay: no inference request could be reconstructed{}",
            file.display(),
            request.map(|r| format!(" for {r}")).unwrap_or_default()
        );
        return Ok(ExitCode::from(NOTHING_RECONSTRUCTED));
    }
    let faults = racecert::replay::system::faults_to_run(&analysis, system.framework, &system.keys);
    let outcome = if faults.is_empty() {
        None
    } else {
        let mut settings = SystemSettings::certify(seed);
        settings.cases = faults.len() as u32;
        settings.faults = faults;
        settings.stop_at_first_failure = false;
        // A fault runs only while a diagnosis it could re-create is not reproduced yet.
        settings.goals = racecert::replay::system::goals(&analysis, system.framework, &system.keys);
        // One case per fault, each bounded by its own drain: the budget only guards against a
        // system that never settles.
        settings.budget = std::time::Duration::from_secs(900);
        eprintln!(
            "replaying {} on {} ({}): {} case(s), faults {}; bringing the test bed up",
            file.display(),
            system.name,
            system.framework.name(),
            settings.cases,
            settings
                .faults
                .iter()
                .map(|f| f.name())
                .collect::<Vec<_>>()
                .join(", ")
        );
        let bed = TestBedBuilder::from_env()?.start().await?;
        let outcome = run_system(&bed, &system, &settings).await;
        bed.shutdown().await;
        Some(outcome?)
    };
    let report = racecert::replay::system::SystemReplay::judge(
        analysis,
        system_file,
        &system.name,
        system.framework,
        &system.keys,
        outcome,
    );
    print(report.text(), serde_json::to_string_pretty(&report)?);
    Ok(verdict_code(report.held()))
}

async fn replay(
    file: &Path,
    request: Option<&str>,
    defects: Defects,
    format: Format,
) -> Result<ExitCode> {
    let bytes = std::fs::read(file).with_context(|| format!("read {}", file.display()))?;
    let analysis = racecert::replay::analyse(&bytes, request);
    let print = |text: String, json: String| match format {
        Format::Text => print!("{text}"),
        Format::Json => println!("{json}"),
    };
    if analysis.reconstruction.requests.is_empty() || analysis.findings.is_empty() {
        print(analysis.text(), serde_json::to_string_pretty(&analysis)?);
        if analysis.reconstruction.requests.is_empty() {
            eprintln!(
                "{}: nothing to replay: no inference request could be reconstructed{}",
                file.display(),
                request.map(|r| format!(" for {r}")).unwrap_or_default()
            );
            return Ok(ExitCode::from(NOTHING_RECONSTRUCTED));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let given = defects.iter().next().is_some();
    let options = racecert::replay::ReproduceOptions {
        defects: given.then_some(defects),
        ..Default::default()
    };
    // Kept for a partial report: the diagnosis stands even if the reproductions are cut short.
    let diagnosis = analysis.clone();
    let report = match with_bed(OnSignal::Drop, async |bed: &TestBed| {
        Ok(racecert::replay::reproduce_on(bed, analysis, &options).await?)
    })
    .await
    {
        Ok(report) => report,
        Err(_) if racecert::interrupt::requested().is_some() => {
            let signal = racecert::interrupt::name(racecert::interrupt::requested().unwrap_or(2));
            print(
                format!(
                    "{}replay interrupted by {signal}: the diagnosis above stands, no cause was reproduced\n",
                    diagnosis.text()
                ),
                serde_json::to_string_pretty(&serde_json::json!({
                    "interrupted": signal,
                    "analysis": diagnosis,
                }))?,
            );
            return Ok(interrupted_code());
        }
        Err(err) => return Err(err),
    };
    print(report.text(), serde_json::to_string_pretty(&report)?);
    Ok(verdict_code(report.held()))
}

async fn run_case(
    suite: Option<&str>,
    schedule: Option<&Path>,
    seed: Option<u64>,
    case: Option<u32>,
    concurrency: usize,
    defects: Defects,
    worker_cmd: Option<&str>,
) -> Result<ExitCode> {
    if let Some(path) = schedule
        && racecert::schedule::wire::WireScheduleFile::is_wire(path)
    {
        return run_wire_file(path, worker_cmd).await;
    }
    if worker_cmd.is_some() {
        anyhow::bail!(
            "--worker-cmd replays a wire schedule file (format {:?}); {} is not one",
            racecert::schedule::wire::FORMAT,
            schedule
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        );
    }
    if let Some(path) = schedule {
        let file = ScheduleFile::read(path)?;
        let held = with_bed(OnSignal::Finish, async |bed: &TestBed| {
            let controller =
                racecert::schedule::controlled::Controller::new(bed, file.settings()).await?;
            let result = controller.run(&file.schedule).await?;
            print!(
                "{}",
                racecert::report::case_text(
                    &format!("schedule {} (suite {})", path.display(), file.suite),
                    &file.schedule,
                    &result
                )
            );
            Ok(result.violations.is_empty())
        })
        .await?;
        return Ok(verdict_code(held));
    }
    let loaded = find_suite(suite.expect("clap requires a suite without --schedule"))?;
    let seed = seed.unwrap_or(loaded.seed);
    let suite = loaded.suite.clone().with_defects(defects.clone());
    let config = ExploreConfig {
        cases: suite.cases.unwrap_or(u32::MAX),
        // Without a case count, explore for the suite's budget (or a whole run's).
        time_budget: match suite.cases {
            Some(_) => None,
            None => Some(
                loaded
                    .time_budget
                    .unwrap_or(racecert::suite::certify::DEFAULT_BUDGET),
            ),
        },
        seed,
        regressions: defects
            .iter()
            .next()
            .is_none()
            .then(|| PathBuf::from("proptest-regressions").join(format!("{}.txt", suite.name))),
        concurrency,
        ..Default::default()
    };
    let held = with_bed(OnSignal::Finish, async |bed: &TestBed| {
        let controller =
            racecert::schedule::controlled::Controller::new(bed, suite.settings.clone()).await?;
        let handle = tokio::runtime::Handle::current();
        tokio::task::block_in_place(|| -> Result<bool> {
            match case {
                Some(case) => {
                    let (schedule, result) = racecert::schedule::explore::replay_case(
                        &handle,
                        &controller,
                        &suite.space,
                        &config,
                        case,
                    )?;
                    print!(
                        "{}",
                        racecert::report::case_text(
                            &format!("suite {} seed {seed} case {case}", suite.name),
                            &schedule,
                            &result
                        )
                    );
                    Ok(result.violations.is_empty())
                }
                None => {
                    let report = racecert::schedule::explore::explore(
                        &handle,
                        &controller,
                        &suite.space,
                        &config,
                    )?;
                    let Some(found) = &report.counterexample else {
                        if report.interrupted {
                            println!(
                                "suite {}: interrupted after {} cases (seed {seed}); every invariant held so far",
                                suite.name, report.cases_run
                            );
                        } else {
                            println!(
                                "suite {}: every invariant held over {} cases (seed {seed})",
                                suite.name, report.cases_run
                            );
                        }
                        return Ok(true);
                    };
                    let path = PathBuf::from("target/racecert/schedules").join(
                        racecert::suite::certify::schedule_file_name(&suite.name, &defects),
                    );
                    let mut file =
                        ScheduleFile::new(&suite.name, &suite.settings, found.schedule.clone());
                    file.found = Some(racecert::schedule::file::Found {
                        seed,
                        case: found.found_after.0,
                    });
                    file.violated = racecert::check::broken(&found.result.violations)
                        .into_iter()
                        .collect();
                    file.write(&path)?;
                    print!(
                        "{}",
                        racecert::report::counterexample_text(
                            found,
                            seed,
                            &format!("racecert run --schedule {}", path.display())
                        )
                    );
                    println!(
                        "or: {}",
                        replay_command(&loaded, seed, found.generated_case, &defects)
                    );
                    Ok(false)
                }
            }
        })
    })
    .await?;
    Ok(verdict_code(held))
}

async fn run(command: Command, color: bool) -> Result<ExitCode> {
    match command {
        Command::Certify {
            suites,
            defects,
            cases,
            budget,
            seed,
            concurrency,
            shard,
            out,
            worker_cmd,
            rounds,
            wire_budget,
            system,
            faults,
            keep_going,
        } => {
            if let Some(file) = system {
                let mut settings = SystemSettings::certify(seed.unwrap_or(1));
                if let Some(budget) = budget {
                    settings.budget = budget;
                }
                settings.faults = faults;
                settings.stop_at_first_failure = !keep_going;
                if let Some(cases) = cases {
                    settings.cases = cases;
                }
                return system_command(&file, settings, &out).await;
            }
            // A suite run is either a fixed number of cases or a time budget; a system run takes
            // both (cases at most, within the budget).
            if cases.is_some() && budget.is_some() {
                anyhow::bail!(
                    "the argument '--cases <CASES>' cannot be used with '--budget <SECONDS>' (except with --system)"
                );
            }
            let defects = Defects::of(defects);
            if let Some(command) = worker_cmd {
                return certify_external_command(
                    &command,
                    rounds,
                    wire_budget,
                    seed.unwrap_or(1),
                    defects,
                    &out,
                    color,
                )
                .await;
            }
            let options = CertifyOptions {
                defects,
                cases,
                budget,
                seed,
                shard,
                regressions: Some(PathBuf::from("proptest-regressions")),
                concurrency,
                schedules: Some(out.join("schedules")),
            };
            // Every suite file is validated before anything runs.
            let suites = shard_of(load_suites(&suites)?, shard);
            certify_command(suites, options, &out, color).await
        }
        Command::Run {
            suite,
            schedule,
            seed,
            case,
            concurrency,
            defects,
            worker_cmd,
        } => {
            run_case(
                suite.as_deref(),
                schedule.as_deref(),
                seed,
                case,
                concurrency,
                Defects::of(defects),
                worker_cmd.as_deref(),
            )
            .await
        }
        Command::Replay {
            file,
            system,
            seed,
            case,
            fault,
            request,
            defects,
            format,
        } => match (system, file) {
            (Some(system), Some(file)) => {
                replay_on_system(&file, &system, seed, request.as_deref(), format).await
            }
            (Some(system), None) => {
                if case.is_none() {
                    anyhow::bail!(
                        "replay --system {} needs a log file to reproduce (racecert replay LOG --system FILE) or --case N to rerun one case of a system run",
                        system.display()
                    );
                }
                let mut settings = SystemSettings::certify(seed);
                settings.only_case = case;
                settings.faults = fault.into_iter().collect();
                system_command(&system, settings, Path::new("target/racecert")).await
            }
            (None, Some(file)) => {
                replay(&file, request.as_deref(), Defects::of(defects), format).await
            }
            (None, None) => unreachable!("clap requires a log file or --system"),
        },
        Command::Report {
            command: ReportCommand::Merge { inputs, out },
        } => {
            let reports = inputs
                .iter()
                .map(|path| Report::read(path))
                .collect::<racecert::Result<Vec<_>>>()?;
            let merged = Report::merge(reports)?;
            merged.write_all(&out)?;
            print!("{}", merged.terminal_with(color));
            println!("reports: {}", out.display());
            Ok(verdict_code(merged.passed()))
        }
        Command::Smoke => smoke().await,
        Command::Worker => {
            racecert::reference::process::run(racecert::reference::process::WorkerEnv::from_env()?)
                .await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Images { command } => images_command(command).await,
        Command::Env {
            command: EnvCommand::Up,
        } => {
            with_bed(OnSignal::Finish, async |bed: &TestBed| {
                print!("{}", racecert::report::addresses_text(&bed.addresses()));
                println!(
                    "test bed up in {:.1?}; Ctrl-C tears it down",
                    bed.startup_time()
                );
                racecert::interrupt::wait().await;
                Ok(())
            })
            .await?;
            Ok(interrupted_code())
        }
        Command::Clean { all } => {
            let removed = tokio::task::spawn_blocking(move || reaper::reap(all)).await??;
            if removed.is_empty() {
                println!("no leftover racecert containers");
            }
            for container in removed {
                println!(
                    "removed {} ({}, {}, owner pid {})",
                    container.name,
                    &container.id[..12.min(container.id.len())],
                    container.service,
                    container.owner.pid
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Proxy {
            command: ProxyCommand::Serve { host, port },
        } => {
            let listen = SocketAddr::new(host, port);
            eprintln!("racecert fault proxy: Toxiproxy API on http://{listen}");
            racecert::env::proxy::server::serve(listen, racecert::interrupt::wait()).await?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn images_command(command: ImagesCommand) -> Result<ExitCode> {
    let config = ImageConfig::from_env()?;
    match command {
        ImagesCommand::Build { force, only } => {
            let services: Vec<Service> = if only.is_empty() {
                Service::ALL.to_vec()
            } else {
                only.into_iter().map(Service::from).collect()
            };
            let outcomes = tokio::task::spawn_blocking(move || {
                images::ensure_images(&config, &services, force)
            })
            .await??;
            for outcome in outcomes {
                println!(
                    "{:<10} {:<40} {:<36} {:.1?}",
                    outcome.service.name(),
                    outcome.image.to_string(),
                    outcome.action,
                    outcome.elapsed
                );
            }
        }
        ImagesCommand::Save { dir, only } => {
            let services: Vec<Service> = if only.is_empty() {
                Service::ALL.to_vec()
            } else {
                only.into_iter().map(Service::from).collect()
            };
            let written =
                tokio::task::spawn_blocking(move || images::save_images(&config, &services, &dir))
                    .await??;
            for file in written {
                println!("saved {}", file.display());
            }
        }
        ImagesCommand::Load { dir } => {
            let shown = dir.display().to_string();
            let loaded = tokio::task::spawn_blocking(move || images::load_images(&dir)).await??;
            if loaded.is_empty() {
                println!("no image archives in {shown}");
            }
            for image in loaded {
                println!("loaded {image}");
            }
        }
        ImagesCommand::List => {
            println!("configured:");
            for service in Service::ALL {
                let image = config.get(service).to_string();
                let present = images::image_exists(&image)?;
                println!(
                    "  {:<10} {:<40} {}",
                    service.name(),
                    image,
                    if present { "present" } else { "missing" }
                );
            }
            println!("built by racecert:");
            print!("{}", images::list_images()?);
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn smoke() -> Result<ExitCode> {
    println!("racecert smoke: bringing the test bed up (images are built on first use)");
    let steps = with_bed(OnSignal::Drop, async |bed: &TestBed| {
        println!("test bed up in {:.1?}", bed.startup_time());
        print!("{}", racecert::report::addresses_text(&bed.addresses()));
        racecert::smoke::run(bed, |step| {
            println!(
                "ok  {:<26} {} ({:.1?})",
                step.name, step.observed, step.elapsed
            );
        })
        .await
        .context("smoke scenario failed")
    })
    .await?;
    println!("smoke passed: {} steps, test bed removed", steps.len());
    Ok(ExitCode::SUCCESS)
}
