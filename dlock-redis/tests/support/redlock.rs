//! The RedLock fixture of the shared conformance suite: five independent, persistent
//! redis-servers per test (or the masters of `DLOCK_TEST_REDLOCK_URL`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dlock_conformance::{Evict, Fault, Faults, FaultyClient, Fixture, Link, Restart, Storage, Timing};
use dlock_core::{LockError, LockName, Locker};
use dlock_redis::redlock::{self, RedLockConfig};
use dlock_redis::{AccessConfig, ConnectConfig, Node};
use dlock_testkit::proxy::{FaultProxy, ProxyLink};
use dlock_testkit::supervisor::external_url;
use dlock_testkit::supervisor::redis::{RedisConfig as ServerConfig, RedisMasters};

use super::CONNECT_TIMEOUT;

/// How many masters the fixture starts.
pub(crate) const MASTERS: usize = 5;

/// The operation timeout of the fixture's clients: twice the single server's, for five
/// servers and their clients sharing a loaded 2-core machine running debug builds.
pub(crate) const OP_TIMEOUT: Duration = Duration::from_secs(2);

/// The per-node timeout of the fixture's clients: a quarter of the operation timeout. A
/// healthy node answers in microseconds; the room is for a starved test process, whose
/// late answers would otherwise count as nodes that did not answer.
pub(crate) const NODE_TIMEOUT: Duration = Duration::from_millis(500);

/// Independent masters the fixture started (or external ones), and clients of them.
pub(crate) struct RedLockFixture {
    masters: Mutex<Option<RedisMasters>>,
    config: RedLockConfig,
    proxies: Mutex<Vec<FaultProxy>>,
    /// Ports of "masters" that accept connections and never answer, kept so that no
    /// server started meanwhile can take them.
    silent: Mutex<Vec<std::net::TcpListener>>,
}

impl RedLockFixture {
    /// A fixture over five fresh persistent servers (AOF, fsync on every write, so that
    /// holds and fence counters survive a kill -9), or over `DLOCK_TEST_REDLOCK_URL`.
    pub(crate) fn new() -> Self {
        Self::with_masters(MASTERS)
    }

    /// As [`new`](Self::new), with `count` masters.
    pub(crate) fn with_masters(count: usize) -> Self {
        if let Some(url) = external_url("redlock") {
            let config = RedLockConfig::from_url(&url).expect("DLOCK_TEST_REDLOCK_URL is a valid RedLock URL");
            return RedLockFixture {
                masters: Mutex::new(None),
                config: timeouts(config),
                proxies: Mutex::new(Vec::new()),
                silent: Mutex::new(Vec::new()),
            };
        }
        let masters = RedisMasters::start(count, &ServerConfig { persistent: true, ..Default::default() })
            .expect("start redis-servers (scripts/install-backends installs them)");
        let config =
            config_for(&masters.addrs().iter().map(|a| Node::new(a.ip().to_string(), a.port())).collect::<Vec<_>>());
        RedLockFixture {
            masters: Mutex::new(Some(masters)),
            config,
            proxies: Mutex::new(Vec::new()),
            silent: Mutex::new(Vec::new()),
        }
    }

    /// The client configuration of the masters.
    pub(crate) fn config(&self) -> RedLockConfig {
        self.config.clone()
    }

    /// Runs `f` on the masters the fixture started.
    pub(crate) fn with_masters_mut<T>(&self, what: &str, f: impl FnOnce(&mut RedisMasters) -> T) -> T {
        let mut masters = self.masters.lock().unwrap();
        let masters = masters.as_mut().unwrap_or_else(|| {
            panic!("{what} needs redis-servers started by the tests; unset DLOCK_TEST_REDLOCK_URL to run it")
        });
        f(masters)
    }

    /// The client configuration with every node reached through a fault proxy of its
    /// own, and the proxies' links, in node order.
    pub(crate) async fn proxied(&self) -> (RedLockConfig, Vec<ProxyLink>) {
        let mut nodes = Vec::new();
        let mut links = Vec::new();
        for node in self.config.nodes() {
            let target = tokio::net::lookup_host((node.host.as_str(), node.port))
                .await
                .ok()
                .and_then(|mut addrs| addrs.next())
                .unwrap_or_else(|| panic!("cannot resolve {node}"));
            let proxy = FaultProxy::start(target).await.expect("start a fault proxy");
            nodes.push(Node::new(proxy.addr().ip().to_string(), proxy.addr().port()));
            links.push(proxy.link());
            self.proxies.lock().unwrap().push(proxy);
        }
        let mut config = RedLockConfig::new(nodes).with_db(self.config.db()).with_prefix(self.config.prefix());
        config = match (self.config.user(), self.config.password()) {
            (Some(user), Some(password)) => config.with_credentials(user, password),
            (None, Some(password)) => config.with_password(password),
            // Without a password nothing is sent (`AUTH` needs one), whatever the user.
            (_, None) => config,
        };
        let config = timeouts(config);
        (config, links)
    }

    /// A plain connection to node `index`, for admin commands.
    pub(crate) async fn admin(&self, index: usize) -> redis::aio::MultiplexedConnection {
        let node = &self.config.nodes()[index];
        let mut info = redis::RedisConnectionInfo::default().set_db(self.config.db());
        if let Some(user) = self.config.user() {
            info = info.set_username(user);
        }
        if let Some(password) = self.config.password() {
            info = info.set_password(password);
        }
        let addr = redis::ConnectionAddr::Tcp(node.host.clone(), node.port);
        let conn_info = redis::IntoConnectionInfo::into_connection_info(addr).unwrap().set_redis_settings(info);
        redis::Client::open(conn_info).unwrap().get_multiplexed_async_connection().await.expect("admin connection")
    }
}

impl Default for RedLockFixture {
    fn default() -> Self {
        Self::new()
    }
}

/// The fixture's client settings for masters at these addresses.
pub(crate) fn config_for(nodes: &[Node]) -> RedLockConfig {
    timeouts(RedLockConfig::new(nodes.to_vec()))
}

/// The fixture's timeouts, and its short keep time for idle names.
fn timeouts(config: RedLockConfig) -> RedLockConfig {
    config
        .with_op_timeout(OP_TIMEOUT)
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_node_timeout(NODE_TIMEOUT)
        .with_keep_idle(super::IDLE)
}

/// One switch over the links to every node.
pub(crate) struct Links(pub Vec<ProxyLink>);

impl Link for Links {
    fn set(&self, fault: Fault) {
        self.0.iter().for_each(|link| link.set(fault));
    }
}

#[async_trait]
impl Fixture for RedLockFixture {
    fn timing(&self) -> Timing {
        // A renewal is five script calls, one per server, where the single server's is
        // one: 1,000 leases renewed every ttl/3 cost the client about four times the CPU.
        // For the same headroom on a shared 2-core machine running debug builds, the ttl
        // is three times the single server's.
        Timing {
            ttl: Duration::from_secs(6),
            margin: Duration::from_secs(4),
            op_timeout: OP_TIMEOUT,
            idle: super::IDLE,
        }
    }

    async fn client(&self) -> Arc<dyn Locker> {
        Arc::new(redlock::connect(self.config()).await.expect("connect to the RedLock masters"))
    }
}

#[async_trait]
impl Evict for RedLockFixture {
    async fn evict(&self, name: &LockName) {
        let keys = dlock_redis::KeyLayout::new(self.config.prefix()).unwrap().lock(name);
        for index in 0..self.config.nodes().len() {
            let mut admin = self.admin(index).await;
            let _: i64 = redis::cmd("DEL").arg(&keys.hold).query_async(&mut admin).await.expect("DEL the hold");
        }
    }
}

#[async_trait]
impl Storage for RedLockFixture {
    async fn records(&self, prefix: &str) -> usize {
        let mut total = 0;
        for index in 0..self.config.nodes().len() {
            total += super::count_keys(&mut self.admin(index).await, self.config.prefix(), prefix).await;
        }
        total
    }
}

#[async_trait]
impl Faults for RedLockFixture {
    async fn faulty_client(&self) -> FaultyClient {
        let (config, links) = self.proxied().await;
        let locker = redlock::connect(config).await.expect("connect through the proxies");
        FaultyClient { locker: Arc::new(locker), link: Box::new(Links(links)) }
    }

    async fn unreachable_client(&self, timeout: Duration) -> Result<Arc<dyn Locker>, LockError> {
        // Five free ports would each be free only until some other test's server took
        // one; listeners that never answer keep them: connections hang like a frozen host's.
        let listeners: Vec<std::net::TcpListener> =
            (0..MASTERS).map(|_| std::net::TcpListener::bind(("127.0.0.1", 0)).expect("a free port")).collect();
        let nodes: Vec<Node> = listeners
            .iter()
            .map(|listener| Node::new("127.0.0.1", listener.local_addr().expect("its address").port()))
            .collect();
        self.silent.lock().unwrap().extend(listeners);
        let config = RedLockConfig::new(nodes)
            .with_connect_timeout(timeout)
            .with_op_timeout(timeout)
            .with_node_timeout(timeout / 4);
        redlock::connect(config).await.map(|locker| Arc::new(locker) as Arc<dyn Locker>)
    }
}

#[async_trait]
impl Restart for RedLockFixture {
    fn cannot_restart(&self) -> Option<String> {
        self.masters
            .lock()
            .unwrap()
            .is_none()
            .then(|| "DLOCK_TEST_REDLOCK_URL names masters the tests cannot kill".into())
    }

    async fn stop_backend(&self) {
        self.with_masters_mut("stopping the backend", |masters| {
            (0..masters.nodes().len()).for_each(|index| masters.kill(index));
        });
    }

    async fn start_backend(&self) {
        self.with_masters_mut("restarting the backend", |masters| {
            for index in 0..masters.nodes().len() {
                masters.start_again(index).expect("restart redis-server");
            }
        });
    }
}
