//! A waiter whose own lease ends while it is blocked must not take the lock for that
//! when the key ahead of it goes (the bug Jepsen found in etcd's own lock, etcd#11456):
//! it queues again, behind whoever was behind it.

mod common;

use std::time::Duration;

use common::EtcdFixture;
use dlock_conformance::properties::{eventually, unique_name};
use dlock_conformance::Link;
use dlock_core::{LockName, LockOptions, Locker};
use dlock_etcd::EtcdLocker;
use etcd_client::{GetOptions, SortOrder, SortTarget};

const MARGIN: Duration = Duration::from_secs(8);

fn opts() -> LockOptions {
    LockOptions::watchdog(Duration::from_secs(2)).wait(Duration::from_secs(60))
}

/// The keys of the lock's queue, oldest first, with their leases.
async fn queue(fixture: &EtcdFixture, admin: &EtcdLocker, name: &LockName) -> Vec<(Vec<u8>, i64)> {
    let dir = dlock_etcd::lock_dir(admin.backend().prefix(), name);
    let mut etcd = fixture.etcd().await;
    let all = GetOptions::new().with_prefix().with_sort(SortTarget::Create, SortOrder::Ascend);
    let resp = etcd.get(dir, Some(all)).await.expect("read the queue");
    resp.kvs().iter().map(|kv| (kv.key().to_vec(), kv.lease())).collect()
}

async fn queued(admin: &EtcdLocker, name: &LockName, waiters: usize) -> bool {
    admin.inspect(name).await.is_ok_and(|info| info.waiters == Some(waiters))
}

/// The waiter's lease is revoked while it waits: when the holder releases, the waiter
/// that was behind it gets the lock, and the revoked waiter queues again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_whose_lease_was_revoked_does_not_take_the_lock() {
    dlock_conformance::init_tracing();
    let fixture = EtcdFixture::start().await;
    let (admin, holder, first, second) =
        (fixture.locker().await, fixture.locker().await, fixture.locker().await, fixture.locker().await);
    let name = unique_name("revoked-waiter");

    let held = holder.acquire(&name, &opts()).await.expect("acquire");
    let first_wait = {
        let (first, name) = (first.clone(), name.clone());
        tokio::spawn(async move { first.acquire(&name, &opts()).await })
    };
    eventually("the first waiter is queued", MARGIN, || queued(&admin, &name, 1)).await;
    let second_wait = {
        let (second, name) = (second.clone(), name.clone());
        tokio::spawn(async move { second.acquire(&name, &opts()).await })
    };
    eventually("the second waiter is queued", MARGIN, || queued(&admin, &name, 2)).await;

    // The first waiter's lease ends (an operator revokes it): its key goes with it.
    let keys = queue(&fixture, &admin, &name).await;
    let (_, first_lease) = keys[1];
    fixture.etcd().await.lease_revoke(first_lease).await.expect("revoke the first waiter's lease");
    eventually("the revoked waiter's key is gone", MARGIN, || queued(&admin, &name, 1)).await;

    second_waiter_wins_and_first_requeues(&admin, &name, held, first_wait, second_wait, "revoked").await;
}

/// The waiter is cut off (its traffic frozen) until its lease expires on the server; when
/// it comes back and the holder releases, it does not report the lock acquired: the
/// waiter behind it holds the lock, and it queues again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_whose_lease_expired_while_blocked_does_not_take_the_lock() {
    dlock_conformance::init_tracing();
    let fixture = EtcdFixture::start().await;
    let (admin, holder, second) = (fixture.locker().await, fixture.locker().await, fixture.locker().await);
    let (first, link) = fixture.proxied().await;
    let name = unique_name("expired-waiter");

    let held = holder.acquire(&name, &opts()).await.expect("acquire");
    let first_wait = {
        let (first, name) = (first.clone(), name.clone());
        tokio::spawn(async move { first.acquire(&name, &opts()).await })
    };
    eventually("the first waiter is queued", MARGIN, || queued(&admin, &name, 1)).await;
    let second_wait = {
        let (second, name) = (second.clone(), name.clone());
        tokio::spawn(async move { second.acquire(&name, &opts()).await })
    };
    eventually("the second waiter is queued", MARGIN, || queued(&admin, &name, 2)).await;
    let first_key = queue(&fixture, &admin, &name).await[1].0.clone();

    // Frozen, the first waiter cannot keep its lease alive: the server expires it.
    link.blackhole();
    eventually("the frozen waiter's lease expires on the server", MARGIN, || async {
        !queue(&fixture, &admin, &name).await.iter().any(|(key, _)| *key == first_key)
    })
    .await;
    link.restore();

    second_waiter_wins_and_first_requeues(&admin, &name, held, first_wait, second_wait, "expired").await;
}

type Waiting = tokio::task::JoinHandle<Result<dlock_core::Lease, dlock_core::LockError>>;

/// The holder releases: the second waiter gets the lock, the first (whose key went while
/// it waited) queues again instead of reporting the lock acquired, and gets it in its new
/// turn with a larger token.
async fn second_waiter_wins_and_first_requeues(
    admin: &EtcdLocker,
    name: &LockName,
    held: dlock_core::Lease,
    first_wait: Waiting,
    second_wait: Waiting,
    why: &str,
) {
    held.release().await.expect("release");
    let second_lease = second_wait.await.expect("task").expect("the second waiter gets the lock");
    // The first waiter woke with the release too, found its key gone and queued again.
    eventually(&format!("the {why} waiter queues again (or takes the lock)"), MARGIN, || async {
        first_wait.is_finished() || queued(admin, name, 1).await
    })
    .await;
    assert!(!first_wait.is_finished(), "the {why} waiter reported the lock acquired while another holds it");
    let info = admin.inspect(name).await.expect("inspect");
    assert_eq!(info.holder.map(|h| h.token), Some(second_lease.token()));

    let second_token = second_lease.token();
    second_lease.release().await.expect("release");
    let first_lease = first_wait.await.expect("task").expect("the first waiter gets the lock in its new turn");
    assert!(first_lease.token() > second_token);
    first_lease.release().await.expect("release");
}
