//! Creating the tables when they are missing.

use std::time::Duration;

use dlock_core::LockError;

use crate::db::{Args, Pool};
use crate::dialect::LeaseSql;
use crate::error::lock_error;

/// Runs the `CREATE … IF NOT EXISTS` statements (the lease table, the results table and its
/// index, the holds table), then brings a lease table made by an earlier version up to date
/// and creates the sweep's indexes where they are missing. Several clients
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
    // A failed `CREATE` is judged once the upgrades have run: the probes read the newest
    // columns, which a table made by an earlier version gets only from its upgrade.
    let mut failed = None;
    for ddl in &sql.create {
        if let Err(err) = pool.run_plain(ddl).await {
            failed.get_or_insert(err);
        }
    }
    if let Err(err) = fix(pool, &[sql.upgrade.as_slice(), sql.indexes.as_slice()].concat()).await {
        return Err(lock_error(failed.unwrap_or(err)));
    }
    if let Some(err) = failed {
        let probe = Args::name("dlock-schema-probe");
        for stmt in [&sql.inspect, &sql.results.load, &sql.holds.live] {
            if pool.run(stmt, probe).await.is_err() {
                return Err(lock_error(err));
            }
        }
    }
    Ok(())
}

/// Runs the fix of each `(probe, fix)` pair whose probe fails, in order: an upgrade of a
/// table, an index to create. A fix that fails is forgiven when the probe passes after it
/// (another client made the same change at the same moment).
pub(crate) async fn fix(pool: &Pool, pairs: &[(String, String)]) -> Result<(), sqlx::Error> {
    for (probe, fix) in pairs {
        if pool.run_plain(probe).await.is_err() {
            if let Err(err) = pool.run_plain(fix).await {
                if pool.run_plain(probe).await.is_err() {
                    return Err(err);
                }
            }
        }
    }
    Ok(())
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use dlock_core::{LockName, LockOptions, Locker};

    use crate::config::SqlConfig;

    /// A database made by the version before shared holds (a lease table without
    /// `shared_us`, no holds table) is brought up to date on connect (the sweep's indexes
    /// included), and works for every kind of hold; its fence counters go on.
    #[tokio::test]
    async fn upgrades_a_database_of_the_previous_version() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("locks.db");
        {
            use sqlx::ConnectOptions;
            let opts = sqlx::sqlite::SqliteConnectOptions::new().filename(&path).create_if_missing(true);
            let mut conn = opts.connect().await.expect("open");
            sqlx::query(
                "CREATE TABLE dlock_leases (name TEXT NOT NULL PRIMARY KEY, owner TEXT, \
                 holds INTEGER NOT NULL DEFAULT 0, fence INTEGER NOT NULL DEFAULT 0, \
                 expires_us INTEGER NOT NULL DEFAULT 0, grants TEXT NOT NULL DEFAULT '') WITHOUT ROWID",
            )
            .execute(&mut conn)
            .await
            .expect("old lease table");
            sqlx::query("INSERT INTO dlock_leases (name, fence) VALUES ('old', 7)")
                .execute(&mut conn)
                .await
                .expect("old row");
        }
        let locker = crate::connect(SqlConfig::sqlite_file(&path)).await.expect("connect");
        let name = LockName::new("old").expect("name");
        let reader = locker.acquire(&name, &LockOptions::new().read()).await.expect("read");
        assert_eq!(reader.token().get(), 8, "the old fence counter goes on");
        assert!(locker.try_acquire(&name, &LockOptions::new()).await.expect("write").is_none());
        reader.release().await.expect("release");
        let writer = locker.acquire(&name, &LockOptions::new()).await.expect("write");
        assert_eq!(writer.token().get(), 9);
        writer.release().await.expect("release");
        // Connecting again finds everything in place, the sweep's indexes too.
        drop(crate::connect(SqlConfig::sqlite_file(&path)).await.expect("connect again"));
        {
            use sqlx::ConnectOptions;
            let mut conn = sqlx::sqlite::SqliteConnectOptions::new().filename(&path).connect().await.expect("open");
            for index in ["dlock_leases INDEXED BY dlock_leases_expires", "dlock_holds INDEXED BY dlock_holds_expires"]
            {
                let probe = sqlx::AssertSqlSafe(format!("SELECT 1 FROM {index} WHERE 1 = 0"));
                sqlx::query(probe).execute(&mut conn).await.unwrap_or_else(|e| panic!("{index}: {e}"));
            }
        }
    }
}
