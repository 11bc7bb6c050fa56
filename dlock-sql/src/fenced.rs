//! Fenced writes: a resource row in the same database remembers the highest fencing token
//! that wrote it and refuses writes carrying a lower one, so a holder whose lease silently
//! ran out (a long pause, a partition) cannot overwrite the work of the holder after it.
//!
//! The guard is `WHERE fence <= $token` (a holder may write several times with its own
//! token), and the write sets `fence = $token`. Zero rows updated is
//! [`SqlError::Fenced`] (or a row that does not exist: create resource rows with fence 0).
//!
//! ```no_run
//! use dlock_sql::{fenced::FencedTable, Dialect, SqlError};
//!
//! # async fn demo(pool: sqlx::PgPool, lease: dlock_core::Lease) -> Result<(), SqlError> {
//! let accounts = FencedTable::new("accounts", "id", "fence")?;
//! let sql = accounts.update_sql(Dialect::Postgres, &["balance"]);
//! let token = lease.token().get() as i64;
//! let done = sqlx::query(sqlx::AssertSqlSafe(sql))
//!     .bind(100_i64) // balance
//!     .bind(token) // fence = token
//!     .bind(7_i64) // id
//!     .bind(token) // WHERE fence <= token
//!     .execute(&pool)
//!     .await?;
//! dlock_sql::fenced::expect_accepted(done.rows_affected())?;
//! # Ok(()) }
//! ```

use crate::config::Dialect;
use crate::error::SqlError;
use crate::rowlock::{check_ident, guarded_update, GuardSet};

/// A table whose rows carry the highest fencing token that wrote them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedTable {
    table: String,
    key_column: String,
    fence_column: String,
}

impl FencedTable {
    /// Plain SQL identifiers (letters, digits, `_`, optionally `schema.table`).
    pub fn new(table: &str, key_column: &str, fence_column: &str) -> Result<Self, SqlError> {
        check_ident("table", table)?;
        check_ident("column", key_column)?;
        check_ident("column", fence_column)?;
        Ok(FencedTable { table: table.into(), key_column: key_column.into(), fence_column: fence_column.into() })
    }

    /// `UPDATE <table> SET <c1> = ?, …, <fence> = ? WHERE <key> = ? AND <fence> <= ?` in
    /// `dialect`'s placeholders. Bind the new values of `columns` in order, then the token,
    /// then the key, then the token again.
    pub fn update_sql(&self, dialect: Dialect, columns: &[&str]) -> String {
        guarded_update(dialect, &self.table, columns, GuardSet::Bind(&self.fence_column), &self.key_column, "<=")
    }
}

/// Turns the row count of a fenced update into its meaning: 0 is `Fenced`.
pub fn expect_accepted(rows_affected: u64) -> Result<(), SqlError> {
    if rows_affected == 0 {
        Err(SqlError::Fenced)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_the_fenced_update() {
        let t = FencedTable::new("accounts", "id", "fence").unwrap();
        assert_eq!(
            t.update_sql(Dialect::Sqlite, &["balance"]),
            "UPDATE accounts SET balance = ?1, fence = ?2 WHERE id = ?3 AND fence <= ?4"
        );
        assert!(matches!(expect_accepted(0), Err(SqlError::Fenced)));
    }
}
