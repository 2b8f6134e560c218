//! `[rollout]` and `[cache]` of a system file: how a team switches model versions (an
//! active-version key its API or workers read, worker replacement with a stop signal, a grace
//! period and surge, its own cache invalidation step and when it runs) and where its result
//! cache lives. The rollout faults (`cutover`, `cache-invalidation-lag`, `drain`) do what this
//! says; `served-by-new-version` and the cache invariants judge what it names.

use super::{System, check_placeholders, placeholders};
use nix::sys::signal::Signal;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::ops::Range;
use std::str::FromStr;
use std::time::Duration;
use toml::Spanned;

/// How the team rolls a new model version out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollout {
    /// A Redis key (in the run's database) the API or the workers read for the active version;
    /// racecert sets it to the old version's value before a case and to the new one's at the
    /// switch.
    pub active_key: Option<String>,
    /// The value of `active_key` per version (a version missing here is its own name).
    pub active_values: BTreeMap<String, String>,
    /// What an orchestrator sends a worker it replaces.
    pub stop_signal: Signal,
    /// How long a stopped worker may take before SIGKILL (None: the job in hand's remaining
    /// model call + 2 s, so that a worker that drains finishes it).
    pub grace: Option<Duration>,
    /// Whether the new version's workers start before the old ones are told to stop (a rolling
    /// update with surge); else after they are gone.
    pub surge: bool,
    /// The team's own cache invalidation step, if it has one.
    pub invalidate: Option<Invalidate>,
    /// When that step runs.
    pub invalidate_at: InvalidateAt,
    /// `served-by-new-version`, opt-in: requests accepted this long after the switch (the mixed
    /// window a team allows) must be answered by the new version. None: not judged.
    pub served_by_new_version: Option<Duration>,
    /// Whether the workers share one model URL whose backend is switched to the next version
    /// (a load balancer's target, a DNS name) rather than one URL per version: puts
    /// `backend-switch` in scope.
    pub backend_switch: bool,
}

impl Default for Rollout {
    fn default() -> Rollout {
        Rollout {
            active_key: None,
            active_values: BTreeMap::new(),
            stop_signal: Signal::SIGTERM,
            grace: None,
            surge: true,
            invalidate: None,
            invalidate_at: InvalidateAt::Switch,
            served_by_new_version: None,
            backend_switch: false,
        }
    }
}

impl Rollout {
    /// The value `active_key` holds while `version` is the active one.
    pub fn active_value<'a>(&'a self, version: &'a str) -> &'a str {
        self.active_values
            .get(version)
            .map_or(version, String::as_str)
    }
}

/// A team's cache invalidation step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invalidate {
    /// Key patterns (`*` globs; `{version}` = the version rolled away from) racecert deletes
    /// with SCAN and DEL, as a team's script would.
    Keys(Vec<String>),
    /// A shell command (placeholders `{redis_url}`, `{database_url}`, `{venv}`, `{version}`).
    Command(String),
}

/// When the invalidation step runs, relative to the rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InvalidateAt {
    /// At the switch, while the old version's workers may still finish jobs.
    Switch,
    /// Once the old version's workers are gone.
    Drained,
}

impl InvalidateAt {
    /// As a file spells it.
    pub fn name(self) -> &'static str {
        match self {
            InvalidateAt::Switch => "switch",
            InvalidateAt::Drained => "drained",
        }
    }
}

/// Where the team's result cache lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cache {
    /// The key pattern (`*` globs, `{version}` if the key names the model version).
    pub key: String,
    /// How long an entry lives, if the team sets a TTL.
    pub ttl: Option<Duration>,
}

impl Cache {
    /// Whether the key names the model version (an entry of one version is never another's).
    pub fn versioned(&self) -> bool {
        placeholders(&self.key).contains(&"version")
    }
}

/// Placeholders an invalidation command may use.
pub(super) const INVALIDATE_PLACEHOLDERS: &[&str] =
    &["redis_url", "database_url", "venv", "version"];

/// The tables as written.
pub(super) mod raw {
    use super::InvalidateAt;
    use serde::Deserialize;
    use std::collections::BTreeMap;
    use toml::Spanned;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(crate) struct Rollout {
        pub active_key: Option<Spanned<String>>,
        #[serde(default)]
        pub active_values: Option<Spanned<BTreeMap<String, String>>>,
        pub stop_signal: Option<Spanned<String>>,
        pub grace_s: Option<Spanned<f64>>,
        pub surge: Option<bool>,
        pub invalidate_keys: Option<Spanned<Vec<String>>>,
        pub invalidate_command: Option<Spanned<String>>,
        pub invalidate_at: Option<Spanned<InvalidateAt>>,
        pub served_by_new_version: Option<Spanned<bool>>,
        pub mixed_window_s: Option<Spanned<f64>>,
        pub backend_switch: Option<bool>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(crate) struct Cache {
        pub key: Spanned<String>,
        pub ttl_s: Option<Spanned<f64>>,
    }
}

/// Where a rollout field is written: its place's name in [`System::place`].
fn field(name: &str) -> String {
    format!("rollout.{name}")
}

/// The file's error at `span`.
fn at_place(
    at: &impl Fn(Range<usize>) -> String,
    span: Range<usize>,
    message: String,
) -> crate::Error {
    crate::Error::Config(format!("{}: {message}", at(span)))
}

/// Reads `[rollout]`, noting each field's place; the errors that need only the field itself
/// (a signal's name, a negative time, two invalidation steps) name that field's line.
pub(super) fn rollout(
    raw: raw::Rollout,
    note: &mut impl FnMut(&str, Range<usize>),
    at: &impl Fn(Range<usize>) -> String,
) -> crate::Result<Rollout> {
    let fail = |span, message| at_place(at, span, message);
    let mut rollout = Rollout::default();
    if let Some(key) = raw.active_key {
        note(&field("active_key"), key.span());
        if key.get_ref().trim().is_empty() {
            return Err(fail(key.span(), "`active_key` is empty".into()));
        }
        rollout.active_key = Some(key.into_inner());
    }
    if let Some(values) = raw.active_values {
        note(&field("active_values"), values.span());
        rollout.active_values = values.into_inner();
    }
    if let Some(signal) = raw.stop_signal {
        let name = signal.get_ref().to_ascii_uppercase();
        let name = if name.starts_with("SIG") {
            name
        } else {
            format!("SIG{name}")
        };
        rollout.stop_signal = match Signal::from_str(&name) {
            Ok(Signal::SIGKILL | Signal::SIGSTOP) => {
                return Err(fail(
                    signal.span(),
                    format!(
                        "stop_signal {:?} cannot be caught: a worker gets no chance to drain (SIGTERM, SIGINT, SIGQUIT, ...)",
                        signal.get_ref()
                    ),
                ));
            }
            Ok(parsed) => parsed,
            Err(_) => {
                return Err(fail(
                    signal.span(),
                    format!(
                        "unknown stop_signal {:?} (a signal name: SIGTERM, SIGINT, SIGQUIT, ...)",
                        signal.get_ref()
                    ),
                ));
            }
        };
    }
    if let Some(grace) = raw.grace_s {
        rollout.grace = Some(seconds(&grace, "grace_s", &fail)?);
    }
    if let Some(surge) = raw.surge {
        rollout.surge = surge;
    }
    rollout.backend_switch = raw.backend_switch.unwrap_or(false);
    rollout.invalidate = match (raw.invalidate_keys, raw.invalidate_command) {
        (Some(_), Some(command)) => {
            return Err(fail(
                command.span(),
                "[rollout] takes `invalidate_keys` or `invalidate_command`, not both".into(),
            ));
        }
        (Some(keys), None) => {
            note(&field("invalidate_keys"), keys.span());
            if keys.get_ref().iter().any(|k| k.trim().is_empty()) || keys.get_ref().is_empty() {
                return Err(fail(
                    keys.span(),
                    "`invalidate_keys` lists key patterns, none of them empty (e.g. [\"cache:*\"])"
                        .into(),
                ));
            }
            for pattern in keys.get_ref() {
                if let Err(bad) = check_placeholders(pattern, &["version"]) {
                    return Err(fail(keys.span(), format!("{pattern:?}: {bad}")));
                }
            }
            Some(Invalidate::Keys(keys.into_inner()))
        }
        (None, Some(command)) => {
            note(&field("invalidate_command"), command.span());
            if command.get_ref().trim().is_empty() {
                return Err(fail(command.span(), "`invalidate_command` is empty".into()));
            }
            if let Err(bad) = check_placeholders(command.get_ref(), INVALIDATE_PLACEHOLDERS)
                .and_then(|()| super::check_unquoted(command.get_ref()))
            {
                return Err(fail(command.span(), bad));
            }
            Some(Invalidate::Command(command.into_inner()))
        }
        (None, None) => None,
    };
    if let Some(when) = raw.invalidate_at {
        if rollout.invalidate.is_none() {
            return Err(fail(
                when.span(),
                "`invalidate_at` needs an invalidation step (`invalidate_keys` or `invalidate_command`)"
                    .into(),
            ));
        }
        rollout.invalidate_at = when.into_inner();
    }
    let judged = raw
        .served_by_new_version
        .as_ref()
        .is_some_and(|s| *s.get_ref());
    rollout.served_by_new_version = match raw.mixed_window_s {
        Some(window) if !judged => {
            return Err(fail(
                window.span(),
                "`mixed_window_s` is the grace of `served_by_new_version`: set `served_by_new_version = true`"
                    .into(),
            ));
        }
        Some(window) => Some(seconds(&window, "mixed_window_s", &fail)?),
        None if judged => Some(Duration::ZERO),
        None => None,
    };
    Ok(rollout)
}

/// Reads `[cache]`.
pub(super) fn cache(
    raw: raw::Cache,
    note: &mut impl FnMut(&str, Range<usize>),
    at: &impl Fn(Range<usize>) -> String,
) -> crate::Result<Cache> {
    let fail = |span, message| at_place(at, span, message);
    note("cache.key", raw.key.span());
    let ttl = match raw.ttl_s {
        Some(ttl) => Some(seconds(&ttl, "ttl_s", &fail)?),
        None => None,
    };
    Ok(Cache {
        key: raw.key.into_inner(),
        ttl,
    })
}

/// A non-negative number of seconds.
fn seconds(
    value: &Spanned<f64>,
    name: &str,
    fail: &impl Fn(Range<usize>, String) -> crate::Error,
) -> crate::Result<Duration> {
    let s = *value.get_ref();
    if !(s.is_finite() && s >= 0.0) {
        return Err(fail(
            value.span(),
            format!("`{name}` must be a non-negative number of seconds"),
        ));
    }
    Ok(Duration::from_secs_f64(s))
}

/// The checks that need the rest of the file: versions named in `active_values` exist.
pub(super) fn validate(system: &System) -> crate::Result<()> {
    for version in system.rollout.active_values.keys() {
        if !system.versions.iter().any(|(v, _)| v == version) {
            return Err(crate::Error::Config(format!(
                "{}: active_values names version {version:?}, which [versions] does not have ({})",
                system.place(&field("active_values")),
                system
                    .versions
                    .iter()
                    .map(|(v, _)| v.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const BASE: &str = r#"
name = "t"
framework = "custom"
[start]
command = "worker"
[versions]
v1 = "a"
v2 = "b"
[submit]
command = "submit {request_id} {input}"
[results]
table = "results"
key = "request_id"
status = "status"
terminal = ["DONE"]
output = "output"
[model]
api = "racecert"
"#;

    fn parse(extra: &str) -> crate::Result<System> {
        System::parse(&format!("{BASE}{extra}"), Path::new("sys.toml"))
    }

    fn error(extra: &str) -> String {
        parse(extra).expect_err("refused").to_string()
    }

    #[test]
    fn a_rollout_reads_as_written_and_defaults_to_sigterm_with_surge() {
        let system = parse("").unwrap();
        assert_eq!(system.rollout.stop_signal, Signal::SIGTERM);
        assert!(system.rollout.surge);
        assert!(system.cache.is_none());
        let system = parse(
            r#"
[rollout]
active_key = "model:active"
active_values = { v2 = "model-b" }
stop_signal = "INT"
grace_s = 4.5
surge = false
invalidate_keys = ["cache:{version}:*"]
invalidate_at = "drained"
served_by_new_version = true
mixed_window_s = 1
backend_switch = true
[cache]
key = "cache:*"
ttl_s = 600
"#,
        )
        .unwrap();
        let rollout = &system.rollout;
        assert_eq!(rollout.active_key.as_deref(), Some("model:active"));
        assert_eq!(rollout.active_value("v1"), "v1");
        assert_eq!(rollout.active_value("v2"), "model-b");
        assert_eq!(rollout.stop_signal, Signal::SIGINT);
        assert_eq!(rollout.grace, Some(Duration::from_millis(4500)));
        assert!(!rollout.surge);
        assert_eq!(
            rollout.invalidate,
            Some(Invalidate::Keys(vec!["cache:{version}:*".into()]))
        );
        assert_eq!(rollout.invalidate_at, InvalidateAt::Drained);
        assert_eq!(rollout.served_by_new_version, Some(Duration::from_secs(1)));
        assert!(rollout.backend_switch);
        let cache = system.cache.as_ref().unwrap();
        assert!(!cache.versioned());
        assert_eq!(cache.ttl, Some(Duration::from_secs(600)));
        // An unversioned cache is judged on the wire all the same.
        assert_eq!(system.keys.cache.as_deref(), Some("cache:*"));
    }

    #[test]
    fn every_table_docs_systems_md_shows_reads_as_written() {
        // The guide's TOML blocks: a whole file (it has `name`) as it stands, a table of one
        // appended to a minimal file. Tables of another framework's preset are read on a file of
        // that framework.
        let guide = include_str!("../../docs/systems.md");
        let blocks: Vec<&str> = guide
            .split("```toml\n")
            .skip(1)
            .filter_map(|rest| rest.split_once("```").map(|(block, _)| block))
            .collect();
        assert!(
            blocks.len() >= 10,
            "the guide's TOML blocks: {}",
            blocks.len()
        );
        for block in blocks {
            let whole = block.contains("[start]") && block.contains("name = ");
            if !whole && !block.starts_with('[') {
                // Top-level keys alone: TOML as written.
                if let Err(err) = block.parse::<toml::Table>() {
                    panic!("docs/systems.md block is not TOML: {err}\n{block}");
                }
                continue;
            }
            let text = if whole {
                block.to_owned()
            } else {
                // The framework the block is of: its preset's table, or a preset's `task`.
                let (framework, preset) = if block.contains("[apalis]")
                    || block.contains("apalis") && block.contains("task =")
                {
                    (
                        "apalis",
                        "[apalis]\nqueue = \"q\"\nheartbeat_s = 2\nmissed_heartbeats = 3\n",
                    )
                } else if block.contains("[celery]") || block.contains("task =") {
                    ("celery", "[celery]\nvisibility_timeout_s = 5\n")
                } else {
                    ("custom", "")
                };
                let mut text = BASE.replace(
                    "framework = \"custom\"",
                    &format!("framework = \"{framework}\""),
                );
                if framework != "custom" {
                    text =
                        text.replace("command = \"submit {request_id} {input}\"", "task = \"t\"");
                    if !block.contains(&preset[..8]) {
                        text.push_str(preset);
                    }
                }
                // A table the minimal file has already is the block's.
                for table in ["[start]", "[versions]", "[submit]", "[results]", "[model]"] {
                    if block.contains(table) {
                        let at = text.find(table).unwrap();
                        let end = text[at + 1..]
                            .find("\n[")
                            .map_or(text.len(), |e| at + 1 + e + 1);
                        text.replace_range(at..end, "");
                    }
                }
                text + block
            };
            if let Err(err) = System::parse(&text, Path::new("guide.toml")) {
                panic!("docs/systems.md block does not read: {err}\n{block}");
            }
        }
    }

    #[test]
    fn a_bad_rollout_is_refused_at_its_own_line() {
        let line = |extra: &str| {
            BASE.lines().count() + extra.lines().position(|l| l.contains('=')).unwrap() + 1
        };
        let extra = "[rollout]\nstop_signal = \"SIGKILL\"\n";
        let message = error(extra);
        assert!(
            message.contains(&format!("sys.toml:{}:15:", line(extra))),
            "{message}"
        );
        assert!(message.contains("cannot be caught"), "{message}");
        assert!(error("[rollout]\nstop_signal = \"SIGFOO\"\n").contains("unknown stop_signal"));
        assert!(error("[rollout]\ngrace_s = -1\n").contains("non-negative"));
        assert!(
            error("[rollout]\ninvalidate_keys = [\"a\"]\ninvalidate_command = \"x\"\n")
                .contains("not both")
        );
        assert!(error("[rollout]\ninvalidate_at = \"switch\"\n").contains("needs an invalidation"));
        assert!(error("[rollout]\nmixed_window_s = 2\n").contains("served_by_new_version"));
        assert!(
            error("[rollout]\ninvalidate_command = \"flush '{redis_url}'\"\n")
                .contains("inside quotes")
        );
        assert!(
            error("[rollout]\ninvalidate_command = \"flush {nope}\"\n")
                .contains("unknown placeholder")
        );
        let message = error("[rollout]\nactive_values = { v3 = \"x\" }\n");
        assert!(
            message.contains("v3") && message.contains("v1, v2"),
            "{message}"
        );
        assert!(error("[rollout]\nbogus = 1\n").contains("unknown field"));
        assert!(
            error("[cache]\nkey = \"c:*\"\n[keys]\ncache = \"c:{version}:*\"\n")
                .contains("[cache] key and [keys] cache")
        );
    }
}
