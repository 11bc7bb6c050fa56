//! Connecting by URL: the in-memory SQLite database, an SQLite file that cannot be opened,
//! a server nobody listens on, and options that are refused.

use std::time::{Duration, Instant};

use dlock_core::LockError;
use dlock_sql::SqlConfig;

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn in_memory_sqlite_locks() {
    use dlock_core::{LockName, LockOptions};
    let locker = dlock_sql::connect_any(SqlConfig::from_url("sqlite::memory:").unwrap()).await.expect("connect");
    let name = LockName::new("memory/a").unwrap();
    let lease = locker.acquire(&name, &LockOptions::new().wait(Duration::from_secs(5))).await.expect("acquire");
    assert!(locker.try_acquire(&name, &LockOptions::new()).await.unwrap().is_none());
    let token = lease.token();
    lease.release().await.expect("release");
    let again = locker.try_acquire(&name, &LockOptions::new()).await.unwrap().expect("free");
    assert!(again.token() > token);
    again.release().await.unwrap();
}

#[tokio::test]
async fn unreachable_databases_are_unavailable_in_time() {
    let port = dlock_testkit::supervisor::free_port().unwrap();
    let mut urls = Vec::new();
    if cfg!(feature = "sqlite") {
        urls.push("sqlite:///nonexistent-dlock-dir/locks.db".to_string());
    }
    if cfg!(feature = "postgres") {
        urls.push(format!("postgres://postgres@127.0.0.1:{port}/postgres?connect_timeout=500ms"));
    }
    if cfg!(feature = "mysql") {
        urls.push(format!("mysql://root@127.0.0.1:{port}/dlock?connect_timeout=500ms"));
    }
    for url in urls {
        let started = Instant::now();
        let outcome = dlock_sql::connect_any(SqlConfig::from_url(&url).unwrap()).await.map(drop);
        assert!(matches!(outcome, Err(LockError::Unavailable { .. })), "{url}: {outcome:?}");
        assert!(started.elapsed() < Duration::from_secs(10), "{url}: failed only after {:?}", started.elapsed());
    }
}

#[cfg(feature = "sqlite")]
#[test]
fn advisory_needs_a_server() {
    assert!(matches!(SqlConfig::from_url("sqlite://x.db?lock=advisory"), Err(LockError::InvalidInput(_))));
}

#[cfg(feature = "postgres")]
#[test]
fn advisory_is_chosen_by_the_url() {
    let config = SqlConfig::from_url("postgres://u@h/db?lock=advisory&pool_size=3&create_table=false").unwrap();
    assert_eq!(config.lock_kind(), dlock_sql::LockKind::Advisory);
    assert_eq!(config.pool_size(), 3);
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_refuses_credentials_and_bad_prefixes() {
    use dlock_core::ConnectConfig;
    let with_credentials = SqlConfig::sqlite_memory().with_credentials("app", "secret");
    assert!(matches!(dlock_sql::connect(with_credentials).await, Err(LockError::InvalidInput(_))));
    let bad_prefix = SqlConfig::sqlite_memory().with_prefix("a-b");
    assert!(matches!(dlock_sql::connect(bad_prefix).await, Err(LockError::InvalidInput(_))));
}

#[cfg(feature = "postgres")]
#[test]
fn passwords_stay_out_of_debug_output() {
    use dlock_core::ConnectConfig;
    let config = SqlConfig::from_url("postgres://u:urlsecret@h/db?op_timeout=3s")
        .unwrap()
        .with_credentials("app", "topsecret")
        .with_connect_timeout(Duration::from_secs(7));
    assert_eq!((config.op_timeout(), config.connect_timeout()), (Duration::from_secs(3), Duration::from_secs(7)));
    assert_eq!(config.user(), Some("app"));
    let shown = format!("{config:?}");
    assert!(shown.contains("app") && !shown.contains("topsecret") && !shown.contains("urlsecret"), "{shown}");
}
