//! A Redis Cluster of three masters: locks whose keys hash to slots on every node are
//! acquired, contended, handed off and released, as readers, writers and permits too;
//! and a node down neither fails a connect nor a node that lacks the scripts.
//!
//! With replicas: waiters listen by sharded pub/sub on the primary that serves the lock's
//! slot, follow the slot when it migrates to another primary and when its primary fails
//! over, and a release's wake-up reaches no other shard.

mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use dlock_conformance::properties::eventually;
use dlock_core::{Lease, LockError, LockName, LockOptions, Locker};
use dlock_redis::{ConnectConfig, KeyLayout, RedisConfig, RedisLocker};
use dlock_testkit::supervisor::redis::{cli, RedisCluster};
use futures::StreamExt;
use tokio::task::JoinHandle;

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

/// How long a hand-off may take at most in the tests below, where the holder's ttl is
/// 30 s: a waiter that looks again at the holder's ttl would take far longer, so only a
/// release message can have woken it in time.
const WOKEN_WITHIN: Duration = Duration::from_secs(5);

/// A cluster of three primaries with a replica each.
async fn cluster_with_replicas() -> RedisCluster {
    tokio::task::spawn_blocking(|| RedisCluster::start_with_replicas(3, 1))
        .await
        .unwrap()
        .expect("start a cluster of 3 primaries with a replica each")
}

fn client_config(url: &str) -> RedisConfig {
    RedisConfig::from_url(url)
        .unwrap()
        .with_op_timeout(Duration::from_secs(5))
        .with_connect_timeout(Duration::from_secs(5))
}

/// `PUBSUB SHARDNUMSUB` of `channel` on the node at `addr`: how many sharded subscribers
/// it has there.
fn shard_subscribers(addr: SocketAddr, channel: &str) -> usize {
    let out = cli(addr, &["PUBSUB", "SHARDNUMSUB", channel]).unwrap();
    out.lines().nth(1).and_then(|n| n.trim().parse().ok()).unwrap_or_else(|| panic!("SHARDNUMSUB: {out:?}"))
}

/// A blocking acquire of `name` by `client`, waiting up to 30 s (longer than any test).
fn wait_for(client: &RedisLocker, name: &LockName) -> JoinHandle<Result<Lease, LockError>> {
    let (client, name) = (client.clone(), name.clone());
    tokio::spawn(async move {
        client.acquire(&name, &LockOptions::watchdog(Duration::from_secs(30)).wait(Duration::from_secs(30))).await
    })
}

/// Releases `lease` and checks that the waiters get the lock one after the other, each
/// within [`WOKEN_WITHIN`] of the release before it.
async fn hand_over(lease: Lease, mut waiters: Vec<JoinHandle<Result<Lease, LockError>>>) {
    let mut token = lease.token();
    let mut released = Instant::now();
    lease.release().await.unwrap();
    while !waiters.is_empty() {
        let (next, _, rest) = futures::future::select_all(waiters).await;
        waiters = rest;
        let next = next.unwrap().expect("a waiter gets the lock");
        let took = released.elapsed();
        assert!(took < WOKEN_WITHIN, "the hand-off took {took:?}: the release message did not wake the waiter");
        assert!(next.token() > token);
        token = next.token();
        released = Instant::now();
        next.release().await.unwrap();
    }
}

/// Waiters of one lock, in two clients, are subscribed (sharded) on the primary serving
/// the lock's slot; the slot migrates to another primary (`SETSLOT IMPORTING/MIGRATING`,
/// `MIGRATE`, `SETSLOT NODE`): their subscriptions follow it, and the release, now run on
/// the new primary, wakes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_follow_a_migrated_slot() {
    let cluster = cluster_with_replicas().await;
    let name = LockName::new("cluster/migrated").unwrap();
    let keys = KeyLayout::new("dlock").unwrap().lock(&name);
    let slot = cluster.slot_of(&keys.hold).unwrap();
    let from = cluster.owner(slot).unwrap();
    let to = *cluster.primaries().unwrap().iter().find(|p| **p != from).unwrap();
    let (from_addr, to_addr) = (cluster.addrs()[from], cluster.addrs()[to]);
    let holder = dlock_redis::connect(client_config(&cluster.url())).await.unwrap();
    let waiting = [
        dlock_redis::connect(client_config(&cluster.url())).await.unwrap(),
        dlock_redis::connect(client_config(&cluster.url())).await.unwrap(),
    ];

    let lease = holder.acquire(&name, &LockOptions::watchdog(Duration::from_secs(30))).await.unwrap();
    let waiters: Vec<_> = waiting.iter().map(|client| wait_for(client, &name)).collect();
    eventually("both waiters listen on the slot's primary", Duration::from_secs(10), || async {
        waiting.iter().all(|c| c.stats().waiting == 1) && shard_subscribers(from_addr, &keys.channel) == 2
    })
    .await;

    let moving = cluster;
    let cluster = tokio::task::spawn_blocking(move || moving.migrate_slot(slot, to).map(|()| moving))
        .await
        .unwrap()
        .expect("migrate the lock's slot");
    assert_eq!(cluster.owner(slot).unwrap(), to);
    eventually("both waiters listen on the slot's new primary", Duration::from_secs(10), || async {
        shard_subscribers(to_addr, &keys.channel) == 2
    })
    .await;
    assert_eq!(shard_subscribers(from_addr, &keys.channel), 0);
    assert!(holder.inspect(&name).await.unwrap().holder.is_some(), "the hold moved with its slot");

    hand_over(lease, waiters).await;
}

/// How the primary serving a lock's slot hands it to its replica.
#[derive(Debug, Clone, Copy)]
enum Failover {
    /// `CLUSTER FAILOVER` on the replica: the primary hands over and becomes a replica,
    /// dropping its sharded subscribers with a `sunsubscribe` push.
    Manual,
    /// kill -9 of the primary: its connections break, and the Cluster promotes the
    /// replica seconds later.
    Kill,
}

/// Waiters of one lock, whose client knows the Cluster only through the primary serving
/// the lock's slot (its one seed), wait while that primary fails over to its replica:
/// their subscriptions move to the new primary, and the holder's release there wakes
/// them.
async fn waiters_follow_a_failover(how: Failover) {
    let cluster = cluster_with_replicas().await;
    let name = LockName::new(format!("cluster/failed-over/{how:?}")).unwrap();
    let keys = KeyLayout::new("dlock").unwrap().lock(&name);
    let slot = cluster.slot_of(&keys.hold).unwrap();
    let primary = cluster.owner(slot).unwrap();
    let primary_addr = cluster.addrs()[primary];
    let holder = dlock_redis::connect(client_config(&cluster.url())).await.unwrap();
    let only_seed = format!("redis+cluster://{primary_addr}");
    let waiting = [
        dlock_redis::connect(client_config(&only_seed)).await.unwrap(),
        dlock_redis::connect(client_config(&only_seed)).await.unwrap(),
    ];

    let lease = holder.acquire(&name, &LockOptions::watchdog(Duration::from_secs(30))).await.unwrap();
    let waiters: Vec<_> = waiting.iter().map(|client| wait_for(client, &name)).collect();
    eventually("both waiters listen on the slot's primary", Duration::from_secs(10), || async {
        waiting.iter().all(|c| c.stats().waiting == 1) && shard_subscribers(primary_addr, &keys.channel) == 2
    })
    .await;

    let mut failing = cluster;
    let (cluster, promoted) = tokio::task::spawn_blocking(move || {
        failing.wait_for_replicas(primary)?;
        let promoted = match how {
            Failover::Manual => failing.fail_over(primary)?,
            Failover::Kill => failing.kill_primary(primary)?,
        };
        Ok::<_, std::io::Error>((failing, promoted))
    })
    .await
    .unwrap()
    .expect("fail the slot's primary over to its replica");
    let promoted_addr = cluster.addrs()[promoted];
    eventually("both waiters listen on the new primary", Duration::from_secs(15), || async {
        shard_subscribers(promoted_addr, &keys.channel) == 2
    })
    .await;
    assert_eq!(holder.inspect(&name).await.unwrap().holder.map(|h| h.token), Some(lease.token()));

    hand_over(lease, waiters).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_follow_a_manual_failover_of_the_slots_primary() {
    waiters_follow_a_failover(Failover::Manual).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_follow_the_promotion_of_a_killed_primarys_replica() {
    waiters_follow_a_failover(Failover::Kill).await;
}

/// The counters of the messages a node received over the cluster bus: classic
/// (`PUBLISH`) and sharded (`SPUBLISH`).
fn bus_messages(addr: SocketAddr) -> (u64, u64) {
    let info = cli(addr, &["CLUSTER", "INFO"]).unwrap();
    let count =
        |field: &str| info.lines().find_map(|l| l.strip_prefix(field)).map_or(0, |n| n.trim().parse::<u64>().unwrap());
    (count("cluster_stats_messages_publish_received:"), count("cluster_stats_messages_publishshard_received:"))
}

/// Releases that wake waiters (on the lock's channel, and on a fair waiter's wake-up
/// channel) publish within the lock's shard alone: no message reaches a node of the
/// other shards, where a subscriber to the lock's channels hears nothing, while the
/// replica of the lock's primary receives each sharded message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wake_ups_stay_in_the_shard_that_serves_the_lock() {
    let cluster = cluster_with_replicas().await;
    let name = LockName::new("cluster/local").unwrap();
    let keys = KeyLayout::new("dlock").unwrap().lock(&name);
    let slot = cluster.slot_of(&keys.hold).unwrap();
    let owner = cluster.owner(slot).unwrap();
    let replica = cluster.replicas_of(owner).unwrap()[0];
    let elsewhere: Vec<SocketAddr> =
        (0..cluster.addrs().len()).filter(|i| ![owner, replica].contains(i)).map(|i| cluster.addrs()[i]).collect();
    assert_eq!(elsewhere.len(), 4, "two other shards of two nodes each");

    // A classic subscriber to every channel of the lock on each node of the other shards:
    // a PUBLISH anywhere in the Cluster reaches it over the bus.
    let pattern = format!("{}*", keys.hold);
    let mut spies = Vec::new();
    for addr in &elsewhere {
        let mut spy = redis::Client::open(format!("redis://{addr}")).unwrap().get_async_pubsub().await.unwrap();
        spy.psubscribe(&pattern).await.unwrap();
        spies.push(spy);
    }
    let before: Vec<(u64, u64)> = elsewhere.iter().map(|a| bus_messages(*a)).collect();
    let replica_before = bus_messages(cluster.addrs()[replica]);

    let clients = [
        dlock_redis::connect(client_config(&cluster.url())).await.unwrap(),
        dlock_redis::connect(client_config(&cluster.url())).await.unwrap(),
        dlock_redis::connect(client_config(&cluster.url())).await.unwrap(),
    ];
    // On the lock's channel: a waiter that does not queue.
    let lease = clients[0].acquire(&name, &LockOptions::watchdog(Duration::from_secs(30))).await.unwrap();
    let waiter = wait_for(&clients[1], &name);
    eventually("the waiter waits", Duration::from_secs(10), || async { clients[1].stats().waiting == 1 }).await;
    lease.release().await.unwrap();
    let lease = waiter.await.unwrap().unwrap();
    // On a client's wake-up channel: a fair waiter, first in the queue.
    let fair = {
        let (client, name) = (clients[2].clone(), name.clone());
        let opts = LockOptions::watchdog(Duration::from_secs(30)).wait(Duration::from_secs(30)).fair(true);
        tokio::spawn(async move { client.acquire(&name, &opts).await })
    };
    eventually("the fair waiter queues", Duration::from_secs(10), || async {
        clients[0].inspect(&name).await.unwrap().waiters == Some(1) && clients[2].stats().waiting == 1
    })
    .await;
    lease.release().await.unwrap();
    fair.await.unwrap().unwrap().release().await.unwrap();

    // A classic message from the lock's primary, after the releases: the bus delivers a
    // node's messages to another in order, so once it arrived, any release message sent
    // to that node before it did too.
    let barrier = format!("{}:barrier", keys.hold);
    cli(cluster.addrs()[owner], &["PUBLISH", &barrier, "end"]).unwrap();
    for (spy, addr) in spies.iter_mut().zip(&elsewhere) {
        let mut heard = Vec::new();
        let mut messages = spy.on_message();
        loop {
            let message = tokio::time::timeout(Duration::from_secs(10), messages.next())
                .await
                .unwrap_or_else(|_| panic!("the barrier reaches {addr}"))
                .expect("the spy's stream");
            if message.get_channel_name() == barrier {
                break;
            }
            heard.push(message.get_channel_name().to_string());
        }
        assert!(heard.is_empty(), "{addr}, in another shard, heard the lock's wake-ups: {heard:?}");
    }
    for ((classic, sharded), (addr, (classic_before, sharded_before))) in
        elsewhere.iter().map(|a| bus_messages(*a)).zip(elsewhere.iter().zip(before))
    {
        assert_eq!(classic, classic_before + 1, "{addr} got a classic message besides the barrier");
        assert_eq!(sharded, sharded_before, "{addr}, in another shard, got a sharded message");
    }
    // Three releases, each publishing once in the shard.
    eventually("the lock's replica gets the shard's messages", Duration::from_secs(10), || async {
        bus_messages(cluster.addrs()[replica]).1 >= replica_before.1 + 3
    })
    .await;
}

/// A client told to reach every node at a fault proxy of its own (`node_address`, as a
/// Cluster behind a NAT is reached) goes through the proxies for everything: its seed,
/// the nodes the slot map names, and its waiters' sharded subscription, so a release
/// wakes its waiter through them; with every proxy cut, it reaches no node, while a
/// client that dials the nodes as they announce themselves still gets the lock; healed,
/// it gets the lock again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reaches_each_node_where_its_node_address_says() {
    use dlock_conformance::Fault;
    use dlock_testkit::proxy::FaultProxy;

    let cluster =
        tokio::task::spawn_blocking(|| RedisCluster::start(3)).await.unwrap().expect("start a 3-master cluster");
    let mut proxies = Vec::new();
    for addr in cluster.addrs() {
        proxies.push(FaultProxy::start(addr).await.unwrap());
    }
    let map: Vec<String> = cluster
        .addrs()
        .iter()
        .zip(&proxies)
        .map(|(node, proxy)| format!("node_address={node}={}", proxy.addr()))
        .collect();
    // The seed is a node's own address: the map sends it to the proxy too.
    let url = format!("redis+cluster://{}?{}", cluster.addrs()[0], map.join("&"));
    let config = client_config(&url).with_op_timeout(Duration::from_secs(2));
    let mapped = dlock_redis::connect(config).await.unwrap();
    let direct = dlock_redis::connect(client_config(&cluster.url())).await.unwrap();
    let name = LockName::new("cluster/mapped").unwrap();
    let keys = KeyLayout::new("dlock").unwrap().lock(&name);
    let owner = cluster.addrs()[cluster.owner(cluster.slot_of(&keys.hold).unwrap()).unwrap()];

    let lease = direct.acquire(&name, &LockOptions::watchdog(Duration::from_secs(30))).await.unwrap();
    let waiter = wait_for(&mapped, &name);
    eventually("the waiter listens on the slot's primary", Duration::from_secs(10), || async {
        mapped.stats().waiting == 1 && shard_subscribers(owner, &keys.channel) == 1
    })
    .await;
    hand_over(lease, vec![waiter]).await;

    proxies.iter().for_each(|proxy| proxy.set_fault(Fault::Cut));
    let opts = LockOptions::watchdog(Duration::from_secs(30));
    match mapped.try_acquire(&name, &opts).await {
        Err(_) => {}
        Ok(got) => panic!("a client whose every way to the nodes is cut got an answer: {:?}", got.map(|l| l.token())),
    }
    let lease = direct.try_acquire(&name, &opts).await.unwrap().expect("the nodes are up");
    lease.release().await.unwrap();

    proxies.iter().for_each(|proxy| proxy.set_fault(Fault::None));
    eventually("the client reaches the nodes again once healed", Duration::from_secs(10), || async {
        match mapped.try_acquire(&name, &opts).await {
            Ok(Some(lease)) => lease.release().await.is_ok(),
            _ => false,
        }
    })
    .await;
}
