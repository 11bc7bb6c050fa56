//! Time: the watchdog, fixed leases, `extend`, `max_hold`, stale leases, fencing tokens.

use std::time::{Duration, Instant};

use dlock_core::{LockError, LockOptions, LostReason};

use super::{assert_unsupported, eventually, unique_name, watchdog};
use crate::fixture::{Evict, Fixture};

/// The watchdog keeps a lock for 3 x ttl while the holder lives: nobody else gets it,
/// the lease is never lost, and it was renewed along the way.
pub async fn watchdog_keeps_lock(f: &dyn Fixture) {
    let timing = f.timing();
    let (a, b) = (f.client().await, f.client().await);
    let name = unique_name("watchdog");
    let lease = a.acquire(&name, &watchdog(f, timing.margin)).await.expect("acquire");
    let renewals_before = a.stats().renewals;

    tokio::time::sleep(timing.ttl * 3).await;
    assert!(!lease.is_lost(), "the watchdog let the lease go: {:?}", lease.lost_reason());
    assert!(lease.remaining() > Duration::ZERO);
    let other = b.try_acquire(&name, &watchdog(f, timing.margin)).await.expect("try_acquire");
    assert!(other.is_none(), "another client got the lock while the watchdog should have kept it");
    let renewals = a.stats().renewals - renewals_before;
    assert!(renewals >= 3, "only {renewals} renewals in 3 ttls (one is due every ttl/3)");
    lease.release().await.expect("the lease is still ours");
}

/// A `Fixed` lease is never renewed: its lost signal fires with `Expired` when its ttl
/// runs out, and then another client gets the lock. (`Unsupported` where not claimed.)
pub async fn fixed_lease_expires(f: &dyn Fixture) {
    let timing = f.timing();
    let (a, b) = (f.client().await, f.client().await);
    let name = unique_name("fixed");
    let opts = LockOptions::fixed(timing.ttl).wait(timing.margin);
    if !a.capabilities().fixed {
        assert_unsupported("a Fixed lease", a.acquire(&name, &opts).await);
        return;
    }
    let started = Instant::now();
    let lease = a.acquire(&name, &opts).await.expect("acquire");
    let reason = tokio::time::timeout(timing.ttl + timing.margin, lease.lost())
        .await
        .expect("the lost signal of a Fixed lease fires at its expiry");
    let fired = started.elapsed();
    assert_eq!(reason, LostReason::Expired);
    assert!(fired >= timing.ttl / 2, "lost after {fired:?}, long before the ttl of {:?}", timing.ttl);
    assert_eq!(a.stats().renewals, 0, "a Fixed lease was renewed");
    assert_eq!(lease.remaining(), Duration::ZERO);

    let next = b.acquire(&name, &watchdog(f, timing.ttl + timing.margin)).await.expect("the lock frees at expiry");
    assert!(next.token() > lease.token());
    next.release().await.expect("release");
}

/// `extend` prolongs a lease past its original ttl (or fails with `Unsupported`).
pub async fn extend_prolongs_lease(f: &dyn Fixture) {
    let timing = f.timing();
    let (a, b) = (f.client().await, f.client().await);
    let name = unique_name("extend");
    let fixed = a.capabilities().fixed;
    let opts = if fixed { LockOptions::fixed(timing.ttl) } else { LockOptions::watchdog(timing.ttl) };
    let lease = a.acquire(&name, &opts.wait(timing.margin)).await.expect("acquire");
    if !a.capabilities().extend {
        assert_unsupported("extend", lease.extend(timing.ttl * 4).await);
        lease.release().await.expect("release");
        return;
    }
    lease.extend(timing.ttl * 4).await.expect("extend our own lease");
    tokio::time::sleep(timing.ttl * 2).await;
    assert!(!lease.is_lost(), "lost after extend: {:?}", lease.lost_reason());
    assert!(lease.remaining() > Duration::ZERO);
    let other = b.try_acquire(&name, &watchdog(f, timing.margin)).await.expect("try_acquire");
    assert!(other.is_none(), "the lock was free before the extended ttl ran out");
    lease.release().await.expect("release");
}

/// `max_hold` stops the watchdog: a lease renewed past its first ttl is lost with
/// `Expired` within a ttl after `max_hold`, and the lock frees.
pub async fn max_hold_stops_renewal(f: &dyn Fixture) {
    let timing = f.timing();
    let (a, b) = (f.client().await, f.client().await);
    let name = unique_name("max-hold");
    let max_hold = timing.ttl * 3 / 2;
    let opts = watchdog(f, timing.margin).max_hold(max_hold);
    if !a.capabilities().ttl {
        assert_unsupported("max_hold", a.acquire(&name, &opts).await);
        return;
    }
    let started = Instant::now();
    let lease = a.acquire(&name, &opts).await.expect("acquire");
    let reason = tokio::time::timeout(max_hold + timing.ttl + timing.margin, lease.lost())
        .await
        .expect("the watchdog must stop at max_hold and the lease run out");
    let fired = started.elapsed();
    assert_eq!(reason, LostReason::Expired);
    assert!(fired >= max_hold, "lost after {fired:?}: the watchdog stopped before max_hold ({max_hold:?})");
    let next = b.acquire(&name, &watchdog(f, timing.ttl + timing.margin)).await.expect("the lock frees");
    next.release().await.expect("release");
}

/// Tokens strictly increase across successive holders on different clients, after a
/// removal underneath the holder, and after an expiry.
pub async fn tokens_increase_across_holders(f: &dyn Evict) {
    let timing = f.timing();
    let clients = [f.client().await, f.client().await, f.client().await];
    let name = unique_name("tokens");
    let mut last = None;
    let mut check = |token| {
        if let Some(prev) = last {
            assert!(token > prev, "token {token} after {prev}: tokens must strictly increase");
        }
        last = Some(token);
    };
    for round in 0..12 {
        let lease = clients[round % 3].acquire(&name, &watchdog(f, timing.margin)).await.expect("acquire");
        check(lease.token());
        lease.release().await.expect("release");
    }

    let lease = clients[0].acquire(&name, &watchdog(f, timing.margin)).await.expect("acquire");
    check(lease.token());
    f.evict(&name).await;
    let next = clients[1].acquire(&name, &watchdog(f, timing.ttl + timing.margin)).await.expect("acquire after evict");
    check(next.token());
    next.release().await.expect("release");
    drop(lease);

    let fixed = LockOptions::fixed(timing.ttl).wait(timing.margin);
    if !clients[0].capabilities().fixed {
        assert_unsupported("a Fixed lease", clients[0].acquire(&name, &fixed).await);
        return;
    }
    let expiring = clients[2].acquire(&name, &fixed).await.expect("acquire");
    check(expiring.token());
    let after =
        clients[0].acquire(&name, &watchdog(f, timing.ttl + timing.margin)).await.expect("acquire after expiry");
    assert!(expiring.remaining().is_zero(), "a new holder got the lock while the old lease was still valid");
    check(after.token());
    after.release().await.expect("release");
}

/// A stale lease (its hold removed, someone else holding now) can neither extend nor
/// release the new holder's lock.
pub async fn stale_lease_cannot_release_or_extend(f: &dyn Evict) {
    let timing = f.timing();
    let (a, b) = (f.client().await, f.client().await);
    let name = unique_name("stale");
    let stale = a.acquire(&name, &LockOptions::watchdog(timing.ttl * 10).wait(timing.margin)).await.expect("acquire");
    f.evict(&name).await;
    let current = b.acquire(&name, &watchdog(f, timing.margin)).await.expect("acquire after evict");
    assert!(current.token() > stale.token());

    let extended = stale.extend(timing.ttl * 10).await;
    if a.capabilities().extend {
        assert!(matches!(extended, Err(LockError::NotHeld { .. })), "a stale lease extended: {extended:?}");
    } else {
        assert_unsupported("extend", extended);
    }
    let released = stale.release().await;
    assert!(matches!(released, Err(LockError::NotHeld { .. })), "a stale lease released: {released:?}");
    if let Err(err) = &released {
        assert_eq!(err.lock_name(), Some(name.as_str()), "the error does not name the lock: {err}");
    }
    // A lease already known lost gives back what may remain of its hold in the background:
    // let that finish before judging what it did.
    let a_settles = a.clone();
    eventually("the stale client's background release finishes", timing.margin, move || {
        let a = a_settles.clone();
        async move { a.stats().in_flight == 0 }
    })
    .await;

    let info = b.inspect(&name).await.expect("inspect");
    let holder = info.holder.expect("the current holder must still hold the lock");
    assert_eq!(holder.token, current.token());
    assert_eq!(&holder.owner, current.owner());
    let intruder = a.try_acquire(&name, &watchdog(f, timing.margin)).await.expect("try_acquire");
    assert!(intruder.is_none(), "the stale lease's release freed the current holder's lock");
    assert!(!current.is_lost());
    current.release().await.expect("the current holder releases its own lock");
}
