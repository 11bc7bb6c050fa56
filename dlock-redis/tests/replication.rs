//! A master with a replica: replica acknowledgement (`WAIT`) of grants and renewals, and
//! locks through Sentinel, before and after a failover.

mod support;

use std::time::{Duration, Instant};

use dlock_core::{LockError, LockName, LockOptions, Locker};
use dlock_redis::{ConnectConfig, RedisConfig};
use dlock_testkit::supervisor::redis::{RedisConfig as ServerConfig, RedisSentinel, RedisServer};

fn master_and_replica() -> (RedisServer, RedisServer) {
    let master = RedisServer::start(&ServerConfig::default()).expect("start the master");
    let replica = RedisServer::start_replica_of(&master, &ServerConfig::default()).expect("start the replica");
    (master, replica)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_and_renewals_wait_for_replicas() {
    let (master, replica) = tokio::task::spawn_blocking(master_and_replica).await.unwrap();
    let base = support::client_config(master.addr());
    let name = LockName::new("replicated").unwrap();

    let acked = dlock_redis::connect(base.clone().with_replica_ack(1, Duration::from_millis(200))).await.unwrap();
    let lease = acked.acquire(&name, &LockOptions::watchdog(Duration::from_millis(900))).await.unwrap();
    // The replica has the hold the moment the grant returns.
    let on_replica = replica.cli(&["HGET", &acked.backend().keys(&name).hold, "token"]).unwrap();
    assert_eq!(on_replica.trim(), lease.token().to_string());
    // Renewals are acknowledged too, so the watchdog keeps the lease.
    let renewals = acked.stats().renewals;
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(!lease.is_lost(), "{:?}", lease.lost_reason());
    assert!(acked.stats().renewals >= renewals + 2);
    lease.release().await.unwrap();

    // Two replicas cannot acknowledge when there is one: the grant is given back.
    let demanding = dlock_redis::connect(base.with_replica_ack(2, Duration::from_millis(50))).await.unwrap();
    let started = Instant::now();
    match demanding.try_acquire(&name, &LockOptions::new()).await {
        Err(LockError::QuorumNotReached { got: 1, needed: 2 }) => {}
        other => panic!("expected QuorumNotReached {{ got: 1, needed: 2 }}, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(acked.inspect(&name).await.unwrap().holder.is_none(), "an unacknowledged grant must be given back");
}

/// A master with two replicas behind a Sentinel. After a forced failover the old master
/// keeps running, and still takes writes until the Sentinel demotes it (about 10 s
/// later): with replica acknowledgement those writes fail (both replicas follow the new
/// master), and the client looks the master up again at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_through_sentinel_follow_a_failover() {
    let (master, replicas, sentinel) = tokio::task::spawn_blocking(|| {
        let (master, first) = master_and_replica();
        let second = RedisServer::start_replica_of(&master, &ServerConfig::default()).expect("start a replica");
        let sentinel = RedisSentinel::start(master.addr(), "locks").expect("start the sentinel");
        sentinel.wait_for_replicas(2).expect("the sentinel finds the replicas");
        (master, [first, second], sentinel)
    })
    .await
    .unwrap();
    let config = RedisConfig::from_url(&format!("{}?wait_replicas=1&wait_timeout=200ms", sentinel.url()))
        .unwrap()
        .with_op_timeout(support::OP_TIMEOUT)
        .with_connect_timeout(support::CONNECT_TIMEOUT);
    let (a, b) = (dlock_redis::connect(config.clone()).await.unwrap(), dlock_redis::connect(config).await.unwrap());
    let held_name = LockName::new("held-across-failover").unwrap();
    let held = a.acquire(&held_name, &LockOptions::watchdog(Duration::from_secs(30))).await.unwrap();
    let name = LockName::new("after-failover").unwrap();
    let lease = b.acquire(&name, &LockOptions::new()).await.unwrap();
    let before = lease.token();
    lease.release().await.unwrap();

    let old = master.addr();
    let (new, sentinel) = tokio::task::spawn_blocking(move || sentinel.failover(old).map(|new| (new, sentinel)))
        .await
        .unwrap()
        .expect("failover");
    assert!(replicas.iter().any(|r| r.addr() == new));
    // The other replica follows the new master; until it does, the old master can still
    // have a write acknowledged (the window WAIT narrows but cannot close).
    let follows = format!("master_port:{}", new.port());
    dlock_conformance::properties::eventually(
        "the other replica follows the new master",
        Duration::from_secs(20),
        || {
            let other = replicas.iter().find(|r| r.addr() != new).unwrap();
            let info = other.cli(&["INFO", "replication"]).unwrap_or_default();
            let ok = info.contains(&follows) && info.contains("master_link_status:up");
            async move { ok }
        },
    )
    .await;

    let failed_over = Instant::now();
    let after = loop {
        match b.acquire(&name, &LockOptions::new().wait(Duration::from_secs(1))).await {
            Ok(lease) => break lease,
            Err(LockError::Unavailable { .. } | LockError::QuorumNotReached { .. } | LockError::Timeout { .. }) => {
                assert!(failed_over.elapsed() < Duration::from_secs(8), "no lock through Sentinel after the failover");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(other) => panic!("after the failover: {other}"),
        }
    };
    assert_eq!(sentinel.master_addr().unwrap(), new);
    let on_new: String = replicas
        .iter()
        .find(|r| r.addr() == new)
        .unwrap()
        .cli(&["HGET", &b.backend().keys(&name).hold, "token"])
        .unwrap();
    assert_eq!(on_new.trim(), after.token().to_string(), "the lock was granted on the new master");
    assert!(after.token() > before, "the fence counter was replicated: {} after {before}", after.token());
    // The hold the replicas acknowledged before the failover is still there.
    let holder = b.inspect(&held_name).await.unwrap().holder.expect("the replicated hold survives the failover");
    assert_eq!(holder.token, held.token());
    after.release().await.unwrap();
    drop(held);
    drop(master);
}

/// `WAIT` blocks the connection it is sent on: it must neither hold up the client's other
/// operations nor follow an attempt that found the lock busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_replicas_holds_up_nothing_else() {
    let (master, _replica) = tokio::task::spawn_blocking(master_and_replica).await.unwrap();
    let base = support::client_config(master.addr());
    // Two replicas are asked for and one exists: every WAIT lasts its whole timeout.
    let wait = Duration::from_millis(800);
    let demanding = dlock_redis::connect(base.clone().with_replica_ack(2, wait)).await.unwrap();
    let plain = dlock_redis::connect(base).await.unwrap();
    let (busy, free) = (LockName::new("acked/busy").unwrap(), LockName::new("acked/free").unwrap());
    let held = plain.acquire(&busy, &LockOptions::new()).await.unwrap();

    // A busy answer is not followed by a WAIT.
    let started = Instant::now();
    assert!(demanding.try_acquire(&busy, &LockOptions::new()).await.unwrap().is_none());
    assert!(started.elapsed() < wait / 2, "a busy attempt took {:?}", started.elapsed());

    // While a grant waits for replicas, the client's other operations go on.
    let granting = {
        let (demanding, free) = (demanding.clone(), free.clone());
        tokio::spawn(async move { demanding.try_acquire(&free, &LockOptions::new()).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    assert!(demanding.inspect(&busy).await.unwrap().holder.is_some());
    assert!(demanding.try_acquire(&busy, &LockOptions::new()).await.unwrap().is_none());
    assert!(started.elapsed() < wait / 2, "operations waited behind a WAIT: {:?}", started.elapsed());
    match granting.await.unwrap() {
        Err(LockError::QuorumNotReached { got: 1, needed: 2 }) => {}
        other => panic!("expected QuorumNotReached {{ got: 1, needed: 2 }}, got {other:?}"),
    }
    held.release().await.unwrap();
}
