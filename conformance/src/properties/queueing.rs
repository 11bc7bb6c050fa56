//! Many waiters on one name: a client's own tasks take turns in the order they asked, a
//! waiter that goes away holds nobody up, and a herd of waiters over several clients is
//! served to the last one.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::{Backoff, FencingToken, LockOptions, Locker};

use super::{acquire_recorded, assert_granted_in_order, eventually, release_recorded, unique_name, watchdog};
use crate::fixture::Fixture;
use crate::history::{FencedRegister, History};

/// Default (not fair) options that wait long and, on a polling backend, poll often.
fn waiting(f: &dyn Fixture, wait: Duration) -> LockOptions {
    watchdog(f, wait).backoff(Backoff::new(Duration::from_millis(1), Duration::from_millis(20)))
}

/// Spawns a task of `client` that acquires `name`, records its grant as `(i, token)`
/// and releases.
fn queue_one(
    client: &Arc<dyn Locker>,
    name: &dlock_core::LockName,
    opts: &LockOptions,
    i: usize,
    order: &Arc<Mutex<Vec<(usize, FencingToken)>>>,
) -> tokio::task::JoinHandle<()> {
    let (client, name, opts, order) = (client.clone(), name.clone(), opts.clone(), order.clone());
    tokio::spawn(async move {
        let lease = client.acquire(&name, &opts).await.expect("a queued waiter gets the lock");
        order.lock().unwrap().push((i, lease.token()));
        lease.release().await.expect("release");
    })
}

/// Waits until `client` counts `n` acquires waiting, so that the next one asks later.
async fn until_waiting(f: &dyn Fixture, client: &Arc<dyn Locker>, n: u64) {
    eventually("the waiter is waiting", f.timing().margin, || async { client.stats().waiting == n }).await;
}

/// Five tasks of one client queue, one after the other, behind a holder of the same
/// client, with default options (not `fair`): they are granted in the order they asked,
/// each with a token above the one before, on every backend. A client whose backend
/// grants in any order keeps its own waiters' order itself.
pub async fn local_waiters_are_granted_in_order(f: &dyn Fixture) {
    let client = f.client().await;
    let name = unique_name("local-order");
    let opts = waiting(f, Duration::from_secs(60));
    let held = client.acquire(&name, &opts).await.expect("acquire");

    const WAITERS: usize = 5;
    let order = Arc::new(Mutex::new(vec![(usize::MAX, held.token())]));
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        tasks.push(queue_one(&client, &name, &opts, i, &order));
        until_waiting(f, &client, i as u64 + 1).await;
    }
    held.release().await.expect("release");
    for task in tasks {
        task.await.expect("waiter");
    }
    assert_granted_in_order(&order.lock().unwrap(), WAITERS, "a client's waiters were granted out of order");
}

/// Of three waiters of one client queued behind a holder, the middle one goes away
/// (its task is aborted) while it waits: when the holder lets go, the first and then
/// the third are granted as soon as the lock is free, without waiting for the gone
/// waiter's bound (it had none), and the gone one never holds the lock.
pub async fn cancelled_local_waiter_does_not_hold_up_the_next(f: &dyn Fixture) {
    let client = f.client().await;
    let name = unique_name("local-cancel");
    let opts = waiting(f, Duration::from_secs(300));
    let held = client.acquire(&name, &opts).await.expect("acquire");

    let order = Arc::new(Mutex::new(vec![(usize::MAX, held.token())]));
    let first = queue_one(&client, &name, &opts, 0, &order);
    until_waiting(f, &client, 1).await;
    let gone = queue_one(&client, &name, &opts, 1, &order);
    until_waiting(f, &client, 2).await;
    let third = queue_one(&client, &name, &opts, 2, &order);
    until_waiting(f, &client, 3).await;
    gone.abort();
    assert!(gone.await.expect_err("the middle waiter was aborted").is_cancelled());

    held.release().await.expect("release");
    // Both remaining waiters come within the margin; one the gone waiter held up would
    // wait for its 300 s wait bound.
    let bound = f.timing().margin * 2;
    for task in [first, third] {
        tokio::time::timeout(bound, task).await.expect("a waiter behind a cancelled one was held up").expect("waiter");
    }
    let waiters: Vec<usize> = order.lock().unwrap()[1..].iter().map(|&(i, _)| i).collect();
    assert_eq!(waiters, vec![0, 2], "the cancelled waiter was granted, or the others out of order");
    let lease = client.try_acquire(&name, &opts).await.expect("try_acquire");
    assert!(lease.is_some(), "the cancelled waiter left a hold behind");
}

/// Eight tasks of one client loop acquire, 1 ms hold, release on one name, with default
/// options: they take turns. A task that lets go and asks again finds its neighbours
/// already waiting, so it takes the lock straight back (a retake) in at most a tenth of
/// the grants, instead of starving them while it wins every race.
pub async fn tasks_of_one_client_take_turns(f: &dyn Fixture) {
    const TASKS: usize = 8;
    const ROUNDS: usize = 25;
    let client = f.client().await;
    let name = unique_name("take-turns");
    let opts = waiting(f, Duration::from_secs(120));
    let grants = Arc::new(Mutex::new(Vec::with_capacity(TASKS * ROUNDS)));
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (client, name, opts, grants) = (client.clone(), name.clone(), opts.clone(), grants.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let lease = client.acquire(&name, &opts).await.expect("acquire");
                grants.lock().unwrap().push((task, lease.token()));
                tokio::time::sleep(Duration::from_millis(1)).await;
                lease.release().await.expect("release");
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    let grants = grants.lock().unwrap();
    assert_eq!(grants.len(), TASKS * ROUNDS);
    for pair in grants.windows(2) {
        assert!(pair[1].1 > pair[0].1, "tokens went back between grants: {:?}", pair);
    }
    let retakes = grants.windows(2).filter(|pair| pair[0].0 == pair[1].0).count();
    assert!(
        retakes * 10 <= grants.len(),
        "{retakes} of {} grants went to the task that had just let go: the client's tasks do not take turns",
        grants.len()
    );
}

/// How long a herd's holders keep their leases without renewal: a waiter that sleeps
/// through a release waits about this long for the next look.
const HERD_TTL: Duration = Duration::from_secs(60);

/// The bound on the whole herd: 200 holds of 1 ms and their hand-offs take a few seconds
/// on a loaded machine, and far less than one [`HERD_TTL`].
const HERD_BOUND: Duration = Duration::from_secs(45);

/// 200 waiters on one name, 50 on each of 4 clients, each acquiring once with a 1 ms
/// hold: every one of them gets the lock exactly once (a herd loses and starves nobody),
/// the holds never overlap, tokens rise strictly, and the whole herd is through well
/// within the holders' ttl, so no waiter slept through a release until the holder's
/// lease would have run out.
pub async fn herd_of_waiters_each_get_the_lock_once(f: &dyn Fixture) {
    const CLIENTS: usize = 4;
    const PER_CLIENT: usize = 50;
    let name = unique_name("herd");
    let history = History::new();
    let register = Arc::new(FencedRegister::new(history.clone()));
    let opts = LockOptions::watchdog(HERD_TTL)
        .wait(Duration::from_secs(120))
        .backoff(Backoff::new(Duration::from_millis(1), Duration::from_millis(20)));
    let started = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let client = f.client().await;
        for w in 0..PER_CLIENT {
            let process = c * PER_CLIENT + w;
            let (client, name, opts, history, register) =
                (client.clone(), name.clone(), opts.clone(), history.clone(), register.clone());
            tasks.push(tokio::spawn(async move {
                let lease = acquire_recorded(&*client, &name, &opts, &history, process).await;
                register.write(process, lease.token(), process as u64).expect("the register refused a current holder");
                tokio::time::sleep(Duration::from_millis(1)).await;
                release_recorded(lease, &history, process).await;
            }));
        }
    }
    for task in tasks {
        task.await.expect("a waiter of the herd");
    }
    let took = started.elapsed();
    assert!(
        took < HERD_BOUND,
        "the herd took {took:?}: a waiter slept through a release (a missed wake-up waits out the holder's {HERD_TTL:?} ttl)"
    );
    let report = history.check();
    assert_eq!(report.holds, CLIENTS * PER_CLIENT, "not every waiter held the lock once: {report}");
    assert!(report.is_clean(), "history: {report}");
}
