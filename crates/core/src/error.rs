//! The library error type: one enum for everything racecert can fail at, so the CLI can print a
//! clear message naming the place (a file, a service, a proxy) and callers can match on the kind.

use std::path::PathBuf;

/// Result alias used across the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in racecert.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A Docker engine operation (CLI or API) failed.
    #[error("docker: {0}")]
    Docker(String),

    /// Building or bootstrapping a service image failed.
    #[error("image {image}: {message}")]
    Image {
        /// The image reference being built.
        image: String,
        /// What went wrong, with the command that failed.
        message: String,
    },

    /// A container from testcontainers failed to start or to answer.
    #[error("container {service}: {source}")]
    Container {
        /// Which service (redis, postgres, ...).
        service: &'static str,
        /// The underlying testcontainers error.
        #[source]
        source: testcontainers::TestcontainersError,
    },

    /// Redis answered with an error or could not be reached.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),

    /// PostgreSQL answered with an error or could not be reached.
    #[error("postgres: {0}")]
    Postgres(#[from] sqlx::Error),

    /// The fault proxy (Toxiproxy API) refused or failed an operation.
    #[error("fault proxy: {0}")]
    Proxy(String),

    /// A model backend (wiremock) could not be set up.
    #[error("model backend: {0}")]
    Backend(String),

    /// Configuration (environment variables, CLI arguments, files) is invalid.
    #[error("configuration: {0}")]
    Config(String),

    /// A destructive operation was refused because the target is not marked for tests.
    #[error("refused: {0}")]
    Refused(String),

    /// An I/O error, with the path or operation that caused it.
    #[error("{context}: {source}")]
    Io {
        /// The path or operation.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A service did not become ready in time.
    #[error("{service} not ready after {waited_ms} ms: {last_error}")]
    NotReady {
        /// Which service.
        service: String,
        /// How long racecert waited.
        waited_ms: u128,
        /// The last error seen while waiting.
        last_error: String,
    },

    /// A signal (SIGINT, SIGTERM) stopped the run before it had anything to report.
    #[error("interrupted by {0}")]
    Interrupted(String),

    /// Anything else, with a message.
    #[error("{0}")]
    Other(String),
}

impl Error {
    /// An I/O error on a path.
    pub fn io_at(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            context: path.into().display().to_string(),
            source,
        }
    }

    /// An I/O error during a named operation.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// Escape hatch for errors that fit no other kind.
    pub fn other(message: impl Into<String>) -> Self {
        Error::Other(message.into())
    }
}
