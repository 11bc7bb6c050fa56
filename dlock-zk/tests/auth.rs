//! Authentication against a standalone ZooKeeper that requires SASL DIGEST-MD5 of every
//! session (`enforce.auth.schemes=sasl`, users in its JAAS `Server` section).
//!
//! Locks work with the right user and password (`?auth=sasl`); each way of getting it
//! wrong (a wrong password, no credentials, digest credentials where the server wants
//! SASL; an unknown user, whom the server lets in, at the first node it touches) is
//! refused in time with a message that says so and names the server,
//! and a closed port stays an outage with its own message. On a server without SASL, a
//! wrong `digest` password is refused when it touches nodes made by the right one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_conformance::properties::{self, unique_name};
use dlock_conformance::{Connecting, Timing};
use dlock_core::{LockError, LockOptions, Locker};
use dlock_testkit::supervisor::free_port;
use dlock_testkit::supervisor::zookeeper::{ZooKeeperConfig, ZooKeeperServer};
use dlock_zk::{ZkAuth, ZkConfig};

/// The connect timeout of the clients that must fail: each must fail within it (plus
/// slack for a loaded machine), never hang.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

async fn start(config: ZooKeeperConfig) -> ZooKeeperServer {
    tokio::task::spawn_blocking(move || ZooKeeperServer::start_with(&config))
        .await
        .expect("spawn_blocking")
        .expect("start ZooKeeper (run scripts/install-backends)")
}

/// A server whose only SASL user is `app` with password `s3cret`.
async fn start_sasl() -> ZooKeeperServer {
    start(ZooKeeperConfig { sasl_users: vec![("app".into(), "s3cret".into())], ..ZooKeeperConfig::default() }).await
}

/// `zk://<credentials>127.0.0.1:<port>/dlock?connect_timeout=3s&<query>`.
fn url(port: u16, credentials: &str, query: &str) -> String {
    format!("zk://{credentials}127.0.0.1:{port}/dlock?connect_timeout=3s&op_timeout=2s&{query}")
}

/// A connect, or the first acquire after it, that must fail, and fail in time rather
/// than hang.
async fn failing(url: &str) -> LockError {
    let started = Instant::now();
    let result = async {
        let locker = dlock_zk::connect(ZkConfig::from_url(url)?).await?;
        locker.acquire(&unique_name("auth"), &LockOptions::new()).await.map(|_| ())
    }
    .await;
    let took = started.elapsed();
    assert!(took < CONNECT_TIMEOUT + Duration::from_secs(3), "{url}: failing took {took:?}");
    match result {
        Ok(()) => panic!("{url} should have failed"),
        Err(err) => err,
    }
}

/// A refusal: not transient, naming the server, and its message says `says`.
fn assert_refused(err: &LockError, port: u16, says: &str) {
    assert!(matches!(err, LockError::Refused { .. }) && !err.is_transient(), "not a refusal: {err:?}");
    let message = err.to_string();
    assert!(message.contains(says), "{message:?} does not say {says:?}");
    assert!(message.contains(&format!("127.0.0.1:{port}")), "{message:?} does not name the server");
    assert!(!message.contains("s3cret") && !message.contains("wrong-password"), "{message:?} shows a password");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_digest_md5_and_refusals() {
    dlock_conformance::init_tracing();
    let server = start_sasl().await;
    let port = server.addr().port();

    let sasl = url(port, "app:s3cret@", "auth=sasl");
    properties::core(&Connecting::new(Timing::SHORT, || async {
        let config = ZkConfig::from_url(&sasl).expect("url");
        Arc::new(dlock_zk::connect(config).await.unwrap_or_else(|err| panic!("connect to {sasl}: {err}")))
            as Arc<dyn Locker>
    }))
    .await;
    let built = ZkConfig::new(&format!("127.0.0.1:{port}"))
        .expect("hosts")
        .with_credentials("app", "s3cret")
        .with_auth(ZkAuth::Sasl);
    let locker = dlock_zk::connect(built).await.expect("connect from a built configuration");
    let lease = locker.acquire(&unique_name("auth"), &LockOptions::new()).await.expect("acquire");
    lease.release().await.expect("release");

    let sasl_refused = "refused the credentials: a wrong SASL user or password";
    assert_refused(&failing(&url(port, "app:wrong-password@", "auth=sasl")).await, port, sasl_refused);
    // The server logs that it does not know the user, yet opens the session as that
    // identity, which the nodes of the known one then refuse.
    assert_refused(
        &failing(&url(port, "nobody:s3cret@", "auth=sasl")).await,
        port,
        "refused this identity the lock's nodes",
    );
    // The server closes the session of a client without SASL at its first request.
    assert_refused(&failing(&url(port, "", "")).await, port, "or none where the server requires SASL");
    assert_refused(
        &failing(&url(port, "app:s3cret@", "auth=digest")).await,
        port,
        "or none where the server requires SASL",
    );

    // Nothing listens: an outage, not a refusal, and said differently.
    let closed = free_port().expect("a free port");
    let unreachable = failing(&url(closed, "app:s3cret@", "auth=sasl")).await;
    assert!(matches!(unreachable, LockError::Unavailable { .. }), "{unreachable:?}");
    let message = unreachable.to_string();
    assert!(
        message.contains(&format!("127.0.0.1:{closed}")) && !message.contains("refused the credentials"),
        "{message}"
    );

    let err = ZkConfig::from_url(&url(port, "", "auth=sasl")).map(|_| ()).unwrap_err();
    assert!(err.to_string().contains("SASL authentication needs a user and a password"), "{err}");
    let err = ZkConfig::from_url(&url(port, "app:s3cret@", "auth=kerberos")).map(|_| ()).unwrap_err();
    assert!(err.to_string().contains("neither digest nor sasl"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_digest_password_is_refused_on_the_right_ones_nodes() {
    dlock_conformance::init_tracing();
    let server = start(ZooKeeperConfig::default()).await;
    let port = server.addr().port();
    let name = unique_name("digest");

    // The right password makes the root and the lock's node, both writable by it alone.
    let right =
        dlock_zk::connect(ZkConfig::from_url(&url(port, "app:s3cret@", "")).expect("url")).await.expect("connect");
    right.acquire(&name, &LockOptions::new()).await.expect("acquire").release().await.expect("release");

    // The digest scheme takes any password at connect; the nodes refuse the identity.
    let wrong = url(port, "app:wrong-password@", "");
    let locker =
        dlock_zk::connect(ZkConfig::from_url(&wrong).expect("url")).await.expect("a digest connect is not checked");
    let err = locker.acquire(&name, &LockOptions::new()).await.map(|_| ()).unwrap_err();
    assert_refused(&err, port, "ZooKeeper refused this identity the lock's nodes");
}
