//! Stored results on the server: where they live and what they hold, their expiry kept
//! in the record, records that are not ours, and a store whose reply is lost.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{ZkFixture, MARGIN, TTL};
use dlock_conformance::properties::{eventually, unique_name};
use dlock_conformance::{Evict, Fault};
use dlock_core::{LockError, LockOptions, Locker};
use dlock_testkit::proxy::FaultProxy;
use dlock_zk::{ConnectConfig, ZkConfig};
use zookeeper_client as zk;

const RETENTION: Duration = Duration::from_secs(600);

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("a clock after 1970").as_millis() as u64
}

/// A result is a persistent znode beside the lock's, `<lock path>.result`, holding `dlr1`,
/// the token and the expiry (big-endian milliseconds since the epoch), then the value.
/// It is not in the lock's queue, and it stays when the hold is evicted, when the lock is
/// released and when the server deletes the lock's empty znode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_live_beside_the_lock() {
    dlock_conformance::init_tracing();
    let fixture = ZkFixture::with_server_config(dlock_testkit::supervisor::zookeeper::ZooKeeperConfig {
        container_check_interval: Duration::from_millis(200),
        ..Default::default()
    })
    .await;
    let admin = fixture.admin().await;
    let client = fixture.zk_client().await;
    let name = unique_name("results/a b");
    let lock_path = fixture.config().lock_path(&name);
    let result_path = fixture.config().result_path(&name);
    assert_eq!(result_path, format!("{lock_path}.result"));

    let lease = client.acquire(&name, &LockOptions::watchdog(TTL)).await.expect("acquire");
    let before = now_ms();
    lease.store_result(b"shipped", RETENTION).await.expect("store");
    let (data, stat) = admin.get_data(&result_path).await.expect("the result znode");
    assert_eq!(stat.ephemeral_owner, 0, "a result outlives sessions");
    assert_eq!(&data[..4], b"dlr1");
    assert_eq!(u64::from_be_bytes(data[4..12].try_into().unwrap()), lease.token().get());
    let expires = u64::from_be_bytes(data[12..20].try_into().unwrap());
    let retention = RETENTION.as_millis() as u64;
    assert!((before + retention..=now_ms() + retention).contains(&expires), "expiry {expires}, stored at {before}");
    assert_eq!(&data[20..], b"shipped");
    assert_eq!(common::queue(&admin, &lock_path).await.len(), 1, "the result joined the queue");
    let children = admin.list_children(&lock_path).await.expect("list");
    assert_eq!(children.len(), 1, "the lock's znode holds only the hold: {children:?}");

    fixture.evict(&name).await;
    let stored = client.load_result(&name).await.expect("load").expect("kept after the eviction");
    assert_eq!((stored.token, stored.value.as_slice()), (lease.token(), &b"shipped"[..]));
    assert!(matches!(lease.store_result(b"again", RETENTION).await, Err(LockError::NotHeld { .. })));
    assert!(matches!(lease.release().await, Err(LockError::NotHeld { .. })));

    eventually("the server deletes the empty lock znode", MARGIN, || async {
        matches!(admin.check_stat(&lock_path).await, Ok(None))
    })
    .await;
    let other = fixture.zk_client().await;
    assert_eq!(other.load_result(&name).await.expect("load"), Some(stored), "the result went with the lock");
}

/// ZooKeeper keeps the record past its expiry, but it reads as absent; the name's next
/// run overwrites it in place (a `setData` on the version read, not a new znode), and a
/// run whose store comes after a newer run's is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_results_read_as_absent_and_are_overwritten() {
    dlock_conformance::init_tracing();
    let fixture = ZkFixture::standalone().await;
    let admin = fixture.admin().await;
    let client = fixture.zk_client().await;
    let name = unique_name("results-expiry");
    let result_path = fixture.config().result_path(&name);
    let opts = LockOptions::watchdog(TTL);

    let first = client.acquire(&name, &opts).await.expect("acquire");
    first.store_result(b"short", Duration::from_millis(300)).await.expect("store");
    assert!(client.load_result(&name).await.expect("load").is_some());
    first.release().await.expect("release");
    eventually("the record expires", MARGIN, || async { client.load_result(&name).await.expect("load").is_none() })
        .await;
    let (_, stat) = admin.get_data(&result_path).await.expect("the expired record stays on the server");
    let czxid = stat.czxid;

    let second = client.acquire(&name, &opts).await.expect("acquire");
    second.store_result(b"long", RETENTION).await.expect("a store over an expired record");
    let (_, stat) = admin.get_data(&result_path).await.expect("the result znode");
    assert_eq!((stat.czxid, stat.version), (czxid, 1), "the record was not overwritten in place");
    let stored = client.load_result(&name).await.expect("load").expect("stored");
    assert_eq!((stored.token, stored.value.as_slice()), (second.token(), &b"long"[..]));
    assert!(
        matches!(second.store_result(b"twice", RETENTION).await, Err(LockError::NotHeld { .. })),
        "a second store of the same token replaced the record"
    );
    second.release().await.expect("release");
    assert_eq!(client.load_result(&name).await.expect("load"), Some(stored));
}

/// A znode at a result's path that does not hold a record is a `Backend` error, for
/// loads and stores alike, and a store leaves it as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_data_is_a_backend_error() {
    dlock_conformance::init_tracing();
    let fixture = ZkFixture::standalone().await;
    let admin = fixture.admin().await;
    let client = fixture.zk_client().await;
    let name = unique_name("results-foreign");
    let result_path = fixture.config().result_path(&name);
    let lease = client.acquire(&name, &LockOptions::watchdog(TTL)).await.expect("acquire");
    admin
        .create(&result_path, b"not a record", &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()))
        .await
        .expect("create a foreign znode");

    let loaded = client.load_result(&name).await;
    assert!(matches!(&loaded, Err(LockError::Backend(err)) if err.to_string().contains(&result_path)), "{loaded:?}");
    let stored = lease.store_result(b"value", RETENTION).await;
    assert!(matches!(stored, Err(LockError::Backend(_))), "{stored:?}");
    let (data, _) = admin.get_data(&result_path).await.expect("read");
    assert_eq!(data, b"not a record");
    lease.release().await.expect("release");
}

/// The connection breaks after the server applied the store and before its reply came
/// back: the client reconnects to its session, reads the record back, finds it is its
/// own, and reports the store done; the hold lives on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_whose_reply_is_lost_is_read_back() {
    dlock_conformance::init_tracing();
    let fixture = ZkFixture::standalone().await;
    let admin = fixture.admin().await;
    let proxy = FaultProxy::start(fixture.addr()).await.expect("start a fault proxy");
    let config = fixture
        .config()
        .clone()
        .with_hosts(&proxy.addr().to_string())
        .expect("proxy config")
        .with_op_timeout(Duration::from_secs(10));
    let client = dlock_zk::connect(config).await.expect("connect through the proxy");
    let name = unique_name("results-lost-reply");
    let result_path = fixture.config().result_path(&name);
    // A long session, so that the break does not end it.
    let lease = client.acquire(&name, &LockOptions::watchdog(Duration::from_secs(30))).await.expect("acquire");

    proxy.set_fault(Fault::DelayReplies(Duration::from_millis(800)));
    let store = {
        let handle = tokio::spawn(async move {
            let outcome = lease.store_result(b"once", RETENTION).await;
            (lease, outcome)
        });
        eventually("the server applies the store", MARGIN, || async {
            matches!(admin.check_stat(&result_path).await, Ok(Some(_)))
        })
        .await;
        proxy.set_fault(Fault::Cut);
        tokio::time::sleep(Duration::from_millis(100)).await;
        proxy.set_fault(Fault::None);
        handle
    };
    let (lease, outcome) = store.await.expect("store task");
    outcome.expect("the store whose reply was lost is found applied");
    let stored = client.load_result(&name).await.expect("load").expect("stored");
    assert_eq!((stored.token, stored.value.as_slice()), (lease.token(), &b"once"[..]));
    assert!(!lease.is_lost(), "the session lived on");
    lease.release().await.expect("release");
}

/// A client without a server to reach fails loads within its operation timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_is_unavailable() {
    dlock_conformance::init_tracing();
    let fixture = ZkFixture::standalone().await;
    let proxy = FaultProxy::start(fixture.addr()).await.expect("start a fault proxy");
    let config = ZkConfig::new(&proxy.addr().to_string()).expect("config").with_op_timeout(Duration::from_millis(500));
    let client = dlock_zk::connect(config).await.expect("connect through the proxy");
    let lease =
        client.acquire(&unique_name("results-unreachable"), &LockOptions::watchdog(TTL)).await.expect("acquire");
    proxy.set_fault(Fault::Blackhole);
    let started = std::time::Instant::now();
    let loaded = client.load_result(lease.name()).await;
    assert!(matches!(loaded, Err(LockError::Unavailable { .. })), "{loaded:?}");
    let stored = lease.store_result(b"value", RETENTION).await;
    assert!(matches!(stored, Err(LockError::Unavailable { .. })), "{stored:?}");
    assert!(started.elapsed() < Duration::from_millis(500) * 2 + MARGIN, "{:?}", started.elapsed());
    proxy.set_fault(Fault::None);
}

/// A sweep deletes result znodes whose record has expired, and only those: a live
/// record and a znode of someone else's layout stay. While another client sweeps (its
/// marker is under the root), a sweep deletes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_deletes_expired_results_only() {
    dlock_conformance::init_tracing();
    let fixture = ZkFixture::standalone().await;
    let admin = fixture.admin().await;
    let client = fixture.zk_client().await;
    let base = unique_name("results-sweep");
    let name = |label: &str| dlock_core::LockName::new(format!("{base}/{label}")).expect("name");
    let (short, long, foreign) = (name("short"), name("long"), name("foreign"));
    for (key, retention) in [(&short, Duration::from_millis(300)), (&long, RETENTION)] {
        let lease = client.acquire(key, &LockOptions::watchdog(TTL)).await.expect("acquire");
        lease.store_result(b"done", retention).await.expect("store");
        lease.release().await.expect("release");
    }
    let foreign_path = fixture.config().result_path(&foreign);
    let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    admin.create(&foreign_path, b"not a record", &options).await.expect("a znode of another layout");
    tokio::time::sleep(Duration::from_millis(400)).await;

    // Another client's sweep is under way: this one leaves everything.
    let marker = format!("{}/.sweeping", fixture.config().root());
    admin.create(&marker, &[], &zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all())).await.expect("marker");
    assert_eq!(client.sweep().await.expect("sweep").removed, 0, "swept beside another sweeper");
    admin.delete(&marker, None).await.expect("delete the marker");

    let swept = client.sweep().await.expect("sweep");
    assert!(swept.removed >= 1, "nothing swept: {swept:?}");
    assert_eq!(
        admin.check_stat(&fixture.config().result_path(&short)).await.expect("stat"),
        None,
        "an expired record stayed"
    );
    assert!(
        admin.check_stat(&fixture.config().result_path(&long)).await.expect("stat").is_some(),
        "a live record went"
    );
    assert!(admin.check_stat(&foreign_path).await.expect("stat").is_some(), "a znode of another layout went");
    assert!(matches!(admin.check_stat(&marker).await, Ok(None)), "the sweeper left its marker");
    assert_eq!(client.load_result(&long).await.expect("load").map(|r| r.value), Some(b"done".to_vec()));
}

/// A re-entrant grant that was released stores nothing, though its owner still holds
/// the lock (and its node) through another grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_reentrant_grant_stores_nothing() {
    use dlock_core::backend::{Attempt, Backend, Release, Request, RequestId};

    dlock_conformance::init_tracing();
    let fixture = ZkFixture::standalone().await;
    let client = fixture.zk_client().await;
    let backend = client.backend();
    let name = unique_name("results-reentrant");
    let owner = dlock_core::OwnerId::new("reentrant-owner").expect("owner");
    let request = |n| Request {
        name: name.clone(),
        owner: owner.clone(),
        id: RequestId::new("test-client", n),
        mode: dlock_core::LeaseMode::Watchdog { ttl: TTL },
        blocking: false,
        fair: false,
        kind: dlock_core::HoldKind::Exclusive,
    };
    let grant = |attempt: Attempt<_>| match attempt {
        Attempt::Granted { hold, token } => (hold, token),
        Attempt::Busy { .. } => panic!("the owner's own lock was busy"),
    };
    let (first, token) = grant(backend.attempt(&request(1), &mut None).await.expect("attempt"));
    let (second, again) = grant(backend.attempt(&request(2), &mut None).await.expect("re-entry"));
    assert_eq!(token, again, "a re-entry keeps the token");
    assert!(matches!(backend.release(&second).await.expect("release"), Release::Released));
    let refused = backend.store_result(&second, token, b"late", RETENTION).await;
    assert!(matches!(refused, Err(LockError::NotHeld { .. })), "a released grant stored a result: {refused:?}");
    backend.store_result(&first, token, b"kept", RETENTION).await.expect("the live grant stores");
    assert!(matches!(backend.release(&first).await.expect("release"), Release::Released));
}
