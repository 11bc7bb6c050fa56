//! Optimistic locking with a version column: read the row with its version, compute, then
//! `UPDATE … SET …, version = version + 1 WHERE id = ? AND version = ?`. Zero rows updated
//! means someone else wrote first: [`SqlError::Conflict`], retried by [`retry`] with a
//! jittered backoff until the policy's attempts run out.
//!
//! Zero rows also results when the row does not exist; read it in each attempt (as below),
//! and the read reports a missing row as [`SqlError::NotFound`], which is not retried. Run
//! the attempts in autocommit, not inside one explicit transaction: under REPEATABLE READ
//! (MySQL's default) every re-read would see the same snapshot, and no attempt could
//! succeed.
//!
//! ```no_run
//! use dlock_sql::{optimistic::{self, RetryPolicy, VersionedTable}, Dialect, SqlError};
//!
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), SqlError> {
//! let stock = VersionedTable::new("stock", "id", "version")?;
//! let update = stock.update_sql(Dialect::Postgres, &["qty"]);
//! optimistic::retry(&RetryPolicy::default(), || async {
//!     let (qty, version): (i64, i64) =
//!         sqlx::query_as("SELECT qty, version FROM stock WHERE id = 1").fetch_one(&pool).await?;
//!     let done = sqlx::query(sqlx::AssertSqlSafe(update.clone()))
//!         .bind(qty - 1)
//!         .bind(1_i64)
//!         .bind(version)
//!         .execute(&pool)
//!         .await?;
//!     optimistic::expect_updated(done.rows_affected())
//! })
//! .await
//! # }
//! ```

use std::future::Future;
use std::time::Duration;

use dlock_core::Backoff;

use crate::config::Dialect;
use crate::error::SqlError;
use crate::rowlock::{check_ident, guarded_update, GuardSet};

/// How often and how patiently to retry a conflicting optimistic update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all (at least 1).
    pub attempts: u32,
    /// The delay between attempts, jittered.
    pub backoff: Backoff,
}

impl Default for RetryPolicy {
    /// 10 attempts, 1 ms doubling to 50 ms.
    fn default() -> Self {
        RetryPolicy { attempts: 10, backoff: Backoff::new(Duration::from_millis(1), Duration::from_millis(50)) }
    }
}

impl RetryPolicy {
    /// A policy of `attempts` attempts with the default backoff.
    pub fn attempts(attempts: u32) -> Self {
        RetryPolicy { attempts: attempts.max(1), ..Self::default() }
    }
}

/// Runs `attempt` until it does not fail with [`SqlError::Conflict`], at most
/// `policy.attempts` times; the last conflict is returned when they run out. Every other
/// outcome is returned at once.
pub async fn retry<T, F, Fut>(policy: &RetryPolicy, mut attempt: F) -> Result<T, SqlError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, SqlError>>,
{
    let attempts = policy.attempts.max(1);
    let mut n = 0;
    loop {
        match attempt().await {
            Err(SqlError::Conflict) if n + 1 < attempts => {
                tokio::time::sleep(policy.backoff.delay(n)).await;
                n += 1;
            }
            other => return other,
        }
    }
}

/// Turns the row count of a version-guarded update into its meaning: 0 is a `Conflict`.
pub fn expect_updated(rows_affected: u64) -> Result<(), SqlError> {
    if rows_affected == 0 {
        Err(SqlError::Conflict)
    } else {
        Ok(())
    }
}

/// A table with a version column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionedTable {
    table: String,
    id_column: String,
    version_column: String,
}

impl VersionedTable {
    /// Plain SQL identifiers (letters, digits, `_`, optionally `schema.table`).
    pub fn new(table: &str, id_column: &str, version_column: &str) -> Result<Self, SqlError> {
        check_ident("table", table)?;
        check_ident("column", id_column)?;
        check_ident("column", version_column)?;
        Ok(VersionedTable { table: table.into(), id_column: id_column.into(), version_column: version_column.into() })
    }

    /// `UPDATE <table> SET <c1> = ?, …, <version> = <version> + 1 WHERE <id> = ? AND
    /// <version> = ?` in `dialect`'s placeholders. Bind the new values of `columns` in order,
    /// then the id, then the version that was read. Column names are not checked here:
    /// pass plain identifiers.
    pub fn update_sql(&self, dialect: Dialect, columns: &[&str]) -> String {
        guarded_update(dialect, &self.table, columns, GuardSet::Increment(&self.version_column), &self.id_column, "=")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_the_guarded_update() {
        let t = VersionedTable::new("stock", "id", "version").unwrap();
        assert_eq!(
            t.update_sql(Dialect::Postgres, &["qty", "note"]),
            "UPDATE stock SET qty = $1, note = $2, version = version + 1 WHERE id = $3 AND version = $4"
        );
        assert_eq!(
            t.update_sql(Dialect::MySql, &["qty"]),
            "UPDATE stock SET qty = ?, version = version + 1 WHERE id = ? AND version = ?"
        );
        assert!(VersionedTable::new("stock; drop", "id", "v").is_err());
    }

    #[tokio::test]
    async fn retries_conflicts_only() {
        let mut calls = 0;
        let out: Result<(), SqlError> = retry(&RetryPolicy::attempts(3), || {
            calls += 1;
            async { Err(SqlError::Conflict) }
        })
        .await;
        assert!(matches!(out, Err(SqlError::Conflict)));
        assert_eq!(calls, 3);
        let mut calls = 0;
        let out: Result<(), SqlError> = retry(&RetryPolicy::attempts(3), || {
            calls += 1;
            async { Err(SqlError::NotFound) }
        })
        .await;
        assert!(matches!(out, Err(SqlError::NotFound)));
        assert_eq!(calls, 1);
    }
}
