//! Connecting by URL: the in-memory SQLite database, an SQLite file that cannot be opened,
//! a server nobody listens on, and options that are refused.

use std::time::{Duration, Instant};

use dlock_core::{LockError, LockName, LockOptions};
use dlock_sql::SqlConfig;

#[tokio::test]
async fn in_memory_sqlite_locks() {
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
    let port = conformance::supervisor::free_port().unwrap();
    for url in [
        "sqlite:///nonexistent-dlock-dir/locks.db".to_string(),
        format!("postgres://postgres@127.0.0.1:{port}/postgres?connect_timeout=500ms"),
        format!("mysql://root@127.0.0.1:{port}/dlock?connect_timeout=500ms"),
    ] {
        let started = Instant::now();
        let outcome = dlock_sql::connect_any(SqlConfig::from_url(&url).unwrap()).await.map(drop);
        assert!(matches!(outcome, Err(LockError::Unavailable(_))), "{url}: {outcome:?}");
        assert!(started.elapsed() < Duration::from_secs(10), "{url}: failed only after {:?}", started.elapsed());
    }
}

#[test]
fn advisory_needs_a_server() {
    assert!(matches!(SqlConfig::from_url("sqlite://x.db?lock=advisory"), Err(LockError::InvalidInput(_))));
    let config = SqlConfig::from_url("postgres://u@h/db?lock=advisory&pool_size=3&create_table=false").unwrap();
    assert_eq!(config.get_lock_kind(), dlock_sql::LockKind::Advisory);
    assert_eq!(config.get_pool_size(), 3);
}
