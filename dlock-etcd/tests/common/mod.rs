//! The etcd fixture of the shared suite: a single etcd started per test (or the server
//! of `DLOCK_TEST_ETCD_URL`), clients over it, and the means to hurt them.

#![allow(dead_code)]

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dlock_conformance::{Evict, Faults, FaultyClient, Fixture, Restart, Storage, Timing};
use dlock_core::{ConnectConfig, LockError, LockName, Locker};
use dlock_etcd::{EtcdConfig, EtcdLocker};
use dlock_testkit::proxy::FaultProxy;
use dlock_testkit::supervisor::etcd::{EtcdConfig as ServerConfig, EtcdServer};
use dlock_testkit::supervisor::{external_url, free_port};
use etcd_client::{GetOptions, SortOrder, SortTarget};

/// Operation timeout of the fixture's clients.
pub(crate) const OP_TIMEOUT: Duration = Duration::from_secs(1);

/// The suite's fixture over one etcd.
pub(crate) struct EtcdFixture {
    server: Option<Mutex<EtcdServer>>,
    url: String,
    admin: EtcdLocker,
    proxies: Mutex<Vec<FaultProxy>>,
}

impl EtcdFixture {
    /// Starts a local etcd, or uses `DLOCK_TEST_ETCD_URL`.
    pub(crate) async fn start() -> Self {
        let (server, url) = match external_url("etcd") {
            Some(url) => (None, url),
            None => {
                let server = tokio::task::spawn_blocking(|| EtcdServer::start(&ServerConfig::default()))
                    .await
                    .expect("spawn_blocking")
                    .expect("start etcd");
                let url = server.url();
                (Some(Mutex::new(server)), url)
            }
        };
        let admin = dlock_etcd::connect(config(&url)).await.expect("connect the fixture's admin client");
        EtcdFixture { server, url, admin, proxies: Mutex::new(Vec::new()) }
    }

    /// The URL clients connect to.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// A client with the fixture's timeouts.
    pub(crate) async fn locker(&self) -> EtcdLocker {
        dlock_etcd::connect(config(&self.url)).await.expect("connect")
    }

    /// The etcd client of the fixture's admin connection.
    pub(crate) async fn etcd(&self) -> etcd_client::Client {
        self.admin.backend().etcd().await.expect("the admin client reaches etcd")
    }

    /// The first server's address.
    fn target(&self) -> SocketAddr {
        let config = EtcdConfig::from_url(&self.url).expect("fixture URL");
        let endpoint = config.endpoints().into_iter().next().expect("an endpoint");
        let host = endpoint.split_once("://").map_or(endpoint.as_str(), |(_, h)| h);
        host.to_socket_addrs().expect("resolve").next().expect("an address")
    }

    /// A client through a fault proxy, and the proxy.
    pub(crate) async fn proxied(&self) -> (EtcdLocker, dlock_testkit::proxy::ProxyLink) {
        let proxy = FaultProxy::start(self.target()).await.expect("start the fault proxy");
        let link = proxy.link();
        let url = with_host(&self.url, &proxy.addr().to_string());
        self.proxies.lock().unwrap().push(proxy);
        (dlock_etcd::connect(config(&url)).await.expect("connect through the proxy"), link)
    }

    fn server(&self) -> std::sync::MutexGuard<'_, EtcdServer> {
        self.server
            .as_ref()
            .expect("stopping the backend needs a local etcd: unset DLOCK_TEST_ETCD_URL for this test")
            .lock()
            .unwrap()
    }
}

/// The fixture's client configuration for a URL.
pub(crate) fn config(url: &str) -> EtcdConfig {
    EtcdConfig::from_url(url)
        .expect("etcd URL")
        .with_op_timeout(OP_TIMEOUT)
        .with_connect_timeout(Duration::from_secs(2))
}

/// The URL with its host list replaced by one host.
fn with_host(url: &str, host: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("scheme");
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let userinfo = authority.rsplit_once('@').map(|(u, _)| format!("{u}@")).unwrap_or_default();
    format!("{scheme}://{userinfo}{host}{tail}")
}

#[async_trait]
impl Fixture for EtcdFixture {
    fn timing(&self) -> Timing {
        // etcd grants whole-second leases (the test servers honour 1 s); 2 s leave the
        // watchdog room for a loaded machine that pauses the client for a few hundred ms.
        Timing {
            ttl: Duration::from_secs(2),
            margin: Duration::from_secs(3),
            op_timeout: OP_TIMEOUT,
            // etcd keeps nothing of an idle name: its keys go with their leases.
            idle: Duration::ZERO,
        }
    }

    async fn client(&self) -> Arc<dyn Locker> {
        Arc::new(self.locker().await)
    }
}

#[async_trait]
impl Evict for EtcdFixture {
    async fn evict(&self, name: &LockName) {
        let dir = dlock_etcd::lock_dir(self.admin.backend().prefix(), name);
        let mut kv = self.etcd().await.kv_client();
        let first = GetOptions::new().with_prefix().with_sort(SortTarget::Create, SortOrder::Ascend).with_limit(1);
        let resp = kv.get(dir, Some(first)).await.expect("read the holder's key");
        let holder = resp.kvs().first().expect("the lock has a holder to evict").key().to_vec();
        kv.delete(holder, None).await.expect("delete the holder's key");
    }
}

#[async_trait]
impl Storage for EtcdFixture {
    async fn records(&self, prefix: &str) -> usize {
        // Names are percent-encoded one character at a time, so the encoding of a prefix is
        // a prefix of the encoding of every name that starts with it.
        let encoded = LockName::new(prefix).expect("a prefix that is a lock name").encoded();
        let key = format!("{}/{encoded}", self.admin.backend().prefix());
        let mut kv = self.etcd().await.kv_client();
        let resp = kv.get(key, Some(GetOptions::new().with_prefix().with_count_only())).await.expect("count keys");
        usize::try_from(resp.count()).expect("a count")
    }
}

#[async_trait]
impl Faults for EtcdFixture {
    async fn faulty_client(&self) -> FaultyClient {
        let (locker, link) = self.proxied().await;
        FaultyClient { locker: Arc::new(locker), link: Box::new(link) }
    }

    async fn unreachable_client(&self, timeout: Duration) -> Result<Arc<dyn Locker>, LockError> {
        let port = free_port().expect("a free port");
        let config =
            EtcdConfig::new([format!("127.0.0.1:{port}")]).with_op_timeout(timeout).with_connect_timeout(timeout);
        Ok(Arc::new(dlock_etcd::connect(config).await?))
    }
}

#[async_trait]
impl Restart for EtcdFixture {
    fn cannot_restart(&self) -> Option<String> {
        self.server.is_none().then(|| "DLOCK_TEST_ETCD_URL names a server the tests cannot kill".into())
    }

    async fn stop_backend(&self) {
        self.server().kill();
    }

    async fn start_backend(&self) {
        let server = self.server.as_ref().expect("a local etcd");
        tokio::task::block_in_place(|| server.lock().unwrap().start_again()).expect("restart etcd");
    }
}
