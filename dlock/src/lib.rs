//! Distributed locks with fencing tokens, behind one API.
//!
//! This crate re-exports [`dlock_core`] (the API, the machinery and the in-process
//! [`memory`] backend); the network backends join it behind feature flags.

pub use dlock_core::*;

// The README's example is compiled and run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;
