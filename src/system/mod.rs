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

pub mod preset;
pub mod rollout;

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
        let at = |span: std::ops::Range<usize>| place(text, path, span.start);
        let raw: raw::File = toml::from_str(text).map_err(|err| {
            let where_ = err
                .span()
                .map(|span| at(span).0)
                .unwrap_or_else(|| path.display().to_string());
            Error::Config(format!("{where_}: {}", err.message()))
        })?;
        let dir = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        let mut places = BTreeMap::new();
        let mut note = |name: &str, span: std::ops::Range<usize>| {
            places.insert(name.to_owned(), at(span));
        };
        note("start.command", raw.start.command.span());
        for (name, value) in &raw.start.env {
            note(&format!("start.env.{name}"), value.span());
        }
        if let Some(setup) = &raw.start.setup {
            note("start.setup", setup.span());
        }
        if let Some(recovery) = raw.timeouts.as_ref().and_then(|t| t.recovery_ms.as_ref()) {
            note("timeouts.recovery_ms", recovery.span());
        }
        note("results.table", raw.results.table.span());
        note("results.key", raw.results.key.span());
        note("results.status", raw.results.status.span());
        note("results.terminal", raw.results.terminal.span());
        note("results.output", raw.results.output.span());
        if let Some(version) = &raw.results.version {
            note("results.version", version.span());
        }
        if let Some(fencing) = &raw.fencing {
            note("fencing.column", fencing.column.span());
        }
        note("framework", raw.framework.span());
        note("submit", raw.submit.span());
        note("model", raw.model.span());
        let keys = match raw.keys {
            Some(keys) => {
                if let Some(lease) = &keys.lease {
                    note("keys.lease", lease.span());
                }
                if let Some(cache) = &keys.cache {
                    note("keys.cache", cache.span());
                }
                KeyLayout {
                    lease: keys.lease.map(Spanned::into_inner),
                    cache: keys.cache.map(Spanned::into_inner),
                }
            }
            None => KeyLayout::default(),
        };
        let mut keys = keys;
        let place_of = |span: std::ops::Range<usize>| at(span).0;
        let cache = match raw.cache {
            Some(cache) => {
                let span = cache.key.span();
                let cache = rollout::cache(cache, &mut note, &place_of)?;
                if keys.cache.is_some() {
                    return Err(Error::Config(format!(
                        "{}: [cache] key and [keys] cache both say where the cache is: keep [cache]",
                        place_of(span)
                    )));
                }
                keys.cache = Some(cache.key.clone());
                Some(cache)
            }
            None => None,
        };
        let rollout = match raw.rollout {
            Some(rollout) => rollout::rollout(rollout, &mut note, &place_of)?,
            None => rollout::Rollout::default(),
        };
        let submit = raw.submit.into_inner();
        let resubmit = submit.resubmit;
        if resubmit.is_some() && submit.command.is_none() {
            return Err(Error::Config(format!(
                "{}: [submit] resubmit needs a submit `command` (a preset submits again as it submits)",
                places["submit"]
            )));
        }
        let submit = match (submit.task, submit.command) {
            (Some(task), None) => Submit::Preset {
                task,
                args: submit.args,
                queue: submit
                    .queue
                    .unwrap_or_else(|| raw.framework.get_ref().default_queue().into()),
            },
            (None, Some(command)) => Submit::Command(command),
            _ => {
                return Err(Error::Config(format!(
                    "{}: [submit] needs exactly one of `task` (the framework preset) or `command`",
                    places["submit"]
                )));
            }
        };
        let model_raw = raw.model.into_inner();
        let model = match model_raw.api.as_str() {
            "racecert" => ModelApi::Racecert,
            "openai-completions" => ModelApi::OpenaiCompletions,
            "openai-chat" => ModelApi::OpenaiChat,
            "kserve-v2" => ModelApi::KserveV2,
            "template" => match (model_raw.path, model_raw.input, model_raw.output) {
                (Some(path), Some(input), Some(output)) => {
                    // Checked here, at their lines: a path the backend cannot follow would only
                    // show up mid-run, as calls it refuses or answers the worker cannot read.
                    for (field, pointer) in [("input", &input), ("output", &output)] {
                        let at_pointer = at(pointer.span());
                        check_pointer(pointer.get_ref()).map_err(|why| {
                            Error::Config(format!("{at_pointer}: [model] {field} {why}"))
                        })?;
                        places.insert(format!("model.{field}"), at_pointer);
                    }
                    ModelApi::Template {
                        path,
                        input: input.into_inner(),
                        output: output.into_inner(),
                    }
                }
                _ => {
                    return Err(Error::Config(format!(
                        "{}: api = \"template\" needs `path`, `input` and `output`",
                        places["model"]
                    )));
                }
            },
            other => {
                return Err(Error::Config(format!(
                    "{}: unknown model api {other:?} (racecert, openai-completions, openai-chat, kserve-v2, template)",
                    places["model"]
                )));
            }
        };
        let workdir = dir.join(raw.start.workdir.unwrap_or_else(|| ".".into()));
        let system = System {
            name: raw.name,
            framework: raw.framework.into_inner(),
            source: Some(path.to_path_buf()),
            start: Start {
                command: raw.start.command.into_inner(),
                requirements: raw.start.requirements.map(|r| dir.join(r)),
                setup: raw.start.setup.map(Spanned::into_inner),
                ready: raw.start.ready,
                env: raw
                    .start
                    .env
                    .into_iter()
                    .map(|(name, value)| (name, value.into_inner()))
                    .collect(),
                workdir,
            },
            versions: raw.versions.into_iter().collect(),
            submit,
            results: Results {
                table: raw.results.table.into_inner(),
                key: raw.results.key.into_inner(),
                status: raw.results.status.into_inner(),
                terminal: raw.results.terminal.into_inner(),
                output: raw.results.output.into_inner(),
                version: raw.results.version.map(Spanned::into_inner),
                schema: raw.results.schema.map(|s| dir.join(s)),
            },
            model,
            model_name: model_raw.name.unwrap_or_else(|| "model".into()),
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
        let fail = |field: &str, message: String| {
            Err(Error::Config(format!("{}: {message}", self.place(field))))
        };
        if self.start.command.trim().is_empty() {
            return fail("start.command", "the command is empty".into());
        }
        if self.versions.is_empty() {
            return fail(
                "framework",
                "[versions] is empty: name at least one model version".into(),
            );
        }
        for (version, _) in &self.versions {
            if version.is_empty() || version.contains(':') {
                return fail(
                    "framework",
                    format!("version {version:?} must be non-empty and contain no ':'"),
                );
            }
        }
        if self.results.terminal.is_empty() {
            return fail(
                "results.terminal",
                "`terminal` is empty: list the status values that are final".into(),
            );
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
                return fail(
                    field,
                    format!("{name:?} is not a plain SQL identifier (letters, digits, _)"),
                );
            }
        }
        let start_allowed = self.allowed(START_PLACEHOLDERS);
        let submit_allowed = self.allowed(SUBMIT_PLACEHOLDERS);
        check_placeholders(&self.start.command, &start_allowed)
            .and_then(|()| check_unquoted(&self.start.command))
            .or_else(|bad| fail("start.command", bad))?;
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
            check_placeholders(pattern, &["key", "version"]).or_else(|bad| fail(field, bad))?;
            let count = placeholders(pattern)
                .iter()
                .filter(|p| **p == needs)
                .count();
            // A cache whose key does not name the version is judged all the same (by the
            // versions its entries' outputs name); a version named twice is ambiguous.
            if count > 1 || (count == 0 && needs == "key") {
                return fail(
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
                );
            }
        }
        for (name, value) in &self.start.env {
            check_placeholders(value, &start_allowed).or_else(|bad| {
                fail(
                    &format!("start.env.{name}"),
                    format!("[start.env] {name}: {bad}"),
                )
            })?;
        }
        match &self.submit {
            Submit::Preset { args, .. } => {
                if self.framework == Framework::Custom {
                    return fail(
                        "submit",
                        "framework = \"custom\" has no preset: submit with `command`".into(),
                    );
                }
                for (name, value) in args {
                    check_placeholders(value, SUBMIT_PLACEHOLDERS)
                        .or_else(|bad| fail("submit", format!("args.{name}: {bad}")))?;
                }
            }
            Submit::Command(command) => {
                for command in std::iter::once(command).chain(&self.resubmit) {
                    check_placeholders(command, &submit_allowed)
                        .and_then(|()| check_unquoted(command))
                        .or_else(|bad| fail("submit", bad))?;
                }
            }
        }
        rollout::validate(self)?;
        if self.recovery.is_some_and(|bound| bound > MAX_RECOVERY) {
            return fail(
                "timeouts.recovery_ms",
                format!(
                    "`recovery_ms` is above {} ms: every case that loses a job waits for it; \
                     shorten your system's own interval for the run (an environment variable in \
                     [start.env])",
                    MAX_RECOVERY.as_millis()
                ),
            );
        }
        match self.framework {
            Framework::Celery => {
                let celery = self.celery()?;
                if celery.visibility_timeout_s <= 0.0 {
                    return fail(
                        "framework",
                        "[celery] visibility_timeout_s must be positive".into(),
                    );
                }
            }
            Framework::Apalis => {
                let apalis = self.apalis()?;
                if apalis.backend != "postgres" {
                    return fail(
                        "framework",
                        format!(
                            "[apalis] backend {:?}: only \"postgres\" is supported",
                            apalis.backend
                        ),
                    );
                }
                if apalis.heartbeat_s <= 0.0 || apalis.missed_heartbeats == 0 {
                    return fail(
                        "framework",
                        "[apalis] heartbeat_s and missed_heartbeats must be positive".into(),
                    );
                }
            }
            Framework::Dramatiq => {
                let dramatiq = self.dramatiq()?;
                if dramatiq.heartbeat_timeout_ms == 0
                    || dramatiq.maintenance_chance == 0
                    || dramatiq.maintenance_chance > DramatiqOptions::MAINTENANCE_SCALE
                {
                    return fail(
                        "framework",
                        "[dramatiq] heartbeat_timeout_ms must be positive and maintenance_chance \
                         between 1 and 1000000 (Dramatiq's MAINTENANCE_SCALE)"
                            .into(),
                    );
                }
                if let Some(limit) = dramatiq.time_limit_ms {
                    let room = Duration::from_millis(limit) + DramatiqOptions::TIME_LIMIT_MARGIN;
                    if limit == 0 || room + Duration::from_millis(500) > self.model_timeout {
                        return fail(
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
                        );
                    }
                }
                if dramatiq.recovery() > MAX_RECOVERY {
                    return fail(
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
                    );
                }
            }
            Framework::Custom => {}
        }
        Ok(())
    }
}

fn is_identifier(name: &str) -> bool {
    !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
}

/// The `{name}` placeholders of a template.
fn placeholders(template: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        match after.find('}') {
            Some(close)
                if after[..close]
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_')
                    && close > 0 =>
            {
                out.push(&after[..close]);
                rest = &after[close + 1..];
            }
            _ => rest = after,
        }
    }
    out
}

fn check_placeholders(template: &str, allowed: &[&str]) -> std::result::Result<(), String> {
    match placeholders(template)
        .into_iter()
        .find(|p| !allowed.contains(p))
    {
        Some(bad) => Err(format!(
            "unknown placeholder {{{bad}}} (here: {})",
            allowed
                .iter()
                .map(|p| format!("{{{p}}}"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
        None => Ok(()),
    }
}

/// A shell command's placeholders must stand outside quotes: [`fill_shell`] quotes each value
/// itself, so `'{input}'` would pass the quotes on to the program (and an input with a quote in
/// it would end them).
fn check_unquoted(command: &str) -> std::result::Result<(), String> {
    // The quoting state of `sh` before each byte: single quotes, double quotes, backslashes.
    let (mut single, mut double, mut escaped) = (false, false, false);
    for (at, c) in command.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' if !single => escaped = true,
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '{' if single || double => {
                if let Some(name) = placeholders(&command[at..]).first()
                    && command[at..].starts_with(&format!("{{{name}}}"))
                {
                    return Err(format!(
                        "{{{name}}} stands inside quotes: racecert quotes each value for the shell \
                         itself (an input with spaces or quotes stays one argument), so write \
                         {{{name}}} without quotes around it"
                    ));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// A template's `input` or `output` must be an RFC 6901 JSON pointer: `""` (the whole body) or
/// `/` before each key and array index, `~` only in `~0` (a `~`) and `~1` (a `/` in a key). The
/// error names the pointer the value probably means ([`suggest_pointer`]).
fn check_pointer(pointer: &str) -> std::result::Result<(), String> {
    let mut chars = pointer.chars();
    let mut escapes_ok = true;
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            escapes_ok = false;
        }
    }
    if (pointer.is_empty() || pointer.starts_with('/')) && escapes_ok {
        return Ok(());
    }
    Err(format!(
        "{pointer:?} is not a JSON pointer (RFC 6901: \"\" for the whole body, or \"/\" before \
         each key and array index, as in \"/choices/0/text\"; a \"~\" in a key is written \"~0\", \
         a \"/\" \"~1\"): did you mean {:?}?",
        suggest_pointer(pointer)
    ))
}

/// The JSON pointer a dotted or bracketed path means (`choices[0].message.content` ->
/// `/choices/0/message/content`, `$.result["text"]` -> `/result/text`, `result/text` ->
/// `/result/text`), or, for a pointer whose only fault is a bare `~`, that pointer escaped.
fn suggest_pointer(path: &str) -> String {
    let escape = |key: &str| key.replace('~', "~0").replace('/', "~1");
    let path = path.trim();
    if path.starts_with('/') {
        let mut fixed = String::new();
        let mut chars = path.chars().peekable();
        while let Some(c) = chars.next() {
            fixed.push(c);
            if c == '~' && !matches!(chars.peek(), Some('0' | '1')) {
                fixed.push('0');
            }
        }
        return fixed;
    }
    let path = path.strip_prefix('$').unwrap_or(path);
    let mut keys = Vec::new();
    let mut key = String::new();
    let mut chars = path.chars();
    while let Some(c) = chars.next() {
        match c {
            '.' | '/' => keys.push(std::mem::take(&mut key)),
            '[' => {
                keys.push(std::mem::take(&mut key));
                let inside: String = chars.by_ref().take_while(|c| *c != ']').collect();
                let inside = inside.trim();
                let unquoted = ['"', '\'']
                    .iter()
                    .find_map(|q| inside.strip_prefix(*q)?.strip_suffix(*q))
                    .unwrap_or(inside);
                keys.push(unquoted.to_owned());
            }
            c => key.push(c),
        }
    }
    keys.push(key);
    keys.iter()
        .filter(|key| !key.is_empty())
        .map(|key| format!("/{}", escape(key)))
        .collect()
}

/// Fills `{name}` placeholders of `template` from `values`; others are left as they are.
pub fn fill(template: &str, values: &[(&str, &str)]) -> String {
    let mut out = template.to_owned();
    for (name, value) in values {
        out = out.replace(&format!("{{{name}}}"), value);
    }
    out
}

/// Fills the placeholders of a command run with `sh -c`, each value quoted for the shell when it
/// needs it (`submit.py {request_id} {input}` keeps an input with spaces as one argument).
pub fn fill_shell(template: &str, values: &[(&str, &str)]) -> String {
    let quoted: Vec<(&str, String)> = values
        .iter()
        .map(|(name, value)| {
            // A NUL byte cannot be passed in an argument at all (the only thing quoting
            // refuses): it is dropped.
            let value = value.replace('\0', "");
            let quoted =
                shlex::try_quote(&value).map_or_else(|_| String::new(), |q| q.into_owned());
            (*name, quoted)
        })
        .collect();
    let values: Vec<(&str, &str)> = quoted.iter().map(|(n, v)| (*n, v.as_str())).collect();
    fill(template, &values)
}

/// `path:line:col` of byte `offset` in `text` (1-based, columns in characters).
fn place(text: &str, path: &Path, offset: usize) -> Place {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    Place(format!("{}:{line}:{col}", path.display()))
}

/// The same description in Rust, without a file (racecert as a dev-dependency of the team's
/// crate). [`SystemBuilder::build`] runs the checks a file gets.
#[derive(Debug, Clone)]
pub struct SystemBuilder {
    system: System,
}

impl SystemBuilder {
    fn new(name: &str, framework: Framework) -> SystemBuilder {
        SystemBuilder {
            system: System {
                name: name.to_owned(),
                framework,
                source: None,
                start: Start {
                    command: String::new(),
                    workdir: PathBuf::from("."),
                    requirements: None,
                    setup: None,
                    ready: None,
                    env: BTreeMap::new(),
                },
                versions: Vec::new(),
                submit: Submit::Command(String::new()),
                results: Results {
                    table: String::new(),
                    key: String::new(),
                    status: String::new(),
                    terminal: Vec::new(),
                    output: String::new(),
                    version: None,
                    schema: None,
                },
                model: ModelApi::Racecert,
                model_name: "model".into(),
                celery: None,
                apalis: None,
                dramatiq: None,
                model_timeout: Duration::from_secs(30),
                recovery: None,
                keys: KeyLayout::default(),
                rollout: rollout::Rollout::default(),
                cache: None,
                fencing: None,
                resubmit: None,
                places: BTreeMap::new(),
            },
        }
    }

    /// The command that starts one worker, and its working directory.
    pub fn command(mut self, command: &str, workdir: impl Into<PathBuf>) -> Self {
        self.system.start.command = command.to_owned();
        self.system.start.workdir = workdir.into();
        self
    }

    /// A command run once before the first worker (a build).
    pub fn setup(mut self, command: &str) -> Self {
        self.system.start.setup = Some(command.to_owned());
        self
    }

    /// A pip requirements file for `{venv}`.
    pub fn requirements(mut self, path: impl Into<PathBuf>) -> Self {
        self.system.start.requirements = Some(path.into());
        self
    }

    /// The line meaning "consuming".
    pub fn ready(mut self, line: &str) -> Self {
        self.system.start.ready = Some(line.to_owned());
        self
    }

    /// One of the worker's variables and its value (placeholders allowed).
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.system
            .start
            .env
            .insert(name.to_owned(), value.to_owned());
        self
    }

    /// A model version of the rollout and its backend's name.
    pub fn version(mut self, version: &str, backend: &str) -> Self {
        self.system
            .versions
            .push((version.to_owned(), backend.to_owned()));
        self
    }

    /// Submission by the framework preset: task / job type and its arguments.
    pub fn submit_task(mut self, task: &str, args: &[(&str, &str)], queue: &str) -> Self {
        self.system.submit = Submit::Preset {
            task: task.to_owned(),
            args: args
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            queue: queue.to_owned(),
        };
        self
    }

    /// Submission by a command of the team's.
    pub fn submit_command(mut self, command: &str) -> Self {
        self.system.submit = Submit::Command(command.to_owned());
        self
    }

    /// Where results land.
    pub fn results(mut self, results: Results) -> Self {
        self.system.results = results;
        self
    }

    /// The model API and model name.
    pub fn model(mut self, api: ModelApi, name: &str) -> Self {
        self.system.model = api;
        self.system.model_name = name.to_owned();
        self
    }

    /// Celery preset options.
    pub fn celery(mut self, options: CeleryOptions) -> Self {
        self.system.celery = Some(options);
        self
    }

    /// apalis preset options.
    pub fn apalis(mut self, options: ApalisOptions) -> Self {
        self.system.apalis = Some(options);
        self
    }

    /// Dramatiq preset options.
    pub fn dramatiq(mut self, options: DramatiqOptions) -> Self {
        self.system.dramatiq = Some(options);
        self
    }

    /// The worker's own model timeout.
    pub fn model_timeout(mut self, timeout: Duration) -> Self {
        self.system.model_timeout = timeout;
        self
    }

    /// The worker's own lease and cache key patterns (`lock:{key}`, `cache:{version}:*`).
    pub fn keys(mut self, keys: KeyLayout) -> Self {
        self.system.keys = keys;
        self
    }

    /// How the team rolls a version out.
    pub fn rollout(mut self, rollout: rollout::Rollout) -> Self {
        self.system.rollout = rollout;
        self
    }

    /// Where the team's result cache lives (judged as `[keys] cache` is).
    pub fn cache(mut self, cache: rollout::Cache) -> Self {
        self.system.keys.cache = Some(cache.key.clone());
        self.system.cache = Some(cache);
        self
    }

    /// The checked description.
    pub fn build(self) -> Result<System> {
        self.system.validate()?;
        Ok(self.system)
    }
}

/// The file as written (serde), before checks.
mod raw {
    use super::{ApalisOptions, CeleryOptions, DramatiqOptions, Framework};
    use serde::Deserialize;
    use std::collections::BTreeMap;
    use toml::Spanned;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct File {
        pub name: String,
        pub framework: Spanned<Framework>,
        pub start: Start,
        pub versions: BTreeMap<String, String>,
        pub submit: Spanned<Submit>,
        pub results: Results,
        pub model: Spanned<Model>,
        #[serde(default)]
        pub keys: Option<Keys>,
        pub celery: Option<CeleryOptions>,
        pub apalis: Option<ApalisOptions>,
        pub dramatiq: Option<DramatiqOptions>,
        pub timeouts: Option<Timeouts>,
        pub rollout: Option<super::rollout::raw::Rollout>,
        pub cache: Option<super::rollout::raw::Cache>,
        pub fencing: Option<Fencing>,
    }

    /// `[fencing]`: the team's own fencing column and how its values order attempts.
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct Fencing {
        pub column: Spanned<String>,
        pub order: crate::contract::fencing::FenceOrder,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct Start {
        pub command: Spanned<String>,
        pub workdir: Option<String>,
        pub requirements: Option<String>,
        pub setup: Option<Spanned<String>>,
        pub ready: Option<String>,
        #[serde(default)]
        pub env: BTreeMap<String, Spanned<String>>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct Submit {
        pub task: Option<String>,
        #[serde(default)]
        pub args: BTreeMap<String, String>,
        pub queue: Option<String>,
        pub command: Option<String>,
        pub resubmit: Option<String>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct Results {
        pub table: Spanned<String>,
        pub key: Spanned<String>,
        pub status: Spanned<String>,
        pub terminal: Spanned<Vec<String>>,
        pub output: Spanned<String>,
        pub version: Option<Spanned<String>>,
        pub schema: Option<String>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct Model {
        pub api: String,
        pub name: Option<String>,
        pub path: Option<String>,
        pub input: Option<Spanned<String>>,
        pub output: Option<Spanned<String>>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct Keys {
        pub lease: Option<Spanned<String>>,
        pub cache: Option<Spanned<String>>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct Timeouts {
        #[serde(default = "model_ms")]
        pub model_ms: u64,
        pub recovery_ms: Option<Spanned<u64>>,
    }

    fn model_ms() -> u64 {
        30_000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(name)
    }

    #[test]
    fn dramatiq_recovery_is_its_heartbeat_then_a_maintenance_pass() {
        let path = example("examples/dramatiq-worker/safe.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let system = System::parse(&text, &path).unwrap();
        let options = system.dramatiq().unwrap();
        // Every command runs maintenance: the heartbeat timeout, one command, a second's margin.
        assert_eq!(options.recovery(), Duration::from_secs(6));
        let (bound, named) = system.recovery_bound();
        assert_eq!(bound, Duration::from_secs(6));
        assert!(named.contains("heartbeat_timeout_ms = 4000"), "{named}");
        assert_eq!(
            system
                .settings_values()
                .iter()
                .find(|(n, _)| *n == "maintenance_chance"),
            Some(&("maintenance_chance", "1000000".to_owned()))
        );
        // A message's queue defaults to Dramatiq's own.
        let Submit::Preset { queue, .. } = &system.submit else {
            panic!("a preset submission");
        };
        assert_eq!(queue, "default");
        // Dramatiq's defaults: a 0.1% chance a command does maintenance, so a dead worker's
        // message waits for thousands of commands: refused, at the framework's line.
        let defaults = text.replace("maintenance_chance = 1000000", "maintenance_chance = 1000");
        let err = System::parse(&defaults, &path).unwrap_err().to_string();
        assert!(
            err.contains("safe.toml:6:") && err.contains("higher maintenance_chance"),
            "{err}"
        );
        // The actors' time limit, declared: a placeholder, and the time-limit fault; one the
        // HTTP client's timeout would beat is refused, naming both.
        assert_eq!(
            system
                .settings_values()
                .iter()
                .find(|(n, _)| *n == "time_limit_ms"),
            Some(&("time_limit_ms", "18000".to_owned()))
        );
        assert!(
            crate::system::preset::system_faults(&system)
                .contains(&crate::fault::FaultKind::TimeLimit)
        );
        let late = text.replace("time_limit_ms = 18000", "time_limit_ms = 23000");
        let err = System::parse(&late, &path).unwrap_err().to_string();
        assert!(
            err.contains("safe.toml:6:")
                && err.contains("time_limit_ms = 23000")
                && err.contains("model_ms = 25000"),
            "{err}"
        );
        let undeclared = text.replace("time_limit_ms = 18000", "");
        let err = System::parse(&undeclared, &path).unwrap_err().to_string();
        assert!(err.contains("unknown placeholder {time_limit_ms}"), "{err}");
        let retrying = example("examples/dramatiq-worker/retry-at-once.toml");
        let retrying = System::load(&retrying).unwrap();
        assert!(
            !crate::system::preset::system_faults(&retrying)
                .contains(&crate::fault::FaultKind::TimeLimit)
        );
        let missing = text.replace("[dramatiq]", "[unused]");
        let err = System::parse(&missing, &path).unwrap_err().to_string();
        assert!(err.contains("unused"), "{err}");
        let none: String = text
            .lines()
            .take_while(|line| *line != "[dramatiq]")
            .map(|line| format!("{line}\n"))
            .collect::<String>()
            .replace("DRAMATIQ_NAMESPACE = \"{namespace}\"", "")
            .replace("HEARTBEAT_TIMEOUT_MS = \"{heartbeat_timeout_ms}\"", "")
            .replace("MAINTENANCE_CHANCE = \"{maintenance_chance}\"", "")
            .replace("TIME_LIMIT_MS = \"{time_limit_ms}\"", "");
        let err = System::parse(&none, &path).unwrap_err().to_string();
        assert!(err.contains("needs a [dramatiq] table"), "{err}");
    }

    #[test]
    fn the_shipped_examples_load() {
        for file in [
            "examples/celery-worker/naive.toml",
            "examples/celery-worker/fenced.toml",
            "examples/celery-worker/locked.toml",
            "examples/apalis-worker/naive.toml",
            "examples/apalis-worker/fenced.toml",
            "examples/dramatiq-worker/naive.toml",
            "examples/dramatiq-worker/safe.toml",
            "examples/dramatiq-worker/lost.toml",
        ] {
            let system = System::load(&example(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert_eq!(system.versions.len(), 2, "{file}");
            assert!(system.results.terminal.contains(&"SUCCEEDED".to_owned()));
        }
        let apalis = System::load(&example("examples/apalis-worker/naive.toml")).unwrap();
        assert_eq!(apalis.start.setup.as_deref(), Some("cargo build --locked"));
        assert!(apalis.place("start.setup").ends_with("naive.toml:8:9"));
        let celery = System::load(&example("examples/celery-worker/naive.toml")).unwrap();
        assert_eq!(celery.framework, Framework::Celery);
        assert_eq!(celery.model, ModelApi::OpenaiCompletions);
        assert_eq!(celery.celery().unwrap().visibility_timeout_s, 5.0);
        assert!(
            celery
                .start
                .requirements
                .as_ref()
                .unwrap()
                .ends_with("examples/celery-worker/requirements.txt")
        );
    }

    fn celery_file(results: &str) -> String {
        format!(
            "name = \"x\"\nframework = \"celery\"\n[start]\ncommand = \"run {{worker_id}}\"\n\
             [versions]\nv1 = \"a\"\n[submit]\ntask = \"t\"\n{results}\n\
             [model]\napi = \"racecert\"\n[celery]\nvisibility_timeout_s = 5\n"
        )
    }

    #[test]
    fn a_fencing_column_is_read_and_a_bad_one_names_its_line() {
        let path = Path::new("sys.toml");
        let results = "[results]\ntable = \"t\"\nkey = \"k\"\nstatus = \"s\"\nterminal = [\"A\"]\noutput = \"o\"";
        let text = format!(
            "{}[fencing]\ncolumn = \"epoch\"\norder = \"increasing\"\n",
            celery_file(results)
        );
        let system = System::parse(&text, path).unwrap();
        assert_eq!(
            system.fencing,
            Some(crate::contract::fencing::Fencing {
                column: "epoch".into(),
                order: crate::contract::fencing::FenceOrder::Increasing,
            })
        );
        let text = format!(
            "{}[fencing]\ncolumn = \"epoch\"\norder = \"newest\"\n",
            celery_file(results)
        );
        let err = System::parse(&text, path).unwrap_err().to_string();
        assert!(err.contains("sys.toml:21:9"), "{err}");
        assert!(err.contains("increasing") && err.contains("token"), "{err}");
        let text = format!(
            "{}[fencing]\ncolumn = \"epoch; --\"\norder = \"token\"\n",
            celery_file(results)
        );
        let err = System::parse(&text, path).unwrap_err().to_string();
        assert!(err.contains("sys.toml:20:10"), "{err}");
        assert!(err.contains("not a plain SQL identifier"), "{err}");
    }

    #[test]
    fn the_files_settings_are_placeholders_and_one_of_a_missing_table_is_unknown() {
        let path = Path::new("sys.toml");
        let results = "[results]\ntable = \"t\"\nkey = \"k\"\nstatus = \"s\"\nterminal = [\"A\"]\noutput = \"o\"";
        let text = celery_file(results).replace(
            "command = \"run {worker_id}\"\n",
            "command = \"run {worker_id} --vt {visibility_timeout_s}\"\n[start.env]\nMODEL_TIMEOUT_S = \"{model_timeout_s}\"\n",
        ) + "[timeouts]\nmodel_ms = 7500\n";
        let system = System::parse(&text, path).unwrap();
        let values = system.settings_values();
        assert!(
            values.contains(&("visibility_timeout_s", "5".into())),
            "{values:?}"
        );
        assert!(
            values.contains(&("model_timeout_s", "7.5".into())),
            "{values:?}"
        );
        let text = text.replace("{visibility_timeout_s}", "{heartbeat_s}");
        let err = System::parse(&text, path).unwrap_err().to_string();
        assert!(err.contains("unknown placeholder {heartbeat_s}"), "{err}");
        assert!(err.contains("{visibility_timeout_s}"), "{err}");
    }

    #[test]
    fn the_recovery_bound_is_the_longer_of_the_presets_and_the_files_and_is_capped() {
        let path = Path::new("sys.toml");
        let results = "[results]\ntable = \"t\"\nkey = \"k\"\nstatus = \"s\"\nterminal = [\"A\"]\noutput = \"o\"";
        let system = System::parse(&celery_file(results), path).unwrap();
        let (bound, source) = system.recovery_bound();
        assert_eq!(bound, Duration::from_secs(5));
        assert!(source.contains("visibility_timeout_s = 5"), "{source}");
        let text = format!("{}[timeouts]\nrecovery_ms = 45000\n", celery_file(results));
        let system = System::parse(&text, path).unwrap();
        assert_eq!(system.model_timeout, Duration::from_secs(30));
        assert_eq!(
            system.recovery_bound(),
            (
                Duration::from_secs(45),
                "[timeouts] recovery_ms = 45000".into()
            )
        );
        let text = format!("{}[timeouts]\nrecovery_ms = 900000\n", celery_file(results));
        let err = System::parse(&text, path).unwrap_err().to_string();
        assert!(err.contains("sys.toml:20:15"), "{err}");
        assert!(err.contains("above 300000 ms"), "{err}");
    }

    #[test]
    fn errors_name_file_line_and_column() {
        let path = Path::new("sys.toml");
        let text = celery_file(
            "[results]\ntable = \"t\"\nkey = \"k\"\nstatus = \"s\"\nterminal = []\noutput = \"o\"",
        );
        let err = System::parse(&text, path).unwrap_err().to_string();
        assert!(err.contains("sys.toml:13:12"), "{err}");
        assert!(err.contains("`terminal` is empty"), "{err}");

        let text = celery_file(
            "[results]\ntable = \"t\"\nkey = \"k\"\nstatus = \"s\"\nterminal = [\"A\"]\noutput = \"o\"\ncolour = 1",
        );
        let err = System::parse(&text, path).unwrap_err().to_string();
        assert!(err.contains("sys.toml:15:1"), "{err}");
        assert!(err.contains("colour"), "{err}");

        let text = celery_file(
            "[results]\ntable = \"t; DROP\"\nkey = \"k\"\nstatus = \"s\"\nterminal = [\"A\"]\noutput = \"o\"",
        );
        let err = System::parse(&text, path).unwrap_err().to_string();
        assert!(err.contains("sys.toml:10:9"), "{err}");

        let text = celery_file(
            "[results]\ntable = \"t\"\nkey = \"k\"\nstatus = \"s\"\nterminal = [\"A\"]\noutput = \"o\"",
        )
        .replace("run {worker_id}", "run {worker}");
        let err = System::parse(&text, path).unwrap_err().to_string();
        assert!(err.contains("sys.toml:4:11"), "{err}");
        assert!(err.contains("unknown placeholder {worker}"), "{err}");

        let results = "[results]\ntable = \"t\"\nkey = \"k\"\nstatus = \"s\"\nterminal = [\"A\"]\noutput = \"o\"";
        let text = format!("{}[keys]\nlease = \"lock:{{id}}\"\n", celery_file(results));
        let err = System::parse(&text, path).unwrap_err().to_string();
        assert!(err.contains("sys.toml:20:9"), "{err}");
        assert!(err.contains("unknown placeholder {id}"), "{err}");
        let text = format!(
            "{}[keys]\ncache = \"cache:{{version}}:{{version}}\"\n",
            celery_file(results)
        );
        let err = System::parse(&text, path).unwrap_err().to_string();
        assert!(err.contains("sys.toml:20:9"), "{err}");
        assert!(err.contains("must hold {version} at most once"), "{err}");

        // A variable's bad placeholder is reported at the variable's own line.
        let text = format!(
            "{}[start.env]\nA = \"{{venv}}\"\nB = \"{{worker}}\"\n",
            celery_file(results)
        );
        let err = System::parse(&text, path).unwrap_err().to_string();
        assert!(err.contains("sys.toml:21:5"), "{err}");
        assert!(
            err.contains("[start.env] B: unknown placeholder {worker}"),
            "{err}"
        );

        // A placeholder inside quotes in a command.
        let text = celery_file(results).replace("run {worker_id}", "run '{worker_id}'");
        let err = System::parse(&text, path).unwrap_err().to_string();
        assert!(err.contains("sys.toml:4:11"), "{err}");
        assert!(err.contains("{worker_id} stands inside quotes"), "{err}");
    }

    /// `celery_file` with its `[model]` table's lines (from line 16) replaced by `model`.
    fn with_model(model: &str) -> String {
        let results = "[results]\ntable = \"t\"\nkey = \"k\"\nstatus = \"s\"\nterminal = [\"A\"]\noutput = \"o\"";
        celery_file(results).replace(
            "[model]\napi = \"racecert\"\n",
            &format!("[model]\n{model}\n"),
        )
    }

    #[test]
    fn model_apis_are_named_and_an_unknown_one_lists_them() {
        let path = Path::new("sys.toml");
        let chat =
            System::parse(&with_model("api = \"openai-chat\"\nname = \"gpt\""), path).unwrap();
        assert_eq!(
            (chat.model, chat.model_name.as_str()),
            (ModelApi::OpenaiChat, "gpt")
        );
        let err = System::parse(&with_model("api = \"openai\""), path)
            .unwrap_err()
            .to_string();
        assert!(err.contains("sys.toml:15:1"), "{err}");
        assert!(
            err.contains(
                "unknown model api \"openai\" (racecert, openai-completions, openai-chat, kserve-v2, template)"
            ),
            "{err}"
        );
    }

    #[test]
    fn template_places_are_json_pointers_checked_at_their_line() {
        let path = Path::new("sys.toml");
        let template = |input: &str, output: &str| {
            with_model(&format!(
                "api = \"template\"\npath = \"/v1/answer\"\ninput = \"{input}\"\noutput = \"{output}\""
            ))
        };
        let good =
            System::parse(&template("/messages/0/content", "/result/a~1b~0c"), path).unwrap();
        assert_eq!(
            good.model,
            ModelApi::Template {
                path: "/v1/answer".into(),
                input: "/messages/0/content".into(),
                output: "/result/a~1b~0c".into(),
            }
        );
        assert_eq!(good.place("model.input"), "sys.toml:18:9");
        assert_eq!(good.place("model.output"), "sys.toml:19:10");
        // The whole body is a pointer too.
        assert!(System::parse(&template("", ""), path).is_ok());

        let err = System::parse(&template("/text", "choices[0].message.content"), path)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(
                "sys.toml:19:10: [model] output \"choices[0].message.content\" is not a JSON pointer (RFC 6901:"
            ),
            "{err}"
        );
        assert!(
            err.ends_with("did you mean \"/choices/0/message/content\"?"),
            "{err}"
        );
        let err = System::parse(&template("inputs.0.text", "/ok"), path)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("sys.toml:18:9: [model] input \"inputs.0.text\""),
            "{err}"
        );
        assert!(err.ends_with("did you mean \"/inputs/0/text\"?"), "{err}");
        // A pointer whose `~` escapes nothing.
        let err = System::parse(&template("/text", "/a~b"), path)
            .unwrap_err()
            .to_string();
        assert!(err.contains("sys.toml:19:10"), "{err}");
        assert!(err.ends_with("did you mean \"/a~0b\"?"), "{err}");
    }

    #[test]
    fn paths_written_other_ways_suggest_their_pointer() {
        for (path, pointer) in [
            ("choices[0].message.content", "/choices/0/message/content"),
            ("$.result.text", "/result/text"),
            ("outputs[0][\"data\"][0]", "/outputs/0/data/0"),
            ("result['a/b']", "/result/a~1b"),
            ("result/text", "/result/text"),
            (" .result ", "/result"),
            ("$", ""),
            ("/a~b~1", "/a~0b~1"),
        ] {
            assert_eq!(suggest_pointer(path), pointer, "{path}");
            assert_eq!(check_pointer(pointer), Ok(()), "{pointer}");
        }
        for bad in ["choices[0].text", "result", "/a~", "/a~2"] {
            assert!(check_pointer(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn placeholders_in_commands_stand_outside_quotes() {
        for ok in [
            "python submit.py {request_id} {input}",
            "{venv}/bin/python x.py --id={request_id}",
            "echo '{\"k\": 1}' {input}",
            "echo \"it's\" {input}",
            "echo \\' {input}",
        ] {
            assert_eq!(check_unquoted(ok), Ok(()), "{ok}");
        }
        for bad in [
            "python submit.py '{input}'",
            "python submit.py \"{request_id}\"",
            "sh -c 'submit {input}'",
            "echo \"$(x)\" \"{venv}/bin/x\"",
        ] {
            assert!(check_unquoted(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn values_are_quoted_for_the_shell() {
        let filled = fill_shell(
            "printf '%s|' {request_id} {input}",
            &[
                ("request_id", "req-1"),
                ("input", "a b 'c' \"d\" $HOME `x` \\ ;|&"),
            ],
        );
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&filled)
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "req-1|a b 'c' \"d\" $HOME `x` \\ ;|&|",
            "{filled}"
        );
        // A value that needs no quotes is left as it is (`{venv}/bin/celery`).
        assert_eq!(
            fill_shell("{venv}/bin/celery", &[("venv", "/tmp/v-1")]),
            "/tmp/v-1/bin/celery"
        );
    }

    #[test]
    fn keys_reach_the_wire_checks_layout() {
        let system = System::load(&example("examples/celery-worker/locked.toml")).unwrap();
        let matcher = system.keys.matcher();
        assert_eq!(matcher.lease_of("lock:req-1").as_deref(), Some("req-1"));
        assert!(!matcher.has_cache());
        let naive = System::load(&example("examples/celery-worker/naive.toml")).unwrap();
        assert_eq!(naive.keys, KeyLayout::default());
    }

    #[test]
    fn the_builder_runs_the_same_checks() {
        let results = Results {
            table: "inference_results".into(),
            key: "request_id".into(),
            status: "status".into(),
            terminal: vec!["SUCCEEDED".into()],
            output: "output".into(),
            version: None,
            schema: None,
        };
        let built = System::builder("apalis", Framework::Apalis)
            .command("./target/debug/apalis-worker", ".")
            .env("WORKER_NAME", "{worker_id}")
            .version("v1", "model-backend-A")
            .submit_task("inference", &[("request_id", "{request_id}")], "inference")
            .results(results.clone())
            .apalis(ApalisOptions {
                backend: "postgres".into(),
                queue: "inference".into(),
                heartbeat_s: 2.0,
                missed_heartbeats: 3,
            })
            .build()
            .unwrap();
        assert_eq!(
            built.versions,
            vec![("v1".into(), "model-backend-A".into())]
        );
        let err = System::builder("apalis", Framework::Apalis)
            .command("w", ".")
            .version("v1", "a")
            .submit_task("inference", &[], "inference")
            .results(results)
            .build()
            .unwrap_err()
            .to_string();
        assert!(err.contains("needs an [apalis] table"), "{err}");
    }

    /// The Celery example's `naive.toml`, written with the builder: the same description.
    #[test]
    fn the_builder_describes_what_the_file_does() {
        let file = System::load(&example("examples/celery-worker/naive.toml")).unwrap();
        let dir = example("examples/celery-worker");
        let mut builder = System::builder("celery-naive", Framework::Celery)
            .command(&file.start.command, dir.join("."))
            .requirements(dir.join("requirements.txt"))
            .ready("{worker_id}@racecert ready.")
            .version("v1", "model-backend-A")
            .version("v2", "model-backend-B")
            .submit_task(
                "tasks.infer_naive",
                &[("request_id", "{request_id}"), ("input", "{input}")],
                "celery",
            )
            .results(Results {
                table: "inference_results".into(),
                key: "request_id".into(),
                status: "status".into(),
                terminal: vec!["SUCCEEDED".into(), "FAILED".into()],
                output: "output".into(),
                version: Some("model_version".into()),
                schema: Some(dir.join("schema.sql")),
            })
            .model(ModelApi::OpenaiCompletions, "inference-model")
            .celery(CeleryOptions {
                visibility_timeout_s: 5.0,
                acks_late: true,
                prefetch_multiplier: 1,
                reject_on_worker_lost: false,
            })
            .model_timeout(Duration::from_secs(15));
        for (name, value) in &file.start.env {
            builder = builder.env(name, value);
        }
        let built = builder.build().unwrap();
        assert_eq!(built.start, file.start);
        assert_eq!(built.versions, file.versions);
        assert_eq!(built.submit, file.submit);
        assert_eq!(built.results, file.results);
        assert_eq!(
            (
                &built.model,
                &built.model_name,
                &built.celery,
                built.model_timeout
            ),
            (
                &file.model,
                &file.model_name,
                &file.celery,
                file.model_timeout
            )
        );
        assert_eq!(built.source, None);
        assert!(built.place("results.output").contains("celery-naive"));
    }

    #[test]
    fn placeholders_fill_and_unknown_ones_are_found() {
        assert_eq!(
            fill("{a}-{b}-{a}", &[("a", "1"), ("b", "2")]),
            "1-2-1".to_owned()
        );
        assert_eq!(placeholders("x {a} {} {B} {c_d}"), vec!["a", "c_d"]);
        assert!(check_placeholders("{venv}/bin/celery", START_PLACEHOLDERS).is_ok());
    }
}
