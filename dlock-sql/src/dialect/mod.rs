//! The SQL text of each database, and nothing else: the logic that runs it is written once
//! in [`crate::lease`]. Expiry is judged by the database's own clock, in microseconds since
//! the Unix epoch, read once per statement.

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

use std::sync::Arc;

use crate::config::Dialect;

/// A statement parameter, by meaning; each dialect lists them in its placeholder order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Param {
    /// The lock name.
    Name,
    /// The owner identity.
    Owner,
    /// The hold's fencing token.
    Fence,
    /// The ttl in microseconds (rounded up).
    TtlUs,
    /// The request id of one grant (see [`dlock_core::backend::RequestId`]).
    Grant,
    /// A batch of holds to renew, as a JSON array of `{"n": name, "o": owner, "f": fence,
    /// "t": ttl_us}` objects.
    Batch,
}

/// What a statement answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reply {
    /// Rows (`RETURNING`, `SELECT`).
    Rows,
    /// Only a result: rows matched and the `LAST_INSERT_ID` value.
    #[cfg_attr(not(any(feature = "mysql", feature = "sqlite")), allow(dead_code))]
    Done,
}

/// One statement with its parameter order.
#[derive(Debug, Clone)]
pub(crate) struct Stmt {
    pub(crate) sql: Arc<str>,
    pub(crate) params: &'static [Param],
    pub(crate) reply: Reply,
}

impl Stmt {
    fn new(sql: String, params: &'static [Param], reply: Reply) -> Self {
        Stmt { sql: Arc::from(sql), params, reply }
    }
}

/// The lease table's statements for one dialect and table.
///
/// - `acquire` grants (free, expired, or re-entrant by the same owner) in one statement and
///   answers with the token: a `(fence, holds)` row, or on MySQL the `LAST_INSERT_ID`
///   value (0 when busy). It records the request id of the grant in `grants`
///   (`,id1,id2,`: one per hold of a re-entrant owner), so that a release, or the give-back
///   of an acquire whose reply was lost, takes back exactly its own grant, once.
/// - `inspect` answers `(owner, fence, holds, remaining_us)`.
/// - `renew` and `release` are owner- and token-checked; they match one row or none.
///   `release` also needs its grant to be recorded, and removes it: a release applied twice
///   (its reply lost, then sent again) takes back one hold, not two.
/// - `give_back` takes back the grant of one request id, if the row has it, whatever the
///   token (the caller never learnt it).
/// - `renew_batch` renews many holds in one statement; it answers with the `(name, fence)`
///   rows it renewed, or on MySQL with the count of rows it matched (`renewed` then lists
///   them when some were not).
/// - `evict` clears the holder and keeps the fence counter.
#[derive(Debug, Clone)]
pub(crate) struct LeaseSql {
    pub(crate) create: Vec<String>,
    pub(crate) acquire: Stmt,
    pub(crate) inspect: Stmt,
    pub(crate) renew: Stmt,
    pub(crate) renew_batch: Stmt,
    pub(crate) renewed: Option<Stmt>,
    pub(crate) release: Stmt,
    pub(crate) give_back: Stmt,
    pub(crate) evict: Stmt,
    /// Brings a lease table made by an earlier version up to date: a probe that fails on an
    /// old table, and the statement that fixes it.
    pub(crate) upgrade: Vec<(String, String)>,
    /// PostgreSQL: the LISTEN/NOTIFY channel released locks are announced on.
    pub(crate) channel: Option<String>,
}

/// Slack added to every expiry the database sets, covering the resolution of its clock
/// (SQLite's `'now'` has millisecond resolution): the hold may last this much longer than
/// asked, never shorter.
pub(crate) const CLOCK_SLACK_US: i64 = 1_000;

impl LeaseSql {
    pub(crate) fn new(dialect: Dialect, table: &str) -> Self {
        match dialect {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => postgres::lease_sql(table),
            #[cfg(feature = "mysql")]
            Dialect::MySql => mysql::lease_sql(table),
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => sqlite::lease_sql(table),
            #[allow(unreachable_patterns)]
            other => unreachable!("{other:?} is not compiled in; SqlConfig refuses it"),
        }
    }
}

/// The statements that create the lease table `<prefix>_leases` on `dialect`, for users
/// who manage their schema with migrations (then connect with `create_table=false`).
///
/// ```
/// use dlock_sql::{schema, Dialect};
///
/// let ddl = schema(Dialect::Postgres, "dlock");
/// assert!(ddl[0].starts_with("CREATE TABLE IF NOT EXISTS dlock_leases"));
/// ```
pub fn schema(dialect: Dialect, prefix: &str) -> Vec<String> {
    LeaseSql::new(dialect, &format!("{prefix}_leases")).create
}
