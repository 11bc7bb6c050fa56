//! The lease server passes the whole shared conformance suite: a fixture that starts the
//! server in the test's process on a free loopback port, and every fixture trait the
//! suite asks for, built on nothing but published crates.

use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dlock_conformance::proxy::FaultProxy;
use dlock_conformance::{Evict, Faults, FaultyClient, Fixture, Restart, Storage, Timing};
use dlock_core::{ConnectConfig, HostPort, LockError, LockName, LockOptions, Locker};
use dlock_example_outside_backend::{connect, register, Admin, LeaseMapConfig, LeaseServer};

/// How long one operation of the fixture's clients may take.
const OP_TIMEOUT: Duration = Duration::from_secs(1);

/// How long the fixture's clients keep an idle name: short, so that the suite sees idle
/// names go.
const IDLE: Duration = Duration::from_secs(1);

/// A lease server of this test's own, and what the suite needs around it.
struct LeaseMapFixture {
    server: LeaseServer,
    /// The fault proxies in front of the faulty clients; dropping one cuts its client off.
    proxies: Mutex<Vec<FaultProxy>>,
    /// Ports that accept connections and never answer, kept open so that no server
    /// started meanwhile takes them.
    silent: Mutex<Vec<TcpListener>>,
}

impl LeaseMapFixture {
    async fn new() -> Self {
        let server = LeaseServer::start("127.0.0.1:0").await.expect("start the lease server");
        LeaseMapFixture { server, proxies: Mutex::new(Vec::new()), silent: Mutex::new(Vec::new()) }
    }

    /// The settings of every client of the server at `addr`.
    fn config(addr: SocketAddr) -> LeaseMapConfig {
        LeaseMapConfig::new(addr.ip().to_string(), addr.port()).with_op_timeout(OP_TIMEOUT).with_keep_idle(IDLE)
    }

    async fn admin(&self) -> Admin {
        let addr = self.server.addr();
        Admin::connect(HostPort::new(addr.ip().to_string(), addr.port()), OP_TIMEOUT).await.expect("admin connection")
    }
}

#[async_trait]
impl Fixture for LeaseMapFixture {
    fn timing(&self) -> Timing {
        // The server is in the test's process, but the test may share 2 cores with other
        // test processes: a ttl of a second leaves a renewal every 333 ms room to land.
        Timing { ttl: Duration::from_secs(1), margin: Duration::from_secs(2), op_timeout: OP_TIMEOUT, idle: IDLE }
    }

    async fn client(&self) -> Arc<dyn Locker> {
        Arc::new(connect(Self::config(self.server.addr())).await.expect("connect to the lease server"))
    }
}

#[async_trait]
impl Evict for LeaseMapFixture {
    async fn evict(&self, name: &LockName) {
        self.admin().await.evict(name).await.expect("EVICT");
    }
}

#[async_trait]
impl Faults for LeaseMapFixture {
    async fn faulty_client(&self) -> FaultyClient {
        let proxy = FaultProxy::start(self.server.addr()).await.expect("start a fault proxy");
        let locker = connect(Self::config(proxy.addr())).await.expect("connect through the proxy");
        let link = Box::new(proxy.link());
        self.proxies.lock().unwrap().push(proxy);
        FaultyClient { locker: Arc::new(locker), link }
    }

    async fn unreachable_client(&self, timeout: Duration) -> Result<Arc<dyn Locker>, LockError> {
        // A host that accepts connections and never answers, as a frozen one does: the
        // harder case than a refused connection, which fails at once.
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("a free port");
        let addr = listener.local_addr().expect("its address");
        self.silent.lock().unwrap().push(listener);
        let config = Self::config(addr).with_connect_timeout(timeout).with_op_timeout(timeout);
        connect(config).await.map(|locker| Arc::new(locker) as Arc<dyn Locker>)
    }
}

#[async_trait]
impl Restart for LeaseMapFixture {
    async fn stop_backend(&self) {
        self.server.stop().await;
    }

    async fn start_backend(&self) {
        // The port is free once the server stopped, but any process on the machine may
        // take a free port meanwhile (an outgoing connection's, too): retry for a while.
        let give_up = Instant::now() + Duration::from_secs(10);
        loop {
            match self.server.start_again().await {
                Ok(()) => return,
                Err(err) if Instant::now() < give_up => {
                    eprintln!("restarting the lease server on {}: {err}; retrying", self.server.addr());
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(err) => panic!("restart the lease server on {}: {err}", self.server.addr()),
            }
        }
    }
}

#[async_trait]
impl Storage for LeaseMapFixture {
    async fn records(&self, prefix: &str) -> usize {
        self.admin().await.count(prefix).await.expect("COUNT")
    }
}

dlock_conformance::suite!(LeaseMapFixture::new().await);

/// `register` makes `leasemap://` URLs reach the server through `dlock::connect`, with
/// the options every backend reads; bad URLs are refused as invalid input.
#[tokio::test]
async fn dlock_connect_reaches_the_server_after_register() {
    let server = LeaseServer::start("127.0.0.1:0").await.expect("start the lease server");
    register().expect("register the leasemap driver");
    register().expect("registering again is harmless");

    let url = format!("leasemap://{}?op_timeout=1s&keep_idle=5s", server.addr());
    let locker = dlock::connect(&url).await.expect("connect by URL");
    assert_eq!(locker.backend_name(), "leasemap");
    assert_eq!(locker.target(), format!("leasemap@{}", server.addr()));
    let name = LockName::new("orders/42 🔒").expect("name");
    let lease = locker.acquire(&name, &LockOptions::new().wait(Duration::from_secs(5))).await.expect("acquire");
    let other = dlock::connect(&url).await.expect("a second client");
    assert!(other.try_acquire(&name, &LockOptions::new()).await.expect("try").is_none(), "held by the first");
    lease.release().await.expect("release");
    assert!(other.inspect(&name).await.expect("inspect").holder.is_none());

    for bad in [
        "leasemap://h1:1,h2:2",
        "leasemap://user:pw@127.0.0.1:1",
        "leasemap://127.0.0.1:1/space",
        "leasemap://127.0.0.1:1?prefix=x",
        "leasemap://127.0.0.1:1?colour=blue",
        "leasemap://127.0.0.1:1?op_timeout=0s",
    ] {
        let refused = dlock::connect(bad).await;
        assert!(matches!(refused, Err(LockError::InvalidInput(_))), "{bad}: {:?}", refused.map(|_| ()));
    }
    // A port nobody listens on: refused at once, as unavailable.
    let closed = TcpListener::bind(("127.0.0.1", 0)).expect("a free port");
    let url = format!("leasemap://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let refused = dlock::connect(&url).await;
    assert!(matches!(refused, Err(LockError::Unavailable { .. })), "{:?}", refused.map(|_| ()));
}
