//! What dlock's own tests need beside the conformance suite: real servers started from
//! installed binaries on free loopback ports ([`supervisor`]), a TCP proxy that plays
//! every [`Fault`](dlock_conformance::Fault) between a client and a server ([`proxy`]),
//! and a throwaway TLS PKI ([`supervisor::tls`]).

/// The fault proxy, which the conformance crate publishes (its `proxy` feature) for
/// fixtures outside this workspace.
pub use dlock_conformance::proxy;
pub mod supervisor;

// The project README's examples are compiled and run as doc tests here, in a crate that is
// never published, so that no published crate reads a file outside its own directory.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;
