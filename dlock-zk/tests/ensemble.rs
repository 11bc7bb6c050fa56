//! A three-member ensemble whose links between members run through fault proxies, so a
//! test can cut one follower off from the leader while its clients still reach it.

use std::time::{Duration, Instant};

use dlock_conformance::properties::unique_name;
use dlock_conformance::Fault;
use dlock_core::{LockOptions, Locker};
use dlock_testkit::supervisor::zookeeper::{ZooKeeperConfig, ZooKeeperEnsemble};
use dlock_zk::{ConnectConfig, ZkConfig};

const MEMBERS: usize = 3;

fn config(ensemble: &ZooKeeperEnsemble, member: usize) -> ZkConfig {
    ZkConfig::from_url(&format!("zk://{}", ensemble.addr(member)))
        .expect("config")
        .with_op_timeout(Duration::from_secs(2))
        .with_connect_timeout(Duration::from_secs(5))
}

/// A holder whose follower is cut off from the leader (the follower still answers reads
/// from its stale tree until it notices, after `syncLimit` ticks) learns of its loss
/// before a waiter on the majority side is granted: only answers that went through the
/// leader confirm its session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_behind_a_partitioned_follower_learns_first() {
    dlock_conformance::init_tracing();
    let ensemble = ZooKeeperEnsemble::start_linked(MEMBERS, &ZooKeeperConfig::default()).await.expect("ensemble");
    let leader = tokio::task::block_in_place(|| ensemble.leader()).expect("a leader");
    let follower = (leader + 1) % MEMBERS;
    let majority = (leader + 2) % MEMBERS;

    let holder = dlock_zk::connect(config(&ensemble, follower)).await.expect("holder connects to its follower");
    let waiter = dlock_zk::connect(config(&ensemble, majority)).await.expect("waiter connects to the majority");
    let name = unique_name("partitioned-follower");
    let ttl = Duration::from_secs(4);
    let lease = holder.acquire(&name, &LockOptions::watchdog(ttl).wait(Duration::from_secs(5))).await.expect("acquire");

    let queued = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move {
            let lease = waiter.acquire(&name, &LockOptions::watchdog(ttl).wait(ttl * 6)).await;
            (Instant::now(), lease)
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while waiter.inspect(&name).await.ok().and_then(|info| info.waiters) != Some(1) {
        assert!(Instant::now() < deadline, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let cut = Instant::now();
    ensemble.fault_between(follower, leader, Fault::Blackhole).expect("links");
    let handle = lease.handle();
    let lost = tokio::spawn(async move {
        let reason = handle.lost().await;
        (Instant::now(), reason)
    });
    let (granted_at, granted) = queued.await.expect("waiter task");
    let granted = granted.expect("the waiter on the majority side gets the lock");
    let (lost_at, reason) = tokio::time::timeout(Duration::from_secs(1), lost)
        .await
        .expect("the holder's lost signal fired by the time the waiter was granted")
        .expect("lost task");
    assert!(
        lost_at < granted_at,
        "the waiter was granted {:?} after the cut, before the holder learned ({reason}) at {:?}",
        granted_at - cut,
        lost_at - cut
    );
    assert!(granted.token() > lease.token());
    granted.release().await.expect("release");
    ensemble.heal();
}
