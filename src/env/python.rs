//! Python environments for workers written in Python (the contract's example worker, a team's
//! Celery app): a virtual environment created from a requirements file on first use and reused
//! while the file is unchanged, so `cargo test` and `racecert certify --system` provision what they
//! need on a fresh machine with nothing but `python3`.
//!
//! Environments live in a cache directory keyed by the requirements' hash
//! (`$RACECERT_VENV_DIR`, else `$XDG_CACHE_HOME/racecert/venvs`, else `~/.cache/racecert/venvs`):
//! a fresh clone on the same machine reuses them, and two processes creating the same one take
//! turns on a lock file. An environment is built in place (a virtual environment's scripts name
//! their interpreter by absolute path, so one built elsewhere and renamed cannot run them) and
//! marked complete last, so a half-built one is never used: it is removed and built again.

use crate::{Error, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A ready virtual environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Venv {
    dir: PathBuf,
}

impl Venv {
    /// The environment of `requirements` (a pip requirements file), created if missing.
    pub fn ensure(requirements: &Path) -> Result<Venv> {
        let text =
            std::fs::read_to_string(requirements).map_err(|err| Error::io_at(requirements, err))?;
        let key = &crate::contract::sha256_hex(&text)[..16];
        let root = cache_root()?;
        std::fs::create_dir_all(&root).map_err(|err| Error::io_at(&root, err))?;
        let dir = root.join(key);
        let venv = Venv { dir: dir.clone() };
        if venv.complete() {
            return Ok(venv);
        }
        let lock_path = root.join(format!("{key}.lock"));
        let lock =
            std::fs::File::create(&lock_path).map_err(|err| Error::io_at(&lock_path, err))?;
        lock.lock().map_err(|err| Error::io_at(&lock_path, err))?;
        // Someone else may have built it while we waited for the lock.
        if venv.complete() {
            return Ok(venv);
        }
        // Half built (an interrupted build, or one from before the marker): start over.
        let _ = std::fs::remove_dir_all(&dir);
        tracing::info!(requirements = %requirements.display(), venv = %dir.display(), "creating a Python environment");
        build(&dir, requirements).inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&dir);
        })?;
        let marker = dir.join(COMPLETE);
        std::fs::write(&marker, text).map_err(|err| Error::io_at(&marker, err))?;
        Ok(venv)
    }

    /// Built to the end (the marker is written last).
    fn complete(&self) -> bool {
        self.dir.join(COMPLETE).is_file() && self.python().is_file()
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its interpreter.
    pub fn python(&self) -> PathBuf {
        self.bin("python")
    }

    /// A program it installed (`celery`, `pip`, ...).
    pub fn bin(&self, name: &str) -> PathBuf {
        self.dir.join("bin").join(name)
    }
}

/// Written once the environment is fully installed; holds the requirements it was built from.
const COMPLETE: &str = ".racecert-complete";

fn cache_root() -> Result<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var("RACECERT_VENV_DIR") {
        return Ok(PathBuf::from(dir));
    }
    if let Some(cache) = var("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(cache).join("racecert").join("venvs"));
    }
    let home = var("HOME").ok_or_else(|| {
        Error::Config("neither RACECERT_VENV_DIR, XDG_CACHE_HOME nor HOME is set".into())
    })?;
    Ok(PathBuf::from(home)
        .join(".cache")
        .join("racecert")
        .join("venvs"))
}

fn run(command: &mut Command, what: &str) -> Result<()> {
    let output = command
        .output()
        .map_err(|err| Error::io(what.to_owned(), err))?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(15).collect();
    Err(Error::other(format!(
        "{what} failed ({}):\n{}",
        output.status,
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    )))
}

/// Creates the environment in `dir` and installs `requirements` into it. A Python without
/// `ensurepip` (Debian's, without python3-venv) gets an environment without pip, which the
/// system's pip then installs into (`pip --python`).
fn build(dir: &Path, requirements: &Path) -> Result<()> {
    let created = run(
        Command::new("python3").arg("-m").arg("venv").arg(dir),
        "python3 -m venv",
    );
    let pip_inside = match created {
        Ok(()) => true,
        Err(first) => {
            let _ = std::fs::remove_dir_all(dir);
            run(
                Command::new("python3")
                    .args(["-m", "venv", "--without-pip"])
                    .arg(dir),
                "python3 -m venv --without-pip",
            )
            .map_err(|_| {
                Error::Config(format!(
                    "cannot create a Python virtual environment (is python3 installed?): {first}"
                ))
            })?;
            false
        }
    };
    let mut install = if pip_inside {
        let mut command = Command::new(dir.join("bin").join("python"));
        command.args(["-m", "pip"]);
        command
    } else {
        let mut command = Command::new("python3");
        command
            .args(["-m", "pip", "--python"])
            .arg(dir.join("bin").join("python"));
        command
    };
    install
        .args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-input",
            "-r",
        ])
        .arg(requirements);
    run(
        &mut install,
        &format!("pip install -r {}", requirements.display()),
    )
}
