//! The result cache a team adds once the same prompts come back: Redis, keys
//! `{CACHE_PREFIX}{sha256 of the input}`, `CACHE_TTL_S` (default 3600). A hit is served as is, a
//! miss computed and stored. Whether a rollout serves the old model's output depends only on the
//! key: with the version in `CACHE_PREFIX` the new version misses and computes; without it, it
//! reads what the old version stored.

use redis::AsyncCommands;
use sha2::{Digest, Sha256};

/// A connection to the cache and its key layout.
pub struct Cache {
    conn: redis::aio::MultiplexedConnection,
    prefix: String,
    ttl_s: u64,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache").field("prefix", &self.prefix).finish()
    }
}

type Error = Box<dyn std::error::Error + Send + Sync>;

impl Cache {
    /// The cache the environment describes: None without `CACHE_PREFIX`; `REDIS_URL` is then
    /// required.
    pub async fn from_env() -> Result<Option<Cache>, Error> {
        let Ok(prefix) = std::env::var("CACHE_PREFIX") else {
            return Ok(None);
        };
        let url = std::env::var("REDIS_URL").map_err(|_| "CACHE_PREFIX is set, REDIS_URL is not")?;
        let ttl = std::env::var("CACHE_TTL_S").unwrap_or_else(|_| "3600".into());
        let ttl_s = ttl.parse().map_err(|e| format!("CACHE_TTL_S={ttl:?}: {e}"))?;
        let conn = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        Ok(Some(Cache {
            conn,
            prefix,
            ttl_s,
        }))
    }

    /// The entry of `input`.
    pub fn key(&self, input: &str) -> String {
        let digest = Sha256::digest(input.as_bytes());
        format!("{}{}", self.prefix, &hex::encode(digest)[..32])
    }

    /// The stored output, if any.
    pub async fn get(&self, key: &str) -> Result<Option<String>, Error> {
        Ok(self.conn.clone().get(key).await?)
    }

    /// Stores `output` under `key` for the TTL.
    pub async fn put(&self, key: &str, output: &str) -> Result<(), Error> {
        let _: () = self.conn.clone().set_ex(key, output, self.ttl_s).await?;
        Ok(())
    }
}
