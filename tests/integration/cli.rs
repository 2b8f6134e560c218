//! The `racecert` binary as a person uses it: `certify` with a defect fails naming the invariant,
//! `run` with the printed seed and case reproduces the violation, the HTML report renders in a
//! real headless browser with its sequence diagram, and malformed suites are refused before
//! anything runs.

use anyhow::Context;
use racecert::env::TestBed;
use racecert::report::Report;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

crate::tests!(
    certify_with_a_defect_fails_and_run_reproduces_it_and_the_html_renders,
    malformed_suites_are_refused_with_file_line_and_column,
);

fn racecert(args: &[&str]) -> std::io::Result<Output> {
    Command::new(env!("CARGO_BIN_EXE_racecert"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("REDIS_URL")
        .env_remove("DATABASE_URL")
        .env_remove("TOXIPROXY_URL")
        .output()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("racecert-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

async fn certify_with_a_defect_fails_and_run_reproduces_it_and_the_html_renders(
    bed: &TestBed,
) -> anyhow::Result<()> {
    // The binary starts a test bed of its own; ours only needs to stay out of the way.
    let _shared = bed.shared().await;
    let out = scratch("certify");
    let out_str = out.display().to_string();
    let certify = tokio::task::spawn_blocking(move || {
        racecert(&[
            "certify",
            "--suite",
            "suites/lease-expiry.toml",
            "--defect",
            "unfenced-final-write",
            "--out",
            &out_str,
        ])
    })
    .await??;
    let stdout = String::from_utf8_lossy(&certify.stdout);
    anyhow::ensure!(
        certify.status.code() == Some(1),
        "certify with a defect must exit 1, got {:?}\n{stdout}\n{}",
        certify.status,
        String::from_utf8_lossy(&certify.stderr)
    );
    // The unfenced write breaks two invariants at once (two final writes, the second by a
    // worker whose lease was taken over); whichever the search reaches first is named.
    let invariant = ["at-most-one-final-write", "no-non-owner-final-write"]
        .into_iter()
        .find(|name| stdout.contains(&format!("violated {name}")))
        .ok_or_else(|| anyhow::anyhow!("the summary must name the invariant:\n{stdout}"))?;

    let report = Report::read(&out.join("report.json"))?;
    let found = report.suites[0]
        .counterexample
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("no counterexample in report.json"))?;
    let junit = std::fs::read_to_string(out.join("junit.xml"))?;
    anyhow::ensure!(junit.contains("<failure") && junit.contains(invariant));

    // The replay command from the report reproduces the same violation.
    let replay: Vec<String> = found
        .replay
        .split_whitespace()
        .skip(1)
        .map(str::to_owned)
        .collect();
    let run = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = replay.iter().map(String::as_str).collect();
        racecert(&args)
    })
    .await??;
    let run_out = String::from_utf8_lossy(&run.stdout);
    anyhow::ensure!(
        run.status.code() == Some(1)
            && run_out.contains(&format!("invariant {invariant} violated")),
        "`{}` did not reproduce the violation:\n{run_out}",
        found.replay
    );

    check_html_in_chromium(&out.join("report.html")).await
}

/// Loads the report in a real chromium, headless: the DOM must hold the sequence diagram with
/// its lanes and the violating write, and a screenshot must come out.
async fn check_html_in_chromium(html: &Path) -> anyhow::Result<()> {
    // On PATH, or Debian's, fetched and unpacked by the test (nothing installed by hand).
    let chromium = tokio::task::spawn_blocking(crate::browser::chromium).await??;
    let url = format!("file://{}", html.display());
    let screenshot = html.with_file_name("report.png");
    let (dom, shot) = {
        let (url, screenshot) = (url.clone(), screenshot.clone());
        tokio::task::spawn_blocking(move || -> anyhow::Result<(Output, Output)> {
            let common = [
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
            ];
            let dom = chromium
                .command()
                .args(common)
                .arg("--dump-dom")
                .arg(&url)
                .output()
                .with_context(|| format!("run {}", chromium.program().display()))?;
            let shot = chromium
                .command()
                .args(common)
                .arg(format!("--screenshot={}", screenshot.display()))
                .arg("--window-size=1400,1600")
                .arg(&url)
                .output()
                .with_context(|| format!("run {}", chromium.program().display()))?;
            Ok((dom, shot))
        })
        .await??
    };
    let dom = String::from_utf8_lossy(&dom.stdout);
    for needle in [
        "class=\"sequence-diagram\"",
        "worker-a (v1)",
        "worker-c (v2)",
        "Postgres",
        "class=\"violation\"",
        "class=\"fault\"",
    ] {
        anyhow::ensure!(dom.contains(needle), "rendered DOM lacks {needle:?}");
    }
    let size = std::fs::metadata(&screenshot).map(|m| m.len()).unwrap_or(0);
    anyhow::ensure!(
        size > 10_000,
        "screenshot {} is {size} bytes: {}",
        screenshot.display(),
        String::from_utf8_lossy(&shot.stderr)
    );
    Ok(())
}

async fn malformed_suites_are_refused_with_file_line_and_column(
    _bed: &TestBed,
) -> anyhow::Result<()> {
    let dir = scratch("suites");
    let good = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("suites/lease-expiry.toml"),
    )?;
    let cases = [
        (
            "syntax.toml",
            good.replace("seed = 1", "seed = = 1"),
            "syntax.toml:4:",
        ),
        (
            "unknown.toml",
            good.replace("seed = 1", "seed = 1\nretries = 3"),
            "unknown.toml:5:1",
        ),
        (
            "negative.toml",
            good.replace("lease_ttl_ms = 60000", "lease_ttl_ms = -1"),
            "must be a positive number",
        ),
    ];
    for (name, text, expected) in cases {
        let path = dir.join(name);
        std::fs::write(&path, text)?;
        let path_str = path.display().to_string();
        // A good suite next to the bad one: nothing may run.
        let output = tokio::task::spawn_blocking(move || {
            racecert(&[
                "certify",
                "--suite",
                "suites/lease-expiry.toml",
                "--suite",
                &path_str,
            ])
        })
        .await??;
        let stderr = String::from_utf8_lossy(&output.stderr);
        let stdout = String::from_utf8_lossy(&output.stdout);
        anyhow::ensure!(
            !output.status.success() && stderr.contains(expected),
            "{name}: expected an error containing {expected:?}, got {:?}\nstderr: {stderr}",
            output.status
        );
        anyhow::ensure!(
            !stdout.contains("bringing the test bed up"),
            "{name}: certify started before refusing the suite"
        );
    }
    Ok(())
}
