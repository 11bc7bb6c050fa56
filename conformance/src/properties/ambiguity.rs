//! Ambiguous outcomes: a request applied whose reply never came, replies that come late,
//! and links that fail in one direction only. The client cannot know what happened; the
//! lock must still never have two holders, never keep an orphan hold for a ttl, and the
//! holder must always learn of its loss first.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::{LockError, LockName, LockOptions, Locker, OwnerId};

use super::{assert_unsupported, eventually, unique_name};
use crate::fixture::{Fault, Faults};

/// How long the suite gives a lock to become free once nothing holds it any more: an
/// operation timeout (the failed call) plus two margins, far below the long ttls these
/// properties use, so that a hold left behind for a ttl cannot pass for a free lock.
fn soon(f: &dyn Faults) -> Duration {
    let timing = f.timing();
    timing.op_timeout + timing.margin * 2
}

/// A lease ttl long enough to outlive a fault of one operation timeout with renewals to
/// spare, and a margin either side.
fn sturdy_ttl(f: &dyn Faults) -> Duration {
    let timing = f.timing();
    timing.ttl.max(timing.op_timeout * 6).max(timing.margin * 3)
}

/// A fresh explicit owner.
fn new_owner(label: &str) -> OwnerId {
    OwnerId::new(format!("{label}-{:016x}", fastrand::u64(..))).expect("owner")
}

/// Waits until `client` gets `name` with a `try_acquire`, within `within`, and releases it.
async fn free_within(client: &Arc<dyn Locker>, name: &LockName, within: Duration, why: &str) {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(Some(lease)) = client.try_acquire(name, &LockOptions::new()).await {
            lease.release().await.expect("release");
            return;
        }
        assert!(Instant::now() < deadline, "{why}: the lock was not free within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asserts that `client` cannot get `name` now.
async fn still_held(client: &Arc<dyn Locker>, name: &LockName, why: &str) {
    let intruder = client.try_acquire(name, &LockOptions::new()).await.expect("try_acquire");
    assert!(intruder.is_none(), "{why}: another client got the lock");
}

/// Waits until the client has nothing under way (background give-backs and releases
/// included), so that what it did can be judged.
async fn settled(client: &Arc<dyn Locker>, within: Duration) {
    let client = client.clone();
    eventually("the client's background work finishes", within, move || {
        let client = client.clone();
        async move { client.stats().in_flight == 0 }
    })
    .await;
}

/// An acquire whose reply was lost (the request was applied, the answer dropped) fails
/// within the operation timeout and leaves no hold behind: another client gets the lock
/// within a few seconds, far below the ttl. With an explicit owner no re-entrant count
/// stays raised: the owner acquires and releases once more, then another owner gets the
/// lock; and an ambiguous re-entry neither keeps the lock held after the owner's real
/// lease is released nor frees it while that lease lives.
pub async fn acquire_whose_reply_was_lost_leaves_no_hold(f: &dyn Faults) {
    let timing = f.timing();
    let ttl = Duration::from_secs(30).max(soon(f) * 3);
    let faulty = f.faulty_client().await;
    let other = f.client().await;
    let opts = LockOptions::watchdog(ttl).wait(timing.margin);

    let ambiguous_acquire = |name: LockName, opts: LockOptions| {
        let (locker, link) = (faulty.locker.clone(), &faulty.link);
        async move {
            link.set(Fault::DropReplies);
            let started = Instant::now();
            let outcome = locker.acquire(&name, &opts).await;
            let took = started.elapsed();
            link.restore();
            assert!(
                matches!(outcome, Err(LockError::Unavailable { .. })),
                "an acquire whose reply was dropped must fail as Unavailable; got {outcome:?}"
            );
            assert!(
                took < timing.op_timeout + timing.margin,
                "an acquire whose reply was dropped failed only after {took:?} (op timeout {:?})",
                timing.op_timeout
            );
        }
    };

    // A fresh owner.
    let name = unique_name("lost-grant");
    ambiguous_acquire(name.clone(), opts.clone()).await;
    free_within(&other, &name, soon(f), "after an acquire whose reply was lost").await;

    let owner = new_owner("ambiguous");
    let owned = opts.clone().owner(owner.clone());
    if !faulty.locker.capabilities().reentrant {
        assert_unsupported("an acquire with an explicit owner", faulty.locker.acquire(&name, &owned).await);
        return;
    }

    // An explicit owner that held nothing: once more acquired and released, the lock is free.
    let name = unique_name("lost-grant-owned");
    ambiguous_acquire(name.clone(), owned.clone()).await;
    let again = faulty.locker.acquire(&name, &owned.clone().wait(soon(f))).await.expect("the owner acquires again");
    again.release().await.expect("the owner releases");
    free_within(
        &other,
        &name,
        soon(f),
        "after an owner's acquire whose reply was lost, acquired and released once more",
    )
    .await;

    // An explicit owner that already holds: the ambiguous re-entry is given back, and only it.
    let name = unique_name("lost-reentry");
    let held = faulty.locker.acquire(&name, &owned).await.expect("the owner acquires");
    ambiguous_acquire(name.clone(), owned.clone()).await;
    settled(&faulty.locker, soon(f)).await;
    still_held(&other, &name, "while the owner's lease lives, after its ambiguous re-entry was given back").await;
    assert!(!held.is_lost(), "the owner's lease was lost: {:?}", held.lost_reason());
    held.release().await.expect("the owner releases its lease");
    free_within(&other, &name, soon(f), "after an ambiguous re-entry and the owner's release").await;
}

/// A release whose reply was lost is applied once, whether the client retries it or
/// reports an error: a lock held once becomes free; a lock its owner holds twice stays
/// held by the other lease, and nobody else gets it until that lease is released.
pub async fn release_whose_reply_was_lost_is_applied_once(f: &dyn Faults) {
    let timing = f.timing();
    let ttl = sturdy_ttl(f);
    let faulty = f.faulty_client().await;
    let other = f.client().await;
    let opts = LockOptions::watchdog(ttl).wait(timing.margin);

    // Held once: the release reached the server, so the lock frees.
    let name = unique_name("lost-release");
    let lease = faulty.locker.acquire(&name, &opts).await.expect("acquire");
    faulty.link.set(Fault::DropReplies);
    let released = lease.release().await;
    faulty.link.restore();
    assert!(
        matches!(released, Ok(()) | Err(LockError::Unavailable { .. })),
        "a release whose reply was dropped: {released:?}"
    );
    free_within(&other, &name, soon(f), "after a release whose reply was lost").await;

    let owned = opts.clone().owner(new_owner("twice"));
    if !faulty.locker.capabilities().reentrant {
        assert_unsupported("an acquire with an explicit owner", faulty.locker.acquire(&name, &owned).await);
        return;
    }

    // Held twice: exactly one of the two holds goes.
    let name = unique_name("lost-release-reentrant");
    let first = faulty.locker.acquire(&name, &owned).await.expect("acquire");
    let second = faulty.locker.acquire(&name, &owned).await.expect("re-enter");
    faulty.link.set(Fault::DropReplies);
    let released = first.release().await;
    faulty.link.restore();
    assert!(
        matches!(released, Ok(()) | Err(LockError::Unavailable { .. })),
        "a release whose reply was dropped: {released:?}"
    );
    settled(&faulty.locker, soon(f)).await;
    still_held(&other, &name, "one of two holds was released, the other lease lives").await;
    // Renewals of the other lease keep going; the lock is still its own a while later.
    tokio::time::sleep(timing.ttl).await;
    still_held(&other, &name, "one of two holds was released, the other lease lives on").await;
    assert!(!second.is_lost(), "the remaining lease was lost: {:?}", second.lost_reason());
    let holder = other.inspect(&name).await.expect("inspect").holder.expect("the remaining lease holds the lock");
    assert_eq!(holder.token, second.token());
    second.release().await.expect("the remaining lease releases");
    free_within(&other, &name, soon(f), "after the last hold was released").await;
}

/// A release whose reply was lost does not leave the lock idle under a waiter of the same
/// client: the waiter, fair where the backend is FIFO, either gets the lock or fails and
/// leaves it free, soon after the link heals. A waiter that a lost reply left unaware of
/// its grant until a timed look (a place refresh, a poll bounded by the ttl) fails here.
pub async fn waiter_goes_on_after_a_release_whose_reply_was_lost(f: &dyn Faults) {
    let faulty = f.faulty_client().await;
    let other = f.client().await;
    let name = unique_name("lost-release-waiter");
    // Long enough that a timed look, a third of the ttl or more away, misses the bound.
    let ttl = sturdy_ttl(f).max(Duration::from_secs(60));
    let fair = faulty.locker.capabilities().fifo;
    let opts = LockOptions::watchdog(ttl).fair(fair).wait(ttl);
    let held = faulty.locker.acquire(&name, &opts).await.expect("acquire");
    let waiter = {
        let (locker, name, opts) = (faulty.locker.clone(), name.clone(), opts.clone());
        tokio::spawn(async move { locker.acquire(&name, &opts).await })
    };
    let locker = faulty.locker.clone();
    eventually("the waiter waits", f.timing().margin, move || {
        let locker = locker.clone();
        async move { locker.stats().waiting == 1 }
    })
    .await;

    faulty.link.set(Fault::DropReplies);
    let released = held.release().await;
    faulty.link.restore();
    assert!(
        matches!(released, Ok(()) | Err(LockError::Unavailable { .. })),
        "a release whose reply was dropped: {released:?}"
    );
    let within = soon(f);
    match tokio::time::timeout(within, waiter).await {
        Err(_) => {
            panic!("the waiter neither got the lock nor gave up within {within:?} of a release whose reply was lost")
        }
        Ok(waited) => match waited.expect("the waiter's task") {
            Ok(lease) => {
                let _ = lease.release().await;
            }
            Err(LockError::Unavailable { .. }) => {}
            Err(err) => panic!("the waiter failed with {err}"),
        },
    }
    settled(&faulty.locker, within).await;
    free_within(&other, &name, within, "after the waiter of a release whose reply was lost").await;
}

/// An extension whose reply was lost neither shortens nor revokes the hold: the lease
/// stays valid, and nobody else gets the lock before the hold's original end.
pub async fn extend_whose_reply_was_lost_keeps_the_hold(f: &dyn Faults) {
    let timing = f.timing();
    let ttl = sturdy_ttl(f);
    let faulty = f.faulty_client().await;
    let other = f.client().await;
    let name = unique_name("lost-extend");
    // A fixed lease is never renewed, so only the extension could change its hold.
    let fixed = faulty.locker.capabilities().fixed;
    let opts = if fixed { LockOptions::fixed(ttl) } else { LockOptions::watchdog(ttl) }.wait(timing.margin);
    let lease = faulty.locker.acquire(&name, &opts).await.expect("acquire");
    if !faulty.locker.capabilities().extend {
        assert_unsupported("extend", lease.extend(ttl * 3).await);
        lease.release().await.expect("release");
        return;
    }
    let ends = Instant::now() + lease.remaining();

    faulty.link.set(Fault::DropReplies);
    let extended = lease.extend(ttl * 3).await;
    faulty.link.restore();
    assert!(
        matches!(extended, Ok(()) | Err(LockError::Unavailable { .. })),
        "an extension whose reply was dropped: {extended:?}"
    );
    still_held(&other, &name, "after an extension whose reply was lost").await;
    let holder = other.inspect(&name).await.expect("inspect").holder.expect("the lease still holds the lock");
    assert_eq!(holder.token, lease.token());
    // Until shortly before the hold's original end, it is still ours.
    tokio::time::sleep_until(ends.checked_sub(timing.margin).unwrap_or(ends).into()).await;
    assert!(!lease.is_lost(), "the lease was lost after an extension whose reply was lost: {:?}", lease.lost_reason());
    still_held(&other, &name, "before the hold's original end, after an extension whose reply was lost").await;
    lease.release().await.expect("release");
}

/// Renewals whose replies come late, past the operation timeout but within the lease's
/// validity, keep the lease. Renewals whose replies never come lose it: the lost signal
/// fires by the end of the validity, and before another client is granted the lock.
pub async fn renewal_that_hangs_is_retried_within_validity(f: &dyn Faults) {
    let timing = f.timing();
    let ttl = sturdy_ttl(f);
    let faulty = f.faulty_client().await;
    let other = f.client().await;
    let name = unique_name("slow-renewal");
    let lease = faulty.locker.acquire(&name, &LockOptions::watchdog(ttl).wait(timing.margin)).await.expect("acquire");

    // Late replies: each renewal is answered one and a half operation timeouts after it
    // was sent, well within the two thirds of the ttl left when it is sent.
    faulty.link.set(Fault::DelayReplies(timing.op_timeout + timing.op_timeout / 2));
    tokio::time::sleep(ttl + timing.margin).await;
    assert!(!lease.is_lost(), "renewals answered late but in time lost the lease: {:?}", lease.lost_reason());
    assert!(!lease.remaining().is_zero());
    still_held(&other, &name, "while renewals are answered late").await;
    faulty.link.restore();

    // No replies at all (requests still arrive). Replies still on their way from the
    // delayed phase may extend the lease a little: follow its validity as it sees it.
    let handle = lease.handle();
    let lost_at = tokio::spawn(async move {
        let mut ends = Instant::now();
        while !handle.is_lost() {
            ends = ends.max(Instant::now() + handle.remaining());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (Instant::now(), ends)
    });
    faulty.link.set(Fault::BlackholeReplies);
    let next = other
        .acquire(&name, &LockOptions::watchdog(timing.ttl).wait(ttl * 3 + timing.margin * 2))
        .await
        .expect("another client gets the lock of a holder that hears nothing back");
    assert!(
        lease.remaining().is_zero(),
        "another client was granted while the holder that hears nothing back still counted itself valid"
    );
    let (lost_at, ends) =
        tokio::time::timeout(timing.margin, lost_at).await.expect("the lost signal fires").expect("task");
    assert!(
        lost_at <= ends + timing.margin / 2,
        "the lost signal fired {:?} after the lease's validity ended",
        lost_at.saturating_duration_since(ends)
    );
    assert!(next.token() > lease.token());
    faulty.link.restore();
    next.release().await.expect("release");
    drop(lease);
}

/// With the holder's link broken in one direction only (its requests held back, or their
/// replies), the holder's lost signal fires no later than the moment another client is
/// granted the lock.
pub async fn holder_learns_first_under_one_way_partitions(f: &dyn Faults) {
    let timing = f.timing();
    let other = f.client().await;
    for fault in [Fault::BlackholeRequests, Fault::BlackholeReplies] {
        let faulty = f.faulty_client().await;
        let name = unique_name("one-way");
        let opts = LockOptions::watchdog(timing.ttl).wait(timing.margin);
        let lease = faulty.locker.acquire(&name, &opts).await.expect("acquire");
        faulty.link.set(fault);
        let next = other
            .acquire(&name, &LockOptions::watchdog(timing.ttl).wait(timing.ttl * 3 + timing.margin * 3))
            .await
            .unwrap_or_else(|e| panic!("another client gets the lock of a holder behind {fault:?}: {e}"));
        assert!(
            lease.remaining().is_zero(),
            "another client was granted while the holder behind {fault:?} still counted itself valid"
        );
        assert!(next.token() > lease.token());
        faulty.link.restore();
        next.release().await.expect("release");
        let released = lease.release().await;
        assert!(matches!(released, Err(LockError::NotHeld { .. })), "the release of a lost lease: {released:?}");
    }
}

/// After the lost signal fired, `release()` answers `NotHeld`, and it never frees the
/// lock of the next holder, even when the old holder's held-back requests arrive late.
pub async fn release_after_lost_is_not_held(f: &dyn Faults) {
    let timing = f.timing();
    let faulty = f.faulty_client().await;
    let (other, third) = (f.client().await, f.client().await);
    let name = unique_name("release-lost");
    let lease =
        faulty.locker.acquire(&name, &LockOptions::watchdog(timing.ttl).wait(timing.margin)).await.expect("acquire");

    faulty.link.set(Fault::BlackholeRequests);
    tokio::time::timeout(timing.ttl + timing.margin * 2, lease.lost()).await.expect("the lost signal fires");
    let next = other
        .acquire(&name, &LockOptions::watchdog(timing.ttl).wait(timing.ttl * 2 + timing.margin * 2))
        .await
        .expect("another client gets the lock");
    // The renewals held back reach the backend now, after the new grant.
    faulty.link.restore();
    let released = lease.release().await;
    assert!(matches!(released, Err(LockError::NotHeld { .. })), "the release of a lost lease: {released:?}");
    settled(&faulty.locker, soon(f)).await;

    let holder = other.inspect(&name).await.expect("inspect").holder.expect("the next holder still holds the lock");
    assert_eq!(holder.token, next.token(), "the lock's holder after the lost lease's release");
    still_held(&third, &name, "after the lost lease's release").await;
    assert!(!next.is_lost(), "the next holder lost its lease: {:?}", next.lost_reason());
    next.release().await.expect("the next holder releases");
}
