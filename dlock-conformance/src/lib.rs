//! The shared dlock conformance suite.
//!
//! Every backend runs the same properties ([`properties`]), each a `pub async fn` taking
//! the fixture trait it needs: [`Fixture`] for independent clients over real servers,
//! [`Evict`], [`Faults`] or [`Restart`] for the means to hurt them (evict a lock
//! underneath its holder; cut, black-hole, delay or drop the replies of a client's link;
//! kill and restart the server), and [`Storage`] to count what the server keeps. The [`history`] checker judges the concurrent runs.
//! The servers, the TCP fault proxy and the test PKI of dlock's own tests live in the
//! `dlock-testkit` crate.
//!
//! A backend's `tests/conformance.rs` stamps out one test per property:
//!
//! ```ignore
//! dlock_conformance::suite!(my_backend_fixture().await);
//! ```
//!
//! The properties are not a stable API: new ones are added as the contract grows.

pub mod fixture;
pub mod history;
pub mod memory;
pub mod properties;

pub use fixture::{Evict, Fault, Faults, FaultyClient, Fixture, FullFixture, Link, Needs, Restart, Storage, Timing};

/// Sends the tests' `tracing` output to the test harness when `RUST_LOG` is set.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// Stamps out one `#[tokio::test]` per property of the suite, each building its own
/// fixture with `$fixture` (an expression, evaluated inside the async test, so it may
/// `.await`; its type must implement every fixture trait). The calling crate needs
/// `tokio` with the `macros` and `rt-multi-thread` features among its dev-dependencies.
#[macro_export]
macro_rules! suite {
    ($fixture:expr) => {
        $crate::for_each_case!(suite_tests { $fixture });
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! suite_tests {
    ({ $fixture:expr } $($case:ident : $needs:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::init_tracing();
                let fixture = $fixture;
                $crate::properties::$case(&fixture).await;
            }
        )*
    };
}
