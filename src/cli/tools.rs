//! The tool commands: service images, the smoke scenario, a long-lived test bed, clean-up of
//! leftovers, the fault proxy server, the reference worker as a process, report merging.

use super::args::{ImagesCommand, ProxyCommand, ReportCommand, ServiceArg};
use super::{OnSignal, interrupted_code, with_bed};
use crate::env::images::{self, ImageConfig, Service};
use crate::env::{TestBed, reaper};
use crate::report::Report;
use crate::{Error, Result};
use std::net::SocketAddr;
use std::process::ExitCode;

/// `racecert report merge`: shard reports joined into one set.
pub fn report(command: ReportCommand, color: bool) -> Result<ExitCode> {
    let ReportCommand::Merge { inputs, out } = command;
    let reports = inputs
        .iter()
        .map(|path| Report::read(path))
        .collect::<Result<Vec<_>>>()?;
    let merged = Report::merge(reports)?;
    merged.write_all(&out)?;
    print!("{}", merged.terminal_with(color));
    println!("reports: {}", out.display());
    Ok(super::verdict_exit(merged.verdict()))
}

/// `racecert worker`: the reference worker as a process under the contract's environment.
pub async fn worker() -> Result<ExitCode> {
    crate::reference::process::run(crate::reference::process::WorkerEnv::from_env()?).await?;
    Ok(ExitCode::SUCCESS)
}

/// `racecert env up`: a test bed kept up (addresses printed) until Ctrl-C.
pub async fn env_up() -> Result<ExitCode> {
    with_bed(OnSignal::Finish, async |bed: &TestBed| {
        print!("{}", crate::report::addresses_text(&bed.addresses()));
        println!(
            "test bed up in {:.1?}; Ctrl-C tears it down",
            bed.startup_time()
        );
        crate::interrupt::wait().await;
        Ok(())
    })
    .await?;
    Ok(interrupted_code())
}

/// `racecert clean`: containers of killed runs removed (`all`: of live runs too), and the worker
/// processes of killed runs killed.
pub async fn clean(all: bool) -> Result<ExitCode> {
    let (removed, killed) = tokio::task::spawn_blocking(move || {
        Ok::<_, Error>((reaper::reap(all)?, reaper::reap_processes()))
    })
    .await
    .map_err(|err| Error::other(format!("clean-up task: {err}")))??;
    if removed.is_empty() {
        println!("no leftover racecert containers");
    }
    for pid in killed {
        println!("killed worker process {pid} (its run is gone)");
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

/// `racecert proxy serve`: Toxiproxy's HTTP API until a signal.
pub async fn proxy(command: ProxyCommand) -> Result<ExitCode> {
    let ProxyCommand::Serve { host, port } = command;
    let listen = SocketAddr::new(host, port);
    eprintln!("racecert fault proxy: Toxiproxy API on http://{listen}");
    crate::env::proxy::server::serve(listen, crate::interrupt::wait()).await?;
    Ok(ExitCode::SUCCESS)
}

fn services(only: Vec<ServiceArg>) -> Vec<Service> {
    if only.is_empty() {
        Service::ALL.to_vec()
    } else {
        only.into_iter().map(Service::from).collect()
    }
}

/// `racecert images`: build, list, save or load the service images.
pub async fn images(command: ImagesCommand) -> Result<ExitCode> {
    let config = ImageConfig::from_env()?;
    match command {
        ImagesCommand::Build { force, only } => {
            let services = services(only);
            let outcomes = tokio::task::spawn_blocking(move || {
                images::ensure_images(&config, &services, force)
            })
            .await
            .map_err(|err| Error::other(format!("image task: {err}")))??;
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
            let services = services(only);
            let written =
                tokio::task::spawn_blocking(move || images::save_images(&config, &services, &dir))
                    .await
                    .map_err(|err| Error::other(format!("image task: {err}")))??;
            for file in written {
                println!("saved {}", file.display());
            }
        }
        ImagesCommand::Load { dir } => {
            let shown = dir.display().to_string();
            let loaded = tokio::task::spawn_blocking(move || images::load_images(&dir))
                .await
                .map_err(|err| Error::other(format!("image task: {err}")))??;
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

/// `racecert smoke`: the bed up, each building block shown working, the bed removed.
pub async fn smoke() -> Result<ExitCode> {
    println!("racecert smoke: bringing the test bed up (images are built on first use)");
    let steps = with_bed(OnSignal::Drop, async |bed: &TestBed| {
        println!("test bed up in {:.1?}", bed.startup_time());
        print!("{}", crate::report::addresses_text(&bed.addresses()));
        crate::smoke::run(bed, |step| {
            println!(
                "ok  {:<26} {} ({:.1?})",
                step.name, step.observed, step.elapsed
            );
        })
        .await
        .map_err(|err| Error::other(format!("smoke scenario failed: {err}")))
    })
    .await?;
    println!("smoke passed: {} steps, test bed removed", steps.len());
    Ok(ExitCode::SUCCESS)
}
