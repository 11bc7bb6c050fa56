//! The shared dlock conformance suite.
//!
//! Every backend runs the same properties ([`properties`]), each a `pub async fn` taking
//! a [`Fixture`]: independent clients over real servers, plus the means to hurt them
//! (evict a lock underneath its holder, cut or blackhole a client's link through the
//! [`proxy`], kill and restart the server through the [`supervisor`]). The
//! [`history`] checker judges the concurrent runs.
//!
//! A backend's `tests/conformance.rs` stamps out one test per property:
//!
//! ```ignore
//! conformance::suite!(my_backend_fixture().await);
//! ```

pub mod fixture;
pub mod history;
pub mod memory;
pub mod properties;
pub mod proxy;
pub mod supervisor;

pub use fixture::{FaultyClient, Fixture, Link, Needs, Timing};

/// Sends the tests' `tracing` output to the test harness when `RUST_LOG` is set.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// Stamps out one `#[tokio::test]` per property of the suite, each building its own
/// fixture with `$fixture` (an expression, evaluated inside the async test, so it may
/// `.await`). The calling crate needs `tokio` with the `macros` and `rt-multi-thread`
/// features among its dev-dependencies.
#[macro_export]
macro_rules! suite {
    ($fixture:expr) => {
        $crate::suite!(@cases $fixture;
            acquire_release,
            mutual_exclusion,
            try_acquire_returns_at_once,
            wait_bound_times_out,
            waiter_wakes_on_release,
            fair_grants_follow_request_order,
            stale_lease_cannot_release_or_extend,
            vanished_holder_frees_within_ttl,
            watchdog_keeps_lock,
            fixed_lease_expires,
            extend_prolongs_lease,
            max_hold_stops_renewal,
            tokens_increase_across_holders,
            reentrant_by_owner,
            lost_when_removed_underneath,
            dropped_lease_frees_lock,
            cancelled_acquire_leaves_nothing,
            many_names_renewed_and_released,
            bad_input_rejected,
            awkward_names_do_not_collide,
            unreachable_backend_fails_fast,
            paused_holder_is_fenced,
            backend_restart,
        );
    };
    (@cases $fixture:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::init_tracing();
                let fixture = $fixture;
                $crate::properties::$case(&fixture).await;
            }
        )*

        /// The macro's list and the suite's list must be the same, so no property is
        /// silently left out of a backend's run.
        #[test]
        fn suite_runs_every_case() {
            let generated: &[&str] = &[$(stringify!($case)),*];
            let all: Vec<&str> = $crate::properties::cases().iter().map(|case| case.name).collect();
            assert_eq!(generated, all.as_slice());
        }
    };
}
