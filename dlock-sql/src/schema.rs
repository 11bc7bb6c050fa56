//! Creating the tables when they are missing.

use std::time::Duration;

use dlock_core::LockError;

use crate::db::{Args, Pool};
use crate::dialect::LeaseSql;
use crate::error::lock_error;

/// Runs the `CREATE … IF NOT EXISTS` statements (the lease table, the results table and its
/// index), then brings a lease table made by an earlier version up to date. Several clients
/// starting at once may race on PostgreSQL's catalog (a unique violation on `pg_type`) or on
/// the upgrade; a statement that fails while the tables are nonetheless usable afterwards is
/// not an error.
pub(crate) async fn ensure(pool: &Pool, sql: &LeaseSql, timeout: Duration) -> Result<(), LockError> {
    let work = async {
        loop {
            match create(pool, sql).await {
                // SQLite may answer "busy" at once while other processes create the same
                // tables: the statements are idempotent, run them again.
                Err(err) if err.is_transient() && pool.is_sqlite() => {
                    tokio::time::sleep(Duration::from_millis(fastrand::u64(5..=50))).await;
                }
                other => return other,
            }
        }
    };
    tokio::time::timeout(timeout, work)
        .await
        .unwrap_or_else(|_| Err(LockError::unavailable(format!("creating the lock tables took over {timeout:?}"))))
}

async fn create(pool: &Pool, sql: &LeaseSql) -> Result<(), LockError> {
    for ddl in &sql.create {
        if let Err(err) = pool.run_plain(ddl).await {
            let probe = Args::name("dlock-schema-probe");
            if pool.run(&sql.inspect, probe).await.is_err() || pool.run(&sql.results.load, probe).await.is_err() {
                return Err(lock_error(err));
            }
        }
    }
    for (probe, upgrade) in &sql.upgrade {
        if pool.run_plain(probe).await.is_err() {
            if let Err(err) = pool.run_plain(upgrade).await {
                if pool.run_plain(probe).await.is_err() {
                    return Err(lock_error(err));
                }
            }
        }
    }
    Ok(())
}
