//! The ZooKeeper fixture of the conformance suite and of this crate's own fault tests:
//! a standalone server started for the test (or the one `DLOCK_TEST_ZOOKEEPER_URL` names),
//! clients with short timeouts, fault proxies, and an operator's client for evictions.

#![allow(dead_code)]

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dlock_conformance::{Evict, Faults, FaultyClient, Fixture, Restart, Storage, Timing};
use dlock_core::{LockError, LockName, Locker};
use dlock_testkit::proxy::FaultProxy;
use dlock_testkit::supervisor::zookeeper::{ZooKeeperConfig, ZooKeeperServer};
use dlock_testkit::supervisor::{external_url, free_port};
use dlock_zk::{ConnectConfig, ZkConfig, ZkLocker};
use zookeeper_client as zk;

/// The lease ttl of the tests: the session timeout of their locks.
pub(crate) const TTL: Duration = Duration::from_secs(3);

/// Slack on every time bound.
pub(crate) const MARGIN: Duration = Duration::from_secs(3);

/// The operation timeout of the tests' clients: a freshly started server's first writes
/// (its JIT still warming up) can take a second on a loaded machine.
pub(crate) const OP_TIMEOUT: Duration = Duration::from_secs(2);

/// How often the test server deletes empty lock znodes: the time an idle name's znode
/// outlives it.
pub(crate) const IDLE: Duration = Duration::from_secs(1);

/// A ZooKeeper under test.
pub(crate) struct ZkFixture {
    server: Option<Mutex<ZooKeeperServer>>,
    config: ZkConfig,
    proxies: Mutex<Vec<Arc<FaultProxy>>>,
}

impl ZkFixture {
    /// A fixture over a fresh standalone server, or over `DLOCK_TEST_ZOOKEEPER_URL`.
    pub(crate) async fn standalone() -> Self {
        if let Some(url) = external_url("zookeeper") {
            let config = ZkConfig::from_url(&url).expect("DLOCK_TEST_ZOOKEEPER_URL is a zk:// URL");
            return ZkFixture { server: None, config: client_config(config), proxies: Mutex::new(Vec::new()) };
        }
        Self::with_server_config(ZooKeeperConfig {
            container_check_interval: IDLE,
            container_max_per_minute: 1_000_000,
            ..ZooKeeperConfig::default()
        })
        .await
    }

    /// A fixture over a fresh local standalone server with these settings (always local:
    /// the test depends on them).
    pub(crate) async fn with_server_config(server_config: ZooKeeperConfig) -> Self {
        let server = tokio::task::block_in_place(|| ZooKeeperServer::start_with(&server_config))
            .expect("start a standalone ZooKeeper (run scripts/install-backends)");
        let config = ZkConfig::from_url(&server.url()).expect("the server's URL");
        ZkFixture { server: Some(Mutex::new(server)), config: client_config(config), proxies: Mutex::new(Vec::new()) }
    }

    /// The configuration of the fixture's clients.
    pub(crate) fn config(&self) -> &ZkConfig {
        &self.config
    }

    /// The server's client address (the first member's, for an external ensemble).
    pub(crate) fn addr(&self) -> SocketAddr {
        let host = &self.config.hosts()[0];
        (host.host.as_str(), host.port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut addrs| addrs.next())
            .unwrap_or_else(|| panic!("cannot resolve the test ZooKeeper {host}"))
    }

    /// A client with the fixture's settings.
    pub(crate) async fn zk_client(&self) -> ZkLocker {
        dlock_zk::connect(self.config.clone()).await.expect("connect to the test ZooKeeper")
    }

    /// A client connected through a new fault proxy, and the proxy itself (kept alive
    /// by the caller; dropping it cuts the client off).
    pub(crate) async fn fault_proxied_client(&self) -> (ZkLocker, Arc<FaultProxy>) {
        let proxy = FaultProxy::start(self.addr()).await.expect("start a fault proxy");
        let config = self.config.clone().with_hosts(&proxy.addr().to_string()).expect("proxy config");
        (dlock_zk::connect(config).await.expect("connect through the proxy"), Arc::new(proxy))
    }

    /// A client connected through a new fault proxy that the fixture keeps, and its link.
    pub(crate) async fn proxied_client(&self) -> (ZkLocker, dlock_testkit::proxy::ProxyLink) {
        let (client, proxy) = self.fault_proxied_client().await;
        let link = proxy.link();
        self.proxies.lock().unwrap().push(proxy);
        (client, link)
    }

    /// A plain ZooKeeper session, as an operator's tool would open.
    pub(crate) async fn admin(&self) -> zk::Client {
        let mut connector = zk::Client::connector().with_session_timeout(Duration::from_secs(30));
        if let (Some(user), Some(password)) = (self.config.user(), self.config.password()) {
            connector = connector.with_auth("digest", format!("{user}:{password}").as_bytes());
        }
        connector.connect(&self.config.connect_string()).await.expect("an operator's session")
    }

    /// The server, for kill and restart.
    pub(crate) fn with_server<T>(&self, f: impl FnOnce(&mut ZooKeeperServer) -> T) -> T {
        let server = self
            .server
            .as_ref()
            .expect("this test needs a local ZooKeeper it can kill and restart; unset DLOCK_TEST_ZOOKEEPER_URL");
        let mut server = server.lock().unwrap();
        f(&mut server)
    }
}

fn client_config(config: ZkConfig) -> ZkConfig {
    config.with_op_timeout(OP_TIMEOUT).with_connect_timeout(Duration::from_secs(3))
}

/// The children of a lock's znode in queue order.
pub(crate) async fn queue(admin: &zk::Client, lock_path: &str) -> Vec<String> {
    let mut children = match admin.list_children(lock_path).await {
        Ok(children) => children,
        Err(zk::Error::NoNode) => return Vec::new(),
        Err(err) => panic!("list {lock_path}: {err}"),
    };
    let sequence = |name: &String| name.rsplit_once("lock-").and_then(|(_, n)| n.parse::<i64>().ok()).unwrap_or(-1);
    children.retain(|c| sequence(c) >= 0);
    children.sort_by_key(sequence);
    children
}

#[async_trait]
impl Fixture for ZkFixture {
    fn timing(&self) -> Timing {
        Timing { ttl: TTL, margin: MARGIN, op_timeout: OP_TIMEOUT, idle: IDLE }
    }

    async fn client(&self) -> Arc<dyn Locker> {
        Arc::new(self.zk_client().await)
    }
}

#[async_trait]
impl Evict for ZkFixture {
    async fn evict(&self, name: &LockName) {
        let admin = self.admin().await;
        let lock_path = self.config.lock_path(name);
        let head = queue(&admin, &lock_path).await.into_iter().next().expect("the lock has a holder to evict");
        admin.delete(&format!("{lock_path}/{head}"), None).await.expect("delete the holder's node");
    }
}

#[async_trait]
impl Storage for ZkFixture {
    async fn records(&self, prefix: &str) -> usize {
        // A name's znodes (its lock's and its result's) are children of the root whose
        // names start with the name's encoding, and the encoding of a prefix is a prefix
        // of it.
        let probe = self.config.lock_path(&LockName::new(prefix).expect("a prefix that is a lock name"));
        let (root, encoded) = probe.rsplit_once('/').expect("a path under the root");
        let root = if root.is_empty() { "/" } else { root };
        match self.admin().await.list_children(root).await {
            Ok(children) => children.iter().filter(|child| child.starts_with(encoded)).count(),
            Err(zk::Error::NoNode) => 0,
            Err(err) => panic!("list {root}: {err}"),
        }
    }
}

#[async_trait]
impl Faults for ZkFixture {
    async fn faulty_client(&self) -> FaultyClient {
        let (locker, link) = self.proxied_client().await;
        FaultyClient { locker: Arc::new(locker), link: Box::new(link) }
    }

    async fn unreachable_client(&self, timeout: Duration) -> Result<Arc<dyn Locker>, LockError> {
        let port = free_port().expect("a free port");
        let config =
            ZkConfig::new(&format!("127.0.0.1:{port}"))?.with_connect_timeout(timeout).with_op_timeout(timeout);
        Ok(Arc::new(dlock_zk::connect(config).await?))
    }
}

#[async_trait]
impl Restart for ZkFixture {
    fn cannot_restart(&self) -> Option<String> {
        self.server.is_none().then(|| "DLOCK_TEST_ZOOKEEPER_URL names a server the tests cannot kill".into())
    }

    async fn stop_backend(&self) {
        self.with_server(|server| server.kill());
    }

    async fn start_backend(&self) {
        tokio::task::block_in_place(|| self.with_server(|server| server.start_again()))
            .expect("restart the ZooKeeper server");
    }
}
