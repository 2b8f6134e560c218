//! Suite files (`suites/*.toml`): parsed strictly (unknown fields are errors) and validated
//! (impossible settings are errors), each error naming the file, line and column and what was
//! expected. Nothing runs until every given file is valid.

use crate::check::Invariant;
use crate::check::coverage::Scope;
use crate::contract::defect::Defects;
use crate::fault::FaultKind;
use crate::reference::ReferenceFactory;
use crate::runner::controlled::CaseSettings;
use crate::schedule::{ScheduleSpace, WorkerSpec};
use crate::suite::Suite;
use crate::{Error, Result};
use serde::Deserialize;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use toml::Spanned;

/// What a suite file holds.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SuiteFile {
    name: Spanned<String>,
    #[serde(default)]
    description: String,
    /// A fixed number of cases (exact reproduction) instead of a time budget.
    #[serde(default)]
    cases: Option<Spanned<i64>>,
    #[serde(default = "default_seed")]
    seed: u64,
    /// Wall-clock budget of the suite, seconds (default: its share of the run's budget).
    #[serde(default)]
    time_budget_s: Option<Spanned<f64>>,
    /// `pass` (every invariant must hold) or `fail` (a demonstration suite that must be caught).
    #[serde(default = "default_expected")]
    expected: Spanned<String>,
    #[serde(default)]
    invariants: Option<Spanned<Vec<Spanned<String>>>>,
    /// Model version -> backend name.
    versions: Spanned<toml::Table>,
    workers: Spanned<Vec<WorkerEntry>>,
    timeouts: Timeouts,
    #[serde(default)]
    rollout: Rollout,
    faults: Faults,
    #[serde(default)]
    schedule: ScheduleShape,
}

fn default_seed() -> u64 {
    1
}

fn default_expected() -> Spanned<String> {
    Spanned::new(0..0, "pass".to_owned())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkerEntry {
    id: Spanned<String>,
    version: Spanned<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Timeouts {
    backend_ms: Spanned<i64>,
    lease_ttl_ms: Spanned<i64>,
    visibility_ms: Spanned<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rollout {
    /// Version the schedules may cut over to.
    #[serde(default)]
    cutover_to: Option<Spanned<String>>,
    /// Whether old workers drain after cutover (the reference always drains; false is refused
    /// for the reference worker, which cannot be told not to).
    #[serde(default = "default_true")]
    drain: bool,
}

fn default_true() -> bool {
    true
}

impl Default for Rollout {
    fn default() -> Self {
        Rollout {
            cutover_to: None,
            drain: true,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Faults {
    kinds: Spanned<Vec<Spanned<String>>>,
    /// Landings each kind in scope needs before the suite may say PASSED (default 1).
    #[serde(default)]
    min_landed: Option<Spanned<i64>>,
    /// Kinds applied but not required to land, each with why (`partition = "..."`).
    #[serde(default)]
    out_of_scope: std::collections::BTreeMap<Spanned<String>, Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduleShape {
    #[serde(default = "default_steps")]
    max_steps: Spanned<i64>,
    #[serde(default = "default_requests")]
    max_requests: Spanned<i64>,
    #[serde(default = "default_inputs")]
    inputs: Spanned<i64>,
}

impl Default for ScheduleShape {
    fn default() -> Self {
        ScheduleShape {
            max_steps: default_steps(),
            max_requests: default_requests(),
            inputs: default_inputs(),
        }
    }
}

fn default_steps() -> Spanned<i64> {
    Spanned::new(0..0, 8)
}
fn default_requests() -> Spanned<i64> {
    Spanned::new(0..0, 2)
}
fn default_inputs() -> Spanned<i64> {
    Spanned::new(0..0, 2)
}

/// A suite as loaded, with its settings beyond what [`Suite`] holds.
#[derive(Debug, Clone)]
pub struct LoadedSuite {
    /// The suite.
    pub suite: Suite,
    /// The file it came from.
    pub path: String,
    /// The default seed.
    pub seed: u64,
    /// Its own wall-clock budget (None: a share of the certification's).
    pub time_budget: Option<Duration>,
    /// Whether it is expected to pass.
    pub expect_pass: bool,
}

/// Line and column (1-based) of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before
        .rfind('\n')
        .map_or(before.len(), |nl| before.len() - nl - 1)
        + 1;
    (line, col)
}

/// Loads and validates a suite file.
pub fn load(path: &Path) -> Result<LoadedSuite> {
    let text = std::fs::read_to_string(path).map_err(|err| Error::io_at(path, err))?;
    parse(&text, &path.display().to_string())
}

/// Parses and validates suite text; `origin` names it in errors.
pub fn parse(text: &str, origin: &str) -> Result<LoadedSuite> {
    let file: SuiteFile = toml::from_str(text).map_err(|err| {
        let (line, col) = err
            .span()
            .map(|span| line_col(text, span.start))
            .unwrap_or((1, 1));
        Error::Config(format!("{origin}:{line}:{col}: {}", err.message().trim()))
    })?;
    let at = |span: std::ops::Range<usize>, message: String| -> Error {
        let (line, col) = line_col(text, span.start);
        Error::Config(format!("{origin}:{line}:{col}: {message}"))
    };
    let positive = |value: &Spanned<i64>, field: &str| -> Result<u64> {
        if *value.get_ref() <= 0 {
            return Err(at(
                value.span(),
                format!("{field} must be a positive number, got {}", value.get_ref()),
            ));
        }
        Ok(*value.get_ref() as u64)
    };

    let name = file.name.get_ref().clone();
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(at(
            file.name.span(),
            format!("name {name:?} must be non-empty letters, digits, '-' or '_'"),
        ));
    }
    let cases = file
        .cases
        .as_ref()
        .map(|cases| positive(cases, "cases"))
        .transpose()?;
    let budget = match &file.time_budget_s {
        Some(budget) if !(budget.get_ref().is_finite() && *budget.get_ref() > 0.0) => {
            return Err(at(
                budget.span(),
                format!(
                    "time_budget_s must be a positive number of seconds, got {}",
                    budget.get_ref()
                ),
            ));
        }
        Some(budget) => Some(Duration::from_secs_f64(*budget.get_ref())),
        None => None,
    };
    if let (Some(cases), Some(budget)) = (&file.cases, &file.time_budget_s) {
        let (first, _) = if cases.span().start < budget.span().start {
            (cases.span(), budget.span())
        } else {
            (budget.span(), cases.span())
        };
        return Err(at(
            first,
            "give cases (a fixed number, for exact reproduction) or time_budget_s (spent on as many cases as fit), not both".into(),
        ));
    }
    let backend = positive(&file.timeouts.backend_ms, "timeouts.backend_ms")?;
    let lease = positive(&file.timeouts.lease_ttl_ms, "timeouts.lease_ttl_ms")?;
    let visibility = positive(&file.timeouts.visibility_ms, "timeouts.visibility_ms")?;
    if lease <= backend {
        return Err(at(
            file.timeouts.lease_ttl_ms.span(),
            format!(
                "lease_ttl_ms ({lease}) must exceed backend_ms ({backend}): a lease shorter than a call is a fault to inject (lease-expiry), not a setting"
            ),
        ));
    }
    if visibility <= backend {
        return Err(at(
            file.timeouts.visibility_ms.span(),
            format!(
                "visibility_ms ({visibility}) must exceed backend_ms ({backend}): redeliveries during a call are a fault to inject (retry-overlap), not a setting"
            ),
        ));
    }
    let expect_pass = match file.expected.get_ref().as_str() {
        "pass" => true,
        "fail" => false,
        other => {
            return Err(at(
                file.expected.span(),
                format!("expected must be \"pass\" or \"fail\", got {other:?}"),
            ));
        }
    };

    let mut versions = Vec::new();
    for (version, backend_name) in file.versions.get_ref() {
        if !backend_name.is_str() {
            return Err(at(
                file.versions.span(),
                format!("versions.{version} must name a backend (a string)"),
            ));
        }
        if !matches!(version.as_str(), "v1" | "v2") {
            return Err(at(
                file.versions.span(),
                format!(
                    "version {version:?}: the test bed serves v1 (model-backend-A) and v2 (model-backend-B)"
                ),
            ));
        }
        versions.push(version.clone());
    }
    if versions.is_empty() {
        return Err(at(
            file.versions.span(),
            "versions: at least one model version".into(),
        ));
    }
    let mut workers = Vec::new();
    for worker in file.workers.get_ref() {
        if !versions.contains(worker.version.get_ref()) {
            return Err(at(
                worker.version.span(),
                format!(
                    "worker {} runs {:?}, which is not among versions ({})",
                    worker.id.get_ref(),
                    worker.version.get_ref(),
                    versions.join(", ")
                ),
            ));
        }
        if workers
            .iter()
            .any(|w: &WorkerSpec| &w.id == worker.id.get_ref())
        {
            return Err(at(
                worker.id.span(),
                format!("duplicate worker id {:?}", worker.id.get_ref()),
            ));
        }
        if worker.id.get_ref().is_empty() || worker.id.get_ref().contains(char::is_whitespace) {
            return Err(at(
                worker.id.span(),
                "worker id must be non-empty without spaces".into(),
            ));
        }
        workers.push(WorkerSpec {
            id: worker.id.get_ref().clone(),
            version: worker.version.get_ref().clone(),
        });
    }
    if workers.is_empty() {
        return Err(at(
            file.workers.span(),
            "workers: at least one worker".into(),
        ));
    }
    let mut faults = Vec::new();
    for kind in file.faults.kinds.get_ref() {
        let found = FaultKind::ALL
            .into_iter()
            .find(|k| k.name() == kind.get_ref());
        match found {
            Some(k) => faults.push(k),
            None => {
                return Err(at(
                    kind.span(),
                    format!(
                        "unknown fault {:?}; expected one of {}",
                        kind.get_ref(),
                        FaultKind::ALL.map(FaultKind::name).join(", ")
                    ),
                ));
            }
        }
    }
    let mut scope = Scope::of(&faults);
    if let Some(min) = &file.faults.min_landed {
        if *min.get_ref() < 1 {
            return Err(at(
                min.span(),
                format!("min_landed must be at least 1, not {}", min.get_ref()),
            ));
        }
        scope.min_landed = (*min.get_ref()).min(i64::from(u32::MAX)) as u32;
    }
    for (kind, why) in &file.faults.out_of_scope {
        let Some(found) = FaultKind::ALL
            .into_iter()
            .find(|k| k.name() == kind.get_ref())
        else {
            return Err(at(
                kind.span(),
                format!(
                    "unknown fault {:?}; expected one of {}",
                    kind.get_ref(),
                    FaultKind::ALL.map(FaultKind::name).join(", ")
                ),
            ));
        };
        if !faults.contains(&found) {
            return Err(at(
                kind.span(),
                format!(
                    "{} is out of scope but not among the suite's fault kinds ({})",
                    kind.get_ref(),
                    faults
                        .iter()
                        .map(|k| k.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        if why.get_ref().trim().is_empty() {
            return Err(at(
                why.span(),
                format!(
                    "out_of_scope.{}: say why the kind is not required",
                    kind.get_ref()
                ),
            ));
        }
        scope.out_of_scope.insert(found, why.get_ref().clone());
    }
    if let Some(to) = &file.rollout.cutover_to {
        if !versions.contains(to.get_ref()) {
            return Err(at(
                to.span(),
                format!("cutover_to {:?} is not among versions", to.get_ref()),
            ));
        }
        if !faults.contains(&FaultKind::Cutover) {
            faults.push(FaultKind::Cutover);
        }
    }
    if !file.rollout.drain {
        return Err(Error::Config(format!(
            "{origin}: rollout.drain = false cannot be honoured: the reference worker always drains when the active version is not its own"
        )));
    }
    let invariants = match &file.invariants {
        None => Invariant::own(),
        Some(list) => {
            let mut out = Vec::new();
            for name in list.get_ref() {
                let invariant = name
                    .get_ref()
                    .parse::<Invariant>()
                    .map_err(|err| at(name.span(), err.to_string()))?;
                if invariant.needs_rollout() {
                    return Err(at(
                        name.span(),
                        format!(
                            "{invariant} is judged on a team's own rollout (`certify --system` with a [rollout]); the reference worker's suites make none"
                        ),
                    ));
                }
                out.push(invariant);
            }
            if out.is_empty() {
                return Err(at(
                    list.span(),
                    "invariants: list at least one, or leave the key out for all".into(),
                ));
            }
            out
        }
    };
    let max_steps = positive(&file.schedule.max_steps, "schedule.max_steps")?;
    let max_requests = positive(&file.schedule.max_requests, "schedule.max_requests")?;
    let inputs = positive(&file.schedule.inputs, "schedule.inputs")?;
    if max_steps > 64 || max_requests > 16 {
        return Err(Error::Config(format!(
            "{origin}: schedule.max_steps <= 64 and schedule.max_requests <= 16 (longer cases shrink poorly)"
        )));
    }
    let cutover_targets = match &file.rollout.cutover_to {
        Some(to) => vec![to.get_ref().clone()],
        None => Vec::new(),
    };
    Ok(LoadedSuite {
        suite: Suite {
            name,
            description: file.description,
            settings: CaseSettings {
                workers: workers.clone(),
                defects: Defects::none(),
                invariants,
                backend_timeout: Duration::from_millis(backend),
                factory: Arc::new(ReferenceFactory),
                wire: true,
            },
            space: ScheduleSpace {
                workers,
                versions,
                cutover_targets,
                max_requests: max_requests as usize,
                inputs: inputs as usize,
                max_steps: max_steps as usize,
                faults,
                between_statements: true,
            },
            cases: cases.map(|cases| cases.min(u64::from(u32::MAX)) as u32),
            scope,
        },
        path: origin.to_owned(),
        seed: file.seed,
        time_budget: budget,
        expect_pass,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
name = "lease-expiry"
cases = 64
[versions]
v1 = "model-backend-A"
v2 = "model-backend-B"
[[workers]]
id = "worker-a"
version = "v1"
[[workers]]
id = "worker-c"
version = "v2"
[timeouts]
backend_ms = 250
lease_ttl_ms = 60000
visibility_ms = 60000
[faults]
kinds = ["lease-expiry", "retry-overlap"]
"#;

    #[test]
    fn a_good_suite_loads() {
        let loaded = parse(GOOD, "good.toml").unwrap();
        assert_eq!(loaded.suite.name, "lease-expiry");
        assert_eq!(loaded.suite.settings.workers.len(), 2);
        assert_eq!(loaded.suite.space.faults.len(), 2);
        assert!(loaded.expect_pass);
    }

    fn error_of(text: &str) -> String {
        parse(text, "s.toml").unwrap_err().to_string()
    }

    #[test]
    fn a_suite_claims_no_invariant_its_runner_cannot_see() {
        // By default: every invariant but those a team's rollout is needed for.
        let loaded = parse(GOOD, "good.toml").unwrap();
        assert!(
            !loaded
                .suite
                .settings
                .invariants
                .contains(&Invariant::DrainDiscipline)
        );
        assert!(
            !loaded
                .suite
                .settings
                .invariants
                .contains(&Invariant::ServedByNewVersion)
        );
        // Named: refused at its place.
        let err = error_of(&GOOD.replace(
            "cases = 64",
            "cases = 64\ninvariants = [\"no-lost-job\", \"served-by-new-version\"]",
        ));
        assert!(
            err.contains("s.toml:4:")
                && err.contains("served-by-new-version is judged on a team's own rollout"),
            "{err}"
        );
    }

    #[test]
    fn a_syntax_error_names_file_line_and_column() {
        let err = error_of(&GOOD.replace("cases = 64", "cases = = 64"));
        assert!(err.contains("s.toml:3:"), "{err}");
    }

    #[test]
    fn an_unknown_field_is_named() {
        let err = error_of(&GOOD.replace("cases = 64", "cases = 64\nretries = 3"));
        assert!(
            err.contains("s.toml:4:1") && err.contains("retries"),
            "{err}"
        );
    }

    #[test]
    fn impossible_settings_are_refused_with_their_place() {
        let err = error_of(&GOOD.replace("lease_ttl_ms = 60000", "lease_ttl_ms = -5"));
        assert!(
            err.contains("s.toml:15:16") && err.contains("positive"),
            "{err}"
        );
        let err = error_of(&GOOD.replace("lease_ttl_ms = 60000", "lease_ttl_ms = 100"));
        assert!(err.contains("must exceed backend_ms"), "{err}");
        let err = error_of(&GOOD.replace("\"lease-expiry\", ", "\"lease-expiry\", \"meteor\", "));
        assert!(err.contains("unknown fault \"meteor\""), "{err}");
        let err = error_of(&GOOD.replace("version = \"v2\"", "version = \"v3\""));
        assert!(err.contains("not among versions"), "{err}");
        let err = error_of(&GOOD.replace("cases = 64", "cases = 0"));
        assert!(err.contains("cases must be a positive number"), "{err}");
        let err = error_of(&GOOD.replace("cases = 64", "time_budget_s = -1.5"));
        assert!(
            err.contains("s.toml:3:17") && err.contains("positive number of seconds"),
            "{err}"
        );
        let err = error_of(&GOOD.replace("cases = 64", "cases = 64\ntime_budget_s = 5"));
        assert!(
            err.contains("s.toml:3:9") && err.contains("not both"),
            "{err}"
        );
    }

    #[test]
    fn a_suite_has_a_case_count_or_a_budget_or_neither() {
        let fixed = parse(GOOD, "s.toml").unwrap();
        assert_eq!((fixed.suite.cases, fixed.time_budget), (Some(64), None));
        let budgeted = parse(&GOOD.replace("cases = 64", "time_budget_s = 7.5"), "s.toml").unwrap();
        assert_eq!(budgeted.suite.cases, None);
        assert_eq!(budgeted.time_budget, Some(Duration::from_millis(7500)));
        let shared = parse(&GOOD.replace("cases = 64\n", ""), "s.toml").unwrap();
        assert_eq!((shared.suite.cases, shared.time_budget), (None, None));
    }
}
