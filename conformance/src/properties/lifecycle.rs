//! The life of a lease: re-entrancy, the lost signal, drop, cancellation, many leases.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::{with_lock, LockError, LockName, LockOptions, LostReason, OwnerId};
use futures::stream::{self, StreamExt, TryStreamExt};

use super::{assert_unsupported, eventually, unique_name, watchdog};
use crate::fixture::{Evict, Fixture};

/// The same owner acquiring twice gets the same token, and the lock frees only after
/// both holds are released (or explicit owners fail with `Unsupported`).
pub async fn reentrant_by_owner(f: &dyn Fixture) {
    let margin = f.timing().margin;
    let (a, b) = (f.client().await, f.client().await);
    let name = unique_name("reentrant");
    let owner = OwnerId::new(format!("owner-{:016x}", fastrand::u64(..))).expect("owner");
    let opts = watchdog(f, margin).owner(owner.clone());
    if !a.capabilities().reentrant {
        assert_unsupported("an acquire with an explicit owner", a.acquire(&name, &opts).await);
        return;
    }
    let first = a.acquire(&name, &opts).await.expect("acquire");
    let second = a.acquire(&name, &opts).await.expect("re-entrant acquire must not block");
    assert_eq!(first.token(), second.token(), "a re-entrant acquire returns the holder's token");
    assert_eq!(first.owner(), &owner);
    let holder = a.inspect(&name).await.expect("inspect").holder.expect("held");
    assert_eq!(holder.owner, owner);
    assert_eq!(holder.count, 2, "the hold count after two acquires");

    let other = b.try_acquire(&name, &watchdog(f, margin)).await.expect("try_acquire");
    assert!(other.is_none(), "another owner got a re-entrantly held lock");
    first.release().await.expect("first release");
    let other = b.try_acquire(&name, &watchdog(f, margin)).await.expect("try_acquire");
    assert!(other.is_none(), "the lock freed after one of two releases");
    assert_eq!(a.inspect(&name).await.expect("inspect").holder.map(|h| h.count), Some(1));
    second.release().await.expect("second release");
    let other = b.try_acquire(&name, &watchdog(f, margin)).await.expect("try_acquire");
    let other = other.expect("the lock frees after the last release");
    other.release().await.expect("release");
}

/// When the lock is removed underneath its holder, the lost signal fires (within a
/// renewal period), and `with_lock` cancels its work and returns `Lost`.
pub async fn lost_when_removed_underneath(f: &dyn Evict) {
    let timing = f.timing();
    let client = f.client().await;
    let name = unique_name("lost");
    let lease = client.acquire(&name, &watchdog(f, timing.margin)).await.expect("acquire");
    f.evict(&name).await;
    let reason = tokio::time::timeout(timing.ttl + timing.margin, lease.lost())
        .await
        .expect("the lost signal fires when the hold is removed");
    assert!(
        matches!(reason, LostReason::Expired | LostReason::Stolen | LostReason::SessionExpired),
        "a removed hold is not a connectivity problem: {reason:?}"
    );
    assert!(lease.is_lost());
    assert_eq!(lease.remaining(), Duration::ZERO);
    drop(lease);

    let name = unique_name("with-lock");
    let started = Arc::new(tokio::sync::Notify::new());
    let dropped = Arc::new(AtomicBool::new(false));
    let work = {
        let (client, name, started, dropped, opts) =
            (client.clone(), name.clone(), started.clone(), dropped.clone(), watchdog(f, timing.margin));
        tokio::spawn(async move {
            with_lock(&*client, &name, &opts, |_lease| async move {
                struct SetOnDrop(Arc<AtomicBool>);
                impl Drop for SetOnDrop {
                    fn drop(&mut self) {
                        self.0.store(true, Ordering::SeqCst);
                    }
                }
                let _guard = SetOnDrop(dropped);
                started.notify_one();
                tokio::time::sleep(Duration::from_secs(3600)).await;
                "the work finished although the lease was lost"
            })
            .await
        })
    };
    started.notified().await;
    f.evict(&name).await;
    let outcome = tokio::time::timeout(timing.ttl + timing.margin, work)
        .await
        .expect("with_lock must return when the lease is lost")
        .expect("task");
    assert!(matches!(outcome, Err(LockError::Lost { .. })), "with_lock returned {outcome:?}");
    if let Err(err) = &outcome {
        assert_eq!(err.lock_name(), Some(name.as_str()), "the error does not name the lock: {err}");
    }
    assert!(dropped.load(Ordering::SeqCst), "with_lock must cancel (drop) the work");
}

/// Dropping a lease stops its renewal at once and frees the lock long before its ttl.
pub async fn dropped_lease_frees_lock(f: &dyn Fixture) {
    let margin = f.timing().margin;
    let (a, b) = (f.client().await, f.client().await);
    let name = unique_name("drop");
    let long_ttl = Duration::from_secs(60);
    let lease = a.acquire(&name, &LockOptions::watchdog(long_ttl).wait(margin)).await.expect("acquire");
    assert_eq!(a.stats().active_leases, 1);
    drop(lease);
    assert_eq!(a.stats().active_leases, 0, "the drop must end the lease at once");

    let started = Instant::now();
    let next = b.acquire(&name, &LockOptions::watchdog(f.timing().ttl).wait(margin)).await;
    let next = next.unwrap_or_else(|e| panic!("the dropped lease's lock was not freed within {margin:?}: {e}"));
    assert!(started.elapsed() < long_ttl);
    eventually("the dropped lease leaves the renewal scheduler", margin, || async { a.stats().scheduled == 0 }).await;
    next.release().await.expect("release");
}

/// Cancelling an `acquire` (a timeout around it, a `select!`) leaves no lock, no queue
/// entry and no renewal behind, whether it was waiting or just being granted.
pub async fn cancelled_acquire_leaves_nothing(f: &dyn Fixture) {
    let margin = f.timing().margin;
    let (a, b, c) = (f.client().await, f.client().await, f.client().await);
    let name = unique_name("cancel");

    // Cancelled while waiting behind a holder.
    let held = a.acquire(&name, &watchdog(f, margin)).await.expect("acquire");
    let long_wait = LockOptions::watchdog(Duration::from_secs(60)).wait(Duration::from_secs(60));
    let waiting = b.acquire(&name, &long_wait);
    let cancelled = tokio::time::timeout(Duration::from_millis(200), waiting).await;
    assert!(cancelled.is_err(), "the acquire should still have been waiting");
    if b.capabilities().queue_length {
        eventually("the cancelled waiter leaves the queue", margin, || async {
            a.inspect(&name).await.map(|i| i.waiters == Some(0)).unwrap_or(false)
        })
        .await;
    }
    held.release().await.expect("release");
    // A queue entry left behind would make this wait for its 60 s ttl.
    let next =
        c.acquire(&name, &watchdog(f, margin)).await.expect("the next waiter is not blocked by the cancelled one");
    next.release().await.expect("release");

    // Cancelled at random points of an acquire on a free lock: whatever was granted is
    // given back.
    for round in 0..20u64 {
        let opts = LockOptions::watchdog(Duration::from_secs(60)).wait(margin);
        let attempt = b.acquire(&name, &opts);
        let cut = Duration::from_micros(fastrand::u64(0..3000));
        let _ = tokio::time::timeout(cut, attempt).await;
        // What the cancelled acquire had under way finishes in the background; once it has,
        // nothing of it may remain.
        eventually(&format!("round {round}: the cancelled acquire winds down"), margin, || async {
            b.stats().in_flight == 0
        })
        .await;
        let info = a.inspect(&name).await.expect("inspect");
        assert!(info.holder.is_none(), "round {round}: a cancelled acquire left the lock held: {info:?}");
    }
    let s = b.stats();
    assert!(
        s.active_leases == 0 && s.scheduled == 0 && s.waiting == 0 && s.in_flight == 0,
        "the cancelling client kept a lease, renewal, waiter or operation: {s:?}"
    );
    let last = c.try_acquire(&name, &watchdog(f, margin)).await.expect("try_acquire").expect("free");
    last.release().await.expect("release");
}

/// One client holds 1,000 distinct names: all are renewed past their ttl (none lost,
/// none free to another client), and all are released.
pub async fn many_names_renewed_and_released(f: &dyn Fixture) {
    const NAMES: usize = 1000;
    let timing = f.timing();
    let (a, b) = (f.client().await, f.client().await);
    let prefix = unique_name("many");
    let names: Vec<LockName> = (0..NAMES).map(|i| LockName::new(format!("{prefix}/{i}")).expect("name")).collect();
    let opts = watchdog(f, timing.margin);

    let leases = for_each_name(&names, |name| {
        let (a, opts) = (a.clone(), opts.clone());
        async move { a.acquire(&name, &opts).await }
    })
    .await
    .expect("acquire 1,000 names");
    assert_eq!(a.stats().active_leases, NAMES as u64);

    tokio::time::sleep(timing.ttl * 2).await;
    let lost = leases.iter().filter(|l| l.is_lost()).count();
    assert_eq!(lost, 0, "{lost} of {NAMES} leases were lost: the watchdog did not renew them all");
    let free = for_each_name(&names, |name| {
        let (b, opts) = (b.clone(), opts.clone());
        async move { b.try_acquire(&name, &opts).await }
    })
    .await
    .expect("try_acquire");
    let stolen = free.iter().filter(|l| l.is_some()).count();
    assert_eq!(stolen, 0, "{stolen} of {NAMES} names were free to another client");
    assert!(a.stats().renewals >= NAMES as u64, "each lease should have been renewed at least once");

    let released: Vec<()> =
        stream::iter(leases).map(|lease| lease.release()).buffered(50).try_collect().await.expect("release all");
    assert_eq!(released.len(), NAMES);
    let infos = for_each_name(&names, |name| {
        let b = b.clone();
        async move { b.inspect(&name).await }
    })
    .await
    .expect("inspect");
    assert!(infos.iter().all(|i| i.holder.is_none()), "some names were still held after release");
    eventually("the scheduler forgets released leases", timing.margin, || async { a.stats().scheduled == 0 }).await;
}

/// Runs `op` on every name, 50 at a time, in order.
async fn for_each_name<T, F, Fut>(names: &[LockName], op: F) -> Result<Vec<T>, LockError>
where
    F: FnMut(LockName) -> Fut,
    Fut: std::future::Future<Output = Result<T, LockError>>,
{
    stream::iter(names.to_vec()).map(op).buffered(50).try_collect().await
}
