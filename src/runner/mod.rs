//! The runners: every way racecert runs workers, each a *plane* that a schedule drives and that
//! hands one [`crate::history::History`] to the judge ([`crate::check`]).
//!
//! - [`controlled`]: workers in process, held at named checkpoints and between round trips;
//!   deterministic.
//! - [`explore`]: the search that drives the controlled runner (proptest, corpus mutation).
//! - [`chaos`]: free-running workers in process, real clocks.
//! - [`fleet`]: worker processes under the contract, free running, with process faults.
//! - [`wire`]: worker processes under the contract, held and released round trip by round trip.
//! - [`system`]: a team's own worker (Celery, apalis) on its own tables, faults of its framework.
//! - [`plane`]: the services side every runner shares (leases, links, backends, cutover).
//! - `link_gate`: holds a worker's requests at its links until a schedule lets them go (the
//!   wire runner's workers, and controlled workers between statements).

mod arrivals;
pub mod chaos;
pub mod controlled;
pub mod explore;
pub mod fleet;
mod link_gate;
pub mod plane;
pub mod system;
pub mod wire;
