//! The properties every backend must have, one `pub async fn` each.
//!
//! Each takes a [`Fixture`] and panics (with a message saying what broke) when the
//! backend does not have the property. A capability the backend does not claim is
//! checked too: asking for it must fail with `Unsupported`.

mod basic;
mod contention;
mod expiry;
mod faults;
mod lifecycle;

use std::future::Future;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;

use crate::fixture::{Fixture, Needs};
use dlock_core::{LockError, LockName, LockOptions};

pub use basic::*;
pub use contention::*;
pub use expiry::*;
pub use faults::*;
pub use lifecycle::*;

/// One property of the suite.
#[derive(Clone, Copy)]
pub struct Case {
    /// Its name (the function's name).
    pub name: &'static str,
    /// What it needs from the fixture.
    pub needs: Needs,
    /// Runs it.
    pub run: for<'a> fn(&'a dyn Fixture) -> BoxFuture<'a, ()>,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Case").field("name", &self.name).field("needs", &self.needs).finish()
    }
}

macro_rules! cases {
    ($( $name:ident : $needs:ident ),* $(,)?) => {
        /// Every property, in the order the suite runs them.
        pub fn cases() -> Vec<Case> {
            vec![$(Case {
                name: stringify!($name),
                needs: Needs::$needs,
                run: |f| Box::pin($name(f)),
            }),*]
        }
    };
}

cases! {
    acquire_release: Clients,
    mutual_exclusion: Clients,
    try_acquire_returns_at_once: Clients,
    wait_bound_times_out: Clients,
    waiter_wakes_on_release: Clients,
    fair_grants_follow_request_order: Clients,
    stale_lease_cannot_release_or_extend: Evict,
    vanished_holder_frees_within_ttl: Faults,
    watchdog_keeps_lock: Clients,
    fixed_lease_expires: Clients,
    extend_prolongs_lease: Clients,
    max_hold_stops_renewal: Clients,
    tokens_increase_across_holders: Evict,
    reentrant_by_owner: Clients,
    lost_when_removed_underneath: Evict,
    dropped_lease_frees_lock: Clients,
    cancelled_acquire_leaves_nothing: Clients,
    many_names_renewed_and_released: Clients,
    bad_input_rejected: Clients,
    awkward_names_do_not_collide: Clients,
    unreachable_backend_fails_fast: Faults,
    paused_holder_is_fenced: Faults,
    backend_restart: Restart,
}

/// A lock name no other test run uses, so tests can share an external server.
pub fn unique_name(label: &str) -> LockName {
    LockName::new(format!("dlock-test/{label}/{:016x}", fastrand::u64(..))).expect("valid name")
}

/// Polls `condition` every 10 ms until it holds; panics with `what` after `within`.
/// This observes state the test cannot be notified of; it never stands in for a sleep.
pub async fn eventually<F, Fut>(what: &str, within: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if condition().await {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: not true within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A watchdog lease of the fixture's ttl, waiting up to `wait`.
pub(crate) fn watchdog(fixture: &dyn Fixture, wait: Duration) -> LockOptions {
    LockOptions::watchdog(fixture.timing().ttl).wait(wait)
}

/// Asserts that `result` is `Err(Unsupported)`.
pub(crate) fn assert_unsupported<T: std::fmt::Debug>(what: &str, result: Result<T, LockError>) {
    match result {
        Err(LockError::Unsupported(_)) => {}
        other => panic!(
            "{what}: the backend does not claim the capability, so this must fail with Unsupported; got {other:?}"
        ),
    }
}
