//! No herd effect: each waiter watches only the node just ahead of it, so a release wakes
//! exactly one waiter however long the queue is.

mod common;

use std::sync::{Arc, Mutex};

use common::{ZkFixture, MARGIN, TTL};
use dlock_conformance::properties::{eventually, unique_name};
use dlock_core::{LockOptions, Locker};

fn metric(fixture: &ZkFixture, key: &str) -> u64 {
    let metrics = dlock_testkit::supervisor::zookeeper::monitor(fixture.addr()).expect("mntr");
    metrics.get(key).unwrap_or_else(|| panic!("mntr has no {key}")).parse().expect("a number")
}

/// 20 waiters queue on one lock, each on its own client. The holder releases, and each
/// waiter releases as soon as it gets the lock: the 21 releases wake each waiter exactly
/// once, in queue order. The server agrees: every deletion of a lock node triggered one
/// watch, and no child watch (the herd's tool) fired at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_release_wakes_exactly_one_waiter() {
    dlock_conformance::init_tracing();
    const WAITERS: usize = 20;
    let fixture = ZkFixture::standalone().await;
    let holder = fixture.zk_client().await;
    let name = unique_name("herd");
    let opts = LockOptions::watchdog(TTL).wait(MARGIN * 10);
    let held = holder.acquire(&name, &opts).await.expect("acquire");

    let order = Arc::new(Mutex::new(Vec::new()));
    let mut clients = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let client = fixture.zk_client().await;
        let (c, queued_name, opts, order) = (client.clone(), name.clone(), opts.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let lease = c.acquire(&queued_name, &opts).await.expect("a queued waiter gets the lock");
            order.lock().unwrap().push(i);
            lease.release().await.expect("release");
        }));
        eventually("the waiter is queued", MARGIN, || async {
            holder.inspect(&name).await.map(|info| info.waiters == Some(i + 1)).unwrap_or(false)
        })
        .await;
        clients.push(client);
    }
    assert!(clients.iter().all(|c| c.backend().watch_events() == 0), "a waiter was woken before any release");
    let deleted_before = metric(&fixture, "zk_sum_node_deleted_watch_count");
    let children_before = metric(&fixture, "zk_sum_node_children_watch_count");

    held.release().await.expect("release");
    for task in tasks {
        task.await.expect("waiter");
    }
    assert_eq!(*order.lock().unwrap(), (0..WAITERS).collect::<Vec<_>>(), "grants out of queue order");
    let per_waiter: Vec<u64> = clients.iter().map(|c| c.backend().watch_events()).collect();
    assert_eq!(per_waiter, vec![1; WAITERS], "watch notifications per waiter");
    assert_eq!(
        metric(&fixture, "zk_sum_node_deleted_watch_count") - deleted_before,
        WAITERS as u64,
        "watches the server fired on the 21 deletions"
    );
    assert_eq!(metric(&fixture, "zk_sum_node_children_watch_count") - children_before, 0, "child watches fired");
}
