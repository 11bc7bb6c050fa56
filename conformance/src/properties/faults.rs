//! Faults: holders cut off or frozen, backends unreachable or restarted.

use std::time::{Duration, Instant};

use dlock_core::{LockError, LockOptions, LostReason, MAX_PLACE_LAPSE};

use super::{assert_unsupported, eventually, unique_name, watchdog};
use crate::fixture::{Faults, Restart};
use crate::history::{FencedRegister, History, Op, Phase};

/// A holder whose connection is cut frees the lock within ttl plus a margin; its lost
/// signal fires, and its validity has ended by the time another client is granted.
pub async fn vanished_holder_frees_within_ttl(f: &dyn Faults) {
    let timing = f.timing();
    let faulty = f.faulty_client().await;
    let other = f.client().await;
    let name = unique_name("vanish");
    let lease = faulty.locker.acquire(&name, &watchdog(f, timing.margin)).await.expect("acquire");

    let cut_at = Instant::now();
    faulty.link.cut();
    let next = other
        .acquire(&name, &LockOptions::watchdog(timing.ttl).wait(timing.ttl + timing.margin * 2))
        .await
        .expect("the lock of a vanished holder frees");
    let freed_after = cut_at.elapsed();
    assert!(
        lease.remaining().is_zero(),
        "another client was granted while the cut-off holder still counted itself valid"
    );
    assert!(freed_after < timing.ttl + timing.margin, "freed {freed_after:?} after the cut; ttl is {:?}", timing.ttl);
    assert!(next.token() > lease.token());
    let reason =
        tokio::time::timeout(timing.margin, lease.lost()).await.expect("the cut-off holder's lost signal fires");
    assert!(
        matches!(
            reason,
            LostReason::BackendUnavailable
                | LostReason::RenewalFailed
                | LostReason::SessionExpired
                | LostReason::Expired
        ),
        "lost reason {reason:?}"
    );
    next.release().await.expect("release");
}

/// A backend that cannot be reached gives `Unavailable` within the configured timeout
/// (plus a margin), never a hang, for acquire, try_acquire and inspect; each error names
/// the server it could not reach (the client's target).
pub async fn unreachable_backend_fails_fast(f: &dyn Faults) {
    let margin = f.timing().margin;
    let timeout = Duration::from_millis(500);
    let bound = timeout * 2 + margin;
    let name = unique_name("unreachable");
    let started = Instant::now();
    let client = match f.unreachable_client(timeout).await {
        Ok(client) => client,
        Err(err @ LockError::Unavailable { .. }) => {
            assert!(started.elapsed() < bound, "connecting failed only after {:?}", started.elapsed());
            // The error says where: an operator reading it knows which server to look at.
            let target = err.target().unwrap_or_else(|| panic!("the error names no server: {err}"));
            assert!(!target.is_empty() && err.to_string().contains(target), "{err}");
            return;
        }
        Err(other) => panic!("connecting to an unreachable backend: expected Unavailable, got {other}"),
    };
    let names_the_server = |what: &str, err: LockError| {
        assert_eq!(err.target(), Some(client.target().as_str()), "{what}: the error names another server: {err}");
        assert!(err.to_string().contains(&client.target()), "{what}: {err}");
    };
    let opts = LockOptions::new().wait(Duration::from_secs(60));
    let started = Instant::now();
    let acquired = client.acquire(&name, &opts).await;
    assert!(matches!(acquired, Err(LockError::Unavailable { .. })), "acquire: {acquired:?}");
    assert!(started.elapsed() < bound, "acquire failed only after {:?}", started.elapsed());
    if let Err(err) = acquired {
        names_the_server("acquire", err);
    }
    let started = Instant::now();
    let tried = client.try_acquire(&name, &opts).await;
    assert!(matches!(tried, Err(LockError::Unavailable { .. })), "try_acquire: {tried:?}");
    assert!(started.elapsed() < bound, "try_acquire failed only after {:?}", started.elapsed());
    if let Err(err) = tried {
        names_the_server("try_acquire", err);
    }
    let started = Instant::now();
    let inspected = client.inspect(&name).await;
    assert!(matches!(inspected, Err(LockError::Unavailable { .. })), "inspect: {inspected:?}");
    assert!(started.elapsed() < bound, "inspect failed only after {:?}", started.elapsed());
    if let Err(err) = inspected {
        names_the_server("inspect", err);
    }
}

/// A holder frozen (its link blackholed) past its ttl loses the lock to another client,
/// and when it wakes up its write to the fenced resource is refused.
pub async fn paused_holder_is_fenced(f: &dyn Faults) {
    let timing = f.timing();
    let history = History::new();
    let register = FencedRegister::new(history.clone());
    let paused = f.faulty_client().await;
    let other = f.client().await;
    let name = unique_name("paused");

    let old = paused.locker.acquire(&name, &watchdog(f, timing.margin)).await.expect("acquire");
    history.record(0, Op::Acquire, Phase::Ok, Some(old.token()));
    register.write(0, old.token(), 1).expect("the first holder writes");

    paused.link.blackhole();
    let new = other
        .acquire(&name, &LockOptions::watchdog(timing.ttl).wait(timing.ttl + timing.margin * 2))
        .await
        .expect("another client gets the lock of the frozen holder");
    // The frozen holder's belief in its lease must have ended before this grant.
    assert!(old.remaining().is_zero(), "the frozen holder still counted itself valid when another was granted");
    history.record(0, Op::Lost, Phase::Ok, None);
    history.record(1, Op::Acquire, Phase::Ok, Some(new.token()));
    assert!(new.token() > old.token());
    register.write(1, new.token(), 2).expect("the new holder writes");

    // The frozen holder resumes, unaware, and writes with its old token.
    let stale = register.write(0, old.token(), 3);
    assert!(stale.is_err(), "the fenced register accepted a write from the superseded holder");
    assert_eq!(register.value(), 2);
    let lost = tokio::time::timeout(timing.margin, old.lost()).await.expect("the frozen holder's lost signal fires");
    assert_ne!(lost, LostReason::Stolen, "the frozen holder could not have seen the new holder");

    paused.link.restore();
    history.record(1, Op::Release, Phase::Invoke, None);
    new.release().await.expect("release");
    let report = history.check();
    assert!(report.is_clean(), "{report}");
}

/// The backend is killed and restarted while a lock is held: the holder's lost signal
/// fires, calls fail with `Unavailable` (no hang), the lock is usable again after the
/// restart, and its tokens keep increasing.
pub async fn backend_restart(f: &dyn Restart) {
    let timing = f.timing();
    let (a, b) = (f.client().await, f.client().await);
    let name = unique_name("restart");
    let lease = a.acquire(&name, &watchdog(f, timing.margin)).await.expect("acquire");
    let before = lease.token();

    f.stop_backend().await;
    let started = Instant::now();
    let denied = b.acquire(&name, &LockOptions::watchdog(timing.ttl).wait(Duration::from_secs(60))).await;
    assert!(
        matches!(denied, Err(LockError::Unavailable { .. })),
        "acquire while the backend is down: expected Unavailable, got {denied:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(30), "the failure took {:?}", started.elapsed());
    let reason = tokio::time::timeout(timing.ttl + timing.margin * 2, lease.lost())
        .await
        .expect("the holder's lost signal fires while the backend is down");
    assert!(
        matches!(reason, LostReason::BackendUnavailable | LostReason::RenewalFailed | LostReason::SessionExpired),
        "lost reason while the backend is down: {reason:?}"
    );
    drop(lease);

    f.start_backend().await;
    // Clients reconnect on their own schedule; retry until one acquire goes through.
    let give_up = Instant::now() + timing.ttl * 2 + timing.margin * 5;
    let after = loop {
        match b.acquire(&name, &LockOptions::watchdog(timing.ttl).wait(timing.margin)).await {
            Ok(lease) => break lease,
            Err(e) => {
                assert!(Instant::now() < give_up, "the lock is not usable again after the restart: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert!(
        after.token() > before,
        "token {} after the restart, {before} before: the fence counter went back",
        after.token()
    );
    after.release().await.expect("release");
}

/// A waiter that died (its link cut) while first in line keeps a free lock from the
/// waiters behind it for no longer than a waiter's place lasts
/// ([`MAX_PLACE_LAPSE`]), however long the lease it asked for: at the head of a fair
/// queue, and as a waiting writer that keeps new readers out.
pub async fn dead_waiter_gives_up_its_place_soon(f: &dyn Faults) {
    let timing = f.timing();
    let (holder_client, next_client) = (f.client().await, f.client().await);
    let caps = holder_client.capabilities();
    // Far beyond the bound: a place that lasted as long as this lease would fail the test.
    let long = Duration::from_secs(3600);
    let bound = MAX_PLACE_LAPSE * 2 + timing.op_timeout + timing.margin;
    let waits = |faulty: &crate::fixture::FaultyClient| {
        let locker = faulty.locker.clone();
        async move { locker.stats().waiting > 0 }
    };

    let name = unique_name("dead-head");
    let fair = |opts: LockOptions| opts.fair(true);
    if caps.fifo {
        let faulty = f.faulty_client().await;
        let holder = holder_client.acquire(&name, &fair(watchdog(f, Duration::ZERO))).await.expect("acquire");
        let dying = tokio::spawn({
            let (locker, name) = (faulty.locker.clone(), name.clone());
            async move { locker.acquire(&name, &fair(LockOptions::fixed(long).wait(long))).await }
        });
        eventually("the waiter that will die waits", timing.margin, || waits(&faulty)).await;
        let behind = tokio::spawn({
            let (locker, name) = (next_client.clone(), name.clone());
            async move { locker.acquire(&name, &fair(LockOptions::watchdog(long).wait(long))).await }
        });
        eventually("the next waiter queues behind it", timing.margin, || {
            let next = next_client.clone();
            async move { next.stats().waiting > 0 }
        })
        .await;
        let died_at = Instant::now();
        faulty.link.cut();
        let holder_token = holder.token();
        holder.release().await.expect("release");
        let next = tokio::time::timeout(bound + timing.margin, behind)
            .await
            .unwrap_or_else(|_| panic!("a dead head of the queue kept a free lock for more than {bound:?}"))
            .expect("join")
            .expect("the waiter behind a dead head is granted");
        let after = died_at.elapsed();
        assert!(after < bound, "granted {after:?} after the head of the queue died; a place lasts {MAX_PLACE_LAPSE:?}");
        assert!(next.token() > holder_token);
        next.release().await.expect("release");
        assert!(dying.await.expect("join").is_err(), "the cut-off waiter was granted");
    } else {
        assert_unsupported("a fair acquire", holder_client.try_acquire(&name, &fair(LockOptions::new())).await);
    }

    let name = unique_name("dead-writer");
    if caps.shared {
        let faulty = f.faulty_client().await;
        let reader = holder_client.acquire(&name, &watchdog(f, Duration::ZERO).read()).await.expect("read");
        let dying = tokio::spawn({
            let (locker, name) = (faulty.locker.clone(), name.clone());
            async move { locker.acquire(&name, &LockOptions::fixed(long).wait(long).write()).await }
        });
        eventually("the writer that will die waits", timing.margin, || waits(&faulty)).await;
        let died_at = Instant::now();
        faulty.link.cut();
        let joined = next_client
            .acquire(&name, &LockOptions::watchdog(long).wait(bound + timing.margin).read())
            .await
            .expect("a reader is let in once the dead writer's place lapsed");
        let after = died_at.elapsed();
        assert!(after < bound, "a dead writer kept readers out for {after:?}; a place lasts {MAX_PLACE_LAPSE:?}");
        assert!(!reader.is_lost(), "the first reader lost its hold");
        joined.release().await.expect("release");
        reader.release().await.expect("release");
        assert!(dying.await.expect("join").is_err(), "the cut-off writer was granted");
    } else {
        assert_unsupported("a reader", holder_client.try_acquire(&name, &LockOptions::new().read()).await);
    }
}
