//! The row-lock, optimistic and fenced helpers under 8 concurrent tasks, on each database:
//! the seeds' stock decrement ends with exactly the right stock and no oversell, and
//! contention, conflicts and stale tokens surface as their typed errors.

// The shared fixtures start every kind of server; the tests need every database feature.
#![cfg(all(feature = "postgres", feature = "mysql", feature = "sqlite"))]

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{Kind, SqlFixture};
use dlock_core::{Backoff, LockName, LockOptions, Locker};
use dlock_sql::fenced::{self, FencedTable};
use dlock_sql::optimistic::{self, RetryPolicy, VersionedTable};
use dlock_sql::{Dialect, RowLock, SqlError};
use sqlx::AssertSqlSafe;

const TASKS: usize = 8;
const STOCK: i64 = 60;
/// More decrements are tried than there is stock: the surplus must be refused.
const TRIES_PER_TASK: usize = 10;

fn p(dialect: Dialect, n: usize) -> String {
    match dialect {
        Dialect::Postgres => format!("${n}"),
        Dialect::Sqlite => format!("?{n}"),
        Dialect::MySql => "?".into(),
    }
}

macro_rules! helper_tests {
    ($module:ident, $db:expr, $Kind:ty, $pool:ty, $connect:path) => {
        mod $module {
            use super::*;

            async fn setup() -> (SqlFixture, $pool) {
                let fixture = SqlFixture::new($db).await;
                let pool = $connect(fixture.url()).await;
                for ddl in [
                    "CREATE TABLE stock (id BIGINT NOT NULL PRIMARY KEY, qty BIGINT NOT NULL, version BIGINT NOT NULL)",
                    "CREATE TABLE ledger (id BIGINT NOT NULL PRIMARY KEY, v BIGINT NOT NULL, fence BIGINT NOT NULL)",
                    "INSERT INTO ledger (id, v, fence) VALUES (1, 0, 0)",
                ] {
                    sqlx::query(ddl).execute(&pool).await.expect("ddl");
                }
                let insert = format!("INSERT INTO stock (id, qty, version) VALUES (1, {STOCK}, 0)");
                sqlx::query(AssertSqlSafe(insert)).execute(&pool).await.expect("stock");
                (fixture, pool)
            }

            async fn stock(pool: &$pool) -> i64 {
                sqlx::query_scalar::<$Kind, i64>("SELECT qty FROM stock WHERE id = 1").fetch_one(pool).await.unwrap()
            }

            /// 8 tasks decrement under `SELECT … FOR UPDATE`: exactly the stock is sold.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn row_lock_stock_decrement() {
                let (fixture, pool) = setup().await;
                let dialect = fixture.dialect();
                let lock = RowLock::new("stock", "id").unwrap().wait(Duration::from_secs(10));
                let sold = Arc::new(AtomicU64::new(0));
                let mut tasks = Vec::new();
                for _ in 0..TASKS {
                    let (pool, lock, sold) = (pool.clone(), lock.clone(), sold.clone());
                    let update = format!("UPDATE stock SET qty = qty - 1 WHERE id = {}", p(dialect, 1));
                    tasks.push(tokio::spawn(async move {
                        for _ in 0..TRIES_PER_TASK {
                            let update = update.clone();
                            let sold_one = lock
                                .run(&pool, 1_i64, |conn| {
                                    Box::pin(async move {
                                        let qty: i64 = sqlx::query_scalar("SELECT qty FROM stock WHERE id = 1")
                                            .fetch_one(&mut *conn)
                                            .await?;
                                        if qty <= 0 {
                                            return Ok(false);
                                        }
                                        // Widen the window a lost update would need.
                                        tokio::task::yield_now().await;
                                        sqlx::query(AssertSqlSafe(update)).bind(1_i64).execute(&mut *conn).await?;
                                        Ok(true)
                                    })
                                })
                                .await
                                .expect("a bounded row lock under contention");
                            if sold_one {
                                sold.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                    }));
                }
                for task in tasks {
                    task.await.expect("task");
                }
                assert_eq!(sold.load(Ordering::SeqCst), STOCK as u64, "sold more or less than the stock");
                assert_eq!(stock(&pool).await, 0, "the stock must end at exactly zero");
            }

            /// A row held by another transaction: `NOWAIT` and a short bound both fail with
            /// `Contended`; a missing row is `NotFound`; once free, the row locks.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn row_lock_contention_is_typed() {
                let (_fixture, pool) = setup().await;
                let lock = RowLock::new("stock", "id").unwrap();
                let (held_tx, held_rx) = tokio::sync::oneshot::channel::<()>();
                let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
                let holder = {
                    let (pool, lock) = (pool.clone(), lock.clone());
                    tokio::spawn(async move {
                        lock.run(&pool, 1_i64, |_conn| {
                            Box::pin(async move {
                                held_tx.send(()).unwrap();
                                go_rx.await.unwrap();
                                Ok(())
                            })
                        })
                        .await
                    })
                };
                held_rx.await.unwrap();
                let nowait = lock.clone().nowait().run(&pool, 1_i64, |_c| Box::pin(async { Ok(()) })).await;
                assert!(matches!(nowait, Err(SqlError::Contended)), "NOWAIT on a held row: {nowait:?}");
                let bounded = lock
                    .clone()
                    .wait(Duration::from_millis(300))
                    .run(&pool, 1_i64, |_c| Box::pin(async { Ok(()) }))
                    .await;
                assert!(matches!(bounded, Err(SqlError::Contended)), "bounded wait on a held row: {bounded:?}");
                assert!(matches!(
                    dlock_core::LockError::from(bounded.unwrap_err()),
                    dlock_core::LockError::Timeout { .. }
                ));
                go_tx.send(()).unwrap();
                holder.await.unwrap().expect("the holder commits");
                let missing = lock.clone().nowait().run(&pool, 999_i64, |_c| Box::pin(async { Ok(()) })).await;
                assert!(matches!(missing, Err(SqlError::NotFound)), "a missing row: {missing:?}");
                lock.nowait().run(&pool, 1_i64, |_c| Box::pin(async { Ok(()) })).await.expect("the row is free again");
            }

            /// 8 tasks decrement with version CAS and retries: exactly the stock is sold.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn optimistic_stock_decrement() {
                let (fixture, pool) = setup().await;
                let update =
                    VersionedTable::new("stock", "id", "version").unwrap().update_sql(fixture.dialect(), &["qty"]);
                let policy = RetryPolicy {
                    attempts: 10_000,
                    backoff: Backoff::new(Duration::from_millis(1), Duration::from_millis(20)),
                };
                let sold = Arc::new(AtomicU64::new(0));
                let conflicts = Arc::new(AtomicU64::new(0));
                let mut tasks = Vec::new();
                for _ in 0..TASKS {
                    let (pool, update, sold, conflicts) =
                        (pool.clone(), update.clone(), sold.clone(), conflicts.clone());
                    tasks.push(tokio::spawn(async move {
                        for _ in 0..TRIES_PER_TASK {
                            let sold_one = optimistic::retry(&policy, || async {
                                let (qty, version): (i64, i64) =
                                    sqlx::query_as("SELECT qty, version FROM stock WHERE id = 1")
                                        .fetch_one(&pool)
                                        .await?;
                                if qty <= 0 {
                                    return Ok(false);
                                }
                                tokio::task::yield_now().await;
                                let done = sqlx::query(AssertSqlSafe(update.clone()))
                                    .bind(qty - 1)
                                    .bind(1_i64)
                                    .bind(version)
                                    .execute(&pool)
                                    .await?;
                                optimistic::expect_updated(done.rows_affected()).inspect_err(|_| {
                                    conflicts.fetch_add(1, Ordering::Relaxed);
                                })?;
                                Ok(true)
                            })
                            .await
                            .expect("optimistic decrement");
                            if sold_one {
                                sold.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                    }));
                }
                for task in tasks {
                    task.await.expect("task");
                }
                assert_eq!(sold.load(Ordering::SeqCst), STOCK as u64, "sold more or less than the stock");
                assert_eq!(stock(&pool).await, 0, "the stock must end at exactly zero");
                let (version,): (i64,) =
                    sqlx::query_as("SELECT version FROM stock WHERE id = 1").fetch_one(&pool).await.unwrap();
                assert_eq!(version, STOCK, "one version step per sale");
            }

            /// A write with a version someone else moved is a `Conflict`, after the policy's
            /// attempts.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn optimistic_conflict_is_typed() {
                let (fixture, pool) = setup().await;
                let update =
                    VersionedTable::new("stock", "id", "version").unwrap().update_sql(fixture.dialect(), &["qty"]);
                let attempts = AtomicU64::new(0);
                let outcome = optimistic::retry(&RetryPolicy::attempts(3), || async {
                    attempts.fetch_add(1, Ordering::SeqCst);
                    let (qty, version): (i64, i64) =
                        sqlx::query_as("SELECT qty, version FROM stock WHERE id = 1").fetch_one(&pool).await?;
                    // Another writer gets in between the read and the write, every time.
                    sqlx::query("UPDATE stock SET version = version + 1 WHERE id = 1").execute(&pool).await?;
                    let done = sqlx::query(AssertSqlSafe(update.clone()))
                        .bind(qty - 1)
                        .bind(1_i64)
                        .bind(version)
                        .execute(&pool)
                        .await?;
                    optimistic::expect_updated(done.rows_affected())
                })
                .await;
                assert!(matches!(outcome, Err(SqlError::Conflict)), "{outcome:?}");
                assert_eq!(attempts.load(Ordering::SeqCst), 3);
                assert_eq!(stock(&pool).await, STOCK, "no conflicting write went through");
            }

            /// Successive lock holders write a fenced row: the superseded holder's write,
            /// with its older token, is refused with `Fenced`.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn fenced_update_refuses_a_stale_holder() {
                let (fixture, pool) = setup().await;
                let update = FencedTable::new("ledger", "id", "fence").unwrap().update_sql(fixture.dialect(), &["v"]);
                let write = |value: i64, token: u64| {
                    let (pool, update) = (pool.clone(), update.clone());
                    async move {
                        let token = token as i64;
                        let done = sqlx::query(AssertSqlSafe(update))
                            .bind(value)
                            .bind(token)
                            .bind(1_i64)
                            .bind(token)
                            .execute(&pool)
                            .await?;
                        fenced::expect_accepted(done.rows_affected())
                    }
                };
                let (a, b) = (fixture.lease_client().await, fixture.lease_client().await);
                let name = LockName::new("ledger/1").unwrap();
                let short = LockOptions::fixed(Duration::from_millis(300)).wait(Duration::from_secs(10));
                let old = a.acquire(&name, &short).await.expect("first holder");
                write(1, old.token().get()).await.expect("the first holder writes");
                write(2, old.token().get()).await.expect("a holder may write again with its token");
                // The first lease runs out while its holder is "paused"; the next holder writes.
                let opts = LockOptions::watchdog(Duration::from_secs(5)).wait(Duration::from_secs(10));
                let new = b.acquire(&name, &opts).await.expect("second holder after expiry");
                assert!(new.token() > old.token());
                write(3, new.token().get()).await.expect("the new holder writes");
                let stale = write(4, old.token().get()).await;
                assert!(matches!(stale, Err(SqlError::Fenced)), "the stale holder's write: {stale:?}");
                let (v,): (i64,) = sqlx::query_as("SELECT v FROM ledger WHERE id = 1").fetch_one(&pool).await.unwrap();
                assert_eq!(v, 3);
                new.release().await.expect("release");
            }

            /// Many concurrent fenced writers, each under the lock: every write of a current
            /// holder is accepted, and the row ends with the last holder's token.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn fenced_writes_under_the_lock() {
                let (fixture, pool) = setup().await;
                let update = FencedTable::new("ledger", "id", "fence").unwrap().update_sql(fixture.dialect(), &["v"]);
                let name = LockName::new("ledger/all").unwrap();
                let max_token = Arc::new(AtomicU64::new(0));
                let mut tasks = Vec::new();
                for _ in 0..TASKS {
                    let client = fixture.lease_client().await;
                    let (pool, update, name, max_token) =
                        (pool.clone(), update.clone(), name.clone(), max_token.clone());
                    tasks.push(tokio::spawn(async move {
                        let opts = LockOptions::watchdog(Duration::from_secs(2)).wait(Duration::from_secs(60));
                        for _ in 0..5 {
                            let lease = client.acquire(&name, &opts).await.expect("acquire");
                            let token = lease.token().get() as i64;
                            let done = sqlx::query(AssertSqlSafe(update.clone()))
                                .bind(token)
                                .bind(token)
                                .bind(1_i64)
                                .bind(token)
                                .execute(&pool)
                                .await
                                .expect("update");
                            fenced::expect_accepted(done.rows_affected()).expect("a current holder is never fenced");
                            max_token.fetch_max(token as u64, Ordering::SeqCst);
                            lease.release().await.expect("release");
                        }
                    }));
                }
                for task in tasks {
                    task.await.expect("task");
                }
                let (fence,): (i64,) =
                    sqlx::query_as("SELECT fence FROM ledger WHERE id = 1").fetch_one(&pool).await.unwrap();
                assert_eq!(fence as u64, max_token.load(Ordering::SeqCst));
            }
        }
    };
}

async fn pg_pool(url: &str) -> sqlx::PgPool {
    sqlx::PgPool::connect(url).await.expect("pool")
}

async fn my_pool(url: &str) -> sqlx::MySqlPool {
    sqlx::MySqlPool::connect(url).await.expect("pool")
}

async fn lite_pool(url: &str) -> sqlx::SqlitePool {
    let path = url.trim_start_matches("sqlite://").to_string();
    let opts = sqlx::sqlite::SqliteConnectOptions::new().filename(path).busy_timeout(Duration::from_secs(10));
    sqlx::SqlitePool::connect_with(opts).await.expect("pool")
}

helper_tests!(postgres, Kind::Postgres, sqlx::Postgres, sqlx::PgPool, pg_pool);
helper_tests!(mariadb, Kind::MariaDb, sqlx::MySql, sqlx::MySqlPool, my_pool);
helper_tests!(sqlite, Kind::Sqlite, sqlx::Sqlite, sqlx::SqlitePool, lite_pool);
