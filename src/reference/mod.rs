//! The reference inference pipeline from the seed (placeholder while it is written).
pub mod checkpoints;
pub mod defects;
