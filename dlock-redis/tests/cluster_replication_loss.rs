//! Asynchronous replication loss on a Redis Cluster: the primary serving a lock's slot
//! grants it while its replica hears nothing (the replication link black-holed), the
//! primary is killed, the Cluster promotes the replica, and another client acquires.
//! Without replica acknowledgement the lock is granted a second time, with a token that
//! went back; with `wait_replicas=1` the grant the replica did not acknowledge is refused,
//! and the next token is above every token a client was given.
//!
//! The replica reaches its primary at the address the primary announces: the primary
//! announces a fault proxy in front of itself, so only the replication link (and nothing
//! else: the clients are told where the primary really is with `node_address`, and the
//! cluster bus has a port of its own) goes through the proxy.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use dlock_conformance::properties::eventually;
use dlock_conformance::Fault;
use dlock_core::{Lease, LockError, LockName, LockOptions, Locker};
use dlock_redis::{ConnectConfig, KeyLayout, RedisConfig, RedisLocker};
use dlock_testkit::proxy::FaultProxy;
use dlock_testkit::supervisor::redis::{cli, RedisCluster};

/// A Cluster of three primaries with a replica each, the primary serving `name`'s slot
/// announcing `front` (a proxy in front of it), through which its replica replicates.
struct Shard {
    cluster: RedisCluster,
    primary: usize,
    replica: usize,
    front: FaultProxy,
}

async fn deploy(name: &LockName) -> Shard {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start_with_replicas(3, 1))
        .await
        .unwrap()
        .expect("start a cluster of 3 primaries with a replica each");
    let hold = KeyLayout::new("dlock").unwrap().lock(name).hold;
    let primary = cluster.owner(cluster.slot_of(&hold).unwrap()).unwrap();
    let replica = cluster.replicas_of(primary).unwrap()[0];
    let front = FaultProxy::start(cluster.addrs()[primary]).await.unwrap();
    let port = front.addr().port().to_string();
    cli(cluster.addrs()[primary], &["CONFIG", "SET", "cluster-announce-port", &port]).unwrap();
    let replica_addr = cluster.addrs()[replica];
    eventually("the replica replicates through the proxy", Duration::from_secs(20), || async {
        cli(replica_addr, &["INFO", "replication"])
            .is_ok_and(|info| info.contains(&format!("master_port:{port}\r")) && info.contains("master_link_status:up"))
    })
    .await;
    Shard { cluster, primary, replica, front }
}

/// A client that reaches the primary where it is, not at the proxy it announces.
async fn client(shard: &Shard, wait_for_replica: bool) -> RedisLocker {
    let primary: SocketAddr = shard.cluster.addrs()[shard.primary];
    let mut url = format!("{}?node_address={}={primary}", shard.cluster.url(), shard.front.addr());
    if wait_for_replica {
        url.push_str("&wait_replicas=1&wait_timeout=300ms");
    }
    let config = RedisConfig::from_url(&url)
        .unwrap()
        .with_op_timeout(Duration::from_secs(2))
        .with_connect_timeout(Duration::from_secs(5));
    dlock_redis::connect(config).await.unwrap()
}

/// What the first client did: the token of a grant the replica has, and what taking the
/// lock while the replica heard nothing answered.
struct Before {
    replicated: u64,
    during_cut: Result<Lease, LockError>,
}

/// The first client takes and releases the lock (replicated), then takes it again with
/// the replication link black-holed; the primary is killed and the replica promoted.
async fn lose_the_primary(shard: &mut Shard, a: &RedisLocker, name: &LockName) -> Before {
    let first = a
        .acquire(name, &LockOptions::new().wait(Duration::from_secs(10)))
        .await
        .unwrap_or_else(|err| panic!("the first grant, replicated: {err}"));
    let replicated = first.token().get();
    first.release().await.unwrap();
    let primary = shard.cluster.addrs()[shard.primary];
    assert_eq!(cli(primary, &["WAIT", "1", "5000"]).unwrap().trim(), "1", "the replica has it all");

    shard.front.set_fault(Fault::Blackhole);
    let during_cut = match a.try_acquire(name, &LockOptions::watchdog(Duration::from_secs(60))).await {
        Ok(Some(lease)) => Ok(lease),
        Ok(None) => panic!("nobody else holds {name}"),
        Err(err) => Err(err),
    };
    // The Cluster knows the primary by the address it announces (the proxy's), which
    // the supervisor's kill_primary would not find among its nodes: instead, every other
    // node is asked until all of them name the replica a primary (a client that asked
    // one that did not yet would be sent back and forth).
    shard.cluster.kill(shard.primary);
    let replica = shard.cluster.addrs()[shard.replica];
    let others: Vec<SocketAddr> =
        shard.cluster.addrs().into_iter().enumerate().filter(|(i, _)| *i != shard.primary).map(|(_, a)| a).collect();
    let promoted = |nodes: String| {
        nodes.lines().any(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            fields.len() > 2
                && fields[1].starts_with(&format!("{replica}@"))
                && fields[2].split(',').any(|f| f == "master")
        })
    };
    eventually("every node names the replica a primary", Duration::from_secs(30), || async {
        others.iter().all(|addr| cli(*addr, &["CLUSTER", "NODES"]).is_ok_and(promoted))
    })
    .await;
    Before { replicated, during_cut }
}

/// A client's first grant of `name` after the failover (retrying while it learns the new
/// slot map).
async fn acquire_after_failover(b: &RedisLocker, name: &LockName) -> Lease {
    let started = Instant::now();
    loop {
        match b.try_acquire(name, &LockOptions::new()).await {
            Ok(Some(lease)) => return lease,
            Ok(None) => panic!("{name} is held on the promoted replica"),
            Err(err) if err.is_transient() => {
                assert!(started.elapsed() < Duration::from_secs(30), "no lock after the failover: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(other) => panic!("after the failover: {other}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_replica_acknowledgement_a_killed_primarys_grant_is_lost() {
    let name = LockName::new("cluster/lost").unwrap();
    let mut shard = deploy(&name).await;
    let a = client(&shard, false).await;
    let before = lose_the_primary(&mut shard, &a, &name).await;
    let late = before.during_cut.expect("granted by the primary alone");
    assert_eq!(late.token().get(), before.replicated + 1);

    // The promoted replica never had that grant: the lock is granted again while its
    // first holder's 60 s lease is valid, with the token that holder already has.
    let b = client(&shard, false).await;
    let second = acquire_after_failover(&b, &name).await;
    assert!(late.remaining() > Duration::ZERO && !late.is_lost(), "the first holder still believes it holds");
    assert_eq!(second.token(), late.token(), "the promoted replica's counter is behind");
    second.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replica_acknowledgement_a_killed_primary_loses_no_grant() {
    let name = LockName::new("cluster/kept").unwrap();
    let mut shard = deploy(&name).await;
    let a = client(&shard, true).await;
    let before = lose_the_primary(&mut shard, &a, &name).await;
    // The grant the replica did not acknowledge was refused (and given back).
    assert!(
        matches!(before.during_cut, Err(LockError::QuorumNotReached { got: 0, needed: 1 })),
        "{:?}",
        before.during_cut.map(|l| l.token())
    );

    // Every grant a client was told of is on the promoted replica: the next token is above.
    let b = client(&shard, false).await;
    let second = acquire_after_failover(&b, &name).await;
    assert!(second.token().get() > before.replicated, "{} after {}", second.token(), before.replicated);
    second.release().await.unwrap();
}
