//! Results stored under a lock's name on one server: where they live, what the store
//! script refuses, a store delivered twice, a record dlock did not write, expiry, a
//! Cluster, and replica acknowledgement.

mod support;

use std::time::Duration;

use dlock_conformance::properties::eventually;
use dlock_core::{LockError, LockName, LockOptions, Locker, OwnerId};
use dlock_redis::results::{scripts as result_scripts, ResultRecord, StoreReply};
use dlock_redis::scripts::{AcquireReply, Invocation, ReleaseReply};
use dlock_redis::{ConnectConfig, KeyLayout, RedisConfig};
use dlock_testkit::supervisor::redis::{cli, RedisCluster, RedisConfig as ServerConfig, RedisServer};
use redis::aio::MultiplexedConnection;

const RETENTION: Duration = Duration::from_secs(600);

fn opts() -> LockOptions {
    LockOptions::watchdog(Duration::from_secs(5)).wait(Duration::from_secs(5))
}

async fn connection(server: &RedisServer) -> MultiplexedConnection {
    let addr = server.addr();
    redis::Client::open(format!("redis://{}:{}", addr.ip(), addr.port()))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn record(conn: &mut MultiplexedConnection, key: &str) -> Option<ResultRecord> {
    let reply = Invocation::new(&result_scripts().load, &[key]).run(conn).await.expect("load script");
    ResultRecord::parse(reply).expect("a record dlock wrote")
}

/// The result is a hash beside the hold with the retention as ttl; releasing or evicting
/// the hold leaves it, a second store of the same token is refused, and only a later
/// holder replaces it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn result_lives_beside_the_hold_and_outlives_it() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let config = support::client_config(server.addr());
    let (client, other) =
        (dlock_redis::connect(config.clone()).await.unwrap(), dlock_redis::connect(config).await.unwrap());
    let mut conn = connection(&server).await;
    let name = LockName::new("results/{layout}").unwrap();
    let keys = client.backend().keys(&name);
    assert_eq!(keys.result(), "dlock:{results%2F%7Blayout%7D}:result");

    let first = client.acquire(&name, &opts()).await.expect("acquire");
    first.store_result(b"first", RETENTION).await.expect("store");
    let kind: String = redis::cmd("TYPE").arg(keys.result()).query_async(&mut conn).await.unwrap();
    assert_eq!(kind, "hash");
    let stored = record(&mut conn, &keys.result()).await.expect("a record");
    assert_eq!((stored.token, stored.value.as_slice()), (first.token().get(), &b"first"[..]));
    assert!(stored.call.starts_with("grant:"), "{stored:?}");
    let pttl: i64 = redis::cmd("PTTL").arg(keys.result()).query_async(&mut conn).await.unwrap();
    assert!(pttl > 590_000 && pttl <= 600_000, "the record lasts the retention: {pttl} ms");

    let again = first.store_result(b"again", RETENTION).await;
    assert!(matches!(again, Err(LockError::NotHeld { .. })), "a second store of the same token: {again:?}");

    // Evicted: the hold is gone, the result stays, and the evicted holder stores nothing.
    let _: i64 = redis::cmd("DEL").arg(&keys.hold).query_async(&mut conn).await.unwrap();
    let kept = other.load_result(&name).await.expect("load").expect("the eviction left the result");
    assert_eq!((kept.token, kept.value.as_slice()), (first.token(), &b"first"[..]));
    let late = first.store_result(b"late", RETENTION).await;
    assert!(matches!(late, Err(LockError::NotHeld { .. })), "a store after the eviction: {late:?}");

    let second = other.acquire(&name, &opts()).await.expect("the evicted lock is free");
    second.store_result(b"second", RETENTION).await.expect("a later holder replaces the result");
    let second_token = second.token();
    second.release().await.expect("release");
    let replaced = client.load_result(&name).await.expect("load").expect("stored");
    assert_eq!((replaced.token, replaced.value.as_slice()), (second_token, &b"second"[..]));
    let exists: bool = redis::cmd("EXISTS").arg(&keys.hold).query_async(&mut conn).await.unwrap();
    assert!(!exists, "the release left the hold");
    drop(first);
}

/// A re-entrant hold stores first; the outer hold, of the same token, is then refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentrant_holds_share_one_result() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let client = dlock_redis::connect(support::client_config(server.addr())).await.unwrap();
    let name = LockName::new("results/reentrant").unwrap();
    let opts = opts().owner(OwnerId::new("job 7").unwrap());
    let outer = client.acquire(&name, &opts).await.expect("acquire");
    let inner = client.acquire(&name, &opts).await.expect("re-enter");
    inner.store_result(b"inner", RETENTION).await.expect("the inner hold stores");
    inner.release().await.expect("release the inner hold");
    let refused = outer.store_result(b"outer", RETENTION).await;
    assert!(matches!(refused, Err(LockError::NotHeld { .. })), "a store of a token already stored: {refused:?}");
    let stored = client.load_result(&name).await.expect("load").expect("stored");
    assert_eq!((stored.token, stored.value.as_slice()), (outer.token(), &b"inner"[..]));
    outer.release().await.expect("release");
}

/// The store script as the server runs it: a call delivered twice stores once and says so
/// both times (also once the hold is gone), another call of the same token is refused,
/// and a grant released or given back stores nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_delivered_twice_stores_once() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let mut conn = connection(&server).await;
    let keys = KeyLayout::new("dlock").unwrap().lock(&LockName::new("resent").unwrap());
    let owner = "owner:job-7";
    let acquire = |grant: &str| support::acquire_call(&keys, owner, grant);
    let release = |grant: &str, token: u64| support::release_call(&keys, owner, grant, token);
    let store = |grant: &str, token: u64, call: &str, value: &str| {
        Invocation::new(&result_scripts().store, &[&keys.hold, &keys.result()])
            .arg(owner)
            .arg(token.to_string())
            .arg(format!("grant:{grant}"))
            .arg(call)
            .arg(value)
            .arg(60_000)
    };
    let granted = |reply| match AcquireReply::parse(reply).unwrap() {
        AcquireReply::Granted(token) => token,
        busy => panic!("not granted: {busy:?}"),
    };

    let token = granted(acquire("a:1").run(&mut conn).await.unwrap());
    let first = store("a:1", token, "call-1", "one");
    assert_eq!(StoreReply::parse(first.run(&mut conn).await.unwrap()).unwrap(), StoreReply::Stored);
    assert_eq!(StoreReply::parse(first.run(&mut conn).await.unwrap()).unwrap(), StoreReply::StoredBefore);
    let other_call = store("a:1", token, "call-2", "two");
    assert_eq!(StoreReply::parse(other_call.run(&mut conn).await.unwrap()).unwrap(), StoreReply::Superseded);

    let released = ReleaseReply::parse(release("a:1", token).run(&mut conn).await.unwrap()).unwrap();
    assert_eq!(released, ReleaseReply::Released);
    assert_eq!(StoreReply::parse(first.run(&mut conn).await.unwrap()).unwrap(), StoreReply::StoredBefore);
    let after_release = store("a:1", token, "call-3", "three");
    assert_eq!(StoreReply::parse(after_release.run(&mut conn).await.unwrap()).unwrap(), StoreReply::NotHeld);

    // A later hold; its owner's second grant released: that grant stores nothing.
    let later = granted(acquire("b:1").run(&mut conn).await.unwrap());
    assert!(later > token);
    assert_eq!(granted(acquire("b:2").run(&mut conn).await.unwrap()), later);
    release("b:2", later).run(&mut conn).await.unwrap();
    let released_grant = store("b:2", later, "call-4", "four");
    assert_eq!(StoreReply::parse(released_grant.run(&mut conn).await.unwrap()).unwrap(), StoreReply::NotHeld);
    // Another owner's field, or the hold's token with a stale one, store nothing either.
    let stale = store("b:1", token, "call-5", "five");
    assert_eq!(StoreReply::parse(stale.run(&mut conn).await.unwrap()).unwrap(), StoreReply::NotHeld);
    let stored = record(&mut conn, &keys.result()).await.expect("stored");
    assert_eq!((stored.token, stored.value.as_slice(), stored.call.as_str()), (token, &b"one"[..], "call-1"));

    let live = store("b:1", later, "call-6", "six");
    assert_eq!(StoreReply::parse(live.run(&mut conn).await.unwrap()).unwrap(), StoreReply::Stored);
    let stored = record(&mut conn, &keys.result()).await.expect("stored");
    assert_eq!((stored.token, stored.value.as_slice()), (later, &b"six"[..]));
}

/// A value at the result key that dlock did not write is a backend error for a load and
/// a store alike, and the store leaves it as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_result_record_is_a_backend_error() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let client = dlock_redis::connect(support::client_config(server.addr())).await.unwrap();
    let mut conn = connection(&server).await;
    let name = LockName::new("results/foreign").unwrap();
    let key = client.backend().keys(&name).result();

    let _: () = redis::cmd("SET").arg(&key).arg("not a record").query_async(&mut conn).await.unwrap();
    let loaded = client.load_result(&name).await;
    assert!(matches!(loaded, Err(LockError::Backend(_))), "loading a foreign string: {loaded:?}");
    let lease = client.acquire(&name, &opts()).await.expect("acquire");
    let stored = lease.store_result(b"mine", RETENTION).await;
    assert!(matches!(stored, Err(LockError::Backend(_))), "storing over a foreign string: {stored:?}");
    let value: String = redis::cmd("GET").arg(&key).query_async(&mut conn).await.unwrap();
    assert_eq!(value, "not a record");

    for fields in [&["token", "x7", "value", "v", "call", "c"][..], &["token", "7", "call", "c"]] {
        let _: i64 = redis::cmd("DEL").arg(&key).query_async(&mut conn).await.unwrap();
        let _: i64 = redis::cmd("HSET").arg(&key).arg(fields).query_async(&mut conn).await.unwrap();
        let loaded = client.load_result(&name).await;
        assert!(matches!(loaded, Err(LockError::Backend(_))), "loading {fields:?}: {loaded:?}");
    }
    lease.release().await.expect("release");
}

/// The result is gone once its retention has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn result_expires_with_its_retention() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let client = dlock_redis::connect(support::client_config(server.addr())).await.unwrap();
    let name = LockName::new("results/expiry").unwrap();
    let lease = client.acquire(&name, &opts()).await.expect("acquire");
    lease.store_result(b"short-lived", Duration::from_millis(1500)).await.expect("store");
    lease.release().await.expect("release");
    assert!(client.load_result(&name).await.expect("load").is_some(), "the result is kept at first");
    eventually("the result expires", Duration::from_secs(5), || async {
        client.load_result(&name).await.expect("load").is_none()
    })
    .await;
}

/// A server that lost its scripts (`SCRIPT FLUSH`, a restart) gets them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_and_loads_survive_a_script_flush() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let client = dlock_redis::connect(support::client_config(server.addr())).await.unwrap();
    let name = LockName::new("results/flushed").unwrap();
    let lease = client.acquire(&name, &opts()).await.expect("acquire");
    server.cli(&["SCRIPT", "FLUSH"]).unwrap();
    lease.store_result(b"kept", RETENTION).await.expect("store after SCRIPT FLUSH");
    server.cli(&["SCRIPT", "FLUSH"]).unwrap();
    let stored = client.load_result(&name).await.expect("load after SCRIPT FLUSH").expect("stored");
    assert_eq!(stored.value, b"kept");
    lease.release().await.expect("release");
}

/// On a Cluster the result shares the hold's slot, whichever node serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_on_every_node_of_a_cluster() {
    let cluster =
        tokio::task::spawn_blocking(|| RedisCluster::start(3)).await.unwrap().expect("start a 3-master cluster");
    let config = RedisConfig::from_url(&cluster.url())
        .unwrap()
        .with_op_timeout(support::OP_TIMEOUT)
        .with_connect_timeout(support::CONNECT_TIMEOUT);
    let (a, b) = (dlock_redis::connect(config.clone()).await.unwrap(), dlock_redis::connect(config).await.unwrap());
    let slot =
        |key: &str| -> u16 { cli(cluster.addrs()[0], &["CLUSTER", "KEYSLOT", key]).unwrap().trim().parse().unwrap() };
    // A name in each third of the slots, so that each of the three masters serves one.
    let mut thirds: [Option<LockName>; 3] = [None, None, None];
    for n in 0..1000 {
        let name = LockName::new(format!("cluster-results/{n}/{{odd}}")).unwrap();
        let third = usize::from(slot(&a.backend().keys(&name).hold) / 5462);
        thirds[third].get_or_insert(name);
        if thirds.iter().all(Option::is_some) {
            break;
        }
    }
    for name in thirds.into_iter().map(|name| name.expect("a name in each third of the slots")) {
        let keys = a.backend().keys(&name);
        assert_eq!(slot(&keys.result()), slot(&keys.hold), "{name}: the result is in another slot");
        let lease = a.acquire(&name, &opts()).await.unwrap_or_else(|e| panic!("acquire {name}: {e}"));
        lease.store_result(name.as_str().as_bytes(), RETENTION).await.unwrap_or_else(|e| panic!("store {name}: {e}"));
        lease.release().await.unwrap();
        let stored = b.load_result(&name).await.unwrap_or_else(|e| panic!("load {name}: {e}")).expect("stored");
        assert_eq!(stored.value, name.as_str().as_bytes());
    }
}

/// With replica acknowledgement the replica has the result when the store returns; a
/// store no replica acknowledges fails, and its record stays on the master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_wait_for_replicas() {
    let (master, mut replica) = tokio::task::spawn_blocking(|| {
        let master = RedisServer::start(&ServerConfig::default()).expect("start the master");
        let replica = RedisServer::start_replica_of(&master, &ServerConfig::default()).expect("start the replica");
        (master, replica)
    })
    .await
    .unwrap();
    let config = support::client_config(master.addr()).with_replica_ack(1, Duration::from_millis(200));
    let client = dlock_redis::connect(config).await.unwrap();
    let name = LockName::new("results/replicated").unwrap();
    let key = client.backend().keys(&name).result();

    let lease = client.acquire(&name, &opts()).await.expect("acquire");
    lease.store_result(b"replicated", RETENTION).await.expect("store");
    let on_replica = replica.cli(&["HGET", &key, "value"]).unwrap();
    assert_eq!(on_replica.trim(), "replicated", "the replica has the result the moment the store returns");
    lease.release().await.expect("release");

    let lease = client.acquire(&name, &opts()).await.expect("acquire again");
    replica.kill();
    let unacknowledged = lease.store_result(b"master only", RETENTION).await;
    assert!(
        matches!(unacknowledged, Err(LockError::QuorumNotReached { got: 0, needed: 1 })),
        "a store no replica acknowledged: {unacknowledged:?}"
    );
    let kept = client.load_result(&name).await.expect("load").expect("the master keeps the record");
    assert_eq!((kept.token, kept.value.as_slice()), (lease.token(), &b"master only"[..]));
    drop(lease);
}
