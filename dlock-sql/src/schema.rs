//! Creating the tables when they are missing.

use std::time::Duration;

use dlock_core::LockError;

use crate::db::{Args, Pool};
use crate::dialect::Stmt;
use crate::error::lock_error;

/// Runs the `CREATE TABLE IF NOT EXISTS` statements. Several clients starting at once may
/// race on PostgreSQL's catalog (a unique violation on `pg_type`); a statement that fails
/// while the table is nonetheless usable afterwards is not an error.
pub(crate) async fn ensure(pool: &Pool, create: &[String], probe: &Stmt, timeout: Duration) -> Result<(), LockError> {
    let work = async {
        for ddl in create {
            if let Err(err) = pool.run_plain(ddl).await {
                if pool.run(probe, Args::name("dlock-schema-probe")).await.is_err() {
                    return Err(lock_error(err));
                }
            }
        }
        Ok(())
    };
    tokio::time::timeout(timeout, work)
        .await
        .unwrap_or_else(|_| Err(LockError::unavailable(format!("creating the lock tables took over {timeout:?}"))))
}
