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

/// Where errors in one suite text point: the text (for line and column) and its name.
struct Place<'a> {
    text: &'a str,
    origin: &'a str,
}

impl Place<'_> {
    /// A configuration error at the start of `span`, prefixed with file, line and column.
    fn at(&self, span: std::ops::Range<usize>, message: String) -> Error {
        let (line, col) = line_col(self.text, span.start);
        Error::Config(format!("{}:{line}:{col}: {message}", self.origin))
    }

    /// A configuration error naming only the file (for settings no one span is to blame for).
    fn whole(&self, message: &str) -> Error {
        Error::Config(format!("{}: {message}", self.origin))
    }

    /// `value` as a positive number, or an error naming `field` at its place.
    fn positive(&self, value: &Spanned<i64>, field: &str) -> Result<u64> {
        if *value.get_ref() <= 0 {
            return Err(self.at(
                value.span(),
                format!("{field} must be a positive number, got {}", value.get_ref()),
            ));
        }
        Ok(*value.get_ref() as u64)
    }

    /// The fault kind named `kind`, or an error listing the known ones.
    fn fault_kind(&self, kind: &Spanned<String>) -> Result<FaultKind> {
        FaultKind::ALL
            .into_iter()
            .find(|k| k.name() == kind.get_ref())
            .ok_or_else(|| {
                self.at(
                    kind.span(),
                    format!(
                        "unknown fault {:?}; expected one of {}",
                        kind.get_ref(),
                        FaultKind::ALL.map(FaultKind::name).join(", ")
                    ),
                )
            })
    }
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
    let place = Place { text, origin };

    let name = suite_name(&place, &file.name)?;
    let (cases, budget) = cases_or_budget(&place, &file)?;
    let backend = backend_timeout(&place, &file.timeouts)?;
    let expect_pass = expectation(&place, &file.expected)?;
    let versions = versions(&place, &file.versions)?;
    let workers = workers(&place, &file.workers, &versions)?;
    let mut faults = file
        .faults
        .kinds
        .get_ref()
        .iter()
        .map(|kind| place.fault_kind(kind))
        .collect::<Result<Vec<_>>>()?;
    let scope = scope(&place, &file.faults, &faults)?;
    let cutover_targets = rollout(&place, &file.rollout, &versions, &mut faults)?;
    let invariants = invariants(&place, file.invariants.as_ref())?;
    let shape = shape(&place, &file.schedule)?;
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
                max_requests: shape.max_requests as usize,
                inputs: shape.inputs as usize,
                max_steps: shape.max_steps as usize,
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

/// The suite's name, if it is non-empty letters, digits, '-' or '_'.
fn suite_name(place: &Place, name: &Spanned<String>) -> Result<String> {
    let value = name.get_ref().clone();
    if value.is_empty()
        || !value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(place.at(
            name.span(),
            format!("name {value:?} must be non-empty letters, digits, '-' or '_'"),
        ));
    }
    Ok(value)
}

/// The fixed case count or the time budget (at most one of them), each checked positive.
fn cases_or_budget(place: &Place, file: &SuiteFile) -> Result<(Option<u64>, Option<Duration>)> {
    let cases = file
        .cases
        .as_ref()
        .map(|cases| place.positive(cases, "cases"))
        .transpose()?;
    let budget = match &file.time_budget_s {
        Some(budget) if !(budget.get_ref().is_finite() && *budget.get_ref() > 0.0) => {
            return Err(place.at(
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
        return Err(place.at(
            first,
            "give cases (a fixed number, for exact reproduction) or time_budget_s (spent on as many cases as fit), not both".into(),
        ));
    }
    Ok((cases, budget))
}

/// The backend timeout (ms), once the lease and visibility timeouts are checked to outlast it.
fn backend_timeout(place: &Place, timeouts: &Timeouts) -> Result<u64> {
    let backend = place.positive(&timeouts.backend_ms, "timeouts.backend_ms")?;
    let lease = place.positive(&timeouts.lease_ttl_ms, "timeouts.lease_ttl_ms")?;
    let visibility = place.positive(&timeouts.visibility_ms, "timeouts.visibility_ms")?;
    if lease <= backend {
        return Err(place.at(
            timeouts.lease_ttl_ms.span(),
            format!(
                "lease_ttl_ms ({lease}) must exceed backend_ms ({backend}): a lease shorter than a call is a fault to inject (lease-expiry), not a setting"
            ),
        ));
    }
    if visibility <= backend {
        return Err(place.at(
            timeouts.visibility_ms.span(),
            format!(
                "visibility_ms ({visibility}) must exceed backend_ms ({backend}): redeliveries during a call are a fault to inject (retry-overlap), not a setting"
            ),
        ));
    }
    Ok(backend)
}

/// Whether the suite is expected to pass (`expected = "pass"`) or to be caught (`"fail"`).
fn expectation(place: &Place, expected: &Spanned<String>) -> Result<bool> {
    match expected.get_ref().as_str() {
        "pass" => Ok(true),
        "fail" => Ok(false),
        other => Err(place.at(
            expected.span(),
            format!("expected must be \"pass\" or \"fail\", got {other:?}"),
        )),
    }
}

/// The model versions the suite serves: at least one, each one the test bed has.
fn versions(place: &Place, table: &Spanned<toml::Table>) -> Result<Vec<String>> {
    let mut versions = Vec::new();
    for (version, backend_name) in table.get_ref() {
        if !backend_name.is_str() {
            return Err(place.at(
                table.span(),
                format!("versions.{version} must name a backend (a string)"),
            ));
        }
        if !matches!(version.as_str(), "v1" | "v2") {
            return Err(place.at(
                table.span(),
                format!(
                    "version {version:?}: the test bed serves v1 (model-backend-A) and v2 (model-backend-B)"
                ),
            ));
        }
        versions.push(version.clone());
    }
    if versions.is_empty() {
        return Err(place.at(table.span(), "versions: at least one model version".into()));
    }
    Ok(versions)
}

/// The workers: at least one, with distinct ids without spaces, each running a known version.
fn workers(
    place: &Place,
    entries: &Spanned<Vec<WorkerEntry>>,
    versions: &[String],
) -> Result<Vec<WorkerSpec>> {
    let mut workers = Vec::new();
    for worker in entries.get_ref() {
        if !versions.contains(worker.version.get_ref()) {
            return Err(place.at(
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
            return Err(place.at(
                worker.id.span(),
                format!("duplicate worker id {:?}", worker.id.get_ref()),
            ));
        }
        if worker.id.get_ref().is_empty() || worker.id.get_ref().contains(char::is_whitespace) {
            return Err(place.at(
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
        return Err(place.at(entries.span(), "workers: at least one worker".into()));
    }
    Ok(workers)
}

/// The coverage scope of `faults`: its landing minimum and the kinds excused, each with why.
fn scope(place: &Place, given: &Faults, faults: &[FaultKind]) -> Result<Scope> {
    let mut scope = Scope::of(faults);
    if let Some(min) = &given.min_landed {
        if *min.get_ref() < 1 {
            return Err(place.at(
                min.span(),
                format!("min_landed must be at least 1, not {}", min.get_ref()),
            ));
        }
        scope.min_landed = (*min.get_ref()).min(i64::from(u32::MAX)) as u32;
    }
    for (kind, why) in &given.out_of_scope {
        let found = place.fault_kind(kind)?;
        if !faults.contains(&found) {
            return Err(place.at(
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
            return Err(place.at(
                why.span(),
                format!(
                    "out_of_scope.{}: say why the kind is not required",
                    kind.get_ref()
                ),
            ));
        }
        scope.out_of_scope.insert(found, why.get_ref().clone());
    }
    Ok(scope)
}

/// The cutover targets of `[rollout]` (a cutover adds the cutover fault to `faults`); refuses
/// what the reference worker cannot do.
fn rollout(
    place: &Place,
    rollout: &Rollout,
    versions: &[String],
    faults: &mut Vec<FaultKind>,
) -> Result<Vec<String>> {
    if let Some(to) = &rollout.cutover_to {
        if !versions.contains(to.get_ref()) {
            return Err(place.at(
                to.span(),
                format!("cutover_to {:?} is not among versions", to.get_ref()),
            ));
        }
        if !faults.contains(&FaultKind::Cutover) {
            faults.push(FaultKind::Cutover);
        }
    }
    if !rollout.drain {
        return Err(place.whole(
            "rollout.drain = false cannot be honoured: the reference worker always drains when the active version is not its own",
        ));
    }
    Ok(match &rollout.cutover_to {
        Some(to) => vec![to.get_ref().clone()],
        None => Vec::new(),
    })
}

/// The invariants judged: those listed (none needing a team's rollout), or by default all the
/// reference worker's own.
fn invariants(
    place: &Place,
    list: Option<&Spanned<Vec<Spanned<String>>>>,
) -> Result<Vec<Invariant>> {
    let Some(list) = list else {
        return Ok(Invariant::own());
    };
    let mut out = Vec::new();
    for name in list.get_ref() {
        let invariant = name
            .get_ref()
            .parse::<Invariant>()
            .map_err(|err| place.at(name.span(), err.to_string()))?;
        if invariant.needs_rollout() {
            return Err(place.at(
                name.span(),
                format!(
                    "{invariant} is judged on a team's own rollout (`certify --system` with a [rollout]); the reference worker's suites make none"
                ),
            ));
        }
        out.push(invariant);
    }
    if out.is_empty() {
        return Err(place.at(
            list.span(),
            "invariants: list at least one, or leave the key out for all".into(),
        ));
    }
    Ok(out)
}

/// The checked `[schedule]` sizes.
struct Shape {
    max_steps: u64,
    max_requests: u64,
    inputs: u64,
}

/// The `[schedule]` sizes, each positive and short enough to shrink well.
fn shape(place: &Place, schedule: &ScheduleShape) -> Result<Shape> {
    let max_steps = place.positive(&schedule.max_steps, "schedule.max_steps")?;
    let max_requests = place.positive(&schedule.max_requests, "schedule.max_requests")?;
    let inputs = place.positive(&schedule.inputs, "schedule.inputs")?;
    if max_steps > 64 || max_requests > 16 {
        return Err(place.whole(
            "schedule.max_steps <= 64 and schedule.max_requests <= 16 (longer cases shrink poorly)",
        ));
    }
    Ok(Shape {
        max_steps,
        max_requests,
        inputs,
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
