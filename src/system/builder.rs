//! The Rust builder of a system description ([`SystemBuilder`]): the same description as a
//! file, with the same checks, for a team that certifies from its own `cargo test`.

use super::*;

/// The same description in Rust, without a file (racecert as a dev-dependency of the team's
/// crate). [`SystemBuilder::build`] runs the checks a file gets.
#[derive(Debug, Clone)]
pub struct SystemBuilder {
    system: System,
}

impl SystemBuilder {
    pub(super) fn new(name: &str, framework: Framework) -> SystemBuilder {
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
