//! `docs/ci.md` as it is written: its GitHub Actions workflow and GitLab CI file are parsed, and
//! the sharded `certify` commands they contain run here (with few cases), one per shard as the
//! matrix / `parallel:` would start them; the shard reports are laid out as each CI's artifacts
//! would be, the file's own merge command joins them, and the merged reports must cover every
//! shipped suite exactly once, with JUnit and HTML beside them. The image-cache commands of the
//! GitLab file (`images load`, `images save`) run too.

use racecert::env::TestBed;
use racecert::report::Report;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use yaml_rust2::{Yaml, YamlLoader};

crate::tests!(
    the_github_actions_matrix_in_docs_ci_runs_and_merges,
    the_gitlab_parallel_job_in_docs_ci_runs_and_merges,
);

/// Cases per suite in the local runs: the point is the sharding and the merge, not the search.
const CASES: &str = "2";

/// The YAML blocks of docs/ci.md, parsed, in order.
fn yaml_blocks() -> anyhow::Result<Vec<Yaml>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/ci.md");
    let text = std::fs::read_to_string(&path)?;
    let mut blocks = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((start, line)) = lines.next() {
        if line.trim() != "```yaml" {
            continue;
        }
        let body: Vec<&str> = lines
            .by_ref()
            .take_while(|(_, l)| l.trim() != "```")
            .map(|(_, l)| l)
            .collect();
        let mut docs = YamlLoader::load_from_str(&body.join("\n")).map_err(|err| {
            anyhow::anyhow!(
                "{}:{}: YAML error: {err}",
                path.display(),
                start + 2 + err.marker().line()
            )
        })?;
        anyhow::ensure!(docs.len() == 1, "one document per block");
        blocks.push(docs.remove(0));
    }
    anyhow::ensure!(
        blocks.len() == 2,
        "docs/ci.md must hold the GitHub and GitLab files"
    );
    Ok(blocks)
}

fn str_of<'a>(yaml: &'a Yaml, what: &str) -> anyhow::Result<&'a str> {
    yaml.as_str()
        .ok_or_else(|| anyhow::anyhow!("{what}: expected a string, got {yaml:?}"))
}

/// A scratch directory standing for a runner's checkout: the shipped suites are there.
fn checkout(name: &str) -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("racecert-ci-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    std::os::unix::fs::symlink(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("suites"),
        dir.join("suites"),
    )?;
    Ok(dir)
}

/// Runs one command line of a CI file in `dir` with `sh` (globs and variables as on a runner),
/// with `cargo run --release --` meaning the racecert binary under test. Returns the exit code
/// and output.
fn sh(dir: &Path, line: &str, env: &BTreeMap<&str, String>) -> anyhow::Result<(i32, String)> {
    anyhow::ensure!(
        line.starts_with("cargo run --release -- "),
        "unexpected command in docs/ci.md: {line}"
    );
    let line = line.replacen(
        "cargo run --release --",
        &format!("'{}'", env!("CARGO_BIN_EXE_racecert")),
        1,
    );
    let output = Command::new("sh")
        .arg("-c")
        .arg(&line)
        .current_dir(dir)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env_remove("REDIS_URL")
        .env_remove("DATABASE_URL")
        .env_remove("TOXIPROXY_URL")
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok((output.status.code().unwrap_or(-1), text))
}

/// Runs the shard commands at once, as the runners would; each must produce its reports (exit 0,
/// 1 or 4: a verdict, not an error; with a couple of cases a suite's faults rarely all land, and
/// the verdict says INCONCLUSIVE).
fn run_shards(dir: &Path, commands: Vec<String>) -> anyhow::Result<()> {
    let runs: Vec<_> = commands
        .into_iter()
        .map(|line| {
            let dir = dir.to_owned();
            std::thread::spawn(move || {
                let line = format!("{line} --cases {CASES}");
                sh(&dir, &line, &BTreeMap::new()).map(|out| (line, out))
            })
        })
        .collect();
    for run in runs {
        let (line, (code, text)) = run
            .join()
            .map_err(|_| anyhow::anyhow!("a shard thread panicked"))??;
        anyhow::ensure!(matches!(code, 0 | 1 | 4), "`{line}` exited {code}:\n{text}");
    }
    Ok(())
}

/// The merged reports in `out` cover every shipped suite exactly once.
fn check_merged(out: &Path, shards: usize) -> anyhow::Result<()> {
    let report = Report::read(&out.join("report.json"))?;
    let mut names: Vec<String> = report.suites.iter().map(|s| s.name.clone()).collect();
    let mut shipped: Vec<String> = racecert::suite::shipped()
        .into_iter()
        .map(|s| s.suite.name)
        .collect();
    names.sort();
    shipped.sort();
    anyhow::ensure!(
        names == shipped,
        "the merge of {shards} shards must hold every suite once: {names:?} vs {shipped:?}"
    );
    let short: Vec<String> = report
        .suites
        .iter()
        .filter(|s| s.cases_run == 0 || s.error.is_some())
        .map(|s| format!("{}: {} cases, error {:?}", s.name, s.cases_run, s.error))
        .collect();
    anyhow::ensure!(short.is_empty(), "suites that did not run: {short:?}");
    let junit = std::fs::read_to_string(out.join("junit.xml"))?;
    anyhow::ensure!(shipped.iter().all(|name| junit.contains(name.as_str())));
    anyhow::ensure!(std::fs::metadata(out.join("report.html"))?.len() > 1000);
    Ok(())
}

async fn the_github_actions_matrix_in_docs_ci_runs_and_merges(bed: &TestBed) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    tokio::task::spawn_blocking(|| -> anyhow::Result<()> {
        let workflow = yaml_blocks()?.remove(0);
        let certify = &workflow["jobs"]["certify"];
        let shards: Vec<i64> = certify["strategy"]["matrix"]["shard"]
            .as_vec()
            .ok_or_else(|| anyhow::anyhow!("jobs.certify.strategy.matrix.shard is not a list"))?
            .iter()
            .filter_map(Yaml::as_i64)
            .collect();
        anyhow::ensure!(shards.len() >= 2, "a matrix of shards: {shards:?}");
        let steps = certify["steps"]
            .as_vec()
            .ok_or_else(|| anyhow::anyhow!("jobs.certify.steps"))?;
        let run_with =
            |shard: i64, text: &str| text.replace("${{ matrix.shard }}", &shard.to_string());
        let shard_step = steps
            .iter()
            .find(|s| {
                s["run"]
                    .as_str()
                    .is_some_and(|r| r.contains("certify --shard"))
            })
            .ok_or_else(|| anyhow::anyhow!("no certify --shard step"))?;
        let upload = steps
            .iter()
            .find(|s| {
                s["uses"]
                    .as_str()
                    .is_some_and(|u| u.starts_with("actions/upload-artifact"))
            })
            .ok_or_else(|| anyhow::anyhow!("the certify job uploads no artifact"))?;
        let dir = checkout("github")?;
        let shard_run = str_of(&shard_step["run"], "run")?.trim();
        let commands: Vec<String> = shards.iter().map(|&s| run_with(s, shard_run)).collect();
        let total = shards.len();
        anyhow::ensure!(
            commands.iter().all(|l| l.contains(&format!("/{total} "))),
            "{shard_run}: the shard count must match the matrix ({total})"
        );
        run_shards(&dir, commands)?;

        // download-artifact with a pattern: each artifact in a directory of its name.
        let report_job = &workflow["jobs"]["report"];
        anyhow::ensure!(report_job["needs"].as_str() == Some("certify"));
        let report_steps = report_job["steps"]
            .as_vec()
            .ok_or_else(|| anyhow::anyhow!("jobs.report.steps"))?;
        let download = report_steps
            .iter()
            .find(|s| {
                s["uses"]
                    .as_str()
                    .is_some_and(|u| u.starts_with("actions/download-artifact"))
            })
            .ok_or_else(|| anyhow::anyhow!("the report job downloads no artifact"))?;
        let into = dir.join(str_of(&download["with"]["path"], "download path")?);
        for &shard in &shards {
            let name = run_with(shard, str_of(&upload["with"]["name"], "artifact name")?);
            let from = dir.join(run_with(
                shard,
                str_of(&upload["with"]["path"], "artifact path")?,
            ));
            let to = into.join(&name);
            std::fs::create_dir_all(&to)?;
            for entry in std::fs::read_dir(&from)? {
                let entry = entry?;
                if entry.path().is_file() {
                    std::fs::copy(entry.path(), to.join(entry.file_name()))?;
                }
            }
        }
        let merge = report_steps
            .iter()
            .filter_map(|s| s["run"].as_str())
            .find(|r| r.contains("report merge"))
            .ok_or_else(|| anyhow::anyhow!("no report merge step"))?;
        let (code, text) = sh(&dir, merge.trim(), &BTreeMap::new())?;
        anyhow::ensure!(
            matches!(code, 0 | 1 | 4),
            "`{merge}` exited {code}:\n{text}"
        );
        let junit_step = report_steps
            .iter()
            .find_map(|s| s["with"]["report_paths"].as_str())
            .ok_or_else(|| anyhow::anyhow!("no JUnit publishing step"))?;
        anyhow::ensure!(
            dir.join(junit_step).is_file(),
            "{junit_step} is not where the merge wrote"
        );
        check_merged(&dir.join("target/racecert/merged"), shards.len())
    })
    .await?
}

async fn the_gitlab_parallel_job_in_docs_ci_runs_and_merges(bed: &TestBed) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    tokio::task::spawn_blocking(|| -> anyhow::Result<()> {
        let file = yaml_blocks()?.remove(1);
        let certify = &file["certify"];
        let total = certify["parallel"]
            .as_i64()
            .ok_or_else(|| anyhow::anyhow!("certify.parallel is not a number"))?;
        anyhow::ensure!(total >= 2, "parallel: {total}");
        let script: Vec<&str> = certify["script"]
            .as_vec()
            .ok_or_else(|| anyhow::anyhow!("certify.script"))?
            .iter()
            .filter_map(Yaml::as_str)
            .collect();
        let dir = checkout("gitlab")?;
        let cache = str_of(&certify["cache"]["paths"][0], "cache path")?;
        // The image-cache lines, on a cold cache then a warm one: load finds nothing, save
        // writes the archives the cache keeps, load reads them back.
        for line in script.iter().filter(|l| l.contains(" images load ")) {
            let (code, text) = sh(&dir, line, &BTreeMap::new())?;
            anyhow::ensure!(
                code == 0 && text.contains("no image archives"),
                "`{line}`: {text}"
            );
        }
        for line in script.iter().filter(|l| l.contains(" images save ")) {
            let (code, text) = sh(&dir, line, &BTreeMap::new())?;
            anyhow::ensure!(code == 0, "`{line}` exited {code}: {text}");
        }
        let archives = std::fs::read_dir(dir.join(cache))?.count();
        anyhow::ensure!(archives >= 1, "images save wrote nothing into {cache}");
        for line in script.iter().filter(|l| l.contains(" images load ")) {
            let (code, text) = sh(&dir, line, &BTreeMap::new())?;
            anyhow::ensure!(code == 0 && text.contains("loaded "), "`{line}`: {text}");
        }
        let _ = std::fs::remove_dir_all(dir.join(cache));

        let shard_line = script
            .iter()
            .find(|l| l.contains("certify --shard"))
            .ok_or_else(|| anyhow::anyhow!("no certify --shard line"))?;
        run_shards(
            &dir,
            (1..=total)
                .map(|index| {
                    shard_line
                        .replace("$CI_NODE_INDEX", &index.to_string())
                        .replace("$CI_NODE_TOTAL", &total.to_string())
                })
                .collect(),
        )?;
        // Artifacts keep their paths: every shard's reports are where its job wrote them.
        for index in 1..=total {
            let junit = str_of(&certify["artifacts"]["reports"]["junit"], "junit report")?
                .replace("$CI_NODE_INDEX", &index.to_string());
            anyhow::ensure!(dir.join(&junit).is_file(), "shard {index}: no {junit}");
        }
        let report = &file["report"];
        anyhow::ensure!(report["needs"][0].as_str() == Some("certify"));
        let merge = report["script"]
            .as_vec()
            .into_iter()
            .flatten()
            .filter_map(Yaml::as_str)
            .find(|l| l.contains("report merge"))
            .ok_or_else(|| anyhow::anyhow!("no report merge line"))?;
        let (code, text) = sh(&dir, merge, &BTreeMap::new())?;
        anyhow::ensure!(
            matches!(code, 0 | 1 | 4),
            "`{merge}` exited {code}:\n{text}"
        );
        let junit = str_of(&report["artifacts"]["reports"]["junit"], "junit report")?;
        anyhow::ensure!(
            dir.join(junit).is_file(),
            "{junit} is not where the merge wrote"
        );
        check_merged(&dir.join("target/racecert/merged"), total as usize)
    })
    .await?
}
