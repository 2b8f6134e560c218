//! Bad input, end to end: one test per row of `docs/errors.md`. Each runs the binary as a person
//! would, and checks that the message names the place (file:line:column, the flag, the command
//! and what it printed, the database) and that nothing was half done: exit code 2, no report file
//! written, no container of the run left.

use racecert::env::{TestBed, reaper};
use sqlx::Connection;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

crate::tests!(
    a_missing_suite_file_is_named,
    a_bad_suite_file_is_refused_at_its_line_and_column,
    a_bad_schedule_file_is_refused_at_its_line_and_column,
    a_missing_log_file_is_named,
    a_log_with_no_inference_request_says_so,
    bad_flags_are_refused_naming_the_flag,
    a_worker_command_that_exits_at_once_is_reported_with_its_stderr,
    a_database_not_marked_for_tests_is_refused_untouched,
);

/// What a run left behind.
struct Ran {
    output: Output,
    out_dir: PathBuf,
    pid: u32,
}

impl Ran {
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    /// The error names every needle; nothing was half done.
    fn refused(&self, row: &str, needles: &[&str]) -> anyhow::Result<()> {
        let stderr = self.stderr();
        anyhow::ensure!(
            self.output.status.code() == Some(2),
            "{row}: expected exit code 2, got {:?}\nstdout: {}\nstderr: {stderr}",
            self.output.status,
            String::from_utf8_lossy(&self.output.stdout)
        );
        for needle in needles {
            anyhow::ensure!(
                stderr.contains(needle),
                "{row}: the message lacks {needle:?}:\n{stderr}"
            );
        }
        let written: Vec<_> = std::fs::read_dir(&self.out_dir)
            .map(|entries| entries.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        anyhow::ensure!(
            written.is_empty(),
            "{row}: files written by a refused run: {written:?}"
        );
        let left: Vec<_> = reaper::list_managed()?
            .into_iter()
            .filter(|c| c.owner.pid == self.pid)
            .collect();
        anyhow::ensure!(left.is_empty(), "{row}: containers left: {left:?}");
        Ok(())
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("racecert-errors-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Runs racecert with `args`; `{out}` in an argument is replaced by a fresh output directory.
async fn racecert(name: &str, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Ran> {
    let out_dir = scratch(&format!("{name}-run")).join("out");
    std::fs::create_dir_all(&out_dir)?;
    let out = out_dir.display().to_string();
    let args: Vec<String> = args.iter().map(|a| a.replace("{out}", &out)).collect();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    tokio::task::spawn_blocking(move || -> anyhow::Result<Ran> {
        let mut command = Command::new(env!("CARGO_BIN_EXE_racecert"));
        command
            .args(&args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env_remove("REDIS_URL")
            .env_remove("DATABASE_URL")
            .env_remove("TOXIPROXY_URL")
            .envs(env);
        let child = command
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        let pid = child.id();
        let output = child.wait_with_output()?;
        Ok(Ran {
            output,
            out_dir,
            pid,
        })
    })
    .await?
}

fn write(dir: &Path, name: &str, text: &str) -> anyhow::Result<String> {
    let path = dir.join(name);
    std::fs::write(&path, text)?;
    Ok(path.display().to_string())
}

async fn a_missing_suite_file_is_named(_bed: &TestBed) -> anyhow::Result<()> {
    racecert(
        "missing-suite",
        &[
            "certify",
            "--suite",
            "suites/no-such-suite.toml",
            "--out",
            "{out}",
        ],
        &[],
    )
    .await?
    .refused(
        "missing suite file",
        &["suites/no-such-suite.toml", "No such file"],
    )
}

async fn a_bad_suite_file_is_refused_at_its_line_and_column(_bed: &TestBed) -> anyhow::Result<()> {
    let dir = scratch("bad-suite");
    let good = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("suites/lease-expiry.toml"),
    )?;
    let bad = write(
        &dir,
        "typo.toml",
        &good.replace("seed = 1\n", "seed = 1\ncasees = 3\n"),
    )?;
    // A good suite beside it: nothing may run, not even that one.
    racecert(
        "bad-suite",
        &[
            "certify",
            "--suite",
            "suites/lease-expiry.toml",
            "--suite",
            &bad,
            "--out",
            "{out}",
        ],
        &[],
    )
    .await?
    .refused("bad suite file", &[&format!("{bad}:5:1"), "casees"])
}

async fn a_bad_schedule_file_is_refused_at_its_line_and_column(
    _bed: &TestBed,
) -> anyhow::Result<()> {
    let dir = scratch("bad-schedule");
    let bad = write(
        &dir,
        "case.json",
        "{\n  \"format\": \"racecert-schedule/2\",\n  \"runner\": oops\n}\n",
    )?;
    racecert("bad-schedule", &["run", "--schedule", &bad], &[])
        .await?
        .refused(
            "bad schedule file",
            &[&format!("{bad}:3:"), "not a schedule file"],
        )
}

async fn a_missing_log_file_is_named(_bed: &TestBed) -> anyhow::Result<()> {
    racecert("missing-log", &["replay", "no-such-incident.log"], &[])
        .await?
        .refused(
            "missing log file",
            &["no-such-incident.log", "No such file"],
        )
}

async fn a_log_with_no_inference_request_says_so(_bed: &TestBed) -> anyhow::Result<()> {
    let dir = scratch("empty-log");
    let log = write(
        &dir,
        "app.log",
        "starting web server on :8080\nGET /healthz 200\n\u{0}\u{1}binary junk\n",
    )?;
    racecert("empty-log", &["replay", &log], &[])
        .await?
        .refused("log without requests", &[&log, "nothing to replay"])
}

async fn bad_flags_are_refused_naming_the_flag(_bed: &TestBed) -> anyhow::Result<()> {
    let rows: [(&[&str], &[&str]); 7] = [
        (&["certify", "--cases", "0"], &["--cases"]),
        (&["certify", "--shard", "3/2"], &["--shard", "3/2"]),
        (&["certify", "--concurrency", "0"], &["--concurrency"]),
        (
            &["certify", "--defect", "no-such-defect"],
            &["--defect", "no-such-defect", "unfenced-final-write"],
        ),
        (
            &[
                "certify",
                "--worker-cmd",
                "racecert worker",
                "--suite",
                "x.toml",
            ],
            &["--worker-cmd", "--suite"],
        ),
        (&["run", "full-rollout", "--case", "x"], &["--case", "'x'"]),
        (
            &["replay", "x.log", "--field", "request=ctx.rid"],
            &["--field", "request=ctx.rid", "request_id"],
        ),
    ];
    for (index, (args, needles)) in rows.into_iter().enumerate() {
        let mut args = args.to_vec();
        if args[0] == "certify" {
            args.extend(["--out", "{out}"]);
        }
        racecert(&format!("flags-{index}"), &args, &[])
            .await?
            .refused(&format!("racecert {}", args.join(" ")), needles)?;
    }
    Ok(())
}

async fn a_worker_command_that_exits_at_once_is_reported_with_its_stderr(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let command = "sh -c 'echo cannot reach the queue >&2; exit 3'";
    racecert(
        "worker-exits",
        &["certify", "--worker-cmd", command, "--out", "{out}"],
        &[],
    )
    .await?
    .refused(
        "worker command that exits at once",
        &[
            command,
            "exited at once",
            "exit status: 3",
            "cannot reach the queue",
        ],
    )
}

async fn a_database_not_marked_for_tests_is_refused_untouched(bed: &TestBed) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let name = crate::namespace("unmarked").replace('-', "_");
    let mut admin = sqlx::PgConnection::connect(&bed.database_direct_url()).await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await?;
    let mut url = reqwest::Url::parse(&bed.database_direct_url())?;
    url.set_path(&format!("/{name}"));
    let redis = bed.redis_direct_url();
    let ran = racecert(
        "unmarked",
        &[
            "certify",
            "--suite",
            "suites/lease-expiry.toml",
            "--out",
            "{out}",
        ],
        &[
            ("REDIS_URL", redis.as_str()),
            ("DATABASE_URL", url.as_str()),
        ],
    )
    .await?;
    let refused = ran.refused(
        "database not marked for tests",
        &[&name, "not marked for tests", "COMMENT ON DATABASE"],
    );
    let mut target = sqlx::PgConnection::connect(url.as_str()).await?;
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')",
    )
    .fetch_one(&mut target)
    .await?;
    target.close().await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP DATABASE {name}")))
        .execute(&mut admin)
        .await?;
    refused?;
    anyhow::ensure!(tables == 0, "the refused run created {tables} table(s)");
    Ok(())
}
