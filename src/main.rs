//! `racecert`: the command line, a thin layer over the library.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use racecert::env::images::{self, ImageConfig, Service};
use racecert::env::{TestBed, TestBedBuilder, reaper};
use std::net::SocketAddr;

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
    /// Bring the test bed up, run the smoke scenario, print what it did, tear it down.
    Smoke,
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

fn main() -> Result<()> {
    let cli = Cli::parse();
    // The proxy server logs every proxy it starts: useful when it is the program, noise when it
    // is embedded in a test bed.
    let default_filter = match cli.command {
        Command::Proxy { .. } => "warn,racecert=info",
        _ => "warn,racecert=info,racecert::env::proxy::server=warn",
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
    runtime.block_on(run(cli.command))
}

async fn run(command: Command) -> Result<()> {
    match command {
        Command::Smoke => smoke().await,
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
                Ok(())
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
                Ok(())
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
            Ok(())
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
            Ok(())
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
            Ok(())
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
