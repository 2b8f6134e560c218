//! racecert's bottom layer: what every worker under test agrees to ([`contract`]: job rows,
//! statuses, log lines, checkpoints, deliveries, defects, the worker trait), the one fault
//! vocabulary ([`fault`]), the error type ([`error`]) and Ctrl-C / SIGTERM handling
//! ([`interrupt`]). Every other crate of the workspace builds on it; it depends on none of them.

#![deny(missing_docs)]

pub mod contract;
pub mod error;
pub mod fault;
pub mod interrupt;

pub use error::{Error, Result};
