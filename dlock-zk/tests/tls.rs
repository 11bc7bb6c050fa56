//! TLS (`zks://`) against a standalone ZooKeeper from the Debian package that serves TLS
//! on its `secureClientPort`, with certificates made for the test. The server's
//! certificate names only `localhost`, so that connecting by `127.0.0.1` shows the
//! host-name check refusing it.
//!
//! Locks work over a verified connection; then each way of getting it wrong (no CA, the CA
//! of another PKI, another host name, a plaintext client on the TLS port, a TLS client on
//! the plaintext port, no or a foreign client certificate where one is required) fails in
//! time, and those that retrying cannot fix fail as refusals that say what to change.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_conformance::properties::{self, unique_name};
use dlock_conformance::{Connecting, Timing};
use dlock_core::{LockError, LockOptions, Locker};
use dlock_testkit::supervisor::tls::TestPki;
use dlock_testkit::supervisor::zookeeper::{ZooKeeperConfig, ZooKeeperServer, ZooKeeperTls};
use dlock_zk::{ConnectConfig, ZkConfig, ZkLocker};

/// The connect timeout of the clients that must fail: each must fail within it (plus
/// slack for a loaded machine), never hang.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The time scale of the properties run over TLS: 3 s leases with 3 s of slack.
const TIMING: Timing = Timing {
    ttl: Duration::from_secs(3),
    margin: Duration::from_secs(3),
    op_timeout: Duration::from_secs(2),
    idle: Duration::from_secs(1),
};

/// A PKI whose server certificate names `localhost` only.
fn test_pki() -> TestPki {
    TestPki::for_server("dlock-client", &["localhost"]).expect("test certificates")
}

fn file(pki: &TestPki, name: &str) -> String {
    pki.path(name).display().to_string()
}

/// Starts a standalone server serving TLS with `pki`'s server certificate; with
/// `client_ca`, it requires client certificates signed by that PKI's CA.
async fn start(pki: &TestPki, client_ca: bool) -> ZooKeeperServer {
    let config = ZooKeeperConfig {
        tls: Some(ZooKeeperTls {
            cert: pki.path("server.pem"),
            key: pki.path("server-key.pem"),
            client_ca: client_ca.then(|| pki.path("ca.pem")),
        }),
        ..ZooKeeperConfig::default()
    };
    tokio::task::spawn_blocking(move || ZooKeeperServer::start_with(&config))
        .await
        .expect("spawn_blocking")
        .expect("start a ZooKeeper serving TLS (run scripts/install-backends)")
}

fn secure_port(server: &ZooKeeperServer) -> u16 {
    server.secure_addr().expect("the server has a secure port").port()
}

/// `zks://<host>:<secure port>/dlock?...&<query>`.
fn url(server: &ZooKeeperServer, host: &str, query: &str) -> String {
    format!("zks://{host}:{}/dlock?connect_timeout=3s&op_timeout=2s&{query}", secure_port(server))
}

async fn connect(url: &str) -> ZkLocker {
    dlock_zk::connect(ZkConfig::from_url(url).expect("url"))
        .await
        .unwrap_or_else(|err| panic!("connect to {url}: {err}"))
}

/// A connect that must fail, and fail in time rather than hang.
async fn failing(config: ZkConfig) -> LockError {
    let started = Instant::now();
    let result = dlock_zk::connect(config.clone()).await;
    let took = started.elapsed();
    assert!(took < CONNECT_TIMEOUT + Duration::from_secs(2), "{config:?}: connecting took {took:?}");
    match result {
        Ok(_) => panic!("connecting with {config:?} should have failed"),
        Err(err) => err,
    }
}

async fn failing_url(url: &str) -> LockError {
    failing(ZkConfig::from_url(url).expect("url")).await
}

/// A refusal: not transient, and its message says `says`.
fn assert_refused(err: &LockError, says: &str) {
    assert!(matches!(err, LockError::Refused { .. }) && !err.is_transient(), "not a refusal: {err:?}");
    let message = err.to_string();
    assert!(message.contains(says), "{message:?} does not say {says:?}");
}

/// Acquires, inspects (the holder's token is the lease's) and releases one lock.
async fn lock_once(locker: &ZkLocker) {
    let name = unique_name("tls");
    let lease = locker.acquire(&name, &LockOptions::new().wait(Duration::from_secs(5))).await.expect("acquire");
    let info = locker.inspect(&name).await.expect("inspect");
    assert_eq!(info.holder.map(|holder| holder.token), Some(lease.token()));
    lease.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_over_tls_and_refusals() {
    dlock_conformance::init_tracing();
    let pki = test_pki();
    let server = start(&pki, false).await;
    let ca = format!("ca={}", file(&pki, "ca.pem"));

    // Acquire, inspect, release; a waiter on another client woken by the release.
    let tls = url(&server, "localhost", &ca);
    let clients = Connecting::new(TIMING, || async { Arc::new(connect(&tls).await) as Arc<dyn Locker> });
    properties::acquire_release(&clients).await;
    properties::waiter_wakes_on_release(&clients).await;
    properties::mutual_exclusion(&clients).await;

    let built = ZkConfig::new(&format!("localhost:{}", secure_port(&server)))
        .expect("hosts")
        .with_root("/dlock")
        .expect("root")
        .with_ca_file(pki.path("ca.pem"))
        .with_connect_timeout(CONNECT_TIMEOUT);
    lock_once(&dlock_zk::connect(built).await.expect("connect from a built configuration")).await;

    // The system's roots do not know the test CA.
    let no_ca = failing_url(&url(&server, "localhost", "")).await;
    assert_refused(&no_ca, "not signed by a CA this client trusts (the system's roots)");

    let other = test_pki();
    let foreign_ca = failing_url(&url(&server, "localhost", &format!("ca={}", file(&other, "ca.pem")))).await;
    assert_refused(&foreign_ca, "not signed by a CA this client trusts (the ca= file)");

    let other_name = failing_url(&url(&server, "127.0.0.1", &ca)).await;
    assert_refused(&other_name, "does not name the host 127.0.0.1");

    // A plaintext client on the TLS port: the server drops it, and a probe finds TLS there.
    let plain = failing_url(&format!("zk://localhost:{}/dlock?connect_timeout=3s", secure_port(&server))).await;
    assert_refused(&plain, "speaks TLS on this port: connect with zks://");

    // A TLS client on the plaintext port: the server closes the connection on the hello,
    // which an overloaded server may do too, so this stays an outage, with a guess.
    let on_plain_port =
        failing_url(&format!("zks://localhost:{}/dlock?connect_timeout=3s&{ca}", server.addr().port())).await;
    assert!(matches!(on_plain_port, LockError::Unavailable { .. }), "{on_plain_port:?}");
    assert!(on_plain_port.to_string().contains("is that its plaintext client port (zk://)?"), "{on_plain_port}");

    // A file that cannot be read is named with its option, before any connection.
    let missing = pki.path("missing.pem");
    let unreadable = failing_url(&url(&server, "localhost", &format!("ca={}", missing.display()))).await;
    match &unreadable {
        LockError::InvalidInput(message) => {
            assert!(message.contains("option ca") && message.contains(&missing.display().to_string()), "{message}")
        }
        other => panic!("not InvalidInput: {other:?}"),
    }
    let not_pem = failing_url(&url(&server, "localhost", &format!("ca={}", file(&pki, "server-key.pem")))).await;
    assert!(matches!(&not_pem, LockError::InvalidInput(m) if m.contains("ca=")), "{not_pem:?}");

    // A `tls` option is pointed at the scheme.
    let err = ZkConfig::from_url(&format!("zk://localhost:{}?tls=true", secure_port(&server))).unwrap_err();
    assert!(err.to_string().contains("TLS for ZooKeeper needs the zks:// scheme"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates() {
    dlock_conformance::init_tracing();
    let pki = test_pki();
    let server = start(&pki, true).await;
    let ca = file(&pki, "ca.pem");
    let identity = |pki: &TestPki| format!("cert={}&key={}", file(pki, "client.pem"), file(pki, "client-key.pem"));

    lock_once(&connect(&url(&server, "localhost", &format!("ca={ca}&{}", identity(&pki)))).await).await;
    let built = ZkConfig::new(&format!("localhost:{}", secure_port(&server)))
        .expect("hosts")
        .with_ca_file(pki.path("ca.pem"))
        .with_client_identity(pki.path("client.pem"), pki.path("client-key.pem"))
        .with_connect_timeout(CONNECT_TIMEOUT);
    lock_once(&dlock_zk::connect(built).await.expect("connect from a built configuration")).await;

    let without = failing_url(&url(&server, "localhost", &format!("ca={ca}"))).await;
    assert_refused(&without, "refused this client's certificate, or its lack of one");

    let other = test_pki();
    let foreign = failing_url(&url(&server, "localhost", &format!("ca={ca}&{}", identity(&other)))).await;
    assert_refused(&foreign, "refused this client's certificate, or its lack of one");

    let missing_key = Path::new("/nonexistent/client-key.pem");
    let unreadable = failing_url(&url(
        &server,
        "localhost",
        &format!("ca={ca}&cert={}&key={}", file(&pki, "client.pem"), missing_key.display()),
    ))
    .await;
    assert!(matches!(&unreadable, LockError::InvalidInput(m) if m.contains("option key")), "{unreadable:?}");
}
