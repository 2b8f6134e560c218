//! Cutover from one model version to another. The reference switches the active-version pointer;
//! cache namespaces are per version, so old entries are never read by the new version, and the
//! retired version's namespace is reclaimed later, asynchronously ([`Cutover::invalidate`] runs
//! whenever the schedule says), as a team frees the memory of a model it retired. That lag window
//! exists in every deployment, so the `cache-invalidation-lag` fault has a path to land on against
//! the reference too. With [`Defect::LateCacheInvalidation`] the cache is unversioned and the
//! late deletion of every entry is the only protection, which is the seed's "new model is live
//! but old outputs still appear".

use crate::Result;
use crate::contract::Keys;
use crate::contract::defect::{Defect, Defects};
use crate::contract::log::LogSink;
use crate::contract::log::{Level, Status};
use redis::AsyncCommands;
use redis::aio::ConnectionManager;

/// A cutover that happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cutover {
    /// The version active before (None: the pointer was unset).
    pub from: Option<String>,
    /// The version active now.
    pub to: String,
    /// Whether old cache entries still wait for their (late) invalidation.
    pub invalidation_pending: bool,
    /// Whether the invalidation deletes every entry ([`Defect::LateCacheInvalidation`]'s
    /// unversioned cache) rather than the retired version's namespace.
    pub flush_all: bool,
}

/// Switches the active-version pointer to `to`.
pub async fn cutover(
    redis: &mut ConnectionManager,
    keys: &Keys,
    to: &str,
    defects: &Defects,
    log: &LogSink,
) -> Result<Cutover> {
    let from: Option<String> = redis::cmd("SET")
        .arg(keys.active_version())
        .arg(to)
        .arg("GET")
        .query_async(redis)
        .await?;
    log.emit(
        Level::Info,
        vec![
            ("status".into(), Status::Cutover.as_str().into()),
            (
                "previous_model_version".into(),
                from.clone().unwrap_or_else(|| "-".into()),
            ),
            ("new_model_version".into(), to.into()),
        ],
    );
    let retiring = from.as_deref() != Some(to);
    Ok(Cutover {
        from,
        to: to.to_owned(),
        // Something waits for the late invalidation: the unversioned cache (defect), or the
        // namespaces of versions no longer active (the pointer may have been unset: any version
        // other than the new one).
        invalidation_pending: defects.has(Defect::LateCacheInvalidation) || retiring,
        flush_all: defects.has(Defect::LateCacheInvalidation),
    })
}

impl Cutover {
    /// Runs the late invalidation: every entry of the unversioned cache (the defect's), else the
    /// entries of every version but the active one. Returns how many entries were deleted.
    pub async fn invalidate(
        &mut self,
        redis: &mut ConnectionManager,
        keys: &Keys,
        log: &LogSink,
    ) -> Result<u64> {
        if !self.invalidation_pending {
            return Ok(0);
        }
        let namespace = format!("{}inf:", keys.prefix());
        let pattern = format!("{namespace}*");
        let kept = format!("{namespace}{}:", self.to);
        // A versioned entry is `inf:{version}:{hash}`; an unversioned one (a defect's layout)
        // has no version to retire and stays unless everything is flushed.
        let doomed: Vec<String> = crate::contract::worker::scan_keys(redis, &pattern)
            .await?
            .into_iter()
            .filter(|key| {
                let versioned = key[namespace.len().min(key.len())..].contains(':');
                self.flush_all || (versioned && !key.starts_with(&kept))
            })
            .collect();
        let deleted: u64 = if doomed.is_empty() {
            0
        } else {
            redis.del(&doomed).await?
        };
        self.invalidation_pending = false;
        log.emit(
            Level::Info,
            vec![
                ("status".into(), Status::CacheInvalidated.as_str().into()),
                ("deleted".into(), deleted.to_string()),
            ],
        );
        Ok(deleted)
    }
}
