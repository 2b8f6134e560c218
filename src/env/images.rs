//! Service images, built locally: our Docker engine starts with no images and reaches no
//! registry, so racecert builds Redis, PostgreSQL and its fault-proxy image from `docker/` itself,
//! on first use or with `racecert images build`.
//!
//! Why one file of ~780 lines: one build pipeline (base image by debootstrap, rootfs fallback,
//! Dockerfiles, tags, staleness); about 30 lines are tests.
//!
//! Base image: `debian:bookworm-slim` when it is present or can be pulled; otherwise a minimal
//! bookworm rootfs made with debootstrap from the Debian mirror the host's apt uses, imported with
//! `docker import`. If `apt-get` inside `docker build` cannot reach the mirror, the packages are
//! installed into the rootfs on the host instead (`debootstrap --include=...`) and the Dockerfiles
//! skip their apt step. Every reference is pinned and overridable through the environment, so a
//! user with a registry can run the official redis, postgres and Shopify toxiproxy images.
//!
//! This module drives the `docker` CLI rather than the engine API: the commands are the ones a
//! person would type to reproduce a failure, and their stderr goes verbatim into the error.

use crate::{Error, Result};
use sha2::Digest;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The Dockerfiles, embedded so an installed racecert binary can build its images anywhere.
const REDIS_DOCKERFILE: &str = include_str!("../../docker/redis/Dockerfile");
const POSTGRES_DOCKERFILE: &str = include_str!("../../docker/postgres/Dockerfile");
const POSTGRES_ENTRYPOINT: &str = include_str!("../../docker/postgres/entrypoint.sh");
const PROXY_DOCKERFILE: &str = include_str!("../../docker/toxiproxy/Dockerfile");

/// The image the Dockerfiles start from when it is available.
pub const DEFAULT_BASE: &str = "debian:bookworm-slim";
/// Where racecert imports its debootstrapped base when [`DEFAULT_BASE`] is missing.
pub const BOOTSTRAP_BASE: &str = "racecert/debian-base:bookworm";
/// Label put on every image racecert builds.
pub const IMAGE_LABEL: &str = "racecert.image";

/// One of the three service images.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Service {
    /// Redis (queue, leases, cache, active-version pointer).
    Redis,
    /// PostgreSQL (jobs table and audit trail).
    Postgres,
    /// The Toxiproxy-compatible fault proxy.
    Proxy,
}

impl Service {
    /// All services, in build order.
    pub const ALL: [Service; 3] = [Service::Redis, Service::Postgres, Service::Proxy];

    /// Short name used in messages and environment variables.
    pub fn name(self) -> &'static str {
        match self {
            Service::Redis => "redis",
            Service::Postgres => "postgres",
            Service::Proxy => "toxiproxy",
        }
    }

    /// The environment variable that overrides this service's image reference.
    pub fn env_var(self) -> &'static str {
        match self {
            Service::Redis => "RACECERT_REDIS_IMAGE",
            Service::Postgres => "RACECERT_POSTGRES_IMAGE",
            Service::Proxy => "RACECERT_PROXY_IMAGE",
        }
    }

    /// The pinned reference of racecert's own image for this service.
    pub fn default_reference(self) -> String {
        match self {
            Service::Redis => "racecert/redis:7.0-bookworm".to_owned(),
            Service::Postgres => "racecert/postgres:15-bookworm".to_owned(),
            // The proxy image carries this crate's binary, so its tag follows the crate version.
            Service::Proxy => format!("racecert/toxiproxy:{}", env!("CARGO_PKG_VERSION")),
        }
    }

    /// Debian packages the service needs; used for the host-side install fallback.
    fn packages(self) -> &'static [&'static str] {
        match self {
            Service::Redis => &["redis-server"],
            Service::Postgres => &["postgresql-15"],
            Service::Proxy => &["libssl3"],
        }
    }
}

/// An image reference split into repository and tag, as testcontainers wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// Repository, e.g. `racecert/redis`.
    pub name: String,
    /// Tag, e.g. `7.0-bookworm`.
    pub tag: String,
}

impl ImageRef {
    /// Parses `name:tag`; a tag is required, because floating tags make runs irreproducible.
    pub fn parse(reference: &str, origin: &str) -> Result<ImageRef> {
        let (name, tag) = match reference.rsplit_once(':') {
            Some((name, tag)) if !name.is_empty() && !tag.is_empty() && !tag.contains('/') => {
                (name, tag)
            }
            _ => {
                return Err(Error::Config(format!(
                    "{origin}: image reference {reference:?} must be NAME:TAG with a pinned tag"
                )));
            }
        };
        Ok(ImageRef {
            name: name.to_owned(),
            tag: tag.to_owned(),
        })
    }

    /// Whether this is one of the images racecert builds itself (and may therefore build).
    pub fn is_racecert_built(&self) -> bool {
        self.name.starts_with("racecert/")
    }
}

impl std::fmt::Display for ImageRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.name, self.tag)
    }
}

/// Which images to use, from the environment, with racecert's pinned defaults.
#[derive(Debug, Clone)]
pub struct ImageConfig {
    /// Redis image.
    pub redis: ImageRef,
    /// PostgreSQL image.
    pub postgres: ImageRef,
    /// Fault-proxy image.
    pub proxy: ImageRef,
    /// Preferred base image (`RACECERT_BASE_IMAGE`, default `debian:bookworm-slim`).
    pub base: String,
    /// Debian mirror for debootstrap (`RACECERT_DEBIAN_MIRROR`, default: the host's apt source).
    pub mirror: Option<String>,
}

impl ImageConfig {
    /// Reads `RACECERT_{REDIS,POSTGRES,PROXY}_IMAGE`, `RACECERT_BASE_IMAGE` and
    /// `RACECERT_DEBIAN_MIRROR`.
    pub fn from_env() -> Result<ImageConfig> {
        let image = |service: Service| -> Result<ImageRef> {
            match std::env::var(service.env_var()) {
                Ok(value) => ImageRef::parse(value.trim(), service.env_var()),
                Err(_) => ImageRef::parse(&service.default_reference(), "built-in default"),
            }
        };
        Ok(ImageConfig {
            redis: image(Service::Redis)?,
            postgres: image(Service::Postgres)?,
            proxy: image(Service::Proxy)?,
            base: std::env::var("RACECERT_BASE_IMAGE").unwrap_or_else(|_| DEFAULT_BASE.to_owned()),
            mirror: std::env::var("RACECERT_DEBIAN_MIRROR").ok(),
        })
    }

    /// The configured reference of one service.
    pub fn get(&self, service: Service) -> &ImageRef {
        match service {
            Service::Redis => &self.redis,
            Service::Postgres => &self.postgres,
            Service::Proxy => &self.proxy,
        }
    }
}

/// What [`ensure_images`] did for one image.
#[derive(Debug, Clone)]
pub struct BuildOutcome {
    /// The service.
    pub service: Service,
    /// The image reference.
    pub image: ImageRef,
    /// What happened: "present", "built", "built (packages installed on host)", "pulled".
    pub action: String,
    /// Time spent on it.
    pub elapsed: Duration,
}

/// Makes sure the images of `services` exist: builds the missing ones (all of them with
/// `force`). Returns what was done per image, so callers can report build times.
pub fn ensure_images(
    config: &ImageConfig,
    services: &[Service],
    force: bool,
) -> Result<Vec<BuildOutcome>> {
    check_engine()?;
    let mut outcomes = Vec::new();
    let mut base: Option<String> = None;
    for &service in services {
        let started = Instant::now();
        let image = config.get(service).clone();
        let present = image_exists(&image.to_string())?;
        // An image racecert built from other files than this build's (an older Dockerfile or
        // entrypoint) is stale, whatever its tag says; so is a proxy image packaging another
        // build of this crate's binary.
        let stale = present
            && image.is_racecert_built()
            && (image_label(&image.to_string(), RECIPE_LABEL)? != Some(recipe_digest(service))
                || (service == Service::Proxy
                    && image_label(&image.to_string(), BINARY_LABEL)?
                        != Some(binary_digest(&racecert_binary()?)?)));
        let action = if present && !force && !stale {
            "present".to_owned()
        } else if !image.is_racecert_built() {
            // A user-supplied image (official redis, postgres, Shopify toxiproxy): pull it.
            docker(&["pull", &image.to_string()], "pull")?;
            "pulled".to_owned()
        } else {
            let base_ref = match &base {
                Some(base_ref) => base_ref.clone(),
                None => {
                    let chosen = ensure_base(config)?;
                    base = Some(chosen.clone());
                    chosen
                }
            };
            build_service(config, service, &image, &base_ref)?
        };
        tracing::info!(image = %image, action = %action, "image ready");
        outcomes.push(BuildOutcome {
            service,
            image,
            action,
            elapsed: started.elapsed(),
        });
    }
    Ok(outcomes)
}

/// Fails with a clear message when no Docker engine answers.
pub fn check_engine() -> Result<()> {
    let output = Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .stdin(Stdio::null())
        .output()
        .map_err(|err| {
            Error::Docker(format!(
                "cannot run the docker CLI ({err}); install Docker (Debian: apt-get install docker.io)"
            ))
        })?;
    if !output.status.success() {
        return Err(Error::Docker(format!(
            "no Docker engine answers: {}; start it (dockerd) and retry",
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(())
}

/// Whether an image exists locally.
pub fn image_exists(reference: &str) -> Result<bool> {
    let output = Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", reference])
        .stdin(Stdio::null())
        .output()
        .map_err(|err| Error::Docker(format!("docker image inspect {reference}: {err}")))?;
    Ok(output.status.success())
}

/// Chooses the base image: the preferred one if present or pullable, else racecert's
/// debootstrapped base (made now if missing).
fn ensure_base(config: &ImageConfig) -> Result<String> {
    if image_exists(&config.base)? {
        return Ok(config.base.clone());
    }
    // A pull fails quickly where there is no registry; bound it anyway so a hanging network
    // cannot stall a build.
    if docker_with_timeout(&["pull", &config.base], Duration::from_secs(60)).is_ok() {
        return Ok(config.base.clone());
    }
    if !image_exists(BOOTSTRAP_BASE)? {
        tracing::info!(base = %config.base, "base image missing and not pullable; bootstrapping one with debootstrap");
        bootstrap_rootfs_image(config, BOOTSTRAP_BASE, &[])?;
    }
    Ok(BOOTSTRAP_BASE.to_owned())
}

/// Builds one service image. If the build fails (typically apt-get inside the build cannot reach
/// the mirror), installs the packages into a debootstrapped rootfs on the host and builds again
/// on top of it; the Dockerfiles skip apt when the packages are already there.
fn build_service(
    config: &ImageConfig,
    service: Service,
    image: &ImageRef,
    base: &str,
) -> Result<String> {
    let context = BuildContext::create(service)?;
    match docker_build(&context, image, base) {
        Ok(()) => Ok("built".to_owned()),
        Err(first) => {
            tracing::warn!(image = %image, error = %first, "build on the base image failed; installing the packages on the host with debootstrap --include");
            let fallback_base = format!("racecert/debian-base-{}:bookworm", service.name());
            if !image_exists(&fallback_base)? {
                bootstrap_rootfs_image(config, &fallback_base, service.packages())?;
            }
            docker_build(&context, image, &fallback_base).map_err(|second| Error::Image {
                image: image.to_string(),
                message: format!(
                    "build failed on {base} ({first}) and on {fallback_base} with host-installed packages ({second})"
                ),
            })?;
            Ok("built (packages installed on host)".to_owned())
        }
    }
}

/// Label of the proxy image: SHA-256 of the racecert binary inside.
const BINARY_LABEL: &str = "racecert.binary-sha256";

fn binary_digest(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|err| Error::io_at(path, err))?;
    Ok(hex::encode(sha2::Sha256::digest(&bytes)))
}

/// Label of every service image racecert builds: SHA-256 of the files it was built from.
const RECIPE_LABEL: &str = "racecert.recipe-sha256";

/// The files a service's image is built from, as this build of racecert carries them (the proxy
/// image's binary is checked on its own: [`BINARY_LABEL`]).
fn recipe(service: Service) -> &'static [(&'static str, &'static str)] {
    match service {
        Service::Redis => &[("Dockerfile", REDIS_DOCKERFILE)],
        Service::Postgres => &[
            ("Dockerfile", POSTGRES_DOCKERFILE),
            ("entrypoint.sh", POSTGRES_ENTRYPOINT),
        ],
        Service::Proxy => &[("Dockerfile", PROXY_DOCKERFILE)],
    }
}

fn recipe_digest(service: Service) -> String {
    files_digest(recipe(service))
}

fn files_digest(files: &[(&str, &str)]) -> String {
    let mut hasher = sha2::Sha256::new();
    for (name, contents) in files {
        // Lengths first, so that moving bytes from one file to the next changes the digest.
        hasher.update((name.len() as u64).to_le_bytes());
        hasher.update(name.as_bytes());
        hasher.update((contents.len() as u64).to_le_bytes());
        hasher.update(contents.as_bytes());
    }
    hex::encode(hasher.finalize())
}

/// The value of `label` on a local image, if it has one.
fn image_label(reference: &str, label: &str) -> Result<Option<String>> {
    let template = format!("{{{{index .Config.Labels \"{label}\"}}}}");
    let output = docker(
        &["image", "inspect", "--format", &template, reference],
        "image inspect",
    )?;
    let value = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    Ok((!value.is_empty() && value != "<no value>").then_some(value))
}

/// The image id a reference points at now, if any.
fn image_id(reference: &str) -> Option<String> {
    let output = Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", reference])
        .stdin(Stdio::null())
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

fn docker_build(context: &BuildContext, image: &ImageRef, base: &str) -> Result<()> {
    let reference = image.to_string();
    let previous = image_id(&reference);
    docker_build_inner(context, image, base)?;
    // A rebuild leaves the old image dangling (the proxy image is rebuilt whenever the binary
    // changes): remove it, unless a container still uses it.
    if let Some(previous) = previous
        && image_id(&reference).as_deref() != Some(previous.as_str())
    {
        let _ = Command::new("docker")
            .args(["rmi", &previous])
            .stdin(Stdio::null())
            .output();
    }
    Ok(())
}

fn docker_build_inner(context: &BuildContext, image: &ImageRef, base: &str) -> Result<()> {
    let reference = image.to_string();
    let base_arg = format!("BASE={base}");
    let context_str = context.dir.display().to_string();
    let mut args = vec![
        "build".to_owned(),
        "--quiet".to_owned(),
        "--build-arg".to_owned(),
        base_arg,
        "--label".to_owned(),
        format!("{IMAGE_LABEL}=true"),
        "-t".to_owned(),
        reference.clone(),
    ];
    for (label, value) in &context.labels {
        args.push("--label".to_owned());
        args.push(format!("{label}={value}"));
    }
    args.push(context_str);
    let mut command = Command::new("docker");
    command.args(&args).stdin(Stdio::null());
    // The legacy builder needs no buildx plugin, which a distribution's docker.io may lack.
    if !buildx_available() {
        command.env("DOCKER_BUILDKIT", "0");
    }
    let output = command
        .output()
        .map_err(|err| Error::Docker(format!("docker build: {err}")))?;
    check_output(&output, &format!("docker build -t {reference}")).map_err(|message| Error::Image {
        image: reference.clone(),
        message,
    })
}

fn buildx_available() -> bool {
    Command::new("docker")
        .args(["buildx", "version"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|status| status.success())
        .unwrap_or(false)
}

/// A temporary build context holding one service's Dockerfile and files, and the labels that
/// say what it was made of (for staleness checks).
struct BuildContext {
    dir: PathBuf,
    labels: Vec<(&'static str, String)>,
}

impl BuildContext {
    fn create(service: Service) -> Result<BuildContext> {
        let dir = std::env::temp_dir().join(format!(
            "racecert-build-{}-{}",
            service.name(),
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|err| Error::io_at(&dir, err))?;
        let mut context = BuildContext {
            dir,
            labels: vec![(RECIPE_LABEL, recipe_digest(service))],
        };
        let write = |name: &str, contents: &[u8]| -> Result<()> {
            let path = context.dir.join(name);
            std::fs::write(&path, contents).map_err(|err| Error::io_at(&path, err))
        };
        for (name, contents) in recipe(service) {
            write(name, contents.as_bytes())?;
        }
        if service == Service::Proxy {
            let binary = racecert_binary()?;
            // The digest of the binary as built (before stripping), so staleness checks compare
            // like with like.
            context.labels.push((BINARY_LABEL, binary_digest(&binary)?));
            let target = context.dir.join("racecert");
            std::fs::copy(&binary, &target).map_err(|err| {
                Error::io(
                    format!("copy {} to {}", binary.display(), target.display()),
                    err,
                )
            })?;
            // Debug builds carry hundreds of MB of debug info the image does not need.
            let _ = Command::new("strip")
                .arg("--strip-debug")
                .arg(&target)
                .stdin(Stdio::null())
                .output();
        }
        Ok(context)
    }
}

impl Drop for BuildContext {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The racecert binary to package in the proxy image: `RACECERT_BIN`, else the running
/// executable when it is racecert, else the `racecert` next to a test or bench binary
/// (`target/<profile>/deps/..` -> `target/<profile>/racecert`).
pub fn racecert_binary() -> Result<PathBuf> {
    if let Ok(path) = std::env::var("RACECERT_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().map_err(|err| Error::io("current executable", err))?;
    if exe.file_name().is_some_and(|name| name == "racecert") {
        return Ok(exe);
    }
    let candidates = exe
        .ancestors()
        .skip(1)
        .take(3)
        .map(|dir| dir.join("racecert"))
        .collect::<Vec<_>>();
    candidates
        .iter()
        .find(|path| path.is_file())
        .cloned()
        .ok_or_else(|| {
            Error::Config(format!(
                "cannot find the racecert binary to package in the proxy image (looked at {}); build it (cargo build) or set RACECERT_BIN",
                candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

/// Creates a minimal bookworm rootfs with debootstrap (plus `packages`) and imports it as
/// `reference`.
fn bootstrap_rootfs_image(config: &ImageConfig, reference: &str, packages: &[&str]) -> Result<()> {
    let mirror = match &config.mirror {
        Some(mirror) => mirror.clone(),
        None => host_debian_mirror()?,
    };
    ensure_debootstrap().map_err(|message| Error::Image {
        image: reference.to_owned(),
        message,
    })?;
    let rootfs = std::env::temp_dir().join(format!("racecert-rootfs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&rootfs);
    let guard = RemoveOnDrop(rootfs.clone());
    let mut args = vec!["--variant=minbase".to_owned()];
    if !packages.is_empty() {
        args.push(format!("--include={}", packages.join(",")));
    }
    args.extend([
        "bookworm".to_owned(),
        rootfs.display().to_string(),
        mirror.clone(),
    ]);
    tracing::info!(rootfs = %rootfs.display(), mirror = %mirror, ?packages, "debootstrap");
    let output = Command::new("debootstrap")
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .map_err(|err| Error::io("debootstrap", err))?;
    check_output(&output, &format!("debootstrap {}", args.join(" "))).map_err(|message| {
        Error::Image {
            image: reference.to_owned(),
            message,
        }
    })?;
    // Keep images small: the package cache is not needed at run time.
    let _ = std::fs::remove_dir_all(rootfs.join("var/cache/apt/archives"));
    let script = format!(
        "tar -C '{}' -c . | docker import --change 'LABEL {IMAGE_LABEL}=true' - '{reference}'",
        rootfs.display()
    );
    let output = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .output()
        .map_err(|err| Error::io("docker import", err))?;
    check_output(&output, &format!("docker import {reference}")).map_err(|message| {
        Error::Image {
            image: reference.to_owned(),
            message,
        }
    })?;
    drop(guard);
    Ok(())
}

fn has_debootstrap() -> bool {
    Command::new("debootstrap")
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success())
}

/// debootstrap is one Debian package away on the machines racecert targets; installing it
/// (as root, with apt-get present) keeps the quick start a single command on a fresh machine.
fn ensure_debootstrap() -> std::result::Result<(), String> {
    if has_debootstrap() {
        return Ok(());
    }
    let hint = "debootstrap is needed to create the base image; install Debian's debootstrap package (apt-get install debootstrap)";
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !is_root || Command::new("apt-get").arg("--version").output().is_err() {
        return Err(hint.to_owned());
    }
    tracing::info!("debootstrap missing; installing it with apt-get");
    for args in [
        &["update", "-qq"][..],
        &[
            "install",
            "-y",
            "-qq",
            "--no-install-recommends",
            "debootstrap",
        ][..],
    ] {
        let output = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .output()
            .map_err(|err| format!("{hint}: apt-get: {err}"))?;
        check_output(&output, &format!("apt-get {}", args.join(" ")))
            .map_err(|err| format!("{hint}: {err}"))?;
    }
    if has_debootstrap() {
        Ok(())
    } else {
        Err(hint.to_owned())
    }
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The Debian mirror the host's apt uses for bookworm (deb822 `.sources` files or the one-line
/// `sources.list` format), so racecert never hard-codes a mirror.
pub fn host_debian_mirror() -> Result<String> {
    let mut files: Vec<PathBuf> = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(entries) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut extra: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        extra.sort();
        files.extend(extra);
    }
    for file in &files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        if let Some(mirror) = mirror_from_sources(&text) {
            return Ok(mirror);
        }
    }
    Err(Error::Config(
        "no Debian bookworm mirror found in /etc/apt/sources.list{,.d}; set RACECERT_DEBIAN_MIRROR"
            .to_owned(),
    ))
}

/// Finds a `bookworm` main archive in apt sources text (either format).
fn mirror_from_sources(text: &str) -> Option<String> {
    // One-line format: `deb [opts] URL bookworm main`.
    for line in text.lines() {
        let Some(rest) = line.trim().strip_prefix("deb ") else {
            continue;
        };
        let rest = match rest.trim_start().strip_prefix('[') {
            Some(options) => match options.split_once(']') {
                Some((_, after)) => after,
                None => continue,
            },
            None => rest,
        };
        let mut fields = rest.split_whitespace();
        if let (Some(uri), Some("bookworm")) = (fields.next(), fields.next()) {
            return Some(uri.to_owned());
        }
    }
    // deb822 format: stanzas with `URIs:` and `Suites:`.
    for stanza in text.split("\n\n") {
        let field = |name: &str| {
            stanza.lines().find_map(|line| {
                line.strip_prefix(name)
                    .and_then(|rest| rest.strip_prefix(':'))
                    .map(|value| value.trim().to_owned())
            })
        };
        let (Some(uris), Some(suites)) = (field("URIs"), field("Suites")) else {
            continue;
        };
        let types = field("Types").unwrap_or_else(|| "deb".to_owned());
        if types.split_whitespace().any(|t| t == "deb")
            && suites.split_whitespace().any(|s| s == "bookworm")
        {
            return uris.split_whitespace().next().map(str::to_owned);
        }
    }
    None
}

/// Lists images racecert built (label `racecert.image`), as `docker images` prints them.
pub fn list_images() -> Result<String> {
    let output = docker(
        &[
            "images",
            "--filter",
            &format!("label={IMAGE_LABEL}"),
            "--format",
            "{{.Repository}}:{{.Tag}}\t{{.ID}}\t{{.Size}}\t{{.CreatedSince}}",
        ],
        "images",
    )?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Runs `docker ARGS`, failing with its stderr.
pub(crate) fn docker(args: &[&str], what: &str) -> Result<Output> {
    let output = Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|err| Error::Docker(format!("docker {what}: {err}")))?;
    check_output(&output, &format!("docker {}", args.join(" "))).map_err(Error::Docker)?;
    Ok(output)
}

fn docker_with_timeout(args: &[&str], timeout: Duration) -> Result<()> {
    let mut child = Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|err| Error::Docker(format!("docker {}: {err}", args.join(" "))))?;
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => {
                return Err(Error::Docker(format!(
                    "docker {} exited with {status}",
                    args.join(" ")
                )));
            }
            Ok(None) if Instant::now() < deadline => {
                // Polling a child process: there is no portable wait-with-timeout in std.
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::Docker(format!(
                    "docker {} did not finish within {timeout:?}",
                    args.join(" ")
                )));
            }
        }
    }
}

fn check_output(output: &Output, command: &str) -> std::result::Result<(), String> {
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    // The tail of the output names the failing step; whole build logs would drown it.
    let tail: Vec<&str> = stderr
        .lines()
        .chain(stdout.lines())
        .filter(|l| !l.trim().is_empty())
        .collect();
    let start = tail.len().saturating_sub(12);
    Err(format!(
        "`{command}` failed ({}):\n{}",
        output.status,
        tail[start..].join("\n")
    ))
}

/// Writes each present image of `services` to `dir/<service>.tar` (`docker save`), for a CI
/// cache: a runner that restores the directory loads them instead of building. Returns the files
/// written. A missing image is an error naming it: save after `images build`.
pub fn save_images(
    config: &ImageConfig,
    services: &[Service],
    dir: &Path,
) -> Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|err| Error::io_at(dir, err))?;
    let mut written = Vec::new();
    for &service in services {
        let image = config.get(service).to_string();
        if !image_exists(&image)? {
            return Err(Error::Image {
                image,
                message: "not present; run `racecert images build` first".into(),
            });
        }
        let file = dir.join(format!("{}.tar", service.name()));
        let file_str = file.display().to_string();
        docker(&["save", "-o", &file_str, &image], "save")?;
        written.push(file);
    }
    Ok(written)
}

/// Loads every `*.tar` in `dir` written by [`save_images`] (`docker load`). Returns the images
/// loaded, as docker names them. A directory without archives loads nothing (a cold cache).
pub fn load_images(dir: &Path) -> Result<Vec<String>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(Error::io_at(dir, err)),
    };
    let mut files: Vec<std::path::PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "tar"))
        .collect();
    files.sort();
    let mut loaded = Vec::new();
    for file in files {
        let file_str = file.display().to_string();
        let output = docker(&["load", "-q", "-i", &file_str], "load")?;
        loaded.extend(
            String::from_utf8_lossy(&output.stdout)
                .lines()
                .filter_map(|l| l.strip_prefix("Loaded image: "))
                .map(str::to_owned),
        );
    }
    Ok(loaded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_need_a_pinned_tag() {
        let image = ImageRef::parse("racecert/redis:7.0-bookworm", "test").unwrap();
        assert_eq!(image.name, "racecert/redis");
        assert_eq!(image.tag, "7.0-bookworm");
        assert!(image.is_racecert_built());
        assert!(ImageRef::parse("redis", "RACECERT_REDIS_IMAGE").is_err());
        assert!(ImageRef::parse("localhost:5000/redis", "x").is_err());
        let official = ImageRef::parse("localhost:5000/redis:7.2", "x").unwrap();
        assert_eq!(official.name, "localhost:5000/redis");
        assert!(!official.is_racecert_built());
    }

    #[test]
    fn a_recipe_digest_changes_with_any_file_of_it() {
        let base = [("Dockerfile", "FROM x\nCOPY e /e\n"), ("e", "#!/bin/sh\n")];
        let digest = files_digest(&base);
        assert_eq!(digest, files_digest(&base), "the digest is stable");
        // A changed file, bytes moved from one file to the next, a renamed file: all stale.
        let changed = [
            ("Dockerfile", "FROM x\nCOPY e /e\n"),
            ("e", "#!/bin/bash\n"),
        ];
        let moved = [("Dockerfile", "FROM x\nCOPY e /e\n#"), ("e", "!/bin/sh\n")];
        let renamed = [("Dockerfile", "FROM x\nCOPY e /e\n"), ("f", "#!/bin/sh\n")];
        for other in [&changed, &moved, &renamed] {
            assert_ne!(digest, files_digest(other));
        }
        // The shipped recipes differ from each other, and the entrypoint is part of Postgres's.
        let services = [Service::Redis, Service::Postgres, Service::Proxy];
        let digests: std::collections::BTreeSet<_> =
            services.iter().map(|&s| recipe_digest(s)).collect();
        assert_eq!(digests.len(), services.len());
        assert!(
            recipe(Service::Postgres)
                .iter()
                .any(|(name, _)| *name == "entrypoint.sh")
        );
    }

    #[test]
    fn mirror_is_read_from_both_apt_formats() {
        let deb822 = "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\nTypes: deb\nURIs: http://security.example/debian-security\nSuites: bookworm-security\n";
        assert_eq!(
            mirror_from_sources(deb822).as_deref(),
            Some("http://mirror.example/debian")
        );
        let one_line =
            "# comment\ndeb [arch=amd64 signed-by=/x.gpg] http://m.example/debian bookworm main\n";
        assert_eq!(
            mirror_from_sources(one_line).as_deref(),
            Some("http://m.example/debian")
        );
        assert_eq!(mirror_from_sources("deb http://x/ubuntu jammy main"), None);
    }
}
