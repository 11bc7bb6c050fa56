//! Pessimistic row locks: run work inside a transaction that holds `SELECT … FOR UPDATE` on
//! one of your rows, with `NOWAIT` or a bounded wait.
//!
//! This is the seeds' database lock: the row itself is the lock, held until the transaction
//! ends, so the work and the lock commit (or roll back) together. A row another transaction
//! holds past the wait bound is [`SqlError::Contended`], never a generic database error.
//!
//! | database | lock | wait bound |
//! |---|---|---|
//! | PostgreSQL | `SELECT … FOR UPDATE [NOWAIT]` | `SET LOCAL lock_timeout` (milliseconds) |
//! | MySQL 8 / MariaDB | `SELECT … FOR UPDATE [NOWAIT]` | `innodb_lock_wait_timeout` (whole seconds, rounded up; reset afterwards) |
//! | SQLite | `BEGIN IMMEDIATE` (the whole file's write lock: SQLite has no row locks) | `PRAGMA busy_timeout` (reset afterwards) |
//!
//! The wait bound also applies to the statements of your work (it is set for the
//! transaction on PostgreSQL, for the session on MySQL and SQLite). A session setting is
//! put back to the session's previous value when the work ends; a connection whose setting
//! could not be put back (an error, or `run` cancelled midway) is closed instead of going
//! back to the pool.
//!
//! ```no_run
//! use std::time::Duration;
//! use dlock_sql::{RowLock, SqlError};
//!
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), SqlError> {
//! let lock = RowLock::new("stock", "id")?.wait(Duration::from_millis(500));
//! let left: i64 = lock
//!     .run(&pool, 42_i64, |conn| {
//!         Box::pin(async move {
//!             let (qty,): (i64,) = sqlx::query_as("SELECT qty FROM stock WHERE id = 42").fetch_one(&mut *conn).await?;
//!             if qty > 0 {
//!                 sqlx::query("UPDATE stock SET qty = qty - 1 WHERE id = 42").execute(&mut *conn).await?;
//!             }
//!             Ok(qty - 1)
//!         })
//!     })
//!     .await?;
//! # let _ = left; Ok(()) }
//! ```

use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::{AssertSqlSafe, Connection};

use crate::config::Dialect;
use crate::error::SqlError;

/// The databases [`RowLock`] works on.
pub trait RowLocking: sqlx::Database + sealed::Sealed {
    /// Which SQL this database speaks.
    const DIALECT: Dialect;
}

mod sealed {
    pub trait Sealed {}
}

#[cfg(feature = "postgres")]
impl sealed::Sealed for sqlx::Postgres {}
#[cfg(feature = "postgres")]
impl RowLocking for sqlx::Postgres {
    const DIALECT: Dialect = Dialect::Postgres;
}
#[cfg(feature = "mysql")]
impl sealed::Sealed for sqlx::MySql {}
#[cfg(feature = "mysql")]
impl RowLocking for sqlx::MySql {
    const DIALECT: Dialect = Dialect::MySql;
}
#[cfg(feature = "sqlite")]
impl sealed::Sealed for sqlx::Sqlite {}
#[cfg(feature = "sqlite")]
impl RowLocking for sqlx::Sqlite {
    const DIALECT: Dialect = Dialect::Sqlite;
}

/// How long to wait for a row another transaction holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowWait {
    /// Fail at once (`NOWAIT`).
    NoWait,
    /// Wait up to this long.
    Bounded(Duration),
}

/// A pessimistic lock on one row of a table (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowLock {
    table: String,
    key_column: String,
    wait: RowWait,
}

/// Checks an SQL identifier (optionally `schema.table`): letters, digits and `_`.
pub(crate) fn check_ident(what: &str, ident: &str) -> Result<(), SqlError> {
    let ok = !ident.is_empty()
        && ident.split('.').all(|part| {
            !part.is_empty()
                && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !part.as_bytes()[0].is_ascii_digit()
        });
    if ok {
        Ok(())
    } else {
        Err(SqlError::Database(sqlx::Error::InvalidArgument(format!(
            "{what} {ident:?} is not a plain SQL identifier (letters, digits, '_')"
        ))))
    }
}

/// The placeholder of parameter `n` (1-based) in `dialect`.
/// How a guarded update changes its guard column.
pub(crate) enum GuardSet<'a> {
    /// `<column> = ?`, bound after the other new values.
    Bind(&'a str),
    /// `<column> = <column> + 1`.
    Increment(&'a str),
}

/// `UPDATE <table> SET <c1> = ?, …, <guard set> WHERE <key> = ? AND <guard column> <op> ?`,
/// with `dialect`'s placeholders numbered in binding order: the columns' new values, the
/// guard's new value (for [`GuardSet::Bind`]), the key, the guard's expected value.
pub(crate) fn guarded_update(
    dialect: Dialect,
    table: &str,
    columns: &[&str],
    guard: GuardSet<'_>,
    key_column: &str,
    op: &str,
) -> String {
    let mut n = 0;
    let mut next = || {
        n += 1;
        placeholder(dialect, n)
    };
    let mut set: Vec<String> = columns.iter().map(|c| format!("{c} = {}", next())).collect();
    let guard_column = match guard {
        GuardSet::Bind(column) => {
            set.push(format!("{column} = {}", next()));
            column
        }
        GuardSet::Increment(column) => {
            set.push(format!("{column} = {column} + 1"));
            column
        }
    };
    let (key, expected) = (next(), next());
    format!("UPDATE {table} SET {} WHERE {key_column} = {key} AND {guard_column} {op} {expected}", set.join(", "))
}

pub(crate) fn placeholder(dialect: Dialect, n: usize) -> String {
    match dialect {
        Dialect::Postgres => format!("${n}"),
        Dialect::Sqlite => format!("?{n}"),
        Dialect::MySql => "?".to_string(),
    }
}

impl RowLock {
    /// A lock on the row of `table` whose `key_column` equals the key given to
    /// [`run`](Self::run); waits up to 5 s by default. Identifiers are plain SQL
    /// identifiers (letters, digits, `_`, optionally `schema.table`).
    pub fn new(table: &str, key_column: &str) -> Result<Self, SqlError> {
        check_ident("table", table)?;
        check_ident("column", key_column)?;
        Ok(RowLock {
            table: table.to_string(),
            key_column: key_column.to_string(),
            wait: RowWait::Bounded(Duration::from_secs(5)),
        })
    }

    /// Fail at once with [`SqlError::Contended`] when the row is locked.
    pub fn nowait(mut self) -> Self {
        self.wait = RowWait::NoWait;
        self
    }

    /// Wait up to `bound` for the row (a zero bound is `NOWAIT`).
    pub fn wait(mut self, bound: Duration) -> Self {
        self.wait = if bound.is_zero() { RowWait::NoWait } else { RowWait::Bounded(bound) };
        self
    }

    /// The wait policy.
    pub fn wait_policy(&self) -> RowWait {
        self.wait
    }

    /// Locks the row with key `key`, runs `work` on the transaction's connection, and
    /// commits when it returns `Ok` (rolls back on `Err`). `Contended` when the row stays
    /// locked past the wait bound, `NotFound` when there is no such row.
    pub async fn run<DB, K, T, F>(&self, pool: &sqlx::Pool<DB>, key: K, work: F) -> Result<T, SqlError>
    where
        DB: RowLocking,
        K: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB> + Send + 'static,
        for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
        DB::Arguments: for<'q> sqlx::IntoArguments<DB>,
        i64: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
        usize: sqlx::ColumnIndex<DB::Row>,
        F: for<'t> FnOnce(&'t mut DB::Connection) -> BoxFuture<'t, Result<T, SqlError>> + Send,
        T: Send,
    {
        let dialect = DB::DIALECT;
        let mut conn = Setting { conn: pool.acquire().await?, changed: false };
        let (set_wait, mut reset_wait) = wait_sql(dialect, self.wait);
        // Put back the session's own value afterwards, not the server's default.
        let current = match dialect {
            Dialect::Sqlite => Some(("PRAGMA busy_timeout", "PRAGMA busy_timeout")),
            Dialect::MySql if set_wait.is_some() => Some((
                "SELECT CAST(@@SESSION.innodb_lock_wait_timeout AS SIGNED)",
                "SET SESSION innodb_lock_wait_timeout =",
            )),
            _ => None,
        };
        if let Some((read, reset)) = current {
            let previous: i64 =
                sqlx::query_scalar::<DB, i64>(AssertSqlSafe(read.to_string())).fetch_one(&mut *conn.conn).await?;
            reset_wait = Some(format!("{reset} {previous}"));
        }
        if let Some(sql) = &set_wait {
            conn.changed = true;
            sqlx::query::<DB>(AssertSqlSafe(sql.clone())).execute(&mut *conn.conn).await?;
        }
        let outcome = self.locked(&mut conn.conn, key, work).await;
        if let Some(sql) = reset_wait {
            if sqlx::query::<DB>(AssertSqlSafe(sql)).execute(&mut *conn.conn).await.is_ok() {
                conn.changed = false;
            }
        }
        outcome
    }

    async fn locked<DB, K, T, F>(&self, conn: &mut DB::Connection, key: K, work: F) -> Result<T, SqlError>
    where
        DB: RowLocking,
        K: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB> + Send + 'static,
        for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
        DB::Arguments: for<'q> sqlx::IntoArguments<DB>,
        F: for<'t> FnOnce(&'t mut DB::Connection) -> BoxFuture<'t, Result<T, SqlError>> + Send,
        T: Send,
    {
        let dialect = DB::DIALECT;
        // An owned statement: a borrowed one trips the higher-ranked `Send` check of
        // callers that spawn this future.
        let begin = if dialect == Dialect::Sqlite { "BEGIN IMMEDIATE" } else { "BEGIN" };
        let mut tx = conn.begin_with(AssertSqlSafe(begin.to_string())).await?;
        if let (Dialect::Postgres, RowWait::Bounded(bound)) = (dialect, self.wait) {
            let ms = bound.as_millis().clamp(1, i32::MAX as u128);
            sqlx::query::<DB>(AssertSqlSafe(format!("SET LOCAL lock_timeout = {ms}"))).execute(&mut *tx).await?;
        }
        let nowait = if self.wait == RowWait::NoWait && dialect != Dialect::Sqlite { " NOWAIT" } else { "" };
        let for_update = if dialect == Dialect::Sqlite { String::new() } else { format!(" FOR UPDATE{nowait}") };
        let sql =
            format!("SELECT 1 FROM {} WHERE {} = {}{for_update}", self.table, self.key_column, placeholder(dialect, 1));
        let found = sqlx::query::<DB>(AssertSqlSafe(sql)).bind(key).fetch_optional(&mut *tx).await?;
        if found.is_none() {
            tx.rollback().await?;
            return Err(SqlError::NotFound);
        }
        match work(&mut tx).await {
            Ok(value) => {
                tx.commit().await?;
                Ok(value)
            }
            Err(err) => {
                // The transaction rolls back when dropped if this fails.
                let _ = tx.rollback().await;
                Err(err)
            }
        }
    }
}

/// A pooled connection whose session setting may differ from the pool's: unless the
/// setting was put back, the connection is closed rather than returned to the pool, also
/// when the future running it is dropped between the two (a cancelled `run`).
struct Setting<DB: sqlx::Database> {
    conn: sqlx::pool::PoolConnection<DB>,
    changed: bool,
}

impl<DB: sqlx::Database> Drop for Setting<DB> {
    fn drop(&mut self) {
        if self.changed {
            self.conn.close_on_drop();
        }
    }
}

/// The session statements that set and reset the wait bound, where it is session-wide.
fn wait_sql(dialect: Dialect, wait: RowWait) -> (Option<String>, Option<String>) {
    match (dialect, wait) {
        (Dialect::MySql, RowWait::Bounded(bound)) => {
            let secs = bound.as_nanos().div_ceil(1_000_000_000).clamp(1, 1_073_741_824);
            // Reset to the session's previous value, read by `run`.
            (Some(format!("SET SESSION innodb_lock_wait_timeout = {secs}")), None)
        }
        (Dialect::Sqlite, wait) => {
            let ms = match wait {
                RowWait::NoWait => 0,
                RowWait::Bounded(bound) => bound.as_millis().min(i32::MAX as u128),
            };
            (Some(format!("PRAGMA busy_timeout = {ms}")), None)
        }
        _ => (None, None),
    }
}
