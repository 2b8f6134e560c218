//! The arguments of every command, as clap parses them: each command's own struct, which its
//! module in [`crate::cli`] takes whole. Checks that a value is well formed belong here (clap
//! value parsers), so a bad argument is refused before anything starts.

use crate::contract::defect::Defect;
use crate::env::images::Service;
use crate::fault::FaultKind;
use crate::logs::FieldMap;
use crate::schedule::search::DEFAULT_CONCURRENCY;
use crate::suite::certify::parse_shard;
use clap::{Args, Subcommand, ValueEnum};
use std::path::PathBuf;

/// When to colour output.
#[derive(Clone, Copy, ValueEnum)]
pub enum ColorWhen {
    /// Only on a terminal, and never with `NO_COLOR` set.
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

impl ColorWhen {
    /// Whether to colour what goes to a stream that `is_terminal` says is (or is not) a
    /// terminal: `auto` colours only a terminal, and never with `NO_COLOR` set to anything.
    pub fn colors(self, is_terminal: bool) -> bool {
        match self {
            ColorWhen::Always => true,
            ColorWhen::Never => false,
            ColorWhen::Auto => {
                is_terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
            }
        }
    }
}

/// A time budget in seconds (fractions allowed), more than zero.
pub fn budget_arg(text: &str) -> std::result::Result<std::time::Duration, String> {
    let seconds: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !(seconds.is_finite() && seconds > 0.0) {
        return Err(format!("{text}: the budget must be more than 0 seconds"));
    }
    Ok(std::time::Duration::from_secs_f64(seconds))
}

/// Cases run at once: 1 to 64.
pub fn concurrency_arg() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64)
}

/// `racecert certify`.
#[derive(Args)]
pub struct CertifyArgs {
    /// Suite files to run (default: every suites/*.toml, or the shipped ones).
    #[arg(long = "suite", value_name = "FILE")]
    pub suites: Vec<PathBuf>,
    /// Switch a defect on in the reference worker (repeatable).
    #[arg(long = "defect", value_name = "NAME")]
    pub defects: Vec<Defect>,
    /// A fixed number of cases per suite, for exact reproduction (no time budget; with
    /// --system: cases at most, within --budget; without --budget, 40 s per case).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub cases: Option<u32>,
    /// Total time budget in seconds, spent across the suites (default 60; a suite file's
    /// `time_budget_s` takes its own share). With --system: seconds of cases (start-up not
    /// counted; default 15 s per fault kind in scope, at least 120, or 40 s per case of --cases).
    #[arg(long, value_name = "SECONDS", value_parser = budget_arg)]
    pub budget: Option<std::time::Duration>,
    /// Seed (overrides the suite files).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Cases run at once (1: one at a time). Failures and shrinking are the same either way.
    #[arg(long, default_value_t = DEFAULT_CONCURRENCY, value_parser = concurrency_arg())]
    pub concurrency: usize,
    /// Run shard i of n (e.g. 2/4); merge shard reports with `racecert report merge`.
    #[arg(long, value_parser = shard_arg)]
    pub shard: Option<(u32, u32)>,
    /// Where report.json, junit.xml, report.html and counterexample schedules go.
    #[arg(long, default_value = "target/racecert")]
    pub out: PathBuf,
    /// Certify an external worker: the command starts one worker process under the
    /// contract's environment (docs/contract.md), e.g. "racecert worker".
    #[arg(long, value_name = "CMD", conflicts_with_all = ["suites", "shard", "cases", "budget"])]
    pub worker_cmd: Option<String>,
    /// Fleet runs for --worker-cmd (stops at the first violation).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,
    /// Seconds of wire schedules for --worker-cmd before the fleet runs (0: fleet only). The
    /// depth-2 and depth-3 enumerations are not cut short by it: they may take up to twice it.
    #[arg(long, default_value_t = 90, value_name = "SECS")]
    pub wire_budget: u64,
    /// Certify a worker racecert did not write, from its system description
    /// (docs/systems.md): its own framework, tables and model API.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["suites", "shard", "worker_cmd", "defects"])]
    pub system: Option<PathBuf>,
    /// With --system: only these faults (repeatable; default: the framework's own).
    #[arg(long = "fault", value_name = "NAME", requires = "system")]
    pub faults: Vec<FaultKind>,
    /// With --system: run every case even after a failure.
    #[arg(long, requires = "system")]
    pub keep_going: bool,
}

/// `racecert run`.
#[derive(Args)]
pub struct RunArgs {
    /// Suite name or file.
    #[arg(required_unless_present = "schedule")]
    pub suite: Option<String>,
    /// A schedule file written for a counterexample: replays exactly that case.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["suite", "seed", "case", "defects"])]
    pub schedule: Option<PathBuf>,
    /// Seed (default: the suite's).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Case number, as a failure report prints it (default: explore until a failure).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub case: Option<u32>,
    /// Cases run at once (1: one at a time). Failures and shrinking are the same either way.
    #[arg(long, default_value_t = DEFAULT_CONCURRENCY, value_parser = concurrency_arg())]
    pub concurrency: usize,
    /// Defects to switch on (repeatable).
    #[arg(long = "defect", value_name = "NAME")]
    pub defects: Vec<Defect>,
    /// For a wire schedule file: the command its worker processes run, instead of the one the
    /// file names (one process per worker of the file, its round trips held as the file says).
    #[arg(long, value_name = "CMD", requires = "schedule")]
    pub worker_cmd: Option<String>,
}

/// `racecert replay`.
#[derive(Args)]
pub struct ReplayArgs {
    /// The log file, in any shape teams export, detected per file and line: logfmt, JSON (nested,
    /// camelCase, snake_case or dotted names) or Celery lines, behind `kubectl logs --prefix`,
    /// `stern` or `docker compose logs` prefixes or not; journald JSON, OTLP JSON, Loki and
    /// Grafana exports, CSV; whole documents (a JSON array such as `gcloud logging read
    /// --format=json`, CloudWatch's `{"events": [...]}`, an Elasticsearch `_search` response),
    /// and records carrying the program's line in a string (Docker's `log`, a JSON `message`).
    /// Streamed: any size. A leap second (`23:59:60`) is read as `23:59:59` of its minute.
    #[arg(required_unless_present = "system")]
    pub file: Option<PathBuf>,
    /// A field under the team's own name: NAME is the seed's (request_id, job_id, worker_id,
    /// model_version, status, ...), PATH the key as the record spells it, nested keys joined with
    /// dots (`--field request_id=ctx.rid`). Repeatable.
    #[arg(long = "field", value_name = "NAME=PATH", value_parser = field_arg)]
    pub fields: Vec<FieldMap>,
    /// A system description: with a log file, reproduce the log's diagnoses on that system
    /// with its framework's faults; without one, rerun one case of a system run (with --seed
    /// and --case, as its report prints).
    #[arg(long, value_name = "FILE", conflicts_with = "defects")]
    pub system: Option<PathBuf>,
    /// With --system: the run's seed.
    #[arg(long, default_value_t = 1, requires = "system")]
    pub seed: u64,
    /// With --system and no log file: the case number.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), requires = "system", conflicts_with = "file")]
    pub case: Option<u32>,
    /// With --system and no log file: the case's fault (default: the one the seed draws).
    #[arg(long, value_name = "NAME", requires = "case")]
    pub fault: Option<FaultKind>,
    /// Only this request's causes (request id, idempotency key or job id).
    #[arg(long)]
    pub request: Option<String>,
    /// Defects to switch on in the reference worker for every cause, instead of each cause's
    /// own (repeatable).
    #[arg(long = "defect", value_name = "NAME")]
    pub defects: Vec<Defect>,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
}

/// `--field NAME=PATH`: the message names the flag, the value and what NAME may be.
pub fn field_arg(text: &str) -> std::result::Result<FieldMap, String> {
    text.parse()
}

/// A shard `i/n` of a certification run.
pub fn shard_arg(text: &str) -> std::result::Result<(u32, u32), String> {
    parse_shard(text).map_err(|err| err.to_string())
}

/// `racecert images`.
#[derive(Subcommand)]
pub enum ImagesCommand {
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
    /// Write the images to `DIR/<service>.tar` (docker save), for a CI cache.
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

/// A service whose image racecert builds.
#[derive(Clone, Copy, ValueEnum)]
pub enum ServiceArg {
    /// Redis.
    Redis,
    /// PostgreSQL.
    Postgres,
    /// The fault proxy.
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

/// `racecert env`.
#[derive(Subcommand)]
pub enum EnvCommand {
    /// Start a test bed, print its addresses, keep it up until Ctrl-C.
    Up,
}

/// Output format.
#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    /// For people.
    Text,
    /// JSON.
    Json,
}

/// `racecert report`.
#[derive(Subcommand)]
pub enum ReportCommand {
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

/// `racecert proxy`.
#[derive(Subcommand)]
pub enum ProxyCommand {
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
