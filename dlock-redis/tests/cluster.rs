//! A Redis Cluster of three masters: locks whose keys hash to slots on every node are
//! acquired, contended, handed off (the release message crosses nodes) and released, as
//! readers, writers and permits too; and a node down neither fails a connect nor a node
//! that lacks the scripts.

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use dlock_core::{LockName, LockOptions, Locker};
use dlock_redis::{ConnectConfig, KeyLayout, RedisConfig};
use dlock_testkit::supervisor::redis::{cli, RedisCluster};

fn slot_of(cluster: &RedisCluster, key: &str) -> u16 {
    cli(cluster.addrs()[0], &["CLUSTER", "KEYSLOT", key]).unwrap().trim().parse().unwrap()
}

/// The slot ranges and the port of the node serving each, from `CLUSTER SLOTS`.
fn owners(cluster: &RedisCluster) -> Vec<(u16, u16, u16)> {
    // redis-cli prints CLUSTER SLOTS flat: start, end, ip, port, id, [replicas...].
    let out = cli(cluster.addrs()[0], &["CLUSTER", "SLOTS"]).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    let mut ranges = Vec::new();
    let mut i = 0;
    while i + 3 < lines.len() {
        if let (Ok(start), Ok(end), Ok(port)) =
            (lines[i].parse::<u16>(), lines[i + 1].parse::<u16>(), lines[i + 3].parse::<u16>())
        {
            if lines[i + 2].contains('.') {
                ranges.push((start, end, port));
                i += 4;
                continue;
            }
        }
        i += 1;
    }
    ranges
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_on_every_node_of_a_cluster() {
    let cluster =
        tokio::task::spawn_blocking(|| RedisCluster::start(3)).await.unwrap().expect("start a 3-master cluster");
    let config = RedisConfig::from_url(&cluster.url())
        .unwrap()
        .with_op_timeout(support::OP_TIMEOUT)
        .with_connect_timeout(Duration::from_secs(5));
    let (a, b) = (dlock_redis::connect(config.clone()).await.unwrap(), dlock_redis::connect(config).await.unwrap());
    let layout = KeyLayout::new("dlock").unwrap();
    let ranges = owners(&cluster);
    assert_eq!(ranges.iter().map(|r| r.2).collect::<std::collections::HashSet<_>>().len(), 3, "{ranges:?}");

    // Names until every node serves at least two of them.
    let mut by_node: HashMap<u16, Vec<LockName>> = HashMap::new();
    let mut n = 0;
    while by_node.len() < 3 || by_node.values().any(|names| names.len() < 2) {
        let name = LockName::new(format!("cluster/{n}/{{odd}}")).unwrap();
        n += 1;
        let keys = layout.lock(&name);
        let slot = slot_of(&cluster, &keys.hold);
        assert_eq!(slot, slot_of(&cluster, &keys.fence), "a lock's keys must share a slot");
        let port = ranges.iter().find(|(start, end, _)| (*start..=*end).contains(&slot)).expect("slot served").2;
        by_node.entry(port).or_default().push(name);
    }
    let names: Vec<LockName> = by_node.values().flatten().cloned().collect();

    let opts = LockOptions::watchdog(Duration::from_secs(30)).wait(Duration::from_secs(5));
    let mut leases = Vec::new();
    for name in &names {
        let lease = a.acquire(name, &opts).await.unwrap_or_else(|e| panic!("acquire {name}: {e}"));
        assert!(b.try_acquire(name, &opts).await.unwrap().is_none(), "{name} granted twice");
        let holder = b.inspect(name).await.unwrap().holder.expect("held");
        assert_eq!(holder.token, lease.token());
        leases.push(lease);
    }

    // Hand-offs: the waiter's subscription is on one node, the release on another.
    for lease in leases {
        let name = lease.name().clone();
        let first = lease.token();
        let waiter = {
            let (b, name, opts) = (b.clone(), name.clone(), opts.clone());
            tokio::spawn(async move { b.acquire(&name, &opts).await })
        };
        dlock_conformance::properties::eventually("the waiter waits", Duration::from_secs(5), || async {
            b.stats().waiting == 1
        })
        .await;
        lease.release().await.unwrap();
        let released = Instant::now();
        let next = waiter.await.unwrap().unwrap_or_else(|e| panic!("hand-off of {name}: {e}"));
        // The holder's ttl was 30 s: only the release message can have woken the waiter.
        assert!(released.elapsed() < Duration::from_secs(3), "hand-off of {name} took {:?}", released.elapsed());
        assert!(next.token() > first);
        next.release().await.unwrap();
        assert!(a.inspect(&name).await.unwrap().holder.is_none());
    }

    // Readers, a writer queued behind them, and permits: every key their scripts touch
    // is in the lock's slot, and the writer's wake-up crosses nodes too.
    let long = LockOptions::watchdog(Duration::from_secs(30));
    for name in &names {
        let reader = a.acquire(name, &long.clone().read()).await.unwrap_or_else(|e| panic!("read {name}: {e}"));
        let second = b.try_acquire(name, &long.clone().read()).await.unwrap().expect("a second reader");
        let writing = {
            let (b, name, opts) = (b.clone(), name.clone(), long.clone().wait(Duration::from_secs(5)));
            tokio::spawn(async move { b.acquire(&name, &opts).await })
        };
        dlock_conformance::properties::eventually("the writer queues", Duration::from_secs(5), || async {
            a.inspect(name).await.unwrap().waiters == Some(1)
        })
        .await;
        let newest = second.token();
        reader.release().await.unwrap();
        second.release().await.unwrap();
        let writer = writing.await.unwrap().unwrap_or_else(|e| panic!("the writer of {name}: {e}"));
        assert!(writer.token() > newest);
        writer.release().await.unwrap();
        let permit = a.acquire(name, &long.clone().permits(2)).await.unwrap_or_else(|e| panic!("permit {name}: {e}"));
        let other = b.try_acquire(name, &long.clone().permits(2)).await.unwrap().expect("a second permit");
        assert!(b.try_acquire(name, &long.clone().permits(2)).await.unwrap().is_none(), "a third permit of two");
        permit.release().await.unwrap();
        other.release().await.unwrap();
        assert!(a.inspect(name).await.unwrap().holder.is_none());
    }
}

/// One node of three is down: a client still connects (no script load has to reach
/// every node), and locks names whose slot a live node serves, also where that node has
/// lost its scripts (as a replica promoted after the client connected would lack them):
/// the node is sent each script whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_down_fails_neither_the_connect_nor_a_node_without_scripts() {
    let mut cluster =
        tokio::task::spawn_blocking(|| RedisCluster::start(3)).await.unwrap().expect("start a 3-master cluster");
    let config = RedisConfig::from_url(&cluster.url())
        .unwrap()
        .with_op_timeout(support::OP_TIMEOUT)
        .with_connect_timeout(Duration::from_secs(5));
    let before = dlock_redis::connect(config.clone()).await.expect("connect with every node up");
    let name = LockName::new("cluster/node-down").unwrap();
    let slot = slot_of(&cluster, &KeyLayout::new("dlock").unwrap().lock(&name).hold);
    let ranges = owners(&cluster);
    let serving = ranges.iter().find(|(start, end, _)| (*start..=*end).contains(&slot)).expect("slot served").2;
    let down = cluster.addrs().iter().position(|addr| addr.port() != serving).expect("another node");
    let serving = cluster.addrs().into_iter().find(|addr| addr.port() == serving).expect("the serving node");
    // Frozen, as a host that stopped answering: its connections stay open.
    cluster.nodes_mut()[down].process().pause().expect("freeze a node");
    cli(serving, &["SCRIPT", "FLUSH"]).expect("flush the serving node's scripts");

    let after = dlock_redis::connect(config).await.expect("connect with a node down");
    let opts = LockOptions::watchdog(Duration::from_secs(30)).wait(Duration::from_secs(5));
    for (client, which) in [(&after, "connected with a node down"), (&before, "connected before")] {
        let lease = client.acquire(&name, &opts).await.unwrap_or_else(|e| panic!("the client {which}: {e}"));
        let holder = client.inspect(&name).await.unwrap().holder.expect("held");
        assert_eq!(holder.token, lease.token());
        lease.release().await.unwrap_or_else(|e| panic!("release, by the client {which}: {e}"));
        cli(serving, &["SCRIPT", "FLUSH"]).expect("flush again");
    }
    cluster.nodes_mut()[down].process().resume().expect("thaw the node");
}
