//! Keys left behind by failed requests do not block a lock while the client's lease lives
//! on (kept alive by its other locks).

mod common;

use std::time::Duration;

use common::EtcdFixture;
use dlock_conformance::properties::{eventually, unique_name};
use dlock_conformance::Link;
use dlock_core::{LockError, LockOptions, Locker};

const MARGIN: Duration = Duration::from_secs(8);

/// A release that cannot reach etcd fails, and the key is deleted once etcd is back,
/// although another lock keeps the same lease alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_release_is_finished_in_the_background() {
    dlock_conformance::init_tracing();
    let fixture = EtcdFixture::start().await;
    let (client, link) = fixture.proxied().await;
    let other = fixture.locker().await;
    let opts = LockOptions::watchdog(Duration::from_secs(30)).wait(MARGIN);
    let (released, kept) = (unique_name("release-fails"), unique_name("keeps-the-lease"));
    let lease = client.acquire(&released, &opts).await.expect("acquire");
    let keeper = client.acquire(&kept, &opts).await.expect("acquire on the same lease");

    link.cut();
    let failed = lease.release().await;
    assert!(matches!(failed, Err(LockError::Unavailable { .. })), "release while cut off: {failed:?}");
    link.restore();

    // Far sooner than the 30 s the lease would take to expire.
    let next = other.acquire(&released, &LockOptions::watchdog(Duration::from_secs(2)).wait(MARGIN)).await;
    let next = next.expect("the lock is free again once etcd is reachable");
    next.release().await.expect("release");
    assert!(!keeper.is_lost());
    keeper.release().await.expect("release");
}

/// A waiter that gives up (its wait bound passes) while etcd cannot be reached leaves no
/// key in the queue once etcd is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_that_gave_up_while_cut_off_leaves_the_queue() {
    dlock_conformance::init_tracing();
    let fixture = EtcdFixture::start().await;
    let (client, link) = fixture.proxied().await;
    let (holder, admin) = (fixture.locker().await, fixture.locker().await);
    let opts = LockOptions::watchdog(Duration::from_secs(30));
    let (name, kept) = (unique_name("gave-up"), unique_name("keeps-the-lease"));
    let held = holder.acquire(&name, &opts.clone().wait(MARGIN)).await.expect("acquire");
    let keeper = client.acquire(&kept, &opts.clone().wait(MARGIN)).await.expect("acquire");

    let waiting = {
        let (client, name, opts) = (client.clone(), name.clone(), opts.clone().wait(Duration::from_secs(2)));
        tokio::spawn(async move { client.acquire(&name, &opts).await })
    };
    eventually("the waiter is queued", MARGIN, || async {
        admin.inspect(&name).await.is_ok_and(|info| info.waiters == Some(1))
    })
    .await;
    link.cut();
    // The acquire gives its place up (and fails to delete its key) before it returns.
    let gave_up = waiting.await.expect("task");
    assert!(matches!(gave_up, Err(LockError::Timeout { .. } | LockError::Unavailable { .. })), "{gave_up:?}");
    link.restore();

    eventually("the abandoned key leaves the queue", MARGIN, || async {
        admin.inspect(&name).await.is_ok_and(|info| info.waiters == Some(0))
    })
    .await;
    held.release().await.expect("release");
    keeper.release().await.expect("release");
}
