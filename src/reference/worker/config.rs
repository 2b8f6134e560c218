//! A reference worker's configuration ([`WorkerConfig`]) and its builder: identity, model
//! version, backends, lease and timeouts, the defects switched on.

use super::*;

/// A worker's configuration, snapshotted at start.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub(super) worker_id: String,
    pub(super) model_version: String,
    pub(super) backends: BTreeMap<String, BackendEndpoint>,
    pub(super) lease_ttl: Duration,
    pub(super) visibility_timeout: Duration,
    pub(super) backend_timeout: Duration,
    pub(super) upstream_warn_after: Duration,
    pub(super) cache_ttl: Duration,
    pub(super) defects: Defects,
    pub(super) seed: u64,
    pub(super) accept_timing_faults: bool,
}

/// Builds a [`WorkerConfig`]; [`WorkerConfigBuilder::build`] refuses settings that cannot work.
#[derive(Debug, Clone)]
pub struct WorkerConfigBuilder {
    pub(super) config: WorkerConfig,
}

impl WorkerConfig {
    /// A worker `worker_id` bound to `model_version`. `backends` maps every version to its
    /// endpoint (the worker uses its own; the re-read-version defect may use others).
    pub fn builder(
        worker_id: &str,
        model_version: &str,
        backends: impl IntoIterator<Item = (String, BackendEndpoint)>,
    ) -> WorkerConfigBuilder {
        WorkerConfigBuilder {
            config: WorkerConfig {
                worker_id: worker_id.to_owned(),
                model_version: model_version.to_owned(),
                backends: backends.into_iter().collect(),
                lease_ttl: Duration::from_secs(30),
                visibility_timeout: Duration::from_secs(30),
                backend_timeout: Duration::from_secs(5),
                upstream_warn_after: Duration::from_secs(2),
                cache_ttl: Duration::from_secs(3600),
                defects: Defects::none(),
                seed: 0,
                accept_timing_faults: false,
            },
        }
    }

    /// The worker id.
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// The version it is bound to.
    pub fn model_version(&self) -> &str {
        &self.model_version
    }

    /// Its defects.
    pub fn defects(&self) -> &Defects {
        &self.defects
    }
}

impl WorkerConfigBuilder {
    /// Lease time-to-live.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.config.lease_ttl = ttl;
        self
    }

    /// Queue visibility timeout: an unacknowledged delivery is redelivered after it.
    pub fn visibility_timeout(mut self, timeout: Duration) -> Self {
        self.config.visibility_timeout = timeout;
        self
    }

    /// Hard timeout of a backend call.
    pub fn backend_timeout(mut self, timeout: Duration) -> Self {
        self.config.backend_timeout = timeout;
        self
    }

    /// After this long without an answer the worker logs `timeout_waiting_upstream` and keeps
    /// waiting (up to the hard timeout), as the seed's worker does.
    pub fn upstream_warn_after(mut self, after: Duration) -> Self {
        self.config.upstream_warn_after = after;
        self
    }

    /// Cache entry time-to-live.
    pub fn cache_ttl(mut self, ttl: Duration) -> Self {
        self.config.cache_ttl = ttl;
        self
    }

    /// Defects to switch on.
    pub fn defects(mut self, defects: Defects) -> Self {
        self.config.defects = defects;
        self
    }

    /// Seed of the worker's randomness (only the random-id defect draws from it).
    pub fn seed(mut self, seed: u64) -> Self {
        self.config.seed = seed;
        self
    }

    /// Accepts a lease TTL or visibility timeout shorter than the backend timeout: for harness
    /// runs that inject that timing on purpose (a warning is logged).
    pub fn accept_timing_faults(mut self) -> Self {
        self.config.accept_timing_faults = true;
        self
    }

    /// Checks the configuration. A visibility timeout or lease shorter than the backend timeout
    /// would make every slow call a retry overlap: that is a fault to inject on purpose, not a
    /// setting.
    pub fn build(self) -> Result<WorkerConfig> {
        let c = &self.config;
        let bad =
            |message: String| Err(Error::Config(format!("worker {}: {message}", c.worker_id)));
        if c.worker_id.is_empty() || c.worker_id.contains(char::is_whitespace) {
            return bad("worker id must be non-empty without spaces".into());
        }
        if !c.backends.contains_key(&c.model_version) {
            return bad(format!(
                "no backend endpoint for its own version {:?}",
                c.model_version
            ));
        }
        if c.lease_ttl.is_zero() || c.backend_timeout.is_zero() {
            return bad("lease TTL and backend timeout must be positive".into());
        }
        if c.accept_timing_faults
            && (c.visibility_timeout <= c.backend_timeout || c.lease_ttl <= c.backend_timeout)
        {
            tracing::warn!(
                worker = %c.worker_id,
                lease_ttl = ?c.lease_ttl,
                visibility_timeout = ?c.visibility_timeout,
                backend_timeout = ?c.backend_timeout,
                "injected timing fault: lease or visibility timeout shorter than a backend call"
            );
            return Ok(self.config);
        }
        if c.visibility_timeout <= c.backend_timeout {
            return bad(format!(
                "visibility timeout {:?} must exceed the backend timeout {:?}",
                c.visibility_timeout, c.backend_timeout
            ));
        }
        if c.lease_ttl <= c.backend_timeout {
            return bad(format!(
                "lease TTL {:?} must exceed the backend timeout {:?}",
                c.lease_ttl, c.backend_timeout
            ));
        }
        if c.upstream_warn_after > c.backend_timeout {
            return bad("the upstream warning must come before the hard timeout".into());
        }
        Ok(self.config)
    }
}
