//! System descriptions: how a worker racecert did not write is started, fed, observed and faulted
//! (docs/systems.md). A description comes from a TOML file ([`System::load`], every error naming
//! `file:line:col`) or from the Rust builder ([`System::builder`], the same checks), so a team can
//! certify its worker from its own `cargo test` without racecert's queue or table types.
//!
//! The framework presets ([`preset`]) know what their framework really does: the message Celery's
//! Redis transport writes and the keys of its unacked index; the row apalis' Postgres storage
//! reads; the message and keys of Dramatiq's Redis broker. [`rollout`] reads how the team rolls a
//! version out (`[rollout]`) and where its cache lives (`[cache]`). The runner that drives a system's processes with faults is
//! `runner::system`.

mod builder;
mod file;
pub mod preset;
pub mod rollout;
mod template;

pub use builder::SystemBuilder;
use template::*;
pub use template::{fill, fill_shell};

use crate::contract::layout::KeyLayout;
use crate::env::backends::ModelApi;
use crate::{Error, Result};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use toml::Spanned;

/// The framework a worker is written on: how requests are submitted, how redelivery is forced
/// and observed, which process faults apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Framework {
    /// Celery 5 with the Redis broker.
    Celery,
    /// apalis 1.0 with the Postgres backend.
    Apalis,
    /// Dramatiq 2 with the Redis broker.
    Dramatiq,
    /// No preset: submit with a command, process and network faults only.
    Custom,
}

impl Framework {
    /// Its name in a system file.
    pub fn name(self) -> &'static str {
        match self {
            Framework::Celery => "celery",
            Framework::Apalis => "apalis",
            Framework::Dramatiq => "dramatiq",
            Framework::Custom => "custom",
        }
    }

    /// The queue its clients send to when none is named: Celery's `celery`, Dramatiq's
    /// `default`.
    pub fn default_queue(self) -> &'static str {
        match self {
            Framework::Dramatiq => "default",
            _ => "celery",
        }
    }
}

/// How one worker process starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Start {
    /// The command (run with `sh -c`), with placeholders.
    pub command: String,
    /// Its working directory.
    pub workdir: PathBuf,
    /// A pip requirements file: racecert provisions `{venv}` from it.
    pub requirements: Option<PathBuf>,
    /// A command run once before the first worker (a build).
    pub setup: Option<String>,
    /// A line (stdout or stderr) meaning "consuming", with placeholders.
    pub ready: Option<String>,
    /// The worker's own variables, with placeholders.
    pub env: BTreeMap<String, String>,
}

/// How a request enters the system.
#[derive(Debug, Clone, PartialEq)]
pub enum Submit {
    /// The framework preset writes the framework's own message.
    Preset {
        /// Celery task name, apalis job type, or Dramatiq actor name.
        task: String,
        /// Keyword arguments (Celery, Dramatiq) or the job's JSON fields (apalis), with
        /// placeholders.
        args: BTreeMap<String, String>,
        /// The queue (default: Celery's `celery`, Dramatiq's `default`).
        queue: String,
    },
    /// A command run once per request, with placeholders.
    Command(String),
}

/// Where final results land.
#[derive(Debug, Clone, PartialEq)]
pub struct Results {
    /// The table.
    pub table: String,
    /// The column identifying the request.
    pub key: String,
    /// The status column.
    pub status: String,
    /// Values of `status` that are final.
    pub terminal: Vec<String>,
    /// The output column.
    pub output: String,
    /// The column naming the model version, if any.
    pub version: Option<String>,
    /// SQL applied to racecert's test database before the run.
    pub schema: Option<PathBuf>,
}

/// Celery preset options: what the app configures and racecert cannot read from a process.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CeleryOptions {
    /// `broker_transport_options["visibility_timeout"]`, seconds.
    pub visibility_timeout_s: f64,
    /// `task_acks_late`.
    #[serde(default)]
    pub acks_late: bool,
    /// `worker_prefetch_multiplier`.
    #[serde(default = "one")]
    pub prefetch_multiplier: u32,
    /// `task_reject_on_worker_lost`.
    #[serde(default)]
    pub reject_on_worker_lost: bool,
}

fn one() -> u32 {
    1
}

/// apalis preset options.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApalisOptions {
    /// Only `postgres`.
    #[serde(default = "postgres")]
    pub backend: String,
    /// `apalis_postgres::Config::queue` (the job type).
    pub queue: String,
    /// `Config::heartbeat_interval`, seconds.
    pub heartbeat_s: f64,
    /// `Config::missed_heartbeats`.
    pub missed_heartbeats: u32,
}

fn postgres() -> String {
    "postgres".into()
}

/// Dramatiq preset options: what the app passes to `RedisBroker(...)`, which racecert cannot
/// read from a process. A dead worker's messages come back only in a maintenance pass (a
/// `maintenance_chance` in a million of the broker's commands) after `heartbeat_timeout`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DramatiqOptions {
    /// `RedisBroker(namespace=...)`: the prefix of every key.
    #[serde(default = "dramatiq_namespace")]
    pub namespace: String,
    /// `RedisBroker(heartbeat_timeout=...)`, milliseconds (Dramatiq's default 60000).
    pub heartbeat_timeout_ms: u64,
    /// `RedisBroker(maintenance_chance=...)`, in a million commands (Dramatiq's default 1000).
    pub maintenance_chance: u32,
    /// The actor's `time_limit`, milliseconds, when the app takes it from the file
    /// (`{time_limit_ms}`): declared, it adds the `time-limit` fault (the limit passing in a model
    /// call); it must lie below `[timeouts] model_ms`, where the HTTP client gives up first.
    #[serde(default)]
    pub time_limit_ms: Option<u64>,
}

fn dramatiq_namespace() -> String {
    "dramatiq".into()
}

impl DramatiqOptions {
    /// Dramatiq's `MAINTENANCE_SCALE`: a chance is out of this many commands.
    pub const MAINTENANCE_SCALE: u32 = 1_000_000;

    /// How far past the time limit the `time-limit` fault holds a model call: the `TimeLimit`
    /// middleware looks at its deadlines once a second (`interval`, 1000 ms), and a loaded
    /// machine gets the rest.
    pub const TIME_LIMIT_MARGIN: Duration = Duration::from_millis(2500);

    /// How long after a worker's last heartbeat its messages are back on the queue, with 99%
    /// confidence: the heartbeat timeout, then enough of the live workers' commands on the queue
    /// for a maintenance pass to run among them. An idle Dramatiq consumer fetches at least
    /// once a second (its `worker_timeout`, 1000 ms by default), so one live worker gives about
    /// one command a second; a second is added for a loaded machine.
    pub fn recovery(&self) -> Duration {
        let chance = f64::from(self.maintenance_chance.min(Self::MAINTENANCE_SCALE))
            / f64::from(Self::MAINTENANCE_SCALE);
        let commands = if chance >= 1.0 {
            1.0
        } else if chance <= 0.0 {
            f64::INFINITY
        } else {
            (0.01f64.ln() / (1.0 - chance).ln()).ceil()
        };
        Duration::from_millis(self.heartbeat_timeout_ms)
            + Duration::try_from_secs_f64(commands + 1.0).unwrap_or(Duration::MAX)
    }
}

/// A place in a system file, for errors: `path:line:col`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place(pub String);

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A validated system description.
#[derive(Debug, Clone, PartialEq)]
pub struct System {
    /// Shown in reports.
    pub name: String,
    /// The preset.
    pub framework: Framework,
    /// The file it was read from (None: built in Rust).
    pub source: Option<PathBuf>,
    /// How a worker starts.
    pub start: Start,
    /// Model versions of the rollout, in order: (version, backend name).
    pub versions: Vec<(String, String)>,
    /// How requests are submitted.
    pub submit: Submit,
    /// Where results land.
    pub results: Results,
    /// The model API the worker calls.
    pub model: ModelApi,
    /// The model name the worker sends.
    pub model_name: String,
    /// Celery options (framework = celery).
    pub celery: Option<CeleryOptions>,
    /// apalis options (framework = apalis).
    pub apalis: Option<ApalisOptions>,
    /// Dramatiq options (framework = dramatiq).
    pub dramatiq: Option<DramatiqOptions>,
    /// How long the worker waits for the model (its own setting).
    pub model_timeout: Duration,
    /// How long the system takes to give back a job a crash left (`[timeouts] recovery_ms`: a
    /// heartbeat timeout, a maintenance interval), if the team named it.
    pub recovery: Option<Duration>,
    /// The worker's own lease and cache keys in Redis (`[keys]`): with them, the wire checks
    /// judge its locks and cache (lease-discipline, no-stale-cache-read, ...).
    pub keys: KeyLayout,
    /// How the team rolls a new model version out (`[rollout]`; defaults when absent).
    pub rollout: rollout::Rollout,
    /// Where its result cache lives (`[cache]`), if it has one.
    pub cache: Option<rollout::Cache>,
    /// The team's own fencing column (`[fencing]`), if it names one: with it the fencing
    /// invariants are judged on its table.
    pub fencing: Option<crate::contract::fencing::Fencing>,
    /// The command that submits a request again (`[submit] resubmit`), for an API whose retry
    /// path differs from its first submission; None: the submit command again.
    pub resubmit: Option<String>,
    places: BTreeMap<String, Place>,
}

/// Placeholders each part of a file may use.
const START_PLACEHOLDERS: &[&str] = &[
    "worker_id",
    "model_version",
    "redis_url",
    "database_url",
    "model_url",
    "venv",
];
/// The submitter's: the workers' (for a `submitter` of its own, on the first version) and the
/// request's.
const SUBMIT_PLACEHOLDERS: &[&str] = &[
    "request_id",
    "input",
    "venv",
    "redis_url",
    "database_url",
    "model_url",
    "worker_id",
    "model_version",
];

/// The recovery bound of a system that names none: a worker's own retry or a framework's
/// requeue of a dead worker's job shows within it on the frameworks racecert has met.
const DEFAULT_RECOVERY: Duration = Duration::from_secs(6);

/// The longest recovery bound a case waits for (`[timeouts] recovery_ms`).
const MAX_RECOVERY: Duration = Duration::from_secs(300);

impl System {
    /// The file's own settings as placeholders (`{visibility_timeout_s}`, `{model_timeout_s}`,
    /// ...), so that a value the worker must also be given (in `[start.env]`) is written once
    /// and cannot disagree with what racecert works with.
    pub fn settings_values(&self) -> Vec<(&'static str, String)> {
        let mut values = vec![
            (
                "model_timeout_ms",
                self.model_timeout.as_millis().to_string(),
            ),
            (
                "model_timeout_s",
                self.model_timeout.as_secs_f64().to_string(),
            ),
        ];
        if let Some(recovery) = self.recovery {
            values.push(("recovery_ms", recovery.as_millis().to_string()));
        }
        if let Some(celery) = &self.celery {
            values.push((
                "visibility_timeout_s",
                celery.visibility_timeout_s.to_string(),
            ));
        }
        if let Some(apalis) = &self.apalis {
            values.push(("heartbeat_s", apalis.heartbeat_s.to_string()));
            values.push(("missed_heartbeats", apalis.missed_heartbeats.to_string()));
        }
        if let Some(dramatiq) = &self.dramatiq {
            values.push(("namespace", dramatiq.namespace.clone()));
            values.push((
                "heartbeat_timeout_ms",
                dramatiq.heartbeat_timeout_ms.to_string(),
            ));
            values.push((
                "maintenance_chance",
                dramatiq.maintenance_chance.to_string(),
            ));
            if let Some(limit) = dramatiq.time_limit_ms {
                values.push(("time_limit_ms", limit.to_string()));
            }
        }
        values
    }

    /// The placeholders a template may hold: `fixed` and the file's settings.
    fn allowed(&self, fixed: &[&'static str]) -> Vec<&'static str> {
        let mut allowed = fixed.to_vec();
        allowed.extend(self.settings_values().into_iter().map(|(name, _)| name));
        allowed
    }

    /// How long after a fault a job it left may still come back (the system's own recovery:
    /// the broker's redelivery, a heartbeat timeout, a maintenance pass), and where that bound
    /// comes from. Liveness is judged only after it (and after every held model call ended).
    pub fn recovery_bound(&self) -> (Duration, String) {
        let preset = match (self.framework, &self.celery, &self.apalis, &self.dramatiq) {
            (Framework::Dramatiq, _, _, Some(dramatiq)) => Some((
                dramatiq.recovery(),
                format!(
                    "Dramatiq's requeue of a dead worker's messages ([dramatiq] heartbeat_timeout_ms = {}, \
                     then a maintenance pass at maintenance_chance = {} in a million commands, 99%)",
                    dramatiq.heartbeat_timeout_ms, dramatiq.maintenance_chance
                ),
            )),
            (Framework::Celery, Some(celery), _, _) => Some((
                Duration::from_secs_f64(celery.visibility_timeout_s),
                format!(
                    "Celery's visibility timeout ([celery] visibility_timeout_s = {})",
                    celery.visibility_timeout_s
                ),
            )),
            (Framework::Apalis, _, Some(apalis), _) => Some((
                Duration::from_secs_f64(apalis.heartbeat_s * f64::from(apalis.missed_heartbeats)),
                format!(
                    "apalis' orphan bound ([apalis] heartbeat_s = {} x missed_heartbeats = {})",
                    apalis.heartbeat_s, apalis.missed_heartbeats
                ),
            )),
            _ => None,
        };
        let named = self.recovery.map(|bound| {
            (
                bound,
                format!("[timeouts] recovery_ms = {}", bound.as_millis()),
            )
        });
        match (preset, named) {
            (Some(preset), Some(named)) => {
                if named.0 > preset.0 {
                    named
                } else {
                    preset
                }
            }
            (Some(bound), None) | (None, Some(bound)) => bound,
            (None, None) => (
                DEFAULT_RECOVERY,
                format!(
                    "racecert's default of {} ms (the file names no [timeouts] recovery_ms)",
                    DEFAULT_RECOVERY.as_millis()
                ),
            ),
        }
    }
    /// Reads and checks a system file; every error names `file:line:col`.
    pub fn load(path: &Path) -> Result<System> {
        let text = std::fs::read_to_string(path).map_err(|err| Error::io_at(path, err))?;
        System::parse(&text, path)
    }

    /// Parses a system file's text; `path` names it in errors and anchors relative paths.
    pub fn parse(text: &str, path: &Path) -> Result<System> {
        let at = |span: std::ops::Range<usize>| file::place(text, path, span.start);
        let raw = file::deserialize(text, path)?;
        let dir = file::base_dir(path);
        let mut places = BTreeMap::new();
        let mut note = |name: &str, span: std::ops::Range<usize>| {
            places.insert(name.to_owned(), at(span));
        };
        file::note_places(&raw, &mut note);
        let mut keys = file::keys(raw.keys, &mut note);
        let place_of = |span: std::ops::Range<usize>| at(span).0;
        let cache = file::cache(raw.cache, &mut keys, &mut note, &place_of)?;
        let rollout = match raw.rollout {
            Some(rollout) => rollout::rollout(rollout, &mut note, &place_of)?,
            None => rollout::Rollout::default(),
        };
        let (submit, resubmit) =
            file::submit(raw.submit.into_inner(), *raw.framework.get_ref(), &places)?;
        let (model, model_name) = file::model(raw.model.into_inner(), &at, &mut places)?;
        let system = System {
            name: raw.name,
            framework: raw.framework.into_inner(),
            source: Some(path.to_path_buf()),
            start: file::start(raw.start, &dir),
            versions: raw.versions.into_iter().collect(),
            submit,
            results: file::results(raw.results, &dir),
            model,
            model_name,
            celery: raw.celery,
            apalis: raw.apalis,
            dramatiq: raw.dramatiq,
            model_timeout: Duration::from_millis(
                raw.timeouts.as_ref().map_or(30_000, |t| t.model_ms),
            ),
            recovery: raw
                .timeouts
                .as_ref()
                .and_then(|t| t.recovery_ms.as_ref())
                .map(|ms| Duration::from_millis(*ms.get_ref())),
            keys,
            rollout,
            cache,
            resubmit,
            fencing: raw.fencing.map(|f| crate::contract::fencing::Fencing {
                column: f.column.into_inner(),
                order: f.order,
            }),
            places,
        };
        system.validate()?;
        Ok(system)
    }

    /// Starts a description in Rust: the same checks as a file at [`SystemBuilder::build`].
    pub fn builder(name: &str, framework: Framework) -> SystemBuilder {
        SystemBuilder::new(name, framework)
    }

    /// Where `field` (`results.output`, `start.command`, ...) is written, for errors: the file's
    /// `path:line:col`, or `system NAME, FIELD` for a description built in Rust.
    pub fn place(&self, field: &str) -> String {
        self.places
            .get(field)
            .map(|p| p.0.clone())
            .unwrap_or_else(|| format!("system {:?}, {field}", self.name))
    }

    /// The Celery options, or an error saying they are missing.
    pub fn celery(&self) -> Result<&CeleryOptions> {
        self.celery.as_ref().ok_or_else(|| {
            Error::Config(format!(
                "{}: framework = \"celery\" needs a [celery] table (visibility_timeout_s, ...)",
                self.place("framework")
            ))
        })
    }

    /// The apalis options, or an error saying they are missing.
    pub fn apalis(&self) -> Result<&ApalisOptions> {
        self.apalis.as_ref().ok_or_else(|| {
            Error::Config(format!(
                "{}: framework = \"apalis\" needs an [apalis] table (queue, heartbeat_s, missed_heartbeats)",
                self.place("framework")
            ))
        })
    }

    /// The framework's time limit for a job, when the file declares it (`[dramatiq]
    /// time_limit_ms`): what the `time-limit` fault holds a model call past.
    pub fn time_limit(&self) -> Option<Duration> {
        self.dramatiq
            .as_ref()
            .and_then(|d| d.time_limit_ms)
            .map(Duration::from_millis)
    }

    /// The Dramatiq options, or an error saying they are missing.
    pub fn dramatiq(&self) -> Result<&DramatiqOptions> {
        self.dramatiq.as_ref().ok_or_else(|| {
            Error::Config(format!(
                "{}: framework = \"dramatiq\" needs a [dramatiq] table (heartbeat_timeout_ms, maintenance_chance)",
                self.place("framework")
            ))
        })
    }

    fn validate(&self) -> Result<()> {
        self.check_fields()?;
        self.check_templates()?;
        rollout::validate(self)?;
        if self.recovery.is_some_and(|bound| bound > MAX_RECOVERY) {
            return Err(self.error_at(
                "timeouts.recovery_ms",
                format!(
                    "`recovery_ms` is above {} ms: every case that loses a job waits for it; \
                     shorten your system's own interval for the run (an environment variable in \
                     [start.env])",
                    MAX_RECOVERY.as_millis()
                ),
            ));
        }
        self.check_framework()
    }

    /// A description error: `message` at the place `field` is written.
    fn error_at(&self, field: &str, message: String) -> Error {
        Error::Config(format!("{}: {message}", self.place(field)))
    }

    /// The fields every description needs: a command, named versions, final statuses, and
    /// plain SQL identifiers for the result (and fencing) columns.
    fn check_fields(&self) -> Result<()> {
        if self.start.command.trim().is_empty() {
            return Err(self.error_at("start.command", "the command is empty".into()));
        }
        if self.versions.is_empty() {
            return Err(self.error_at(
                "framework",
                "[versions] is empty: name at least one model version".into(),
            ));
        }
        for (version, _) in &self.versions {
            if version.is_empty() || version.contains(':') {
                return Err(self.error_at(
                    "framework",
                    format!("version {version:?} must be non-empty and contain no ':'"),
                ));
            }
        }
        if self.results.terminal.is_empty() {
            return Err(self.error_at(
                "results.terminal",
                "`terminal` is empty: list the status values that are final".into(),
            ));
        }
        for (field, name) in [
            ("results.table", &self.results.table),
            ("results.key", &self.results.key),
            ("results.status", &self.results.status),
            ("results.output", &self.results.output),
        ]
        .into_iter()
        .chain(
            self.results
                .version
                .as_ref()
                .map(|v| ("results.version", v)),
        )
        .chain(self.fencing.as_ref().map(|f| ("fencing.column", &f.column)))
        {
            if !is_identifier(name) {
                return Err(self.error_at(
                    field,
                    format!("{name:?} is not a plain SQL identifier (letters, digits, _)"),
                ));
            }
        }
        Ok(())
    }

    /// The templates' placeholders: the start command, the key patterns, the worker's
    /// variables and the submission, each using only what its part may.
    fn check_templates(&self) -> Result<()> {
        let start_allowed = self.allowed(START_PLACEHOLDERS);
        let submit_allowed = self.allowed(SUBMIT_PLACEHOLDERS);
        check_placeholders(&self.start.command, &start_allowed)
            .and_then(|()| check_unquoted(&self.start.command))
            .map_err(|bad| self.error_at("start.command", bad))?;
        self.check_key_patterns()?;
        for (name, value) in &self.start.env {
            check_placeholders(value, &start_allowed).map_err(|bad| {
                self.error_at(
                    &format!("start.env.{name}"),
                    format!("[start.env] {name}: {bad}"),
                )
            })?;
        }
        match &self.submit {
            Submit::Preset { args, .. } => {
                if self.framework == Framework::Custom {
                    return Err(self.error_at(
                        "submit",
                        "framework = \"custom\" has no preset: submit with `command`".into(),
                    ));
                }
                for (name, value) in args {
                    check_placeholders(value, SUBMIT_PLACEHOLDERS)
                        .map_err(|bad| self.error_at("submit", format!("args.{name}: {bad}")))?;
                }
            }
            Submit::Command(command) => {
                for command in std::iter::once(command).chain(&self.resubmit) {
                    check_placeholders(command, &submit_allowed)
                        .and_then(|()| check_unquoted(command))
                        .map_err(|bad| self.error_at("submit", bad))?;
                }
            }
        }
        Ok(())
    }

    /// The lease and cache key patterns: `{key}` exactly once in a lease, `{version}` at most
    /// once in a cache key.
    fn check_key_patterns(&self) -> Result<()> {
        let cache_field = if self.cache.is_some() {
            "cache.key"
        } else {
            "keys.cache"
        };
        for (field, pattern, needs) in [
            ("keys.lease", &self.keys.lease, "key"),
            (cache_field, &self.keys.cache, "version"),
        ] {
            let Some(pattern) = pattern else { continue };
            check_placeholders(pattern, &["key", "version"])
                .map_err(|bad| self.error_at(field, bad))?;
            let count = placeholders(pattern)
                .iter()
                .filter(|p| **p == needs)
                .count();
            // A cache whose key does not name the version is judged all the same (by the
            // versions its entries' outputs name); a version named twice is ambiguous.
            if count > 1 || (count == 0 && needs == "key") {
                return Err(self.error_at(
                    field,
                    format!(
                        "{pattern:?} must hold {{{needs}}} {} (e.g. {})",
                        if needs == "key" {
                            "exactly once"
                        } else {
                            "at most once"
                        },
                        if needs == "key" {
                            "\"lock:{key}\""
                        } else {
                            "\"cache:{version}:*\", or \"cache:*\" for a key without it"
                        }
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The framework preset's own options: present, and settings it can work with.
    fn check_framework(&self) -> Result<()> {
        match self.framework {
            Framework::Celery => {
                let celery = self.celery()?;
                if celery.visibility_timeout_s <= 0.0 {
                    return Err(self.error_at(
                        "framework",
                        "[celery] visibility_timeout_s must be positive".into(),
                    ));
                }
            }
            Framework::Apalis => {
                let apalis = self.apalis()?;
                if apalis.backend != "postgres" {
                    return Err(self.error_at(
                        "framework",
                        format!(
                            "[apalis] backend {:?}: only \"postgres\" is supported",
                            apalis.backend
                        ),
                    ));
                }
                if apalis.heartbeat_s <= 0.0 || apalis.missed_heartbeats == 0 {
                    return Err(self.error_at(
                        "framework",
                        "[apalis] heartbeat_s and missed_heartbeats must be positive".into(),
                    ));
                }
            }
            Framework::Dramatiq => self.check_dramatiq(self.dramatiq()?)?,
            Framework::Custom => {}
        }
        Ok(())
    }

    /// Dramatiq's options: a maintenance chance on its scale, a time limit that can fire inside
    /// a model call, and a recovery a case can wait for.
    fn check_dramatiq(&self, dramatiq: &DramatiqOptions) -> Result<()> {
        if dramatiq.heartbeat_timeout_ms == 0
            || dramatiq.maintenance_chance == 0
            || dramatiq.maintenance_chance > DramatiqOptions::MAINTENANCE_SCALE
        {
            return Err(self.error_at(
                "framework",
                "[dramatiq] heartbeat_timeout_ms must be positive and maintenance_chance \
                 between 1 and 1000000 (Dramatiq's MAINTENANCE_SCALE)"
                    .into(),
            ));
        }
        if let Some(limit) = dramatiq.time_limit_ms {
            let room = Duration::from_millis(limit) + DramatiqOptions::TIME_LIMIT_MARGIN;
            if limit == 0 || room + Duration::from_millis(500) > self.model_timeout {
                return Err(self.error_at(
                    "framework",
                    format!(
                        "[dramatiq] time_limit_ms = {limit} must be positive and at least {} ms \
                         below [timeouts] model_ms = {} (the TimeLimit middleware checks \
                         once a second): a time limit past the HTTP client's timeout never \
                         fires in a model call, and upstream-timeout already tests that \
                         timeout; leave time_limit_ms out then",
                        (DramatiqOptions::TIME_LIMIT_MARGIN + Duration::from_millis(500))
                            .as_millis(),
                        self.model_timeout.as_millis()
                    ),
                ));
            }
        }
        if dramatiq.recovery() > MAX_RECOVERY {
            return Err(self.error_at(
                "framework",
                format!(
                    "[dramatiq] a dead worker's messages come back only after about {:.0} s \
                     (heartbeat_timeout_ms = {}, then a maintenance pass at maintenance_chance \
                     = {} in a million commands), above the {} s a case waits: give the \
                     broker a shorter heartbeat_timeout and a higher maintenance_chance for \
                     the run (RedisBroker(heartbeat_timeout=..., maintenance_chance=...), from \
                     {{heartbeat_timeout_ms}} and {{maintenance_chance}} in [start.env])",
                    dramatiq.recovery().as_secs_f64(),
                    dramatiq.heartbeat_timeout_ms,
                    dramatiq.maintenance_chance,
                    MAX_RECOVERY.as_secs()
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
