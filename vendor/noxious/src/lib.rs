#![forbid(unsafe_code)]
#![warn(
    missing_copy_implementations,
    missing_debug_implementations,
    missing_docs,
    trivial_numeric_casts,
    unused_extern_crates,
    unused_import_braces,
    unused_qualifications
)]
#![cfg_attr(feature = "clippy", warn(cast_possible_truncation))]
#![cfg_attr(feature = "clippy", warn(cast_possible_wrap))]
#![cfg_attr(feature = "clippy", warn(cast_precision_loss))]
#![cfg_attr(feature = "clippy", warn(cast_sign_loss))]
#![cfg_attr(feature = "clippy", warn(missing_docs_in_private_items))]
#![cfg_attr(feature = "clippy", warn(mut_mut))]
#![cfg_attr(feature = "clippy", warn(print_stdout))]
#![cfg_attr(all(not(test), feature = "clippy"), warn(result_unwrap_used))]
#![cfg_attr(feature = "clippy", warn(unseparated_literal_suffix))]
#![cfg_attr(feature = "clippy", warn(wrong_pub_self_convention))]

//! # noxious

/// Contains the errors
pub mod error;
mod link;
/// Contains the proxy data types and runners
pub mod proxy;
/// Contains the Stop and Close signals
pub mod signal;
/// Contains wrappers around Tokio types to make them mockable
pub mod socket;
/// Contains the shared proxy and toxic state
pub mod state;
mod stream;
/// racecert patch: taps that observe (and may hold) the bytes of every connection
pub mod tap;
mod tests;
/// Contains the toxic data types
pub mod toxic;
mod toxics;
