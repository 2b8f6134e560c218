//! A team's own fencing, as its system file names it: the column each attempt of a job takes
//! before it works (an epoch it raises, a token it replaces) and how its values order attempts.
//! With it the audit trail records the column's old and new value on every write, and the two
//! fencing invariants are judged on a team's table as on the contract's: `generations-increase`
//! (the fence never goes back) and `no-non-owner-final-write` (the final write comes from the
//! attempt that holds the row's current fence).

use serde::{Deserialize, Serialize};

/// The fencing column and how its values order attempts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fencing {
    /// The column (e.g. `epoch`, `attempt_token`).
    pub column: String,
    /// How its values order attempts.
    pub order: FenceOrder,
}

/// How a fencing column's values order attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FenceOrder {
    /// A number each take raises (an epoch, a generation counter): a newer attempt holds a
    /// greater value, and the column never decreases.
    Increasing,
    /// An opaque value each take replaces (a UUID, a random token): a newer attempt holds a
    /// value the row never held before, and a replaced value never comes back.
    Token,
}
