//! The properties every backend must have, one `pub async fn` each.
//!
//! Each takes a [`Fixture`] and panics (with a message saying what broke) when the
//! backend does not have the property. A capability the backend does not claim is
//! checked too: asking for it must fail with `Unsupported`.

mod ambiguity;
mod basic;
mod contention;
mod election;
mod expiry;
mod faults;
mod lifecycle;
mod primitives;
mod queueing;
mod recipes;
mod storage;

use std::future::Future;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;

use crate::fixture::{Evict, Faults, Fixture, FullFixture, Needs, Restart, Storage};
use dlock_core::{FencingToken, Lease, LockError, LockName, LockOptions, Locker};

use crate::history::{History, Op, Phase};

pub use ambiguity::*;
pub use basic::*;
pub use contention::*;
pub use election::*;
pub use expiry::*;
pub use faults::*;
pub use lifecycle::*;
pub use primitives::*;
pub use queueing::*;
pub use recipes::*;
pub use storage::*;

/// How to run one property: a function of the fixture trait it needs.
#[derive(Clone, Copy)]
pub enum Run {
    /// Needs only clients.
    Clients(for<'a> fn(&'a dyn Fixture) -> BoxFuture<'a, ()>),
    /// Needs to evict locks.
    Evict(for<'a> fn(&'a dyn Evict) -> BoxFuture<'a, ()>),
    /// Needs to hurt links.
    Faults(for<'a> fn(&'a dyn Faults) -> BoxFuture<'a, ()>),
    /// Needs to restart the backend.
    Restart(for<'a> fn(&'a dyn Restart) -> BoxFuture<'a, ()>),
    /// Needs to count what the backend stores.
    Storage(for<'a> fn(&'a dyn Storage) -> BoxFuture<'a, ()>),
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Run::Clients(_) => "Run::Clients",
            Run::Evict(_) => "Run::Evict",
            Run::Faults(_) => "Run::Faults",
            Run::Restart(_) => "Run::Restart",
            Run::Storage(_) => "Run::Storage",
        })
    }
}

/// One property of the suite.
#[derive(Clone, Copy)]
pub struct Case {
    /// Its name (the function's name).
    pub name: &'static str,
    /// How to run it.
    pub run: Run,
}

impl Case {
    /// What it needs from the fixture.
    pub fn needs(&self) -> Needs {
        match self.run {
            Run::Clients(_) => Needs::Clients,
            Run::Evict(_) => Needs::Evict,
            Run::Faults(_) => Needs::Faults,
            Run::Restart(_) => Needs::Restart,
            Run::Storage(_) => Needs::Storage,
        }
    }

    /// Runs it on a fixture with every capability.
    pub fn run<'a>(&self, fixture: &'a dyn FullFixture) -> BoxFuture<'a, ()> {
        match self.run {
            Run::Clients(run) => run(fixture),
            Run::Evict(run) => run(fixture),
            Run::Faults(run) => run(fixture),
            Run::Restart(run) => run(fixture),
            Run::Storage(run) => run(fixture),
        }
    }

    /// Runs it on plain clients, if that is all it needs.
    pub fn run_on_clients<'a>(&self, fixture: &'a dyn Fixture) -> Option<BoxFuture<'a, ()>> {
        match self.run {
            Run::Clients(run) => Some(run(fixture)),
            _ => None,
        }
    }
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Case").field("name", &self.name).field("needs", &self.needs()).finish()
    }
}

/// Calls the macro `$callback` with `{ $($pre)* }` followed by every property of the
/// suite, as `name: Needs`, in the order the suite runs them. This list is the one place
/// that names them: [`cases`] and [`suite!`](crate::suite) are both made from it.
#[doc(hidden)]
#[macro_export]
macro_rules! for_each_case {
    ($callback:ident { $($pre:tt)* }) => {
        $crate::$callback! { { $($pre)* }
            acquire_release: Clients,
            inspect_follows_hand_offs: Clients,
            mutual_exclusion: Clients,
            try_acquire_returns_at_once: Clients,
            wait_bound_times_out: Clients,
            waiter_wakes_on_release: Clients,
            fair_grants_follow_request_order: Clients,
            fair_order_holds_within_one_client: Clients,
            local_waiters_are_granted_in_order: Clients,
            cancelled_local_waiter_does_not_hold_up_the_next: Clients,
            tasks_of_one_client_take_turns: Clients,
            herd_of_waiters_each_get_the_lock_once: Clients,
            stale_lease_cannot_release_or_extend: Evict,
            vanished_holder_frees_within_ttl: Faults,
            dead_waiter_gives_up_its_place_soon: Faults,
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
            acquire_whose_reply_was_lost_leaves_no_hold: Faults,
            release_whose_reply_was_lost_is_applied_once: Faults,
            waiter_goes_on_after_a_release_whose_reply_was_lost: Faults,
            extend_whose_reply_was_lost_keeps_the_hold: Faults,
            renewal_that_hangs_is_retried_within_validity: Faults,
            holder_learns_first_under_one_way_partitions: Faults,
            release_after_lost_is_not_held: Faults,
            idempotent_runs_once_and_replays_the_result: Clients,
            idempotent_duplicate_gets_fallback_while_running: Clients,
            idempotent_failure_frees_the_key: Clients,
            idempotent_duplicates_race_the_end_of_a_run: Clients,
            idempotent_dead_runner_frees_the_key_within_ttl: Faults,
            idempotent_late_result_is_refused: Evict,
            multilock_overlapping_sets_do_not_deadlock: Clients,
            multilock_failure_leaves_no_partial_holds: Faults,
            multilease_combines_its_parts: Evict,
            multilock_parts_are_live_when_granted: Clients,
            recipes_refuse_options_that_share_them: Clients,
            rwlock_readers_share_and_a_writer_excludes: Clients,
            rwlock_waiting_writer_keeps_new_readers_out: Clients,
            rwlock_writers_never_hold_beside_anyone: Clients,
            cancelled_reader_leaves_nothing: Clients,
            semaphore_admits_at_most_n: Clients,
            semaphore_permits_change_at_run_time: Clients,
            semaphore_mixed_counts_never_crowd_a_holder: Clients,
            semaphore_reentry_with_another_count_takes_another_permit: Clients,
            semaphore_permit_of_a_vanished_holder_comes_back: Faults,
            hold_kinds_exclude_each_other: Clients,
            hold_kinds_survive_frozen_holders: Faults,
            election_one_leader_per_term_seen_in_order: Clients,
            election_vanished_leader_is_replaced_after_it_knows: Faults,
            election_store_whose_reply_was_lost_is_confirmed: Faults,
            idle_names_leave_nothing_behind: Storage,
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! case_table {
    ({} $($name:ident : $needs:ident),* $(,)?) => {
        /// Every property, in the order the suite runs them.
        pub fn cases() -> Vec<Case> {
            vec![$(Case { name: stringify!($name), run: Run::$needs(|f| Box::pin($name(f))) }),*]
        }
    };
}

/// The properties a backend reached another way (over TLS, through a pooler, with the
/// application's own client) is first judged by: a grant and its release, mutual
/// exclusion, a waiter woken by a release, a watchdog lease kept past its ttl, a fixed
/// lease that expires, and a run-once key. The whole suite runs on the usual fixtures;
/// these show the other way of connecting changes none of it.
pub async fn core(f: &dyn Fixture) {
    acquire_release(f).await;
    mutual_exclusion(f).await;
    waiter_wakes_on_release(f).await;
    watchdog_keeps_lock(f).await;
    fixed_lease_expires(f).await;
    idempotent_runs_once_and_replays_the_result(f).await;
}

crate::for_each_case!(case_table {});

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

/// Asserts that `order`, the holder's grant and then each waiter's as `(waiter, token)`,
/// has the waiters `0..waiters` in that order and tokens that rise at every grant.
pub(crate) fn assert_granted_in_order(order: &[(usize, FencingToken)], waiters: usize, what: &str) {
    let granted: Vec<usize> = order[1..].iter().map(|&(i, _)| i).collect();
    assert_eq!(granted, (0..waiters).collect::<Vec<_>>(), "{what}");
    for pair in order.windows(2) {
        assert!(pair[1].1 > pair[0].1, "a later grant's token is not above the one before: {order:?}");
    }
}

/// Acquires `name` as history process `process`, recording the call and its outcome;
/// panics (after recording the failure) when the acquire fails.
pub(crate) async fn acquire_recorded(
    client: &dyn Locker,
    name: &LockName,
    opts: &LockOptions,
    history: &History,
    process: usize,
) -> Lease {
    history.record(process, Op::Acquire, Phase::Invoke, None);
    match client.acquire(name, opts).await {
        Ok(lease) => {
            history.record(process, Op::Acquire, Phase::Ok, Some(lease.token()));
            lease
        }
        Err(e) => {
            history.record(process, Op::Acquire, Phase::Fail, None);
            panic!("process {process}: acquire failed: {e}");
        }
    }
}

/// Releases `lease` as history process `process`, recording the call; panics when the
/// release fails.
pub(crate) async fn release_recorded(lease: Lease, history: &History, process: usize) {
    history.record(process, Op::Release, Phase::Invoke, None);
    match lease.release().await {
        Ok(()) => history.record(process, Op::Release, Phase::Ok, None),
        Err(e) => panic!("process {process}: release failed: {e}"),
    }
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
