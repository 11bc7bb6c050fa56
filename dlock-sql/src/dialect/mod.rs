//! The SQL text of each database, and nothing else: the logic that runs it is written once
//! in [`crate::lease`] (and [`crate::advisory`]). Expiry is judged by the database's own
//! clock, in microseconds since the Unix epoch, read once per statement.

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
    /// A stored result's bytes.
    Value,
    /// How long a stored result is kept, in microseconds (rounded up).
    RetentionUs,
    /// The kind of a hold in the holds table (see [`HoldSql`]).
    Kind,
}

/// What a statement answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reply {
    /// Rows (`RETURNING`, `SELECT`).
    Rows,
    /// Only a result: rows matched and the `LAST_INSERT_ID` value.
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
/// - `acquire` grants only while no shared hold or permit is live: the row's `shared_us`
///   (the latest expiry of the name's shared holds and permits, kept by [`HoldSql`]) has
///   passed. The exclusive statements read nothing but their own row, so they stay one
///   statement each.
/// - `inspect` answers `(owner, fence, holds, remaining_us, shared_remaining_us)`.
/// - `renew` and `release` are owner- and token-checked; they match one row or none.
///   `release` also needs its grant to be recorded, and removes it: a release applied twice
///   (its reply lost, then sent again) takes back one hold, not two.
/// - `give_back` takes back the grant of one request id, if the row has it, whatever the
///   token (the caller never learnt it).
/// - `renew_batch` renews many holds in one statement; it answers with the `(name, fence)`
///   rows it renewed, or on MySQL with the count of rows it matched (`renewed` then lists
///   them when some were not).
/// - `evict` clears the holder (and `shared_us`) and keeps the fence counter.
/// - `store_result` writes the result row of a hold, in the same statement as the check
///   `release` makes (owner, token, grant recorded, not expired) and the check that the
///   stored result is of a lower token or expired: it matches one row when it stored, none
///   when it refused. The lease row is read with a shared lock (PostgreSQL `FOR SHARE`,
///   MySQL `LOCK IN SHARE MODE`; SQLite holds the file's write lock for the statement), so a
///   release, eviction or grant cannot slip between the check and the write.
/// - `results` are the statements of the results table beside the lease table.
///
/// `create` makes the three tables.
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
    pub(crate) store_result: Stmt,
    pub(crate) results: ResultSql,
    pub(crate) holds: HoldSql,
    /// Brings a lease table made by an earlier version up to date: a probe that fails on an
    /// old table, and the statement that fixes it.
    pub(crate) upgrade: Vec<(String, String)>,
    /// PostgreSQL: the LISTEN/NOTIFY channel released locks are announced on.
    pub(crate) channel: Option<String>,
}

/// The statements of a results table (`<prefix>_results` beside the lease table,
/// `<prefix>_advisory_results` beside the advisory table): one row per lock name, with the
/// same name encoding as the lock's own table, holding the token of the run that stored the
/// result, its bytes and its expiry (`expires_us`, on the database's clock). The row is
/// apart from the lock's, so releasing or evicting the lock leaves it; it counts as gone
/// once expired, the next store of the name replaces it, and `sweep` deletes expired rows.
///
/// - `create` makes the table and its index on `expires_us`.
/// - `load` answers `(token, value)` of the name's record, if it has not expired.
/// - `sweep` deletes up to [`SWEEP_BATCH`] expired rows.
#[derive(Debug, Clone)]
pub(crate) struct ResultSql {
    pub(crate) create: Vec<String>,
    pub(crate) load: Stmt,
    pub(crate) sweep: Stmt,
}

/// The `kind` of a holds-table row that is not a hold but a waiting writer's place: while
/// one is live, no new shared hold or permit is granted (writer preference).
pub(crate) const WAITING: &str = "waiting";

/// The statements of the holds table (`<prefix>_holds` beside the lease table), which keeps
/// the shared holds and semaphore permits: one row per grant (`name`, `request`: the
/// request id; `owner`, `kind`: `shared`, `permit` or [`WAITING`]; `fence`: the token,
/// shared by the grants of one owner's re-entered hold; `expires_us`). The fence counter
/// stays in the lease row, so every grant of any kind takes the next token of one counter.
///
/// Every change to a name's holds runs in a transaction that first locks the name's lease
/// row (`lock`, then `locked` on MySQL), so the statements after it read the holds as the
/// last transaction left them, and decide and write without anyone slipping in between.
/// The lease row's `shared_us` carries the latest expiry of the live holds to the
/// exclusive statements, which read no other table: raised by every grant and renewal,
/// recomputed from the rows by every release (`recount`).
///
/// - `lock` makes the lease row if missing and locks it, answering (PostgreSQL, SQLite)
///   `(owner, holds, remaining_us, fence)` of the exclusive hold; on MySQL `locked` reads
///   them after it.
/// - `live` answers `(request, owner, kind, fence, remaining_us)` of every live row.
/// - `sweep` deletes the name's expired rows.
/// - `bump` takes the next token and raises `shared_us` for a new hold of `ttl`, answering
///   with the token (a row, or MySQL's `LAST_INSERT_ID`).
/// - `insert` records one grant.
/// - `touch` keeps the live rows of one hold (owner and token) for `ttl` more; `extend`
///   raises `shared_us` to match.
/// - `release` deletes a live grant (owner, request id, token); `give_back` deletes the row
///   of a request id whatever it is (a grant of unknown token, or a waiting place);
///   `recount` then sets `shared_us` from the rows left.
/// - `wait` records (or refreshes) a waiting writer's place; `unwait` deletes it.
/// - `evict` deletes every row of the name.
/// - `store_result` is the lease table's `store_result` for a hold of this table.
/// - `notify` (PostgreSQL) announces at commit that holds of the name were given up.
#[derive(Debug, Clone)]
pub(crate) struct HoldSql {
    pub(crate) lock: Stmt,
    pub(crate) locked: Option<Stmt>,
    pub(crate) live: Stmt,
    pub(crate) sweep: Stmt,
    pub(crate) bump: Stmt,
    pub(crate) insert: Stmt,
    pub(crate) touch: Stmt,
    pub(crate) extend: Stmt,
    pub(crate) release: Stmt,
    pub(crate) give_back: Stmt,
    pub(crate) recount: Stmt,
    pub(crate) wait: Stmt,
    pub(crate) unwait: Stmt,
    pub(crate) evict: Stmt,
    pub(crate) store_result: Stmt,
    pub(crate) notify: Option<Stmt>,
}

/// The most expired result rows one sweep deletes, so that a sweep stays a short statement
/// however many rows have piled up.
pub(crate) const SWEEP_BATCH: u32 = 100;

impl ResultSql {
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) fn new(dialect: Dialect, table: &str) -> Self {
        match dialect {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => postgres::result_sql(table),
            #[cfg(feature = "mysql")]
            Dialect::MySql => mysql::result_sql(table),
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => sqlite::result_sql(table),
            #[allow(unreachable_patterns)]
            other => unreachable!("{other:?} is not compiled in; SqlConfig refuses it"),
        }
    }
}

/// The store of an advisory hold's result, run on the holding session: written only while
/// this session holds the lock (`pg_locks` / `IS_USED_LOCK`), the advisory row's fence is
/// the hold's token, and the stored result is of a lower token or expired. The session
/// holds the lock for as long as the statement runs (the lock ends only with the session,
/// which would abort the statement), so the check and the write are one atomic step.
/// Parameters in order: the value, the retention in microseconds, the advisory row's id
/// (`INTEGER`), the token. Answers with a row (PostgreSQL) or a matched count (MySQL) when
/// it stored.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn advisory_store(dialect: Dialect, results: &str, advisory: &str, classid: i32) -> String {
    match dialect {
        #[cfg(feature = "postgres")]
        Dialect::Postgres => postgres::advisory_store(results, advisory, classid),
        #[cfg(feature = "mysql")]
        Dialect::MySql => {
            // MySQL's lock names carry no class: `GET_LOCK` names are `<table>:<id>`.
            let _ = classid;
            mysql::advisory_store(results, advisory)
        }
        #[allow(unreachable_patterns)]
        other => unreachable!("{other:?} has no advisory locks"),
    }
}

/// Slack added to every expiry the database sets, covering the resolution of its clock
/// (SQLite's `'now'` has millisecond resolution): the hold may last this much longer than
/// asked, never shorter.
pub(crate) const CLOCK_SLACK_US: i64 = 1_000;

/// The names of the lease table and the tables beside it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tables<'a> {
    pub(crate) leases: &'a str,
    pub(crate) results: &'a str,
    pub(crate) holds: &'a str,
}

impl LeaseSql {
    /// The statements of the tables `config` names.
    pub(crate) fn of(config: &crate::config::SqlConfig) -> Self {
        let (leases, results, holds) = (config.table(), config.results_table(), config.holds_table());
        Self::new(config.dialect, Tables { leases: &leases, results: &results, holds: &holds })
    }

    /// The statements of the lease table and the tables beside it.
    pub(crate) fn new(dialect: Dialect, tables: Tables<'_>) -> Self {
        match dialect {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => postgres::lease_sql(tables),
            #[cfg(feature = "mysql")]
            Dialect::MySql => mysql::lease_sql(tables),
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => sqlite::lease_sql(tables),
            #[allow(unreachable_patterns)]
            other => unreachable!("{other:?} is not compiled in; SqlConfig refuses it"),
        }
    }
}

/// The statements that create the lease table `<prefix>_leases`, the results table
/// `<prefix>_results` (with its index) and the holds table `<prefix>_holds` on `dialect`,
/// for users who manage their schema with migrations (then connect with
/// `create_table=false`). Without the results table, locks work and storing or loading a
/// result fails with a database error; without the holds table, so do shared holds and
/// permits. A lease table made by an earlier version needs its new column too:
/// `shared_us`, a `BIGINT NOT NULL DEFAULT 0` (SQLite `INTEGER`).
///
/// ```
/// use dlock_sql::{schema, Dialect};
///
/// let ddl = schema(Dialect::Postgres, "dlock");
/// assert!(ddl[0].starts_with("CREATE TABLE IF NOT EXISTS dlock_leases"));
/// assert!(ddl[1].starts_with("CREATE TABLE IF NOT EXISTS dlock_results"));
/// ```
pub fn schema(dialect: Dialect, prefix: &str) -> Vec<String> {
    let (leases, results, holds) = (format!("{prefix}_leases"), format!("{prefix}_results"), format!("{prefix}_holds"));
    LeaseSql::new(dialect, Tables { leases: &leases, results: &results, holds: &holds }).create
}
