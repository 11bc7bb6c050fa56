//! The shared dlock conformance suite.
//!
//! Every backend runs the same properties ([`properties`]), each a `pub async fn` taking
//! the fixture trait it needs: [`Fixture`] for independent clients over real servers,
//! [`Evict`], [`Faults`] or [`Restart`] for the means to hurt them (evict a lock
//! underneath its holder; cut, black-hole, delay or drop the replies of a client's link;
//! kill and restart the server), and [`Storage`] to count what the server keeps. The [`history`] checker judges the concurrent runs.
//! The TCP fault proxy that plays every [`Fault`] on a client's link is [`proxy`] (the
//! `proxy` feature), for any fixture whose backend speaks TCP. The servers and the test
//! PKI of dlock's own tests live in the unpublished `dlock-testkit` crate.
//!
//! A backend's `tests/conformance.rs` stamps out one test per property:
//!
//! ```ignore
//! dlock_conformance::suite!(my_backend_fixture().await);
//! ```
//!
//! The properties are not a stable API: new ones are added as the contract grows.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod fixture;
pub mod history;
pub mod memory;
pub mod properties;
#[cfg(feature = "proxy")]
#[cfg_attr(docsrs, doc(cfg(feature = "proxy")))]
pub mod proxy;

pub use fixture::{
    Connecting, Evict, Fault, Faults, FaultyClient, Fixture, FullFixture, Link, Needs, Restart, Storage, Timing,
};

/// Sends the tests' `tracing` output to the test harness when `RUST_LOG` is set (with
/// the `test-log` feature; without it, does nothing).
pub fn init_tracing() {
    #[cfg(feature = "test-log")]
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// Stamps out one `#[tokio::test]` per property of the suite, each building its own
/// fixture with `$fixture` (an expression, evaluated inside the async test, so it may
/// `.await`; its type must implement every fixture trait: [`FullFixture`]). The calling
/// crate needs `tokio` with the `macros` and `rt-multi-thread` features among its
/// dev-dependencies.
///
/// A fixture that cannot do everything (a backend run against a server the tests cannot
/// kill, a fixture without a fault proxy) runs the properties its capabilities allow
/// with the macros named for them instead: [`suite_clients!`] (every fixture),
/// [`suite_evict!`], [`suite_faults!`], [`suite_restart!`] and [`suite_storage!`]. The
/// ones it leaves out are the properties it cannot judge; a capability the backend
/// lacks is still run, and fails with `Unsupported`.
#[macro_export]
macro_rules! suite {
    ($fixture:expr) => {
        $crate::suite_clients!($fixture);
        $crate::suite_evict!($fixture);
        $crate::suite_faults!($fixture);
        $crate::suite_restart!($fixture);
        $crate::suite_storage!($fixture);
    };
}

/// The properties that need only independent clients ([`Fixture`]): what any live
/// backend can be judged by.
#[macro_export]
macro_rules! suite_clients {
    ($fixture:expr) => {
        $crate::for_each_case!(suite_only { @Clients $fixture });
    };
}

/// The properties that need to remove a lock underneath its holder ([`Evict`]).
#[macro_export]
macro_rules! suite_evict {
    ($fixture:expr) => {
        $crate::for_each_case!(suite_only { @Evict $fixture });
    };
}

/// The properties that need to hurt a client's link ([`Faults`]).
#[macro_export]
macro_rules! suite_faults {
    ($fixture:expr) => {
        $crate::for_each_case!(suite_only { @Faults $fixture });
    };
}

/// The properties that need to stop and restart the backend ([`Restart`]).
#[macro_export]
macro_rules! suite_restart {
    ($fixture:expr) => {
        $crate::for_each_case!(suite_only { @Restart $fixture });
    };
}

/// The properties that need to count what the backend stores ([`Storage`]).
#[macro_export]
macro_rules! suite_storage {
    ($fixture:expr) => {
        $crate::for_each_case!(suite_only { @Storage $fixture });
    };
}

/// Keeps the cases of one need: `{ @Need fixture } case: need, ...`. A macro cannot
/// compare two captured identifiers, so each need has its own pair of rules.
#[doc(hidden)]
#[macro_export]
macro_rules! suite_only {
    ({ @$want:ident $fixture:expr }) => {};
    ({ @Clients $fixture:expr } $case:ident : Clients $(, $($rest:tt)*)?) => {
        $crate::suite_case!($fixture, $case);
        $crate::suite_only!({ @Clients $fixture } $($($rest)*)?);
    };
    ({ @Evict $fixture:expr } $case:ident : Evict $(, $($rest:tt)*)?) => {
        $crate::suite_case!($fixture, $case);
        $crate::suite_only!({ @Evict $fixture } $($($rest)*)?);
    };
    ({ @Faults $fixture:expr } $case:ident : Faults $(, $($rest:tt)*)?) => {
        $crate::suite_case!($fixture, $case);
        $crate::suite_only!({ @Faults $fixture } $($($rest)*)?);
    };
    ({ @Restart $fixture:expr } $case:ident : Restart $(, $($rest:tt)*)?) => {
        $crate::suite_restart_case!($fixture, $case);
        $crate::suite_only!({ @Restart $fixture } $($($rest)*)?);
    };
    ({ @Storage $fixture:expr } $case:ident : Storage $(, $($rest:tt)*)?) => {
        $crate::suite_case!($fixture, $case);
        $crate::suite_only!({ @Storage $fixture } $($($rest)*)?);
    };
    ({ @$want:ident $fixture:expr } $case:ident : $other:ident $(, $($rest:tt)*)?) => {
        $crate::suite_only!({ @$want $fixture } $($($rest)*)?);
    };
}

/// One property that stops and restarts the backend, as one test: when the fixture
/// cannot (see [`Restart::cannot_restart`]), the test says why and passes.
#[doc(hidden)]
#[macro_export]
macro_rules! suite_restart_case {
    ($fixture:expr, $case:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            $crate::init_tracing();
            let fixture = $fixture;
            if let Some(why) = $crate::Restart::cannot_restart(&fixture) {
                eprintln!("skipped {}: {why}", stringify!($case));
                return;
            }
            $crate::properties::$case(&fixture).await;
        }
    };
}

/// One property as one test.
#[doc(hidden)]
#[macro_export]
macro_rules! suite_case {
    ($fixture:expr, $case:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            $crate::init_tracing();
            let fixture = $fixture;
            $crate::properties::$case(&fixture).await;
        }
    };
}
