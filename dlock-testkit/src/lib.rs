//! What dlock's own tests need beside the conformance suite: real servers started from
//! installed binaries on free loopback ports ([`supervisor`]), a TCP proxy that plays
//! every [`Fault`](dlock_conformance::Fault) between a client and a server ([`proxy`]),
//! and a throwaway TLS PKI ([`supervisor::tls`]).

pub mod proxy;
pub mod supervisor;
