//! Locks over the application's own sqlx pool (`SqlConfig::from_pg_pool` and its
//! siblings): the suite's core properties pass with clients made from pools, the server
//! sees no more connections than the docs say (the pool's, plus one `LISTEN` connection on
//! PostgreSQL), and the application's pool outlives the lock client.

// The shared fixtures start every kind of server; the tests need every database feature.
#![cfg(all(feature = "postgres", feature = "mysql", feature = "sqlite"))]

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::{Kind, SqlFixture};
use dlock_conformance::properties::{self, unique_name};
use dlock_conformance::{Fixture, Timing};
use dlock_core::{ConnectConfig, LockOptions, Locker};
use dlock_sql::sqlx::{self, Executor, MySqlPool, PgPool, SqlitePool};
use dlock_sql::{LockKind, SqlConfig};

/// Connections in each of the application's pools.
const POOL: u32 = 3;

/// How the application made its pool.
#[derive(Clone)]
enum AppPool {
    Postgres(String),
    MySql(String),
    Sqlite(std::path::PathBuf),
}

impl AppPool {
    fn open(&self) -> SqlConfig {
        let timeout = Duration::from_secs(10);
        match self {
            AppPool::Postgres(url) => SqlConfig::from_pg_pool(
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(POOL)
                    .acquire_timeout(timeout)
                    .connect_lazy(url)
                    .unwrap(),
            ),
            AppPool::MySql(url) => SqlConfig::from_mysql_pool(
                sqlx::mysql::MySqlPoolOptions::new()
                    .max_connections(POOL)
                    .acquire_timeout(timeout)
                    .connect_lazy(url)
                    .unwrap(),
            ),
            AppPool::Sqlite(path) => {
                let options = sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(path)
                    .create_if_missing(true)
                    .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
                    .busy_timeout(Duration::from_secs(2));
                SqlConfig::from_sqlite_pool(
                    sqlx::sqlite::SqlitePoolOptions::new().max_connections(POOL).connect_lazy_with(options),
                )
            }
        }
    }
}

/// Each client over a pool of its own, as the replicas of a service would have.
struct Pools(AppPool);

#[async_trait]
impl Fixture for Pools {
    fn timing(&self) -> Timing {
        Timing::SHORT
    }

    async fn client(&self) -> Arc<dyn Locker> {
        let config =
            self.0.open().with_op_timeout(Duration::from_secs(2)).with_connect_timeout(Duration::from_secs(10));
        Arc::new(dlock_sql::connect(config).await.expect("connect over the application's pool"))
    }
}

async fn core_properties(pool: AppPool) {
    let pools = Pools(pool);
    properties::core(&pools).await;
}

async fn lock_once(locker: &dyn Locker) {
    let name = unique_name("own-pool");
    let lease = locker.acquire(&name, &LockOptions::new().wait(Duration::from_secs(5))).await.expect("acquire");
    lease.release().await.expect("release");
}

/// Holds a lock while a second task of the same client waits for it and eight more lock
/// names of their own, and returns the most connections `count` saw meanwhile.
async fn busy_count<F, Fut>(locker: &Arc<dyn Locker>, count: F) -> i64
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = i64>,
{
    let name = unique_name("counted");
    let held = locker.acquire(&name, &LockOptions::watchdog(Duration::from_secs(2))).await.expect("acquire");
    let waiter = {
        let (locker, name) = (locker.clone(), name.clone());
        tokio::spawn(async move { locker.acquire(&name, &LockOptions::new().wait(Duration::from_secs(10))).await })
    };
    // Renewals and the waiter's attempts run meanwhile, and eight tasks lock names of
    // their own as fast as they can: a client that opened connections beyond the pool's
    // would show them now.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy: Vec<_> = (0..8)
        .map(|_| {
            let (locker, stop, name) = (locker.clone(), stop.clone(), unique_name("busy"));
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let lease = locker.acquire(&name, &LockOptions::new()).await.expect("acquire");
                    lease.release().await.expect("release");
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut seen = 0;
    for _ in 0..10 {
        seen = seen.max(count().await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in busy {
        task.await.expect("a busy task");
    }
    held.release().await.expect("release");
    waiter.await.expect("the waiter").expect("granted").release().await.expect("release");
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_pool_passes_the_core_properties() {
    let fixture = SqlFixture::new(Kind::Postgres).await;
    core_properties(AppPool::Postgres(fixture.url().to_string())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_pool_uses_its_connections_and_one_listener() {
    let fixture = SqlFixture::new(Kind::Postgres).await;
    let app = sqlx::postgres::PgPoolOptions::new()
        .max_connections(POOL)
        .connect_with(fixture.url().parse::<sqlx::postgres::PgConnectOptions>().unwrap().application_name("shop"))
        .await
        .expect("the application's pool");
    let locker: Arc<dyn Locker> =
        Arc::new(dlock_sql::connect(SqlConfig::from_pg_pool(app.clone())).await.expect("connect"));
    let admin = PgPool::connect(fixture.url()).await.expect("admin");
    let seen = busy_count(&locker, || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'shop'")
            .fetch_one(&admin)
            .await
            .expect("count connections")
    })
    .await;
    assert!(seen >= 2 && seen <= i64::from(POOL) + 1, "{seen} connections: the pool's {POOL} and one LISTEN at most");

    // An advisory client over the same pool: its sessions are extra, one per lock held.
    let advisory = SqlConfig::from_pg_pool(app.clone()).with_lock_kind(LockKind::Advisory);
    lock_once(&*dlock_sql::connect_any(advisory).await.expect("advisory over the pool")).await;

    drop(locker);
    assert!(!app.is_closed(), "the lock client closed the application's pool");
    app.execute("SELECT 1").await.expect("the application's pool still works");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_pool_passes_the_core_properties_within_its_connections() {
    let fixture = SqlFixture::new(Kind::MariaDb).await;
    core_properties(AppPool::MySql(fixture.url().to_string())).await;

    let app: MySqlPool =
        sqlx::mysql::MySqlPoolOptions::new().max_connections(POOL).connect(fixture.url()).await.expect("pool");
    let admin = sqlx::mysql::MySqlPoolOptions::new().max_connections(1).connect(fixture.url()).await.expect("admin");
    let before: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE COMMAND <> 'Daemon'")
            .fetch_one(&admin)
            .await
            .expect("count connections");
    let locker: Arc<dyn Locker> =
        Arc::new(dlock_sql::connect(SqlConfig::from_mysql_pool(app.clone())).await.expect("connect"));
    let seen = busy_count(&locker, || async {
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE COMMAND <> 'Daemon'")
            .fetch_one(&admin)
            .await
            .expect("count connections")
    })
    .await;
    // `before` counts the test's other connections and the pool's first one.
    assert!(seen - before < i64::from(POOL), "{before} connections before, {seen} while locking");
    drop(locker);
    app.execute("SELECT 1").await.expect("the application's pool still works");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_pool_passes_the_core_properties() {
    let dir = tempfile::tempdir().expect("temp dir");
    core_properties(AppPool::Sqlite(dir.path().join("app.db"))).await;

    let app = SqlitePool::connect_with(
        sqlx::sqlite::SqliteConnectOptions::new().filename(dir.path().join("app.db")).create_if_missing(true),
    )
    .await
    .expect("the application's pool");
    let locker = dlock_sql::connect(SqlConfig::from_sqlite_pool(app.clone())).await.expect("connect");
    lock_once(&locker).await;
    drop(locker);
    app.execute("SELECT 1").await.expect("the application's pool still works");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_keeps_its_own_credentials_and_tls() {
    let pool = sqlx::postgres::PgPoolOptions::new().connect_lazy("postgres://app@127.0.0.1:1/db").unwrap();
    for config in [
        SqlConfig::from_pg_pool(pool.clone()).with_credentials("app", "secret"),
        SqlConfig::from_pg_pool(pool.clone()).with_connect_timeout(Duration::from_millis(500)),
    ] {
        let started = std::time::Instant::now();
        let result = dlock_sql::connect(config).await;
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        assert!(result.is_err());
    }
    match dlock_sql::connect(SqlConfig::from_pg_pool(pool).with_credentials("app", "secret")).await {
        Err(dlock_core::LockError::InvalidInput(why)) => assert!(why.contains("application's pool"), "{why}"),
        other => panic!("{:?}", other.map(|_| "connected")),
    }
}
