//! What a RedLock client sends to each master, read back with MONITOR: an uncontended
//! acquire and release are one fan-out each (one script call per node), reading the
//! counters first adds one read per node, a waiter subscribes on every node before it
//! looks again, and the URL's settings reach every node.

mod support;

use std::time::Duration;

use dlock_conformance::properties::eventually;
use dlock_core::{LockName, LockOptions, Locker};
use dlock_redis::redlock::{self, RedLockConfig, RedLockLocker, TokenSource};
use dlock_redis::scripts::scripts;
use dlock_redis::{ConnectConfig, Node};
use dlock_testkit::supervisor::redis::{RedisConfig as ServerConfig, RedisMasters};
use support::monitor::{client_commands, Monitor, Sent};

fn masters(count: usize) -> RedisMasters {
    RedisMasters::start(count, &ServerConfig::default()).expect("start redis-servers")
}

/// Roomy timeouts: these tests look at what is sent, and a command that a starved test
/// process could not send within the node timeout would count as a node that failed.
fn config(masters: &RedisMasters) -> RedLockConfig {
    let nodes: Vec<Node> = masters.addrs().iter().map(|a| Node::new(a.ip().to_string(), a.port())).collect();
    support::redlock::config_for(&nodes)
        .with_op_timeout(Duration::from_secs(8))
        .with_node_timeout(Duration::from_secs(2))
}

async fn monitors(masters: &RedisMasters) -> Vec<Monitor> {
    let mut monitors = Vec::new();
    for server in masters.nodes() {
        monitors.push(Monitor::start(server).await);
    }
    monitors
}

/// Waits until no master has a hold of `name`, so that every command of a release that
/// returned at a quorum has run everywhere.
async fn released_everywhere(masters: &RedisMasters, locker: &RedLockLocker, name: &LockName) {
    everywhere(masters, locker, name, "0").await;
}

/// Waits until every master has a hold of `name`, so that every grant of an acquire
/// that returned at a quorum has run everywhere.
async fn held_everywhere(masters: &RedisMasters, locker: &RedLockLocker, name: &LockName) {
    everywhere(masters, locker, name, "1").await;
}

async fn everywhere(masters: &RedisMasters, locker: &RedLockLocker, name: &LockName, exists: &str) {
    let key = locker.backend().keys(name).hold;
    eventually(&format!("EXISTS {key} is {exists} on every master"), Duration::from_secs(5), || async {
        masters.nodes().iter().all(|server| server.cli(&["EXISTS", &key]).is_ok_and(|out| out.trim() == exists))
    })
    .await;
}

/// What the client sent, without the checks of [`released_everywhere`].
fn sent_by_client(sent: &[Sent]) -> Vec<&Sent> {
    client_commands(sent).into_iter().filter(|s| s.command() != "exists").collect()
}

fn names(sent: &[&Sent]) -> Vec<String> {
    sent.iter().map(|s| s.command()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_acquire_and_release_are_one_fan_out_each() {
    dlock_conformance::init_tracing();
    let masters = masters(5);
    let locker = redlock::connect(config(&masters)).await.unwrap();
    let name = LockName::new("wire/uncontended").unwrap();
    let mut monitors = monitors(&masters).await;

    let lease = locker.acquire(&name, &LockOptions::new()).await.unwrap();
    lease.release().await.unwrap();
    released_everywhere(&masters, &locker, &name).await;

    for (index, monitor) in monitors.iter_mut().enumerate() {
        let sent = monitor.collect().await;
        let commands = sent_by_client(&sent);
        assert_eq!(commands.len(), 2, "node {index} received {:?}", names(&commands));
        assert!(commands[0].is_script(scripts().grant.get_hash()), "node {index}, first: {:?}", commands[0]);
        assert!(commands[1].is_script(scripts().release.get_hash()), "node {index}, second: {:?}", commands[1]);
    }
}

/// Reading the counters first costs one read per node and look, also on a name new to
/// the masters, whose read reports each master's clock (plus a lead): the proposal made
/// from it is not refused because the clocks moved on meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_the_counters_first_adds_one_read_per_node() {
    dlock_conformance::init_tracing();
    let masters = masters(3);
    let locker = redlock::connect(config(&masters).with_token_source(TokenSource::ReadFirst)).await.unwrap();
    let name = LockName::new("wire/read-first").unwrap();
    let mut monitors = monitors(&masters).await;
    let first = locker.acquire(&name, &LockOptions::new()).await.unwrap();
    let first_token = first.token();
    first.release().await.unwrap();
    released_everywhere(&masters, &locker, &name).await;

    let lease = locker.acquire(&name, &LockOptions::new()).await.unwrap();
    assert_eq!(lease.token().get(), first_token.get() + 1, "read first: the maximum plus one");
    lease.release().await.unwrap();
    released_everywhere(&masters, &locker, &name).await;

    let (read, grant, release) =
        (scripts().read_fence.get_hash(), scripts().grant.get_hash(), scripts().release.get_hash());
    for (index, monitor) in monitors.iter_mut().enumerate() {
        let sent = monitor.collect().await;
        let commands = sent_by_client(&sent);
        assert_eq!(commands.len(), 6, "node {index}: {:?}", names(&commands));
        for (at, script) in [read, grant, release, read, grant, release].into_iter().enumerate() {
            assert!(commands[at].is_script(script), "node {index}, call {at}: {:?}", commands[at]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_subscribes_on_every_node_before_looking_again() {
    dlock_conformance::init_tracing();
    let masters = masters(5);
    let config = config(&masters);
    let (holder, waiter) = (redlock::connect(config.clone()).await.unwrap(), redlock::connect(config).await.unwrap());
    let name = LockName::new("wire/waiter").unwrap();
    let held = holder.acquire(&name, &LockOptions::watchdog(Duration::from_secs(30))).await.unwrap();
    held_everywhere(&masters, &holder, &name).await;
    let mut monitors = monitors(&masters).await;

    let task = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move { waiter.acquire(&name, &LockOptions::new().wait(Duration::from_secs(20))).await })
    };
    eventually("the waiter waits", Duration::from_secs(5), || async { waiter.stats().waiting == 1 }).await;
    let grant = scripts().grant.get_hash();
    for (index, monitor) in monitors.iter_mut().enumerate() {
        let sent = monitor.collect().await;
        let commands = client_commands(&sent);
        let subscribe = commands.iter().position(|s| s.command() == "subscribe");
        let subscribe = subscribe.unwrap_or_else(|| panic!("node {index}: no subscription in {:?}", names(&commands)));
        let looks: Vec<usize> = (0..commands.len()).filter(|&i| commands[i].is_script(grant)).collect();
        // One look, the subscriptions, one more look: a release in between is not missed.
        assert_eq!(looks.len(), 2, "node {index}: {:?}", names(&commands));
        assert!(looks[0] < subscribe && subscribe < looks[1], "node {index}: {:?}", names(&commands));
    }
    held.release().await.unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(5), task).await.expect("the release wakes the waiter");
    lease.unwrap().unwrap().release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_settings_reach_every_node() {
    dlock_conformance::init_tracing();
    let args = ["--user", "default", "off", "--user", "locks", "on", ">s3cr%t", "~*", "&*", "+@all"];
    let masters = RedisMasters::start(
        3,
        &ServerConfig { extra_args: args.map(String::from).to_vec(), ..ServerConfig::default() },
    )
    .unwrap();
    let hosts: Vec<String> = masters.addrs().iter().map(ToString::to_string).collect();
    let url = format!(
        "redlock://locks:s3cr%25t@{}/3?prefix=shop&op_timeout=1s&connect_timeout=1s&node_timeout=200ms",
        hosts.join(",")
    );
    let locker = redlock::connect(RedLockConfig::from_url(&url).unwrap()).await.expect("connect as the ACL user");
    let mut listed = hosts.clone();
    listed.sort();
    assert_eq!(locker.target(), format!("redlock://{}/3 prefix shop", listed.join(",")), "no credentials in it");
    let name = LockName::new("stock/{sku-1}").unwrap();
    let lease = locker.acquire(&name, &LockOptions::new()).await.unwrap();

    let auth = ["--user", "locks", "--pass", "s3cr%t", "--no-auth-warning"];
    for server in masters.nodes() {
        let in_db = |db: &str| {
            let mut args = auth.to_vec();
            args.extend(["-n", db, "HGET", "shop:{stock%2F%7Bsku-1%7D}", "token"]);
            server.cli(&args).unwrap().trim().to_string()
        };
        // The acquire returned at a quorum; the last grant may still be on its way.
        let what = format!("{}: the hold is in database 3 under the prefix", server.addr());
        eventually(&what, Duration::from_secs(5), || {
            let found = in_db("3") == lease.token().to_string();
            async move { found }
        })
        .await;
        assert_eq!(in_db("0"), "", "{}: nothing in database 0", server.addr());
    }
    lease.release().await.unwrap();

    // Wrong credentials on every node: an error, promptly, not a client.
    let wrong = url.replace("s3cr%25t", "wrong");
    let started = std::time::Instant::now();
    let result = redlock::connect(RedLockConfig::from_url(&wrong).unwrap()).await;
    assert!(result.is_err(), "wrong credentials were accepted");
    assert!(started.elapsed() < Duration::from_secs(3));
}

/// Two entries that reach one server (here a proxy in front of another entry, as two
/// names of one host would) are refused: each would get a vote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_listed_twice_is_refused() {
    let masters = masters(3);
    let alias = dlock_testkit::proxy::FaultProxy::start(masters.addrs()[0]).await.expect("start a proxy");
    let mut nodes: Vec<Node> = masters.addrs().iter().map(|a| Node::new(a.ip().to_string(), a.port())).collect();
    nodes.push(Node::new(alias.addr().ip().to_string(), alias.addr().port()));
    let config = support::redlock::config_for(&nodes)
        .with_op_timeout(Duration::from_secs(8))
        .with_node_timeout(Duration::from_secs(2));
    match redlock::connect(config).await {
        Err(dlock_core::LockError::InvalidInput(why)) => assert!(why.contains("one Redis server"), "{why}"),
        other => panic!("expected InvalidInput, got {:?}", other.map(|_| "a client")),
    }
}
