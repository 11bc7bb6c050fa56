//! What the server sees, counted from its metrics: an uncontended acquire and release is
//! two transactions (for a reader or a permit too); a client grants one lease per ttl, not one per lock; renewing many
//! locks takes far fewer requests than locks.

use std::time::Duration;

use dlock_conformance::properties::unique_name;
use dlock_core::{ConnectConfig, LockName, LockOptions, Locker};
use dlock_etcd::EtcdConfig;
use dlock_testkit::supervisor::etcd::{EtcdConfig as ServerConfig, EtcdServer};
use futures::stream::{self, StreamExt, TryStreamExt};

/// Request counters of one server, by gRPC method.
struct Counts(String);

impl Counts {
    fn read(server: &mut EtcdServer) -> Self {
        Counts(server.member().metrics().expect("read the server's metrics"))
    }

    fn sum(&self, name: &str, method: &str) -> u64 {
        let label = format!("grpc_method=\"{method}\"");
        self.0
            .lines()
            .filter(|line| line.starts_with(&format!("{name}{{")) && line.contains(&label))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// Unary calls (or streams) started.
    fn calls(&self, method: &str) -> u64 {
        self.sum("grpc_server_started_total", method)
    }

    /// Keepalive messages received.
    fn keepalives(&self) -> u64 {
        self.sum("grpc_server_msg_received_total", "LeaseKeepAlive")
    }
}

async fn server() -> EtcdServer {
    tokio::task::spawn_blocking(|| EtcdServer::start(&ServerConfig::default()))
        .await
        .expect("spawn_blocking")
        .expect("start etcd")
}

async fn connect(server: &EtcdServer) -> dlock_etcd::EtcdLocker {
    let config = EtcdConfig::from_url(&server.url()).expect("url").with_op_timeout(Duration::from_secs(1));
    dlock_etcd::connect(config).await.expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_acquire_and_release_take_two_transactions() {
    let mut server = server().await;
    let locker = connect(&server).await;
    let opts = LockOptions::watchdog(Duration::from_secs(30));
    // The first acquire grants the client's lease for this ttl.
    let first = locker.acquire(&unique_name("requests"), &opts).await.expect("acquire");
    first.release().await.expect("release");

    const ROUNDS: u64 = 20;
    let before = Counts::read(&mut server);
    for _ in 0..ROUNDS {
        let lease = locker.acquire(&unique_name("requests"), &opts).await.expect("acquire");
        lease.release().await.expect("release");
    }
    let after = Counts::read(&mut server);
    assert_eq!(after.calls("Txn") - before.calls("Txn"), 2 * ROUNDS, "one transaction to acquire, one to release");
    assert_eq!(after.calls("LeaseGrant") - before.calls("LeaseGrant"), 0, "no lease per lock");
    assert_eq!(after.calls("Range") - before.calls("Range"), 0);
    assert!(after.keepalives() - before.keepalives() <= ROUNDS, "at most one keepalive along with each acquire");
}

/// A reader, or a permit, costs what a mutex does when nobody is in the way: one
/// transaction to acquire, one to release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_readers_and_permits_take_two_transactions() {
    let mut server = server().await;
    let locker = connect(&server).await;
    let ttl = LockOptions::watchdog(Duration::from_secs(30));
    let warm = locker.acquire(&unique_name("requests"), &ttl).await.expect("acquire");
    warm.release().await.expect("release");

    for opts in [ttl.clone().read(), ttl.clone().permits(3)] {
        const ROUNDS: u64 = 10;
        let before = Counts::read(&mut server);
        for _ in 0..ROUNDS {
            let lease = locker.acquire(&unique_name("requests"), &opts).await.expect("acquire");
            lease.release().await.expect("release");
        }
        let after = Counts::read(&mut server);
        let kind = opts.hold_kind();
        assert_eq!(after.calls("Txn") - before.calls("Txn"), 2 * ROUNDS, "{kind:?}: one transaction each way");
        assert_eq!(after.calls("Range") - before.calls("Range"), 0, "{kind:?}");
        assert_eq!(after.calls("LeaseGrant") - before.calls("LeaseGrant"), 0, "{kind:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_lease_per_ttl_renews_many_locks() {
    let mut server = server().await;
    let locker = connect(&server).await;
    let prefix = unique_name("many");
    let names: Vec<LockName> = (0..200).map(|i| LockName::new(format!("{prefix}/{i}")).expect("name")).collect();
    let ttl = Duration::from_secs(2);

    let before = Counts::read(&mut server);
    let leases: Vec<_> = stream::iter(names.iter().cloned())
        .map(|name| {
            let locker = locker.clone();
            async move { locker.acquire(&name, &LockOptions::watchdog(ttl)).await }
        })
        .buffer_unordered(200)
        .try_collect()
        .await
        .expect("acquire 200 names");
    let other = locker.acquire(&unique_name("other-ttl"), &LockOptions::watchdog(ttl * 2)).await.expect("acquire");
    let granted = Counts::read(&mut server);
    assert_eq!(granted.calls("LeaseGrant") - before.calls("LeaseGrant"), 2, "one lease per ttl, whatever the locks");

    // Time for every lock to be renewed a few times.
    let renewed_before = locker.stats().renewals;
    tokio::time::sleep(ttl * 3 / 2).await;
    let renewed = Counts::read(&mut server);
    let renewals = locker.stats().renewals - renewed_before;
    let keepalives = renewed.keepalives() - granted.keepalives();
    let txns = renewed.calls("Txn") - granted.calls("Txn");
    assert!(renewals >= 2 * 200, "only {renewals} renewals of 200 locks in one and a half ttls");
    assert!(leases.iter().all(|lease| !lease.is_lost()));
    assert!(
        keepalives * 4 <= renewals && txns * 4 <= renewals,
        "{renewals} renewals took {keepalives} keepalives and {txns} transactions: they are not batched"
    );
    println!("{renewals} renewals: {keepalives} keepalives, {txns} transactions");

    for lease in leases {
        lease.release().await.expect("release");
    }
    other.release().await.expect("release");
}
