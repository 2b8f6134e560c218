//! Cutover from one model version to another. The reference switches the active-version pointer
//! and nothing else: cache namespaces are per version, so old entries are simply never read by the
//! new version. With [`Defect::LateCacheInvalidation`] the cache is unversioned and the old
//! entries must be deleted; the deletion is asynchronous and late ([`Cutover::invalidate`] runs
//! whenever the schedule says), which is the seed's "new model is live but old outputs still
//! appear".

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
    Ok(Cutover {
        from,
        to: to.to_owned(),
        invalidation_pending: defects.has(Defect::LateCacheInvalidation),
    })
}

impl Cutover {
    /// Runs the late invalidation of the unversioned cache (defect only; the reference has
    /// nothing to invalidate). Returns how many entries were deleted.
    pub async fn invalidate(
        &mut self,
        redis: &mut ConnectionManager,
        keys: &Keys,
        log: &LogSink,
    ) -> Result<u64> {
        if !self.invalidation_pending {
            return Ok(0);
        }
        let pattern = format!("{}inf:*", keys.prefix());
        let mut doomed = Vec::new();
        {
            let mut iter: redis::AsyncIter<String> = redis.scan_match(&pattern).await?;
            while let Some(key) = iter.next_item().await {
                doomed.push(key?);
            }
        }
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
