//! Asynchronous replication loss: a grant the replica never received, the master killed,
//! Sentinel promoting the replica, another client acquiring. Without replica
//! acknowledgement the lock is granted a second time and the fencing token goes back
//! (the limit the crate docs state); with `wait_replicas=1` no grant is lost and tokens
//! keep increasing, at the price of no grants while the new master has no replica to
//! acknowledge them.

mod support;

use std::io;
use std::time::{Duration, Instant};

use dlock_conformance::Fault;
use dlock_core::{Lease, LockError, LockName, LockOptions, Locker};
use dlock_redis::{ConnectConfig, RedisConfig, RedisLocker};
use dlock_testkit::proxy::FaultProxy;
use dlock_testkit::supervisor::redis::{RedisConfig as ServerConfig, RedisSentinel, RedisServer};

/// A master, one replica that reaches it through a fault proxy, and a Sentinel.
struct Deployment {
    master: RedisServer,
    replica: RedisServer,
    sentinel: RedisSentinel,
    replication: FaultProxy,
}

async fn deploy() -> Deployment {
    let master = tokio::task::spawn_blocking(|| RedisServer::start(&ServerConfig::default()))
        .await
        .unwrap()
        .expect("start the master");
    let replication = FaultProxy::start(master.addr()).await.expect("start the replication proxy");
    let via = replication.addr();
    let (master, replica, sentinel) = tokio::task::spawn_blocking(move || {
        let replica = RedisServer::start_replica_via(&master, via, &ServerConfig::default())?;
        let sentinel = RedisSentinel::start(master.addr(), "locks")?;
        sentinel.wait_for_replicas(1)?;
        Ok::<_, io::Error>((master, replica, sentinel))
    })
    .await
    .unwrap()
    .expect("start the replica and the sentinel");
    Deployment { master, replica, sentinel, replication }
}

async fn client(sentinel: &RedisSentinel, wait_for_replica: bool) -> RedisLocker {
    let query = if wait_for_replica { "?wait_replicas=1&wait_timeout=300ms" } else { "" };
    let config = RedisConfig::from_url(&format!("{}{query}", sentinel.url()))
        .unwrap()
        .with_op_timeout(support::OP_TIMEOUT)
        .with_connect_timeout(support::CONNECT_TIMEOUT);
    // While a failover is in progress the Sentinel flags the master down, and clients
    // cannot connect until it completes.
    let started = Instant::now();
    loop {
        match dlock_redis::connect(config.clone()).await {
            Ok(locker) => return locker,
            Err(_) if started.elapsed() < Duration::from_secs(20) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => panic!("connect through the sentinel: {err}"),
        }
    }
}

/// What the first client did before the master died.
struct Before {
    /// Held since before the replication link failed (so the replica has it).
    held: Lease,
    /// The token `late` was granted with before the link failed.
    replicated: u64,
    /// What taking `late` twice while the link was black-holed answered: tokens granted,
    /// or the error.
    during_cut: Vec<Result<u64, LockError>>,
    /// The second of those grants, still held.
    late: Option<Lease>,
}

/// The first client holds `held`, takes `late` once (both replicated), then, with the
/// replication link black-holed, takes `late`, releases it and takes it again; then the
/// master is killed and Sentinel promotes the replica. Returns the second client,
/// connected afterwards.
async fn lose_the_master(d: &mut Deployment, a: &RedisLocker, wait_for_replica: bool) -> (Before, RedisLocker) {
    // Long enough to outlast the failover and the old master's return, during which
    // renewals that wait for a replica fail.
    let held = a.acquire(&name("held"), &LockOptions::watchdog(Duration::from_secs(60))).await.unwrap();
    let first = a.acquire(&name("late"), &LockOptions::new()).await.unwrap();
    let replicated = first.token().get();
    first.release().await.unwrap();
    // Everything so far is on the replica before the link fails.
    assert_eq!(d.master.cli(&["WAIT", "1", "5000"]).unwrap().trim(), "1");

    d.replication.set_fault(Fault::Blackhole);
    let mut during_cut = Vec::new();
    let mut late = None;
    for round in 0..2 {
        match a.try_acquire(&name("late"), &LockOptions::watchdog(Duration::from_secs(30))).await {
            Ok(Some(lease)) => {
                during_cut.push(Ok(lease.token().get()));
                if round == 0 {
                    lease.release().await.unwrap();
                } else {
                    late = Some(lease);
                }
            }
            Ok(None) => panic!("nobody else holds late"),
            Err(err) => during_cut.push(Err(err)),
        }
    }

    let (old, promoted) = (d.master.addr(), d.replica.addr());
    d.master.kill();
    let sentinel = &d.sentinel;
    dlock_conformance::properties::eventually("Sentinel promotes the replica", Duration::from_secs(30), || {
        let ok = sentinel.master_addr().is_ok_and(|addr| addr == promoted && addr != old);
        async move { ok }
    })
    .await;
    let b = client(&d.sentinel, wait_for_replica).await;
    (Before { held, replicated, during_cut, late }, b)
}

fn name(text: &str) -> LockName {
    LockName::new(text).unwrap()
}

/// The second client's first grant of `late` on the promoted replica (retrying while its
/// connection follows the failover).
async fn acquire_after_failover(b: &RedisLocker) -> Lease {
    let started = Instant::now();
    loop {
        match b.try_acquire(&name("late"), &LockOptions::new()).await {
            Ok(Some(lease)) => return lease,
            Ok(None) => panic!("late is held on the promoted replica"),
            Err(err @ (LockError::Unavailable { .. } | LockError::QuorumNotReached { .. })) => {
                assert!(started.elapsed() < Duration::from_secs(30), "no lock after the failover: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(other) => panic!("after the failover: {other}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_replica_acknowledgement_a_grant_is_lost_and_the_token_goes_back() {
    let mut d = deploy().await;
    let a = client(&d.sentinel, false).await;
    let (before, b) = lose_the_master(&mut d, &a, false).await;
    let granted: Vec<u64> =
        before.during_cut.iter().map(|r| *r.as_ref().expect("granted on the master alone")).collect();
    assert_eq!(granted, [before.replicated + 1, before.replicated + 2]);
    let late = before.late.as_ref().expect("a holds late");

    // The replica never had the holds made during the cut: late is granted again, while
    // its first holder may still believe it holds it, and with a token it already saw.
    let second = acquire_after_failover(&b).await;
    assert_eq!(second.token().get(), before.replicated + 1, "the promoted replica's counter is behind");
    assert!(second.token() < late.token(), "{} after {}", second.token(), late.token());
    // What was replicated survives.
    assert!(b.try_acquire(&name("held"), &LockOptions::new()).await.unwrap().is_none());
    assert!(b.inspect(&name("held")).await.unwrap().holder.is_some_and(|h| h.token == before.held.token()));
    second.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replica_acknowledgement_no_grant_is_lost_and_tokens_increase() {
    let mut d = deploy().await;
    let a = client(&d.sentinel, true).await;
    let (before, b) = lose_the_master(&mut d, &a, true).await;
    // Grants the replica did not acknowledge were refused (and given back).
    for attempt in &before.during_cut {
        assert!(matches!(attempt, Err(LockError::QuorumNotReached { got: 0, needed: 1 })), "{attempt:?}");
    }
    assert!(before.late.is_none());

    // The promoted replica has no replica of its own: grants wait until one follows it,
    // as the old master does when it comes back (Sentinel makes it a replica).
    match b.try_acquire(&name("late"), &LockOptions::new()).await {
        Err(LockError::QuorumNotReached { got: 0, needed: 1 } | LockError::Unavailable { .. }) => {}
        other => panic!("granted with no replica to acknowledge it: {other:?}"),
    }
    let master = &mut d.master;
    tokio::task::block_in_place(|| master.start_again()).expect("restart the old master");

    // Every grant a client was told of is on the promoted replica, and the next token is
    // above every token a client was given.
    let second = acquire_after_failover(&b).await;
    assert!(second.token().get() > before.replicated, "{} after {}", second.token(), before.replicated);
    assert!(b.try_acquire(&name("held"), &LockOptions::new()).await.unwrap().is_none());
    let holder = b.inspect(&name("held")).await.unwrap().holder.expect("the acknowledged hold survives");
    assert_eq!(holder.token, before.held.token());
    assert!(!before.held.is_lost(), "{:?}", before.held.lost_reason());
    second.release().await.unwrap();
}
