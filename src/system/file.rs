//! Reading a system file: the file as written ([`raw`]) and the steps of [`System::parse`]
//! that turn it into a description, each noting where its fields are written.

use super::*;
use std::ops::Range;

/// The file as deserialized, or an error at the place the TOML is wrong.
pub(super) fn deserialize(text: &str, path: &Path) -> Result<raw::File> {
    toml::from_str(text).map_err(|err| {
        let where_ = err
            .span()
            .map(|span| place(text, path, span.start).0)
            .unwrap_or_else(|| path.display().to_string());
        Error::Config(format!("{where_}: {}", err.message()))
    })
}

/// The directory relative paths in the file are read from: the file's own (`.` for a bare name).
pub(super) fn base_dir(path: &Path) -> PathBuf {
    let dir = path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    if dir.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        dir
    }
}

/// Notes where the fields outside `[keys]`, `[cache]` and `[rollout]` are written.
pub(super) fn note_places(raw: &raw::File, note: &mut impl FnMut(&str, Range<usize>)) {
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
}

/// The worker's lease and cache key patterns (`[keys]`), noting where each is written.
pub(super) fn keys(raw: Option<raw::Keys>, note: &mut impl FnMut(&str, Range<usize>)) -> KeyLayout {
    match raw {
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
    }
}

/// The result cache (`[cache]`), whose key becomes the cache pattern of `keys`; refused when
/// `[keys] cache` names one too.
pub(super) fn cache(
    raw: Option<crate::system::rollout::raw::Cache>,
    keys: &mut KeyLayout,
    note: &mut impl FnMut(&str, Range<usize>),
    place_of: &impl Fn(Range<usize>) -> String,
) -> Result<Option<rollout::Cache>> {
    let Some(cache) = raw else {
        return Ok(None);
    };
    let span = cache.key.span();
    let cache = rollout::cache(cache, note, place_of)?;
    if keys.cache.is_some() {
        return Err(Error::Config(format!(
            "{}: [cache] key and [keys] cache both say where the cache is: keep [cache]",
            place_of(span)
        )));
    }
    keys.cache = Some(cache.key.clone());
    Ok(Some(cache))
}

/// How a request is submitted (`[submit]`: a preset task or a command) and the command that
/// submits it again, if any.
pub(super) fn submit(
    submit: raw::Submit,
    framework: Framework,
    places: &BTreeMap<String, Place>,
) -> Result<(Submit, Option<String>)> {
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
                .unwrap_or_else(|| framework.default_queue().into()),
        },
        (None, Some(command)) => Submit::Command(command),
        _ => {
            return Err(Error::Config(format!(
                "{}: [submit] needs exactly one of `task` (the framework preset) or `command`",
                places["submit"]
            )));
        }
    };
    Ok((submit, resubmit))
}

/// The model API the worker calls (`[model] api`) and the model name it sends; a template's
/// pointers are checked and their places noted.
pub(super) fn model(
    model: raw::Model,
    at: &impl Fn(Range<usize>) -> Place,
    places: &mut BTreeMap<String, Place>,
) -> Result<(ModelApi, String)> {
    let api = match model.api.as_str() {
        "racecert" => ModelApi::Racecert,
        "openai-completions" => ModelApi::OpenaiCompletions,
        "openai-chat" => ModelApi::OpenaiChat,
        "kserve-v2" => ModelApi::KserveV2,
        "template" => match (model.path, model.input, model.output) {
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
    Ok((api, model.name.unwrap_or_else(|| "model".into())))
}

/// How a worker starts (`[start]`), its paths read from `dir`.
pub(super) fn start(start: raw::Start, dir: &Path) -> Start {
    let workdir = dir.join(start.workdir.unwrap_or_else(|| ".".into()));
    Start {
        command: start.command.into_inner(),
        requirements: start.requirements.map(|r| dir.join(r)),
        setup: start.setup.map(Spanned::into_inner),
        ready: start.ready,
        env: start
            .env
            .into_iter()
            .map(|(name, value)| (name, value.into_inner()))
            .collect(),
        workdir,
    }
}

/// Where results land (`[results]`), the schema's path read from `dir`.
pub(super) fn results(results: raw::Results, dir: &Path) -> Results {
    Results {
        table: results.table.into_inner(),
        key: results.key.into_inner(),
        status: results.status.into_inner(),
        terminal: results.terminal.into_inner(),
        output: results.output.into_inner(),
        version: results.version.map(Spanned::into_inner),
        schema: results.schema.map(|s| dir.join(s)),
    }
}

/// `path:line:col` of byte `offset` in `text` (1-based, columns in characters).
pub(super) fn place(text: &str, path: &Path, offset: usize) -> Place {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    Place(format!("{}:{line}:{col}", path.display()))
}

/// The file as written (serde), before checks.
pub(super) mod raw {
    use crate::system::{ApalisOptions, CeleryOptions, DramatiqOptions, Framework};
    use serde::Deserialize;
    use std::collections::BTreeMap;
    use toml::Spanned;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(in crate::system) struct File {
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
        pub rollout: Option<crate::system::rollout::raw::Rollout>,
        pub cache: Option<crate::system::rollout::raw::Cache>,
        pub fencing: Option<Fencing>,
    }

    /// `[fencing]`: the team's own fencing column and how its values order attempts.
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(in crate::system) struct Fencing {
        pub column: Spanned<String>,
        pub order: crate::contract::fencing::FenceOrder,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(in crate::system) struct Start {
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
    pub(in crate::system) struct Submit {
        pub task: Option<String>,
        #[serde(default)]
        pub args: BTreeMap<String, String>,
        pub queue: Option<String>,
        pub command: Option<String>,
        pub resubmit: Option<String>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(in crate::system) struct Results {
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
    pub(in crate::system) struct Model {
        pub api: String,
        pub name: Option<String>,
        pub path: Option<String>,
        pub input: Option<Spanned<String>>,
        pub output: Option<Spanned<String>>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(in crate::system) struct Keys {
        pub lease: Option<Spanned<String>>,
        pub cache: Option<Spanned<String>>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(in crate::system) struct Timeouts {
        #[serde(default = "model_ms")]
        pub model_ms: u64,
        pub recovery_ms: Option<Spanned<u64>>,
    }

    fn model_ms() -> u64 {
        30_000
    }
}
