//! No herd effect: each waiter watches only the node just ahead of it, so a release wakes
//! exactly one waiter however long the queue is. Readers watch the last writer ahead of
//! them (they are all granted when it leaves), and a permit of `n` waits on at most the
//! `n` nodes just ahead of it.

mod common;

use std::sync::{Arc, Mutex};

use common::{ZkFixture, MARGIN, TTL};
use dlock_conformance::properties::{eventually, unique_name};
use dlock_core::{Lease, LockOptions, Locker};

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

/// A writer holds; six readers queue behind it, then a second writer, then a reader. The
/// writer's release wakes the six readers once each and nobody else: the second writer
/// watches the last reader, the late reader watches the second writer. Tokens follow the
/// queue: the second writer's is above every reader's, the late reader's above it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writers_release_wakes_the_readers_behind_it_once_each() {
    dlock_conformance::init_tracing();
    const READERS: usize = 6;
    let fixture = ZkFixture::standalone().await;
    let holder = fixture.zk_client().await;
    let name = unique_name("herd-rw");
    let write = LockOptions::watchdog(TTL).wait(MARGIN * 10).write();
    let read = LockOptions::watchdog(TTL).wait(MARGIN * 10).read();
    let held = holder.acquire(&name, &write).await.expect("write");

    let queued = |waiters: usize| {
        let (holder, name) = (&holder, &name);
        eventually("the waiter is queued", MARGIN, move || async move {
            holder.inspect(name).await.map(|info| info.waiters == Some(waiters)).unwrap_or(false)
        })
    };
    let spawn = |client: dlock_zk::ZkLocker, opts: LockOptions| {
        let name = name.clone();
        tokio::spawn(async move { client.acquire(&name, &opts).await.expect("a queued waiter is granted") })
    };
    let mut readers = Vec::new();
    for i in 0..READERS {
        let client = fixture.zk_client().await;
        readers.push((client.clone(), spawn(client, read.clone())));
        queued(i + 1).await;
    }
    let second_writer = fixture.zk_client().await;
    let writing = spawn(second_writer.clone(), write.clone());
    queued(READERS + 1).await;
    let late_reader = fixture.zk_client().await;
    let late = spawn(late_reader.clone(), read.clone());
    queued(READERS + 2).await;
    let deleted_before = metric(&fixture, "zk_sum_node_deleted_watch_count");
    let children_before = metric(&fixture, "zk_sum_node_children_watch_count");

    let writer_token = held.token();
    held.release().await.expect("release");
    let mut leases: Vec<Lease> = Vec::new();
    for (_, task) in readers.iter_mut() {
        leases.push(task.await.expect("reader"));
    }
    assert!(leases.iter().all(|l| l.token() > writer_token), "a reader's token is below the writer's");
    let per_reader: Vec<u64> = readers.iter().map(|(c, _)| c.backend().watch_events()).collect();
    assert_eq!(per_reader, vec![1; READERS], "watch notifications per reader");
    assert_eq!(second_writer.backend().watch_events(), 0, "the waiting writer was woken");
    assert_eq!(late_reader.backend().watch_events(), 0, "the reader behind the waiting writer was woken");
    assert_eq!(
        metric(&fixture, "zk_sum_node_deleted_watch_count") - deleted_before,
        READERS as u64,
        "watches the server fired on the writer's release"
    );
    assert_eq!(holder.inspect(&name).await.expect("inspect").waiters, Some(2), "the writer and the late reader wait");

    let most_reader = leases.iter().map(|l| l.token()).max().expect("readers");
    for lease in leases {
        lease.release().await.expect("release");
    }
    let writer = writing.await.expect("writer");
    assert!(writer.token() > most_reader, "the second writer's token is not above the readers'");
    assert!(!late.is_finished(), "a reader was granted beside the writer");
    let second_token = writer.token();
    writer.release().await.expect("release");
    let late = late.await.expect("late reader");
    assert!(late.token() > second_token);
    late.release().await.expect("release");
    assert_eq!(metric(&fixture, "zk_sum_node_children_watch_count") - children_before, 0, "child watches fired");
}

/// Two permits are out and eight waiters queue for them, each returning its permit as
/// soon as it has it. Each waiter watches the two nodes just ahead of it, so the ten
/// returns wake at most two waiters each, never the queue, and no child watch fires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returned_permit_wakes_at_most_n_waiters() {
    dlock_conformance::init_tracing();
    const PERMITS: u32 = 2;
    const WAITERS: usize = 8;
    let fixture = ZkFixture::standalone().await;
    let name = unique_name("herd-sem");
    let opts = LockOptions::watchdog(TTL).wait(MARGIN * 10).permits(PERMITS);
    let holder = fixture.zk_client().await;
    let mut held = Vec::new();
    for _ in 0..PERMITS {
        held.push(holder.acquire(&name, &opts).await.expect("permit"));
    }
    let out = Arc::new(Mutex::new((0u32, 0u32)));
    let mut clients = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let client = fixture.zk_client().await;
        let (c, queued_name, opts, out) = (client.clone(), name.clone(), opts.clone(), out.clone());
        tasks.push(tokio::spawn(async move {
            let lease = c.acquire(&queued_name, &opts).await.expect("a queued waiter gets a permit");
            {
                let mut out = out.lock().unwrap();
                out.0 += 1;
                out.1 = out.1.max(out.0);
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            out.lock().unwrap().0 -= 1;
            lease.release().await.expect("release");
        }));
        eventually("the waiter is queued", MARGIN, || async {
            holder.inspect(&name).await.map(|info| info.waiters == Some(i + 1)).unwrap_or(false)
        })
        .await;
        clients.push(client);
    }
    assert!(clients.iter().all(|c| c.backend().watch_events() == 0), "a waiter was woken before any return");
    let children_before = metric(&fixture, "zk_sum_node_children_watch_count");
    for lease in held {
        lease.release().await.expect("release");
    }
    for task in tasks {
        task.await.expect("waiter");
    }
    let (_, most) = *out.lock().unwrap();
    assert!(most <= PERMITS, "{most} waiters held a permit at once");
    let wakes: Vec<u64> = clients.iter().map(|c| c.backend().watch_events()).collect();
    let returns = (PERMITS as usize + WAITERS) as u64;
    assert!(wakes.iter().all(|&w| w >= 1), "a waiter was granted without a wake-up: {wakes:?}");
    assert!(wakes.iter().sum::<u64>() <= u64::from(PERMITS) * returns, "a herd: {wakes:?}");
    assert_eq!(metric(&fixture, "zk_sum_node_children_watch_count") - children_before, 0, "child watches fired");
}
