//! `racecert`: the command line. It parses the arguments (clap; each command's arguments are
//! `racecert::cli::args`), then makes one call per command into `racecert::cli`, which holds the
//! commands over the library. Errors print as one line naming the place, with exit code 2.

use clap::{Parser, Subcommand};
use racecert::cli::args::{
    CertifyArgs, ColorWhen, EnvCommand, ImagesCommand, ProxyCommand, ReplayArgs, ReportCommand,
    RunArgs,
};
use std::io::IsTerminal;
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

#[derive(Subcommand)]
enum Command {
    /// Certify the worker: run the suites (suites/*.toml, or those given) and write reports.
    /// Exits 0 only if every suite came out as expected and every fault kind landed.
    Certify(CertifyArgs),
    /// Reproduce one case exactly (from its schedule file, or a suite's seed and case number) and
    /// print its timeline; with a suite alone, explore it until a failure.
    Run(RunArgs),
    /// Diagnose the races in production logs and reproduce each cause against the reference
    /// worker, with the defect it needs and then safe; with --system, on the team's own system
    /// with its framework's faults.
    Replay(ReplayArgs),
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

fn main() -> ExitCode {
    racecert::cli::quiet_backend_connection_panics();
    let cli = Cli::parse();
    racecert::cli::init_tracing(
        matches!(cli.command, Command::Proxy { .. }),
        cli.color.colors(std::io::stderr().is_terminal()),
    );
    // Progress bars draw on stderr, and only on a terminal (indicatif hides them elsewhere);
    // they are plain text, so colour settings do not concern them.
    let color = cli.color.colors(std::io::stdout().is_terminal());
    let outcome = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|err| racecert::Error::io("start the async runtime", err))
        .and_then(|runtime| {
            runtime.block_on(async {
                racecert::cli::stop_on_signals()?;
                run(cli.command, color).await
            })
        });
    match outcome {
        Ok(code) => code,
        Err(err) => {
            // The whole chain, without repeating a cause that its error already quotes (an I/O
            // error names its path and then its cause); no backtrace for a user's mistake.
            let mut message = err.to_string();
            let mut cause = std::error::Error::source(&err);
            while let Some(next) = cause {
                let text = next.to_string();
                if !message.ends_with(&text) {
                    message.push_str(": ");
                    message.push_str(&text);
                }
                cause = next.source();
            }
            eprintln!("racecert: error: {message}");
            match err {
                racecert::Error::Interrupted(_) => racecert::cli::interrupted_code(),
                _ => ExitCode::from(2),
            }
        }
    }
}

async fn run(command: Command, color: bool) -> racecert::Result<ExitCode> {
    use racecert::cli;
    match command {
        Command::Certify(args) => cli::certify::run(args, color).await,
        Command::Run(args) => cli::run::run(args).await,
        Command::Replay(args) => cli::replay::run(args).await,
        Command::Report { command } => cli::tools::report(command, color),
        Command::Smoke => cli::tools::smoke().await,
        Command::Worker => cli::tools::worker().await,
        Command::Images { command } => cli::tools::images(command).await,
        Command::Env {
            command: EnvCommand::Up,
        } => cli::tools::env_up().await,
        Command::Clean { all } => cli::tools::clean(all).await,
        Command::Proxy { command } => cli::tools::proxy(command).await,
    }
}
