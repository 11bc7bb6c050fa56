//! TLS and authentication against PostgreSQL and MariaDB servers that accept TLS
//! connections only, with certificates made for the test (the server's names only
//! `localhost`, so that connecting by `127.0.0.1` shows a host-name check refusing it).
//!
//! Each database: the suite's core properties over a verified connection with a password;
//! then each way of getting it wrong (no TLS, an unknown CA, another host name, a wrong
//! password, a wrong port) fails in time, with its own message that names the server.

#![cfg(all(feature = "postgres", feature = "mysql"))]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_conformance::properties::{self, unique_name};
use dlock_conformance::{Connecting, Timing};
use dlock_core::{ConnectConfig, LockError, LockOptions, Locker};
use dlock_sql::SqlConfig;
use dlock_testkit::supervisor::free_port;
use dlock_testkit::supervisor::mariadb::{MariaDbServer, MariaDbTls};
use dlock_testkit::supervisor::postgres::{PostgresServer, PostgresTls};
use dlock_testkit::supervisor::tls::TestPki;
use sqlx::{ConnectOptions, Executor};

const PASSWORD: &str = "s3cret";

fn pki() -> TestPki {
    TestPki::for_server("certuser", &["localhost"]).expect("test certificates")
}

fn file(pki: &TestPki, name: &str) -> String {
    pki.path(name).display().to_string()
}

fn config(url: &str) -> SqlConfig {
    SqlConfig::from_url(url)
        .expect("url")
        .with_connect_timeout(Duration::from_secs(10))
        .with_op_timeout(Duration::from_secs(2))
        .with_pool_size(4)
}

/// The suite's core properties over one TLS connection string.
async fn core_properties(url: &str) {
    let clients = Connecting::new(Timing::SHORT, || async {
        Arc::new(dlock_sql::connect(config(url)).await.expect("connect over TLS")) as Arc<dyn Locker>
    });
    properties::core(&clients).await;
}

/// A connect that must fail, and fail in time rather than hang.
async fn refused(url: &str) -> LockError {
    let started = Instant::now();
    let result = dlock_sql::connect(config(url).with_connect_timeout(Duration::from_secs(2))).await;
    assert!(started.elapsed() < Duration::from_secs(6), "{url}: connecting took {:?}", started.elapsed());
    match result {
        Ok(_) => panic!("connecting to {url} should have failed"),
        Err(err) => err,
    }
}

/// Each error names the server it was about, says `expected`, and is told apart from the
/// others.
fn assert_distinct(cases: &[(&str, &LockError, &str, &str)]) {
    for (what, err, server, expected) in cases {
        let message = err.to_string();
        eprintln!("{what}: {message}");
        assert!(message.contains(server), "{what}: the message does not name {server}: {message}");
        assert!(message.contains(expected), "{what}: expected {expected:?} in: {message}");
    }
    for (i, (a, first, ..)) in cases.iter().enumerate() {
        for (b, second, ..) in &cases[i + 1..] {
            assert_ne!(first.to_string(), second.to_string(), "{a} and {b} read the same");
        }
    }
}

async fn lock_once(locker: &dyn Locker) {
    let name = unique_name("tls");
    let lease = locker.acquire(&name, &LockOptions::new().wait(Duration::from_secs(5))).await.expect("acquire");
    assert_eq!(locker.inspect(&name).await.expect("inspect").holder.map(|h| h.token), Some(lease.token()));
    lease.release().await.expect("release");
}

async fn start_postgres(pki: &TestPki) -> PostgresServer {
    let tls = PostgresTls {
        cert: pki.path("server.pem"),
        key: pki.path("server-key.pem"),
        client_ca: pki.path("ca.pem"),
        cert_user: "certuser".into(),
    };
    let server = tokio::task::spawn_blocking(move || PostgresServer::start_tls(100, &tls))
        .await
        .expect("spawn_blocking")
        .expect("start PostgreSQL with TLS");
    let admin = sqlx::postgres::PgConnectOptions::new()
        .socket(server.dir())
        .port(server.addr().port())
        .username("postgres")
        .database("postgres");
    let mut admin = settled(|| admin.connect()).await;
    for statement in [
        format!("CREATE ROLE app LOGIN PASSWORD '{PASSWORD}'"),
        "CREATE ROLE certuser LOGIN".to_string(),
        "GRANT ALL ON SCHEMA public TO app, certuser".to_string(),
    ] {
        admin.execute(sqlx::AssertSqlSafe(statement)).await.expect("set up the roles");
    }
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_verify_full_with_a_password_passes_the_core_properties() {
    let pki = pki();
    let server = start_postgres(&pki).await;
    let port = server.addr().port();
    let ca = file(&pki, "ca.pem");
    let url = format!("postgres://app:{PASSWORD}@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={ca}");
    core_properties(&url).await;

    // A client certificate in place of a password.
    let by_cert = format!(
        "postgres://certuser@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={ca}&sslcert={}&sslkey={}&prefix=bycert",
        file(&pki, "client.pem"),
        file(&pki, "client-key.pem")
    );
    lock_once(&dlock_sql::connect(config(&by_cert)).await.expect("connect with a client certificate")).await;

    // Advisory sessions reach the server through a loopback relay: the CA is checked, the
    // host name cannot be, and asking for it is refused rather than quietly skipped.
    let advisory = format!("postgres://app:{PASSWORD}@localhost:{port}/postgres?sslmode=verify-ca&sslrootcert={ca}");
    lock_once(&dlock_sql::connect_advisory(config(&advisory)).await.expect("advisory over TLS")).await;
    match dlock_sql::connect_advisory(config(&url)).await {
        Err(LockError::InvalidInput(why)) => assert!(why.contains("host name"), "{why}"),
        other => panic!("advisory with verify-full: {:?}", other.map(|_| "connected")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refusals_say_what_failed_and_where() {
    let pki = pki();
    let server = start_postgres(&pki).await;
    let port = server.addr().port();
    let ca = file(&pki, "ca.pem");
    let other_ca = pki_elsewhere();
    let good = format!("postgres://app:{PASSWORD}@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={ca}");
    lock_once(&dlock_sql::connect(config(&good)).await.expect("connect")).await;

    let plain = refused(&format!("postgres://app:{PASSWORD}@localhost:{port}/postgres?sslmode=disable")).await;
    let other_host =
        refused(&format!("postgres://app:{PASSWORD}@127.0.0.1:{port}/postgres?sslmode=verify-full&sslrootcert={ca}"))
            .await;
    let unknown_ca = refused(&format!(
        "postgres://app:{PASSWORD}@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={}",
        file(&other_ca, "ca.pem")
    ))
    .await;
    let password =
        refused(&format!("postgres://app:wrong@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={ca}")).await;
    let closed = free_port().expect("a free port");
    let no_server =
        refused(&format!("postgres://app:{PASSWORD}@localhost:{closed}/postgres?sslmode=verify-full&sslrootcert={ca}"))
            .await;

    for err in [&plain, &other_host, &unknown_ca, &password] {
        assert!(matches!(err, LockError::Refused { .. }), "not a refusal: {err:?}");
        assert!(!err.is_transient(), "{err}");
    }
    assert!(matches!(no_server, LockError::Unavailable { .. }) && no_server.is_transient(), "{no_server:?}");
    let server = format!("postgres://localhost:{port}/postgres");
    let nowhere = format!("postgres://localhost:{closed}/postgres");
    assert_distinct(&[
        ("no TLS", &plain, &server, "only TLS"),
        ("another host name", &other_host, &format!("postgres://127.0.0.1:{port}/postgres"), "does not name the host"),
        ("an unknown CA", &unknown_ca, &server, "not signed by a CA"),
        ("a wrong password", &password, &server, "user name and password"),
        ("a wrong port", &no_server, &nowhere, "refused"),
    ]);
    for err in [&plain, &other_host, &unknown_ca, &password, &no_server] {
        assert!(!err.to_string().contains(PASSWORD) && !err.to_string().contains("wrong"), "{err}");
    }
}

/// Another CA, which signed nothing the servers present.
fn pki_elsewhere() -> TestPki {
    TestPki::new("nobody").expect("another CA")
}

async fn start_mariadb(pki: &TestPki) -> MariaDbServer {
    let tls =
        MariaDbTls { cert: pki.path("server.pem"), key: pki.path("server-key.pem"), client_ca: pki.path("ca.pem") };
    let server = tokio::task::spawn_blocking(move || MariaDbServer::start_tls(100, &tls))
        .await
        .expect("spawn_blocking")
        .expect("start MariaDB with TLS");
    let socket = server.dir().join("mysqld.sock");
    let mut admin = admin_mysql(&socket).await;
    for statement in
        [format!("CREATE USER 'app'@'%' IDENTIFIED BY '{PASSWORD}'"), "GRANT ALL ON dlock.* TO 'app'@'%'".to_string()]
    {
        admin.execute(sqlx::AssertSqlSafe(statement)).await.expect("set up the user");
    }
    server
}

async fn admin_mysql(socket: &Path) -> sqlx::MySqlConnection {
    let admin = sqlx::mysql::MySqlConnectOptions::new().socket(socket).username("root").database("dlock");
    settled(|| admin.connect()).await
}

/// An administrator's connection over the Unix socket, once the server that just opened
/// its port has finished starting ("the database system is starting up").
async fn settled<C, F>(connect: impl Fn() -> F) -> C
where
    F: std::future::Future<Output = Result<C, sqlx::Error>>,
{
    let started = Instant::now();
    loop {
        match connect().await {
            Ok(conn) => return conn,
            Err(err) if started.elapsed() < Duration::from_secs(30) => {
                eprintln!("the server is not ready yet: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => panic!("connect over the Unix socket: {err}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_verify_identity_with_a_password_passes_the_core_properties() {
    let pki = pki();
    let server = start_mariadb(&pki).await;
    let port = server.addr().port();
    let ca = file(&pki, "ca.pem");
    let url = format!("mysql://app:{PASSWORD}@localhost:{port}/dlock?ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}");
    core_properties(&url).await;

    let advisory = format!("mysql://app:{PASSWORD}@localhost:{port}/dlock?ssl-mode=VERIFY_CA&ssl-ca={ca}");
    lock_once(&dlock_sql::connect_advisory(config(&advisory)).await.expect("advisory over TLS")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_refusals_say_what_failed_and_where() {
    let pki = pki();
    let server = start_mariadb(&pki).await;
    let port = server.addr().port();
    let ca = file(&pki, "ca.pem");
    let other_ca = pki_elsewhere();
    let good = format!("mysql://app:{PASSWORD}@localhost:{port}/dlock?ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}");
    lock_once(&dlock_sql::connect(config(&good)).await.expect("connect")).await;

    let plain = refused(&format!("mysql://app:{PASSWORD}@localhost:{port}/dlock?ssl-mode=DISABLED")).await;
    let other_host =
        refused(&format!("mysql://app:{PASSWORD}@127.0.0.1:{port}/dlock?ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}")).await;
    let unknown_ca = refused(&format!(
        "mysql://app:{PASSWORD}@localhost:{port}/dlock?ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
        file(&other_ca, "ca.pem")
    ))
    .await;
    let password =
        refused(&format!("mysql://app:wrong@localhost:{port}/dlock?ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}")).await;
    let closed = free_port().expect("a free port");
    let no_server =
        refused(&format!("mysql://app:{PASSWORD}@localhost:{closed}/dlock?ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}")).await;

    for err in [&plain, &other_host, &unknown_ca, &password] {
        assert!(matches!(err, LockError::Refused { .. }), "not a refusal: {err:?}");
    }
    assert!(matches!(no_server, LockError::Unavailable { .. }), "{no_server:?}");
    let server = format!("mysql://localhost:{port}/dlock");
    // MariaDB answers a plain connection to a server that requires TLS as it answers a
    // wrong password: the message says it may be either.
    assert_distinct(&[
        ("no TLS", &plain, &server, "only TLS connections and ssl-mode=DISABLED"),
        ("another host name", &other_host, &format!("mysql://127.0.0.1:{port}/dlock"), "does not name the host"),
        ("an unknown CA", &unknown_ca, &server, "not signed by a CA"),
        ("a wrong password", &password, &server, "user name and password"),
        ("a wrong port", &no_server, &format!("mysql://localhost:{closed}/dlock"), "refused"),
    ]);
}
