//! Cache causes: a cache entry of one version served for another, keys that name no version, a
//! hit served before the invalidation that should have dropped it.

use super::*;

/// Every model version the log names.
pub(super) fn known_versions(reconstruction: &Reconstruction) -> Vec<String> {
    let mut versions: Vec<String> = Vec::new();
    let mut add = |v: Option<&String>| {
        if let Some(v) = v
            && !versions.contains(v)
        {
            versions.push(v.clone());
        }
    };
    for story in &reconstruction.requests {
        for attempt in &story.attempts {
            add(attempt.model_version.as_ref());
            for event in &attempt.events {
                add(event.served_version.as_ref());
            }
        }
    }
    for cutover in &reconstruction.cutovers {
        add(cutover.from.as_ref());
        add(cutover.to.as_ref());
    }
    versions
}

/// The model version a cache key names: a `:`, `/` or `|` separated part that is a version the
/// log names, or looks like one (`v2`).
pub fn key_version<'a>(key: &'a str, versions: &[String]) -> Option<&'a str> {
    key.split([':', '/', '|']).find(|part| {
        versions.iter().any(|v| v == part) || {
            let mut chars = part.chars();
            matches!(chars.next(), Some('v' | 'V'))
                && chars.next().is_some_and(|c| c.is_ascii_digit())
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
        }
    })
}

/// Every cache hit: (story, attempt, event, key).
pub(super) fn hits(
    reconstruction: &Reconstruction,
) -> impl Iterator<Item = (&RequestStory, &Attempt, &Event, Option<&str>)> {
    reconstruction.requests.iter().flat_map(|story| {
        story.attempts.iter().flat_map(move |attempt| {
            attempt
                .events
                .iter()
                .filter(|e| e.is(Status::CacheHit))
                .map(move |e| {
                    let key = e.cache_key.as_deref().or(attempt.cache_key.as_deref());
                    (story, attempt, e, key)
                })
        })
    })
}

pub(super) fn cross_version_cache(
    reconstruction: &Reconstruction,
    versions: &[String],
    findings: &mut Vec<Finding>,
) {
    // Who filled each key: attempts with a miss (or a cache write) on it.
    let mut fillers: HashMap<&str, Vec<(&RequestStory, &Attempt, &Event)>> = HashMap::new();
    for story in &reconstruction.requests {
        for attempt in &story.attempts {
            for event in &attempt.events {
                if (event.is(Status::CacheMiss) || event.is(Status::CacheWritten))
                    && let Some(key) = event.cache_key.as_deref().or(attempt.cache_key.as_deref())
                {
                    // The first fill of each version is the one a later hit can have read.
                    let fills = fillers.entry(key).or_default();
                    match fills
                        .iter_mut()
                        .find(|(_, a, _)| a.model_version == attempt.model_version)
                    {
                        Some(first) if first.2.seq > event.seq => *first = (story, attempt, event),
                        Some(_) => {}
                        None => fills.push((story, attempt, event)),
                    }
                }
            }
        }
    }
    for (story, attempt, hit, key) in hits(reconstruction) {
        // The reader's version: its own, else the one active when it read (a worker that does
        // not log its version serves the active one).
        let mine = attempt.model_version.as_deref().or_else(|| {
            reconstruction
                .cutovers
                .iter()
                .rfind(|c| c.seq < hit.seq)
                .and_then(|c| c.to.as_deref())
        });
        let filler = key.and_then(|k| fillers.get(k)).and_then(|fills| {
            fills.iter().find(|(_, filler, fill)| {
                fill.seq < hit.seq
                    && filler.model_version.is_some()
                    && filler.model_version.as_deref() != mine
            })
        });
        let served = hit
            .served_version
            .as_deref()
            .filter(|s| mine.is_some_and(|m| m != *s));
        let named = key
            .and_then(|k| key_version(k, versions))
            .filter(|v| mine.is_some_and(|m| m != *v));
        let other = served
            .or(named)
            .or_else(|| filler.and_then(|(_, f, _)| f.model_version.as_deref()));
        let Some(other) = other else {
            continue;
        };
        let key_text = key.unwrap_or("a key not logged");
        let explanation = match (served.or(named), filler) {
            (None, Some((filler_story, filler, _))) => format!(
                "{} on {} got a cache hit on {key_text} (line {}), an entry filled by {} on {} for request {}: the cache key does not distinguish versions",
                attempt.worker_id,
                mine.unwrap_or("?"),
                hit.line,
                filler.worker_id,
                filler.model_version.as_deref().unwrap_or("?"),
                filler_story.request_id
            ),
            _ => format!(
                "{} got a cache hit on {key_text} (line {}) that served an entry of {other}{}: the answer came from another model version",
                attempt.who(),
                hit.line,
                filler
                    .map(|(fs, f, _)| format!(
                        ", filled by {} for request {} (line {})",
                        f.worker_id,
                        fs.request_id,
                        f.first_line()
                    ))
                    .unwrap_or_default()
            ),
        };
        let mut lines = vec![hit.line];
        let mut actors = Vec::new();
        match filler {
            Some((filler_story, filler, _)) => {
                lines.push(filler.first_line());
                actors.push(Actor::of(filler_story, filler));
            }
            None => actors.push(Actor {
                request_id: story.request_id.clone(),
                worker_id: None,
                model_version: Some(other.to_owned()),
            }),
        }
        actors.push(Actor::of(story, attempt));
        findings.push(Finding::new(
            Cause::CrossVersionCache,
            &story.request_id,
            explanation,
            lines,
            actors,
        ));
    }
}

pub(super) fn unversioned_cache_key(
    reconstruction: &Reconstruction,
    versions: &[String],
    findings: &mut Vec<Finding>,
) {
    // Every logged use of a cache key, in time order.
    let mut uses: Vec<(&Event, &RequestStory, &Attempt, &str)> = Vec::new();
    for story in &reconstruction.requests {
        for attempt in &story.attempts {
            for event in &attempt.events {
                if let Some(key) = event.cache_key.as_deref() {
                    uses.push((event, story, attempt, key));
                }
            }
        }
    }
    uses.sort_by_key(|(e, _, _, _)| e.seq);
    let versioned = uses
        .iter()
        .find(|(_, _, _, key)| key_version(key, versions).is_some());
    let mut by_key: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, (_, _, _, key)) in uses.iter().enumerate() {
        by_key.entry(key).or_default().push(i);
    }
    let mut seen: HashSet<&str> = HashSet::new();
    let mut mixed_reported = false;
    for (event, story, attempt, key) in &uses {
        if !seen.insert(key) || key_version(key, versions).is_some() {
            continue;
        }
        let shared = by_key[key]
            .iter()
            .map(|&j| &uses[j])
            .find(|(_, _, other, _)| {
                other.model_version.is_some()
                    && attempt.model_version.is_some()
                    && other.model_version != attempt.model_version
            });
        let mixed = versioned.filter(|_| !mixed_reported && shared.is_none());
        let mut lines = vec![event.line];
        let mut actors = vec![Actor::of(story, attempt)];
        let (request, explanation) = if let Some((other_event, other_story, other, _)) = shared {
            lines.push(other_event.line);
            actors.push(Actor::of(other_story, other));
            (
                &other_story.request_id,
                format!(
                    "cache key {key} names no model version and was used by {} (line {}) and {} (line {}): entries of one version are read by the other",
                    attempt.who(),
                    event.line,
                    other.who(),
                    other_event.line
                ),
            )
        } else if let Some((versioned_event, versioned_story, versioned_attempt, versioned_key)) =
            mixed
        {
            mixed_reported = true;
            lines.push(versioned_event.line);
            actors.push(Actor::of(versioned_story, versioned_attempt));
            (
                &story.request_id,
                format!(
                    "cache key {key} (line {}) names no model version while {versioned_key} (line {}) does: entries written under the unversioned key are shared by every version",
                    event.line, versioned_event.line
                ),
            )
        } else {
            continue;
        };
        findings.push(Finding::new(
            Cause::UnversionedCacheKey,
            request,
            explanation,
            lines,
            actors,
        ));
    }
}

pub(super) fn cache_hit_before_invalidation(
    reconstruction: &Reconstruction,
    versions: &[String],
    findings: &mut Vec<Finding>,
) {
    for cutover in &reconstruction.cutovers {
        let Some(invalidated) = reconstruction
            .marks
            .iter()
            .find(|m| m.status == Status::CacheInvalidated && m.seq > cutover.seq)
        else {
            continue;
        };
        for (story, attempt, hit, key) in hits(reconstruction) {
            if hit.seq <= cutover.seq || hit.seq >= invalidated.seq {
                continue;
            }
            let mine = attempt.model_version.as_deref();
            // An old worker reading its own version's entries, or a key in the reader's own
            // namespace, is not stale.
            if mine.is_some() && mine == cutover.from.as_deref() {
                continue;
            }
            if let (Some(key), Some(mine)) = (key, mine)
                && key_version(key, versions) == Some(mine)
            {
                continue;
            }
            let after = match (hit.millis, cutover.millis) {
                (Some(h), Some(c)) => format!("{} s after", seconds(h - c)),
                _ => "after".to_owned(),
            };
            let before = match (invalidated.millis, hit.millis) {
                (Some(i), Some(h)) => format!("{} s before", seconds(i - h)),
                _ => "before".to_owned(),
            };
            findings.push(Finding::new(
                Cause::CacheHitBeforeInvalidation,
                &story.request_id,
                format!(
                    "{} got a cache hit{} at line {}, {after} the cutover{} began (line {}) and {before} the cache invalidation finished (line {}): entries of the previous version were still served",
                    attempt.who(),
                    key.map(|k| format!(" on {k}")).unwrap_or_default(),
                    hit.line,
                    cutover
                        .to
                        .as_deref()
                        .map(|v| format!(" to {v}"))
                        .unwrap_or_default(),
                    cutover.line,
                    invalidated.line
                ),
                vec![cutover.line, hit.line, invalidated.line],
                vec![
                    Actor {
                        request_id: story.request_id.clone(),
                        worker_id: None,
                        model_version: cutover.from.clone(),
                    },
                    Actor::of(story, attempt),
                ],
            ));
        }
    }
}
