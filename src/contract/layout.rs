//! Where a system keeps its leases and its cache in Redis, as patterns the wire checks match
//! keys against: `{key}` is the job's key, `{version}` a model version, `*` anything. racecert's
//! own contract is `{prefix}inference:lock:{key}` and `{prefix}inf:{version}:*`; a described
//! system gives its own.

use regex::Regex;
use serde::{Deserialize, Serialize};

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
    lease: Option<Regex>,
    cache: Option<Regex>,
}

fn compile(pattern: &str) -> Option<Regex> {
    let mut regex = String::from("^");
    let mut rest = pattern;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("{key}") {
            regex.push_str("(?P<key>.+)");
            rest = after;
        } else if let Some(after) = rest.strip_prefix("{version}") {
            regex.push_str("(?P<version>[^:{}]+)");
            rest = after;
        } else if let Some(after) = rest.strip_prefix('*') {
            regex.push_str(".*");
            rest = after;
        } else {
            let next = rest.chars().next().expect("not empty");
            regex.push_str(&regex::escape(&next.to_string()));
            rest = &rest[next.len_utf8()..];
        }
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
            lease: self.lease.as_deref().and_then(compile),
            cache: self.cache.as_deref().and_then(compile),
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
}
