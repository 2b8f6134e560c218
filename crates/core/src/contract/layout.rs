//! Where a system keeps its leases and its cache in Redis, as patterns the wire checks match
//! keys against: `{key}` is the job's key, `{version}` a model version, `*` anything. racecert's
//! own contract is `{prefix}inference:lock:{key}` and `{prefix}inf:{version}:*`; a described
//! system gives its own.

use regex::Regex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

/// Lease and cache key patterns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyLayout {
    /// The lease key, with `{key}` (e.g. `lock:{key}`).
    pub lease: Option<String>,
    /// A cache key, with `{version}` (e.g. `cache:{version}:*`).
    pub cache: Option<String>,
}

/// A compiled [`KeyLayout`].
#[derive(Debug, Clone)]
pub struct KeyMatcher {
    lease: Option<Compiled>,
    cache: Option<Compiled>,
}

/// One compiled pattern: its literal head (everything before the first placeholder), matched as a
/// plain prefix, and the rest as a regex. The head is where a case's namespace goes, so the rest
/// is the same from case to case and is compiled once per process ([`compile_rest`]): every case
/// is judged through a matcher, and compiling two regexes per case cost about 4% of racecert's CPU
/// in the budgets bench.
#[derive(Debug, Clone)]
struct Compiled {
    head: String,
    rest: Regex,
}

impl Compiled {
    fn new(pattern: &str) -> Option<Compiled> {
        let placeholder = PLACEHOLDERS
            .iter()
            .filter_map(|(p, _)| pattern.find(p))
            .min()
            .unwrap_or(pattern.len());
        let (head, rest) = pattern.split_at(placeholder);
        Some(Compiled {
            head: head.to_owned(),
            rest: compile_rest(rest)?,
        })
    }

    fn captures<'k>(&self, key: &'k str) -> Option<regex::Captures<'k>> {
        self.rest.captures(key.strip_prefix(self.head.as_str())?)
    }

    fn is_match(&self, key: &str) -> bool {
        key.strip_prefix(self.head.as_str())
            .is_some_and(|rest| self.rest.is_match(rest))
    }
}

/// The regex of a pattern's rest (after its literal head), from a process-wide cache: a regex is
/// cheap to clone and costly to compile. Bounded, in case a layout puts something unique to a case
/// after a placeholder.
fn compile_rest(rest: &str) -> Option<Regex> {
    const KEPT: usize = 256;
    static COMPILED: LazyLock<Mutex<HashMap<String, Option<Regex>>>> =
        LazyLock::new(Default::default);
    let mut compiled = COMPILED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(regex) = compiled.get(rest) {
        return regex.clone();
    }
    if compiled.len() >= KEPT {
        compiled.clear();
    }
    let regex = compile(rest);
    compiled.insert(rest.to_owned(), regex.clone());
    regex
}

/// A pattern's placeholders and the regex each stands for.
const PLACEHOLDERS: [(&str, &str); 3] = [
    ("{key}", "(?P<key>.+)"),
    ("{version}", "(?P<version>[^:{}]+)"),
    ("*", ".*"),
];

fn compile(pattern: &str) -> Option<Regex> {
    let mut regex = String::from("^");
    let mut rest = pattern;
    'next: while !rest.is_empty() {
        for (placeholder, stands_for) in PLACEHOLDERS {
            if let Some(after) = rest.strip_prefix(placeholder) {
                regex.push_str(stands_for);
                rest = after;
                continue 'next;
            }
        }
        let next = rest.chars().next().expect("not empty");
        regex.push_str(&regex::escape(&next.to_string()));
        rest = &rest[next.len_utf8()..];
    }
    regex.push('$');
    Regex::new(&regex).ok()
}

impl KeyLayout {
    /// racecert's contract under `prefix` (a case's namespace, or empty).
    pub fn contract(prefix: &str) -> KeyLayout {
        KeyLayout {
            lease: Some(format!("{prefix}inference:lock:{{key}}")),
            cache: Some(format!("{prefix}inf:{{version}}:*")),
        }
    }

    /// The patterns, compiled.
    pub fn matcher(&self) -> KeyMatcher {
        KeyMatcher {
            lease: self.lease.as_deref().and_then(Compiled::new),
            cache: self.cache.as_deref().and_then(Compiled::new),
        }
    }
}

impl KeyMatcher {
    /// Whether `key` is a lease key.
    pub fn is_lease(&self, key: &str) -> bool {
        self.lease.as_ref().is_some_and(|r| r.is_match(key))
    }

    /// The job key of a lease key.
    pub fn lease_of(&self, key: &str) -> Option<String> {
        let captures = self.lease.as_ref()?.captures(key)?;
        Some(captures.name("key")?.as_str().to_owned())
    }

    /// Whether `key` is a cache key of the layout (with or without a version in it).
    pub fn is_cache(&self, key: &str) -> bool {
        self.cache.as_ref().is_some_and(|r| r.is_match(key))
    }

    /// The model version whose namespace a cache key is in (None: not a cache key of the
    /// pattern, e.g. a key without a version).
    pub fn cache_version(&self, key: &str) -> Option<String> {
        let captures = self.cache.as_ref()?.captures(key)?;
        Some(captures.name("version")?.as_str().to_owned())
    }

    /// Whether the layout knows any cache keys.
    pub fn has_cache(&self) -> bool {
        self.cache.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_find_lease_keys_and_cache_versions() {
        let keys = crate::contract::Keys::namespaced("r1x0c4");
        let matcher = KeyLayout::contract(keys.prefix()).matcher();
        let lease = keys.lease("r1x0c4:idem-abc");
        assert!(matcher.is_lease(&lease));
        assert_eq!(matcher.lease_of(&lease).as_deref(), Some("r1x0c4:idem-abc"));
        assert_eq!(
            matcher.cache_version(&keys.cache("v2", "hello")).as_deref(),
            Some("v2")
        );
        // An unversioned key is not in any version's namespace.
        assert_eq!(matcher.cache_version("r1x0c4:inf:0123abcd"), None);
        let custom = KeyLayout {
            lease: Some("lock:{key}".into()),
            cache: Some("cache:{version}:*".into()),
        }
        .matcher();
        assert_eq!(custom.lease_of("lock:req-1").as_deref(), Some("req-1"));
        assert_eq!(custom.cache_version("cache:v1:x").as_deref(), Some("v1"));
        assert!(!custom.is_lease("lockx:req-1"));
    }

    #[test]
    fn matchers_of_other_namespaces_match_only_their_own_keys() {
        let (one, two) = (
            crate::contract::Keys::namespaced("r1x0c4"),
            crate::contract::Keys::namespaced("r1x0c5"),
        );
        let (first, second) = (
            KeyLayout::contract(one.prefix()).matcher(),
            KeyLayout::contract(two.prefix()).matcher(),
        );
        let lease = one.lease("r1x0c4:idem-abc");
        assert!(first.is_lease(&lease));
        assert!(!second.is_lease(&lease));
        assert_eq!(second.cache_version(&one.cache("v2", "hello")), None);
        assert_eq!(
            second.cache_version(&two.cache("v2", "hello")).as_deref(),
            Some("v2")
        );
        // A pattern without placeholders is matched whole, not as a prefix.
        let fixed = KeyLayout {
            lease: Some("the-lock".into()),
            cache: None,
        }
        .matcher();
        assert!(fixed.is_lease("the-lock"));
        assert!(!fixed.is_lease("the-lock2"));
        assert!(!fixed.has_cache());
    }
}
