//! TLS (`etcds://`), client certificates, and user/password authentication against a
//! real etcd, with certificates made for the test.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dlock_conformance::properties::unique_name;
use dlock_core::{LockError, LockOptions, Locker};
use dlock_etcd::EtcdConfig;
use dlock_testkit::supervisor::etcd::{EtcdConfig as ServerConfig, EtcdServer, EtcdTls};
use dlock_testkit::supervisor::tls::TestPki;

/// A CA, a server certificate for 127.0.0.1, and a client certificate for `root`.
struct Pki(TestPki);

impl Pki {
    fn new() -> Self {
        Pki(TestPki::new("root").expect("test certificates"))
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.path(name)
    }

    fn server_tls(&self, client_ca: bool) -> EtcdTls {
        EtcdTls {
            cert: self.path("server.pem"),
            key: self.path("server-key.pem"),
            client_ca: client_ca.then(|| self.path("ca.pem")),
        }
    }
}

async fn start(tls: EtcdTls) -> EtcdServer {
    let config = ServerConfig { tls: Some(tls), ..ServerConfig::default() };
    tokio::task::spawn_blocking(move || EtcdServer::start(&config))
        .await
        .expect("spawn_blocking")
        .expect("start etcd with TLS")
}

fn url(server: &EtcdServer, userinfo: &str, query: &str) -> String {
    format!("etcds://{userinfo}{}?connect_timeout=2s&op_timeout=2s&{query}", server.addr())
}

fn path_param(path: &Path) -> String {
    path.display().to_string()
}

async fn lock_once(locker: &dlock_etcd::EtcdLocker) {
    let name = unique_name("tls");
    let lease = locker.acquire(&name, &LockOptions::new().wait(Duration::from_secs(5))).await.expect("acquire");
    let info = locker.inspect(&name).await.expect("inspect");
    assert_eq!(info.holder.map(|h| h.token), Some(lease.token()));
    lease.release().await.expect("release");
}

/// A connection that must fail, and fail in time rather than hang.
async fn refused(url: &str) -> LockError {
    let started = Instant::now();
    let result = dlock_etcd::connect(EtcdConfig::from_url(url).expect("url")).await;
    assert!(started.elapsed() < Duration::from_secs(5), "connecting took {:?}", started.elapsed());
    match result {
        Ok(_) => panic!("connecting to {url} should have failed"),
        Err(err) => err,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_user_and_password() {
    let pki = Pki::new();
    let server = start(pki.server_tls(false)).await;
    let ca = format!("ca={}", path_param(&pki.path("ca.pem")));

    let admin = dlock_etcd::connect(EtcdConfig::from_url(&url(&server, "", &ca)).expect("url")).await.expect("connect");
    lock_once(&admin).await;
    let mut etcd = admin.backend().etcd().await.expect("etcd client");
    etcd.user_add("root", "s3cret", None).await.expect("add user root");
    let _ = etcd.role_add("root").await;
    etcd.user_grant_role("root", "root").await.expect("grant the root role");
    etcd.auth_enable().await.expect("enable authentication");

    let locker = dlock_etcd::connect(EtcdConfig::from_url(&url(&server, "root:s3cret@", &ca)).expect("url"))
        .await
        .expect("connect as root");
    lock_once(&locker).await;

    let wrong = refused(&url(&server, "root:wrong@", &ca)).await;
    let anonymous = refused(&url(&server, "", &ca)).await;
    // The server's certificate is not signed by a CA the system trusts.
    let untrusted = refused(&url(&server, "root:s3cret@", "")).await;
    let plaintext = refused(&format!("etcd://root:s3cret@{}?connect_timeout=2s", server.addr())).await;
    let closed = dlock_testkit::supervisor::free_port().expect("a free port");
    let no_server = refused(&format!("etcds://root:s3cret@127.0.0.1:{closed}?connect_timeout=2s&{ca}")).await;
    // Each names the server and says what failed; none of them is an outage, except the
    // server that is not there.
    for (err, place, says) in [
        (&wrong, server.addr().to_string(), "did not accept the user name and password"),
        (&anonymous, server.addr().to_string(), "authentication on"),
        (&untrusted, server.addr().to_string(), "certificate"),
        (&plaintext, server.addr().to_string(), "speaks TLS on this port: connect with etcds://"),
        (&no_server, format!("127.0.0.1:{closed}"), "etcd"),
    ] {
        let message = err.to_string();
        assert!(message.contains(&place) && message.contains(says), "{message}");
        assert!(!message.contains("s3cret"), "{message}");
    }
    for err in [&wrong, &anonymous, &plaintext] {
        assert!(matches!(err, LockError::Refused { .. }) && !err.is_transient(), "not a refusal: {err:?}");
    }
    assert!(!untrusted.is_transient(), "{untrusted:?}");
    assert!(matches!(no_server, LockError::Unavailable { .. }), "{no_server:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_client_certificate() {
    let pki = Pki::new();
    let server = start(pki.server_tls(true)).await;
    let query = format!(
        "ca={}&cert={}&key={}&domain=localhost",
        path_param(&pki.path("ca.pem")),
        path_param(&pki.path("client.pem")),
        path_param(&pki.path("client-key.pem")),
    );
    let locker = dlock_etcd::connect(EtcdConfig::from_url(&url(&server, "", &query)).expect("url"))
        .await
        .expect("connect with a client certificate");
    lock_once(&locker).await;

    let built = EtcdConfig::new([server.addr().to_string()])
        .with_ca_file(pki.path("ca.pem"))
        .with_client_identity(pki.path("client.pem"), pki.path("client-key.pem"));
    lock_once(&dlock_etcd::connect(built).await.expect("connect from a built configuration")).await;

    refused(&url(&server, "", &format!("ca={}", path_param(&pki.path("ca.pem"))))).await;
}
