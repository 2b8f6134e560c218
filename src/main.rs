//! `racecert`: the command line, a thin layer over the library.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use racecert::env::images::{self, ImageConfig, Service};
use racecert::env::{TestBed, TestBedBuilder, reaper};
use racecert::reference::defects::{Defect, Defects};
use racecert::report::Report;
use racecert::suite::certify::{CertifyOptions, certify, parse_shard, replay_command, shard_of};
use racecert::suite::file::{self as suite_file, LoadedSuite};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

#[derive(Parser)]
#[command(
    name = "racecert",
    version,
    about = "Certify inference workers against model-rollout races on real Redis, Postgres and a fault proxy"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
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
        defects: Vec<String>,
        /// Cases per suite (overrides the suite files).
        #[arg(long)]
        cases: Option<u32>,
        /// Seed (overrides the suite files).
        #[arg(long)]
        seed: Option<u64>,
        /// Cases run at once (1: one at a time). Failures and shrinking are the same either way.
        #[arg(long, default_value_t = racecert::schedule::explore::DEFAULT_CONCURRENCY, value_parser = concurrency_arg)]
        concurrency: usize,
        /// Run shard i of n (e.g. 2/4); merge shard reports with `racecert report merge`.
        #[arg(long)]
        shard: Option<String>,
        /// Where report.json, junit.xml and report.html go.
        #[arg(long, default_value = "target/racecert")]
        out: PathBuf,
        /// Certify an external worker: the command starts one worker process under the
        /// contract's environment (docs/contract.md), e.g. "racecert worker".
        #[arg(long, value_name = "CMD")]
        worker_cmd: Option<String>,
        /// Fleet runs for --worker-cmd (stops at the first violation).
        #[arg(long, default_value_t = 4)]
        rounds: u32,
    },
    /// Reproduce one case of a suite exactly and print its timeline.
    Run {
        /// Suite name or file.
        suite: String,
        /// Seed (default: the suite's).
        #[arg(long)]
        seed: Option<u64>,
        /// Case number, as a failure report prints it (default: explore until a failure).
        #[arg(long)]
        case: Option<u32>,
        /// Cases run at once (1: one at a time). Failures and shrinking are the same either way.
        #[arg(long, default_value_t = racecert::schedule::explore::DEFAULT_CONCURRENCY, value_parser = concurrency_arg)]
        concurrency: usize,
        /// Defects to switch on (repeatable).
        #[arg(long = "defect", value_name = "NAME")]
        defects: Vec<String>,
    },
    /// Diagnose the races in production logs (logfmt, JSON or Celery lines) and reproduce each
    /// cause against the reference worker, with the defect it needs and then safe.
    Replay {
        /// The log file.
        file: PathBuf,
        /// Only this request's causes (request id, idempotency key or job id).
        #[arg(long)]
        request: Option<String>,
        /// Defects to switch on in the reference worker for every cause, instead of each cause's
        /// own (repeatable).
        #[arg(long = "defect", value_name = "NAME")]
        defects: Vec<String>,
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

fn main() -> std::process::ExitCode {
    match real_main() {
        Ok(code) => code,
        Err(err) => {
            // The whole chain, one line per cause; no backtrace for a user's mistake.
            eprintln!("racecert: error: {err:#}");
            std::process::ExitCode::from(2)
        }
    }
}

fn real_main() -> Result<std::process::ExitCode> {
    let cli = Cli::parse();
    // The proxy server logs every proxy it starts: useful when it is the program, noise when it
    // is embedded in a test bed.
    let default_filter = match cli.command {
        Command::Proxy { .. } => "warn,racecert=info",
        // Injected partitions make sqlx warn about every connection they cut: expected noise.
        _ => "warn,racecert=info,racecert::env::proxy::server=warn,sqlx=error",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_filter.into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    let code = runtime.block_on(run(cli.command))?;
    Ok(code)
}

fn exit_code(passed: bool) -> std::process::ExitCode {
    if passed {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

fn parse_defects(names: &[String]) -> Result<Defects> {
    let defects = names
        .iter()
        .map(|name| name.parse::<Defect>())
        .collect::<racecert::Result<Vec<_>>>()?;
    Ok(Defects::of(defects))
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

async fn certify_command(
    suites: Vec<LoadedSuite>,
    options: CertifyOptions,
    out: &Path,
) -> Result<std::process::ExitCode> {
    println!(
        "racecert certify: {} suite(s){}; bringing the test bed up (images are built on first use)",
        suites.len(),
        options
            .shard
            .map(|(i, n)| format!(", shard {i}/{n}"))
            .unwrap_or_default()
    );
    let bed = TestBedBuilder::from_env()?.start().await?;
    println!("test bed up in {:.1?}", bed.startup_time());
    let bars = indicatif::MultiProgress::new();
    let style = indicatif::ProgressStyle::with_template(
        "{prefix:<26} [{bar:30}] {pos:>4}/{len:4} cases {elapsed:>4}",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
    .progress_chars("=> ");
    let by_name: std::collections::HashMap<String, indicatif::ProgressBar> = suites
        .iter()
        .map(|s| {
            let bar = bars.add(indicatif::ProgressBar::new(u64::from(
                options.cases.unwrap_or(s.suite.cases),
            )));
            bar.set_style(style.clone());
            bar.set_prefix(s.suite.name.clone());
            (s.suite.name.clone(), bar)
        })
        .collect();
    let by_name = std::sync::Arc::new(by_name);
    let progress = {
        let by_name = by_name.clone();
        move |suite: &str, done: u32| {
            if let Some(bar) = by_name.get(suite) {
                bar.set_position(u64::from(done));
            }
        }
    };
    let handle = tokio::runtime::Handle::current();
    let result =
        tokio::task::block_in_place(|| certify(&handle, &bed, &suites, &options, progress));
    for bar in by_name.values() {
        bar.finish();
    }
    bed.shutdown().await;
    let report = result?;
    report.write_all(out)?;
    print!("{}", report.terminal());
    println!(
        "reports: {0}/report.html, {0}/report.json, {0}/junit.xml",
        out.display()
    );
    Ok(exit_code(report.passed()))
}

/// Exit code when nothing in the log could be reconstructed.
const NOTHING_RECONSTRUCTED: u8 = 2;

async fn replay(
    file: &Path,
    request: Option<&str>,
    defects: Defects,
    format: Format,
) -> Result<std::process::ExitCode> {
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
            return Ok(std::process::ExitCode::from(NOTHING_RECONSTRUCTED));
        }
        return Ok(std::process::ExitCode::SUCCESS);
    }
    let given = defects.iter().next().is_some();
    let options = racecert::replay::ReproduceOptions {
        defects: given.then_some(defects),
        ..Default::default()
    };
    let bed = TestBedBuilder::from_env()?.start().await?;
    let report = racecert::replay::reproduce_on(&bed, analysis, &options).await;
    bed.shutdown().await;
    let report = report?;
    print(report.text(), serde_json::to_string_pretty(&report)?);
    Ok(exit_code(report.held()))
}

async fn certify_external_command(
    command: &str,
    rounds: u32,
    seed: u64,
    defects: Defects,
    out: &Path,
) -> Result<std::process::ExitCode> {
    println!(
        "racecert certify --worker-cmd {command:?}: up to {rounds} fleet run(s); bringing the test bed up"
    );
    let bed = TestBedBuilder::from_env()?.start().await?;
    let bar = indicatif::ProgressBar::new(u64::from(rounds));
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{prefix:<26} [{bar:30}] {pos:>4}/{len:4} runs {elapsed:>4}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_prefix("external-fleet");
    let outcome =
        racecert::suite::certify::certify_external(&bed, command, rounds, seed, &defects, |done| {
            bar.set_position(u64::from(done));
        })
        .await;
    bar.finish();
    bed.shutdown().await;
    let mut report = Report::new(None);
    report.suites.push(outcome?);
    report.write_all(out)?;
    print!("{}", report.terminal());
    println!(
        "reports: {0}/report.html, {0}/report.json, {0}/junit.xml (worker stdout/stderr in the HTML and JSON)",
        out.display()
    );
    Ok(exit_code(report.passed()))
}

/// `--concurrency`: 1 to 64 cases at once.
fn concurrency_arg(text: &str) -> std::result::Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n @ 1..=64) => Ok(n),
        Ok(n) => Err(format!(
            "{n} is out of range: between 1 and 64 cases at once"
        )),
        Err(err) => Err(format!("not a number of cases: {err}")),
    }
}

async fn run_case(
    suite: &str,
    seed: Option<u64>,
    case: Option<u32>,
    concurrency: usize,
    defects: Defects,
) -> Result<std::process::ExitCode> {
    let loaded = find_suite(suite)?;
    let seed = seed.unwrap_or(loaded.seed);
    let suite = loaded.suite.clone().with_defects(defects.clone());
    let bed = TestBedBuilder::from_env()?.start().await?;
    let handle = tokio::runtime::Handle::current();
    let config = racecert::schedule::explore::ExploreConfig {
        cases: suite.cases,
        seed,
        regressions: defects
            .iter()
            .next()
            .is_none()
            .then(|| PathBuf::from("proptest-regressions").join(format!("{}.txt", suite.name))),
        concurrency,
        ..Default::default()
    };
    let result = tokio::task::block_in_place(|| -> Result<bool> {
        let controller = handle.block_on(racecert::schedule::controlled::Controller::new(
            &bed,
            suite.settings.clone(),
        ))?;
        match case {
            Some(case) => {
                let (schedule, result) = racecert::schedule::explore::replay_case(
                    &handle,
                    &controller,
                    &suite.space,
                    &config,
                    case,
                )?;
                println!("suite {} seed {seed} case {case}:\n{schedule}", suite.name);
                println!("timeline:\n{}", result.history.timeline());
                for violation in &result.violations {
                    print!("{violation}");
                }
                if result.violations.is_empty() {
                    println!("every invariant held");
                }
                Ok(result.violations.is_empty())
            }
            None => {
                let report = racecert::schedule::explore::explore(
                    &handle,
                    &controller,
                    &suite.space,
                    &config,
                )?;
                match &report.counterexample {
                    None => {
                        println!(
                            "suite {}: every invariant held over {} cases (seed {seed})",
                            suite.name, report.cases_run
                        );
                        Ok(true)
                    }
                    Some(found) => {
                        let replay = replay_command(&loaded, seed, found.found_after.0, &defects);
                        print!("{}", found.report(seed, &replay));
                        Ok(false)
                    }
                }
            }
        }
    });
    bed.shutdown().await;
    Ok(exit_code(result?))
}

async fn run(command: Command) -> Result<std::process::ExitCode> {
    match command {
        Command::Certify {
            suites,
            defects,
            cases,
            seed,
            concurrency,
            shard,
            out,
            worker_cmd,
            rounds,
        } => {
            if let Some(command) = worker_cmd {
                if !suites.is_empty() || shard.is_some() || cases.is_some() {
                    anyhow::bail!(
                        "--worker-cmd runs the external fleet (process faults, real clocks); --suite, --shard and --cases apply to in-process suites"
                    );
                }
                return certify_external_command(
                    &command,
                    rounds,
                    seed.unwrap_or(1),
                    parse_defects(&defects)?,
                    &out,
                )
                .await;
            }
            let shard = shard.as_deref().map(parse_shard).transpose()?;
            let options = CertifyOptions {
                defects: parse_defects(&defects)?,
                cases,
                seed,
                shard,
                regressions: Some(PathBuf::from("proptest-regressions")),
                concurrency,
            };
            if cases == Some(0) {
                anyhow::bail!("--cases must be at least 1");
            }
            // Every suite file is validated before anything runs.
            let suites = shard_of(load_suites(&suites)?, shard);
            certify_command(suites, options, &out).await
        }
        Command::Run {
            suite,
            seed,
            case,
            concurrency,
            defects,
        } => run_case(&suite, seed, case, concurrency, parse_defects(&defects)?).await,
        Command::Replay {
            file,
            request,
            defects,
            format,
        } => replay(&file, request.as_deref(), parse_defects(&defects)?, format).await,
        Command::Report {
            command: ReportCommand::Merge { inputs, out },
        } => {
            let reports = inputs
                .iter()
                .map(|path| Report::read(path))
                .collect::<racecert::Result<Vec<_>>>()?;
            let merged = Report::merge(reports)?;
            merged.write_all(&out)?;
            print!("{}", merged.terminal());
            println!("reports: {}", out.display());
            Ok(exit_code(merged.passed()))
        }
        Command::Smoke => smoke().await.map(|()| std::process::ExitCode::SUCCESS),
        Command::Worker => {
            racecert::reference::process::run(racecert::reference::process::WorkerEnv::from_env()?)
                .await?;
            Ok(std::process::ExitCode::SUCCESS)
        }
        Command::Images { command } => match command {
            ImagesCommand::Build { force, only } => {
                let config = ImageConfig::from_env()?;
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
                Ok(std::process::ExitCode::SUCCESS)
            }
            ImagesCommand::List => {
                let config = ImageConfig::from_env()?;
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
                Ok(std::process::ExitCode::SUCCESS)
            }
        },
        Command::Env {
            command: EnvCommand::Up,
        } => {
            let bed = TestBedBuilder::from_env()?.start().await?;
            print_addresses(&bed);
            println!(
                "test bed up in {:.1?}; Ctrl-C tears it down",
                bed.startup_time()
            );
            tokio::signal::ctrl_c().await?;
            bed.shutdown().await;
            Ok(std::process::ExitCode::SUCCESS)
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
            Ok(std::process::ExitCode::SUCCESS)
        }
        Command::Proxy {
            command: ProxyCommand::Serve { host, port },
        } => {
            let listen = SocketAddr::new(host, port);
            eprintln!("racecert fault proxy: Toxiproxy API on http://{listen}");
            racecert::env::proxy::server::serve(listen, async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await?;
            Ok(std::process::ExitCode::SUCCESS)
        }
    }
}

fn print_addresses(bed: &TestBed) {
    let a = bed.addresses();
    println!(
        "redis      {}  (direct {})",
        a.redis_url, a.redis_direct_url
    );
    println!(
        "postgres   {}  (direct {})",
        a.database_url, a.database_direct_url
    );
    for (name, version, url) in &a.backends {
        println!("backend    {url}  {name} serving {version}");
    }
    println!("toxiproxy  {}", a.toxiproxy_url);
}

async fn smoke() -> Result<()> {
    println!("racecert smoke: bringing the test bed up (images are built on first use)");
    let bed = TestBedBuilder::from_env()?.start().await?;
    println!("test bed up in {:.1?}", bed.startup_time());
    print_addresses(&bed);
    let result = racecert::smoke::run(&bed, |step| {
        println!(
            "ok  {:<26} {} ({:.1?})",
            step.name, step.observed, step.elapsed
        );
    })
    .await;
    bed.shutdown().await;
    match result {
        Ok(steps) => {
            println!("smoke passed: {} steps, test bed removed", steps.len());
            Ok(())
        }
        Err(err) => Err(err).context("smoke scenario failed"),
    }
}
