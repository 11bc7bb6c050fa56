//! Many clients on one lock: exclusion, wake-up, fairness.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock_core::{Backoff, LockOptions};

use super::{
    acquire_recorded, assert_granted_in_order, assert_unsupported, eventually, release_recorded, unique_name, watchdog,
};
use crate::fixture::Fixture;
use crate::history::{FencedRegister, History};

const WORKERS: usize = 8;
const ITERATIONS: usize = 50;

/// 8 clients x 50 iterations of read-sleep-write on a shared counter under the lock:
/// the count is exact, the history shows no overlapping holds and strictly increasing
/// tokens, and the fenced register accepted every write.
pub async fn mutual_exclusion(f: &dyn Fixture) {
    let name = unique_name("mutual-exclusion");
    let history = History::new();
    let register = Arc::new(FencedRegister::new(history.clone()));
    let counter = Arc::new(AtomicU64::new(0));
    let opts = LockOptions::watchdog(f.timing().ttl)
        .wait(Duration::from_secs(120))
        .backoff(Backoff::new(Duration::from_millis(1), Duration::from_millis(20)));

    let mut workers = Vec::new();
    for process in 0..WORKERS {
        let client = f.client().await;
        let (name, history, register, counter, opts) =
            (name.clone(), history.clone(), register.clone(), counter.clone(), opts.clone());
        workers.push(tokio::spawn(async move {
            for _ in 0..ITERATIONS {
                let lease = acquire_recorded(&*client, &name, &opts, &history, process).await;
                let seen = counter.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1)).await;
                counter.store(seen + 1, Ordering::SeqCst);
                register.write(process, lease.token(), seen + 1).expect("the register refused a current holder");
                release_recorded(lease, &history, process).await;
            }
        }));
    }
    for worker in workers {
        worker.await.expect("worker");
    }
    let report = history.check();
    assert_eq!(report.holds, WORKERS * ITERATIONS);
    assert!(report.is_clean(), "history: {report}");
    assert_eq!(counter.load(Ordering::SeqCst), (WORKERS * ITERATIONS) as u64, "lost updates under the lock");
    assert_eq!(register.value(), (WORKERS * ITERATIONS) as u64);
}

/// A waiter wakes promptly when the holder releases. On a backend that claims
/// notification, the hand-off beats both the holder's 30 s ttl and a 10 s backoff by
/// far (so it cannot be polling); on a polling backend it comes within one backoff step.
pub async fn waiter_wakes_on_release(f: &dyn Fixture) {
    let margin = f.timing().margin;
    let (a, b) = (f.client().await, f.client().await);
    let notify = b.capabilities().notify;
    let name = unique_name("wake-up");
    let held = a.acquire(&name, &LockOptions::watchdog(Duration::from_secs(30)).wait(margin)).await.expect("acquire");

    let poll = if notify {
        Backoff::new(Duration::from_secs(10), Duration::from_secs(20))
    } else {
        Backoff::new(Duration::from_millis(20), Duration::from_millis(100))
    };
    let opts = LockOptions::watchdog(f.timing().ttl).wait(Duration::from_secs(10)).backoff(poll);
    let waiter = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move {
            let lease = b.acquire(&name, &opts).await;
            (Instant::now(), lease)
        })
    };
    eventually("the waiter is waiting", margin, || async { b.stats().waiting == 1 }).await;

    held.release().await.expect("release");
    let released = Instant::now();
    let (granted, lease) = waiter.await.expect("waiter task");
    let lease = lease.expect("the waiter gets the lock");
    let handoff = granted.saturating_duration_since(released);
    let bound = if notify { margin.min(Duration::from_secs(5)) } else { poll.max() + margin };
    assert!(
        handoff < bound,
        "hand-off took {handoff:?} (bound {bound:?}; backend claims notify = {notify}): the waiter was not woken by the release"
    );
    lease.release().await.expect("release");
}

/// Grants follow request order exactly when fairness is asked for (or the acquire fails
/// with `Unsupported` on a backend that does not claim FIFO), each waiter on a client of
/// its own.
pub async fn fair_grants_follow_request_order(f: &dyn Fixture) {
    fair_order(f, false).await
}

/// The same, with every waiter a task of the holder's one client: hand-offs inside a
/// client keep the queue's order, and each grant's token is above the one before.
pub async fn fair_order_holds_within_one_client(f: &dyn Fixture) {
    fair_order(f, true).await
}

async fn fair_order(f: &dyn Fixture, one_client: bool) {
    let margin = f.timing().margin;
    let holder = f.client().await;
    let name = unique_name("fair");
    let opts = watchdog(f, Duration::from_secs(60)).fair(true);
    if !holder.capabilities().fifo {
        assert_unsupported("a fair acquire", holder.acquire(&name, &opts).await);
        return;
    }
    let held = holder.acquire(&name, &opts).await.expect("acquire");

    const WAITERS: usize = 5;
    let order = Arc::new(Mutex::new(vec![(usize::MAX, held.token())]));
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let client = if one_client { holder.clone() } else { f.client().await };
        let (queued_name, opts, order) = (name.clone(), opts.clone(), order.clone());
        let c = client.clone();
        tasks.push(tokio::spawn(async move {
            let lease = c.acquire(&queued_name, &opts).await.expect("a queued waiter gets the lock");
            order.lock().unwrap().push((i, lease.token()));
            lease.release().await.expect("release");
        }));
        // Queue them one by one so the request order is known.
        let waiting = if one_client { i as u64 + 1 } else { 1 };
        eventually("the waiter is queued", margin, || async {
            let queued = if client.capabilities().queue_length {
                holder.inspect(&name).await.map(|info| info.waiters == Some(i + 1)).unwrap_or(false)
            } else {
                true
            };
            queued && client.stats().waiting == waiting
        })
        .await;
    }
    held.release().await.expect("release");
    for task in tasks {
        task.await.expect("waiter");
    }
    assert_granted_in_order(&order.lock().unwrap(), WAITERS, "grants out of request order");
}
