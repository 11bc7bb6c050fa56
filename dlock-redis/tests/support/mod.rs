//! The Redis fixture of the shared conformance suite, and helpers for this crate's tests.

#![allow(dead_code)]

pub(crate) mod monitor;
pub(crate) mod redlock;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dlock_conformance::{Evict, Faults, FaultyClient, Fixture, Restart, Storage, Timing};
use dlock_core::{LockError, LockName, Locker};
use dlock_redis::scripts::{scripts, Invocation};
use dlock_redis::{AccessConfig, ConnectConfig, LockKeys, RedisConfig, Topology};
use dlock_testkit::proxy::FaultProxy;
use dlock_testkit::supervisor::external_url;
use dlock_testkit::supervisor::redis::{RedisConfig as ServerConfig, RedisServer};

/// Operation timeout of the fixture's clients.
pub(crate) const OP_TIMEOUT: Duration = Duration::from_secs(1);

/// How long the fixture's clients keep an idle name's fence counter.
pub(crate) const IDLE: Duration = Duration::from_secs(1);

/// Connect timeout of the fixture's clients: connecting (and loading the scripts) on a
/// loaded machine can take longer than one operation.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A redis-server the fixture started (or an external one from `DLOCK_TEST_REDIS_URL`),
/// and clients of it.
pub(crate) struct RedisFixture {
    server: Mutex<Option<RedisServer>>,
    config: RedisConfig,
    proxies: Mutex<Vec<FaultProxy>>,
    /// The port of a "server" that accepts connections and never answers, kept so that no
    /// server started meanwhile can take it.
    silent: Mutex<Vec<std::net::TcpListener>>,
}

impl RedisFixture {
    /// A fixture over a fresh persistent server (AOF, fsync on every write, so that the
    /// fence counters survive a kill -9), or over `DLOCK_TEST_REDIS_URL` when set.
    pub(crate) fn new() -> Self {
        if let Some(url) = external_url("redis") {
            let config = RedisConfig::from_url(&url).expect("DLOCK_TEST_REDIS_URL is a valid Redis URL");
            return RedisFixture {
                server: Mutex::new(None),
                config: timeouts(config),
                proxies: Mutex::new(Vec::new()),
                silent: Mutex::new(Vec::new()),
            };
        }
        let server = RedisServer::start(&ServerConfig { persistent: true, ..Default::default() })
            .expect("start redis-server (scripts/install-backends installs it)");
        let config = client_config(server.addr());
        RedisFixture {
            server: Mutex::new(Some(server)),
            config,
            proxies: Mutex::new(Vec::new()),
            silent: Mutex::new(Vec::new()),
        }
    }

    /// The client configuration of the server.
    pub(crate) fn config(&self) -> RedisConfig {
        self.config.clone()
    }

    fn address(&self) -> SocketAddr {
        match self.config.topology() {
            Topology::Single(node) => {
                use std::net::ToSocketAddrs;
                (node.host.as_str(), node.port)
                    .to_socket_addrs()
                    .ok()
                    .and_then(|mut addrs| addrs.next())
                    .unwrap_or_else(|| panic!("cannot resolve {node}"))
            }
            other => panic!("the Redis fixture needs a single server, not {other:?}"),
        }
    }

    fn with_server<T>(&self, what: &str, f: impl FnOnce(&mut RedisServer) -> T) -> T {
        let mut server = self.server.lock().unwrap();
        let server = server.as_mut().unwrap_or_else(|| {
            panic!("{what} needs a redis-server started by the tests; unset DLOCK_TEST_REDIS_URL to run it")
        });
        f(server)
    }

    /// A plain connection for admin commands.
    pub(crate) async fn admin(&self) -> redis::aio::MultiplexedConnection {
        let node = match self.config.topology() {
            Topology::Single(node) => node.clone(),
            other => panic!("admin connection to {other:?}"),
        };
        let mut info = redis::RedisConnectionInfo::default().set_db(self.config.db());
        if let Some(user) = self.config.user() {
            info = info.set_username(user);
        }
        if let Some(password) = self.config.password() {
            info = info.set_password(password);
        }
        let addr = redis::ConnectionAddr::Tcp(node.host, node.port);
        let conn_info = redis::IntoConnectionInfo::into_connection_info(addr).unwrap().set_redis_settings(info);
        redis::Client::open(conn_info).unwrap().get_multiplexed_async_connection().await.expect("admin connection")
    }
}

impl Default for RedisFixture {
    fn default() -> Self {
        Self::new()
    }
}

/// The fixture's client settings for a server at `addr`.
pub(crate) fn client_config(addr: SocketAddr) -> RedisConfig {
    timeouts(RedisConfig::single(addr.ip().to_string(), addr.port()))
}

/// The fixture's timeouts, and its short keep time for idle names.
fn timeouts(config: RedisConfig) -> RedisConfig {
    config.with_op_timeout(OP_TIMEOUT).with_connect_timeout(CONNECT_TIMEOUT).with_keep_idle(IDLE)
}

/// `config` authenticating as a URL's `user` and `password` did.
fn same_credentials(config: RedisConfig, user: Option<&str>, password: Option<&str>) -> RedisConfig {
    match (user, password) {
        (Some(user), Some(password)) => config.with_credentials(user, password),
        (None, Some(password)) => config.with_password(password),
        // Without a password nothing is sent (`AUTH` needs one), whatever the user.
        (_, None) => config,
    }
}

#[async_trait]
impl Fixture for RedisFixture {
    fn timing(&self) -> Timing {
        // 1,000 leases renewed every ttl/3 over one connection must keep up on a shared
        // 2-core machine running debug builds of several test processes at once.
        Timing { ttl: Duration::from_secs(2), margin: Duration::from_secs(3), op_timeout: OP_TIMEOUT, idle: IDLE }
    }

    async fn client(&self) -> Arc<dyn Locker> {
        Arc::new(dlock_redis::connect(self.config()).await.expect("connect to redis"))
    }
}

#[async_trait]
impl Evict for RedisFixture {
    async fn evict(&self, name: &LockName) {
        let keys = dlock_redis::KeyLayout::new(self.config.prefix()).unwrap().lock(name);
        let mut admin = self.admin().await;
        let _: i64 = redis::cmd("DEL").arg(&keys.hold).query_async(&mut admin).await.expect("DEL the hold");
    }
}

#[async_trait]
impl Storage for RedisFixture {
    async fn records(&self, prefix: &str) -> usize {
        count_keys(&mut self.admin().await, self.config.prefix(), prefix).await
    }
}

/// How many keys one server has for the lock names that start with `name_prefix`, under
/// the key prefix `key_prefix` (keys past their ttl do not count: `SCAN` skips them).
pub(crate) async fn count_keys(
    admin: &mut redis::aio::MultiplexedConnection,
    key_prefix: &str,
    name_prefix: &str,
) -> usize {
    // A name's keys start with `<prefix>:{<encoded name>`, and the encoding of a prefix
    // is a prefix of the encoding of every name that starts with it. Encoded names have
    // no glob characters.
    let encoded = LockName::new(name_prefix).expect("a prefix that is a lock name").encoded();
    let pattern = format!("{key_prefix}:{{{encoded}*");
    let (mut cursor, mut count) = (0u64, 0usize);
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(admin)
            .await
            .expect("SCAN");
        count += keys.len();
        if next == 0 {
            return count;
        }
        cursor = next;
    }
}

#[async_trait]
impl Faults for RedisFixture {
    async fn faulty_client(&self) -> FaultyClient {
        let proxy = FaultProxy::start(self.address()).await.expect("start the fault proxy");
        let config = RedisConfig::single(proxy.addr().ip().to_string(), proxy.addr().port()).with_db(self.config.db());
        let config = timeouts(same_credentials(config, self.config.user(), self.config.password()));
        let locker = dlock_redis::connect(config).await.expect("connect through the proxy");
        let link = Box::new(proxy.link());
        self.proxies.lock().unwrap().push(proxy);
        FaultyClient { locker: Arc::new(locker), link }
    }

    async fn unreachable_client(&self, timeout: Duration) -> Result<Arc<dyn Locker>, LockError> {
        // A free port would be free only until some other test's server took it; a
        // listener that never answers keeps it: connections hang like a frozen host's.
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("a free port");
        let port = listener.local_addr().expect("its address").port();
        self.silent.lock().unwrap().push(listener);
        let config = RedisConfig::single("127.0.0.1", port).with_connect_timeout(timeout).with_op_timeout(timeout);
        dlock_redis::connect(config).await.map(|locker| Arc::new(locker) as Arc<dyn Locker>)
    }
}

#[async_trait]
impl Restart for RedisFixture {
    fn cannot_restart(&self) -> Option<String> {
        self.server
            .lock()
            .unwrap()
            .is_none()
            .then(|| "DLOCK_TEST_REDIS_URL names a server the tests cannot kill".into())
    }

    async fn stop_backend(&self) {
        self.with_server("stopping the backend", |server| server.kill());
    }

    async fn start_backend(&self) {
        self.with_server("restarting the backend", |server| server.start_again().expect("restart redis-server"));
    }
}

/// How long the fence counter outlives a name's last use in the script calls the tests
/// make themselves, in ms: a client's default.
pub(crate) const KEEP_MS: u64 = 3_600_000;

/// The acquire script call the backend sends for `grant` of `owner` (a 30 s ttl, no place
/// in the queue), for tests that play the server's side of a re-sent call.
pub(crate) fn acquire_call(keys: &LockKeys, owner: &str, grant: &str) -> Invocation {
    acquire_call_placed(keys, owner, grant, ("0", 5_000))
}

/// The acquire script call of `grant` of `owner` (a 30 s ttl), with its place in the
/// queue: its mode (`0` never, `1` behind a queue, `2` always) and how long it lasts in ms.
pub(crate) fn acquire_call_placed(keys: &LockKeys, owner: &str, grant: &str, place: (&str, u64)) -> Invocation {
    let void = format!("{}:void:{grant}", keys.hold);
    Invocation::new(&scripts().acquire, &[&keys.hold, &keys.fence, &void, &keys.queue, &keys.places])
        .arg(owner)
        .arg(30_000)
        .arg(format!("grant:{grant}"))
        .arg(grant)
        .arg(place.0)
        .arg(&keys.wake_prefix)
        .arg(place.1)
        .arg(KEEP_MS)
}

/// The release script call the backend sends for `grant` of `owner`, granted `token`.
pub(crate) fn release_call(keys: &LockKeys, owner: &str, grant: &str, token: u64) -> Invocation {
    Invocation::new(&scripts().release, &[&keys.hold, &keys.queue, &keys.places, &keys.fence])
        .arg(owner)
        .arg(token.to_string())
        .arg(&keys.channel)
        .arg(format!("grant:{grant}"))
        .arg(&keys.wake_prefix)
        .arg(KEEP_MS)
}
