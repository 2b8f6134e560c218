//! A real headless browser for the HTML report test, provisioned by the test itself so that
//! `cargo test` needs nothing installed by hand: a chromium on PATH if there is one, else Debian's
//! chromium packages fetched with `apt-get download` (with every library they need that the
//! machine lacks), unpacked with `dpkg -x` into a cache directory and run with `LD_LIBRARY_PATH`.
//! No root needed. The unpacked browser lives in `$RACECERT_BROWSER_DIR`, else
//! `$XDG_CACHE_HOME/racecert/browsers`, else `~/.cache/racecert/browsers`, one directory per
//! package version; it is built aside and renamed into place, so a half-unpacked one is never
//! used, and two test processes take turns on a lock file.

use anyhow::{Context, bail};
use std::collections::{BTreeSet, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A chromium that runs: its program and the environment it needs.
#[derive(Debug, Clone)]
pub struct Chromium {
    program: PathBuf,
    library_path: Option<String>,
}

impl Chromium {
    /// A command running this browser.
    pub fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        if let Some(path) = &self.library_path {
            command.env("LD_LIBRARY_PATH", path);
        }
        command
    }

    /// Where it comes from, for messages.
    pub fn program(&self) -> &Path {
        &self.program
    }
}

/// A chromium on PATH, else Debian's, provisioned into the cache.
pub fn chromium() -> anyhow::Result<Chromium> {
    for name in ["chromium", "chromium-browser"] {
        let found = Chromium {
            program: PathBuf::from(name),
            library_path: None,
        };
        if runs(&found) {
            return Ok(found);
        }
    }
    provision().context(
        "no chromium on PATH, and Debian's chromium could not be provisioned with apt-get download",
    )
}

fn runs(browser: &Chromium) -> bool {
    browser
        .command()
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn cache_root() -> anyhow::Result<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var("RACECERT_BROWSER_DIR") {
        return Ok(PathBuf::from(dir));
    }
    if let Some(cache) = var("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(cache).join("racecert/browsers"));
    }
    let home =
        var("HOME").context("neither RACECERT_BROWSER_DIR, XDG_CACHE_HOME nor HOME is set")?;
    Ok(PathBuf::from(home).join(".cache/racecert/browsers"))
}

fn output(command: &mut Command) -> anyhow::Result<String> {
    let shown = format!("{command:?}");
    let out = command
        .output()
        .with_context(|| format!("cannot run {shown}"))?;
    if !out.status.success() {
        bail!(
            "{shown} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// apt with the machine's package lists, or with lists of our own (fetched without root when the
/// machine has none: a fresh machine before its first `apt-get update`).
struct Apt {
    options: Vec<String>,
}

impl Apt {
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command.args(&self.options);
        command
    }

    /// The candidate version of `package`, if these lists know it.
    fn candidate(&self, package: &str) -> Option<String> {
        let policy = output(self.command("apt-cache").args(["policy", package])).ok()?;
        policy
            .lines()
            .find_map(|l| l.trim().strip_prefix("Candidate:"))
            .map(str::trim)
            .filter(|v| !v.is_empty() && *v != "(none)")
            .map(str::to_owned)
    }

    /// Package lists of our own under `dir`, fetched from the sources the machine's apt uses.
    fn private(dir: &Path) -> anyhow::Result<Apt> {
        let lists = dir.join("lists");
        let cache = dir.join("cache");
        std::fs::create_dir_all(lists.join("partial"))?;
        std::fs::create_dir_all(cache.join("archives/partial"))?;
        let apt = Apt {
            options: vec![
                "-o".into(),
                format!("Dir::State::Lists={}", lists.display()),
                "-o".into(),
                format!("Dir::Cache={}", cache.display()),
                "-o".into(),
                "Debug::NoLocking=1".into(),
            ],
        };
        output(apt.command("apt-get").args(["-q", "update"]))?;
        Ok(apt)
    }
}

fn provision() -> anyhow::Result<Chromium> {
    let root = cache_root()?;
    std::fs::create_dir_all(&root).with_context(|| format!("create {}", root.display()))?;
    let mut apt = Apt {
        options: Vec::new(),
    };
    let version = match apt.candidate("chromium") {
        Some(version) => version,
        None => {
            apt = Apt::private(&root.join("apt"))?;
            apt.candidate("chromium")
                .context("the package lists know no chromium package")?
        }
    };
    let safe: String = version
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let dir = root.join(format!("chromium-{safe}"));
    if let Some(found) = ready(&dir) {
        return Ok(found);
    }
    let lock_path = root.join(format!("chromium-{safe}.lock"));
    let lock = std::fs::File::create(&lock_path)
        .with_context(|| format!("create {}", lock_path.display()))?;
    lock.lock()
        .with_context(|| format!("lock {}", lock_path.display()))?;
    // Another test process may have unpacked it while we waited.
    if let Some(found) = ready(&dir) {
        return Ok(found);
    }
    let scratch = root.join(format!("chromium-{safe}.building-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let built = unpack(&apt, &scratch);
    if let Err(err) = built {
        let _ = std::fs::remove_dir_all(&scratch);
        return Err(err);
    }
    std::fs::rename(&scratch, &dir).with_context(|| format!("rename into {}", dir.display()))?;
    ready(&dir).with_context(|| format!("the browser unpacked in {} does not run", dir.display()))
}

/// The browser unpacked in `dir`, if it is complete and runs.
fn ready(dir: &Path) -> Option<Chromium> {
    let root = dir.join("root");
    let program = root.join("usr/lib/chromium/chromium");
    if !program.is_file() {
        return None;
    }
    let browser = Chromium {
        program,
        library_path: Some(library_path(&root)),
    };
    runs(&browser).then_some(browser)
}

/// Every directory of the unpacked tree that holds shared libraries (the multiarch directories
/// and the few plugin directories such as pulseaudio's), chromium's own excepted: it finds those
/// itself.
fn library_path(root: &Path) -> String {
    let mut dirs = BTreeSet::new();
    let mut stack = vec![root.join("usr/lib"), root.join("lib")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() && !path.ends_with("chromium") {
                stack.push(path);
            } else if entry.file_name().to_string_lossy().contains(".so") {
                dirs.insert(dir.clone());
            }
        }
    }
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(":")
}

/// Downloads chromium and the packages it needs that are not installed, and unpacks them in
/// `scratch/root`.
fn unpack(apt: &Apt, scratch: &Path) -> anyhow::Result<()> {
    let debs = scratch.join("debs");
    let root = scratch.join("root");
    std::fs::create_dir_all(&debs)?;
    std::fs::create_dir_all(&root)?;
    let packages = closure(apt, "chromium")?;
    eprintln!(
        "provisioning chromium for the browser test: {} Debian package(s) into {}",
        packages.len(),
        scratch.display()
    );
    output(
        apt.command("apt-get")
            .arg("download")
            .args(&packages)
            .current_dir(&debs),
    )?;
    for entry in std::fs::read_dir(&debs)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "deb") {
            output(Command::new("dpkg").arg("-x").arg(&path).arg(&root))?;
        }
    }
    std::fs::remove_dir_all(&debs)?;
    Ok(())
}

/// `package` and, transitively, what it depends on (the first choice of each alternative, a
/// provider for a virtual package), less what is installed already.
fn closure(apt: &Apt, package: &str) -> anyhow::Result<Vec<String>> {
    let installed: HashSet<String> =
        output(Command::new("dpkg-query").args(["-W", "-f", "${Package} ${Status}\\n"]))?
            .lines()
            .filter(|l| l.ends_with(" installed"))
            .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
            .collect();
    let mut seen = HashSet::new();
    let mut needed = Vec::new();
    let mut queue = VecDeque::from([package.to_owned()]);
    while !queue.is_empty() {
        // One apt-cache call per level of the graph: each call loads the whole cache.
        let level: Vec<String> = queue
            .drain(..)
            .filter(|p| !installed.contains(p) && seen.insert(p.clone()))
            .collect();
        if level.is_empty() {
            break;
        }
        needed.extend(level.iter().cloned());
        let text = output(
            apt.command("apt-cache")
                .args([
                    "depends",
                    "--no-recommends",
                    "--no-suggests",
                    "--no-conflicts",
                    "--no-breaks",
                    "--no-replaces",
                    "--no-enhances",
                ])
                .args(&level),
        )?;
        queue.extend(first_choices(&text, &installed));
    }
    Ok(needed)
}

/// From `apt-cache depends` output, the package to fetch for each dependency: an alternative
/// group (`|Depends:` lines, then a plain one) is satisfied by any installed member, else by its
/// first real package; a virtual package (`<name>`) by one of its providers (the deeper-indented
/// lines under it).
fn first_choices(text: &str, installed: &HashSet<String>) -> Vec<String> {
    // Each group: its members, each (name, providers if virtual).
    let mut groups: Vec<Vec<(String, Vec<String>)>> = Vec::new();
    let mut open = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if indent == 0 {
            open = false;
            continue;
        }
        if let Some((kind, name)) = trimmed.split_once(": ") {
            if !matches!(kind, "Depends" | "|Depends" | "PreDepends" | "|PreDepends") {
                open = false;
                continue;
            }
            let name = name.split(':').next().unwrap_or(name).to_owned();
            if !open {
                groups.push(Vec::new());
            }
            if let Some(group) = groups.last_mut() {
                group.push((name, Vec::new()));
            }
            open = kind.starts_with('|');
        } else if indent >= 4 {
            // A provider of the virtual package just named.
            if let Some((_, providers)) = groups.last_mut().and_then(|g| g.last_mut()) {
                providers.push(trimmed.split(':').next().unwrap_or(trimmed).to_owned());
            }
        }
    }
    let mut choices = Vec::new();
    for group in groups {
        let real = |name: &str| !name.starts_with('<');
        let satisfied = group.iter().any(|(name, providers)| {
            installed.contains(name.trim_matches(|c| c == '<' || c == '>'))
                || providers.iter().any(|p| installed.contains(p))
        });
        if satisfied {
            continue;
        }
        let pick = group
            .iter()
            .find(|(name, _)| real(name))
            .map(|(name, _)| name.clone())
            .or_else(|| {
                group
                    .iter()
                    .find_map(|(_, providers)| providers.first().cloned())
            });
        choices.extend(pick);
    }
    choices
}
