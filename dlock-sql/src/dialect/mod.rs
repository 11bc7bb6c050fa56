//! The SQL text of each database, and nothing else: the logic that runs it is written once
//! in [`crate::lease`] (and [`crate::advisory`]). Expiry is judged by the database's own
//! clock, in microseconds since the Unix epoch, read once per statement.

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

#[cfg(feature = "postgres")]
pub(crate) use postgres::record_key;

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
    /// When a new or renewed hold of the holds table expires, in microseconds of the
    /// database's clock: one value for its row and the lease row's `shared_us`.
    ExpiresUs,
    /// How long a waiter's place lasts after its refresh, in microseconds.
    LapseUs,
    /// How long an idle name's rows are kept, in microseconds.
    KeepUs,
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
///   of an acquire whose reply was lost, takes back exactly its own grant, once. A row it
///   makes starts its fence at the database's clock in microseconds (see [`SweepSql`]).
/// - `acquire` grants only while no shared hold or permit is live: the row's `shared_us`
///   (the latest expiry of the name's shared holds and permits, kept by [`HoldSql`]) has
///   passed. The exclusive statements read nothing but their own row, so they stay one
///   statement each.
/// - `inspect` answers `(owner, fence, holds, remaining_us, shared_remaining_us)`.
/// - `renew` and `release` are owner- and token-checked; they match one row or none.
///   `release` also needs its grant to be recorded, and removes it: a release applied twice
///   (its reply lost, then sent again) takes back one hold, not two. The last release of a
///   hold sets `expires_us` to the time of the release, which is when the name was last
///   used as far as the sweep is concerned.
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
/// - `sweep` removes what idle names leave behind (see [`SweepSql`]).
///
/// `create` makes the three tables; `indexes` the indexes the sweep reads (each with a
/// probe that fails while it is missing, so that a client does not lock a large table to
/// create an index that is there).
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
    pub(crate) sweep: SweepSql,
    /// Brings a lease table made by an earlier version up to date: a probe that fails on an
    /// old table, and the statement that fixes it.
    pub(crate) upgrade: Vec<(String, String)>,
    /// The indexes of the sweep: a probe that fails while one is missing, and its `CREATE`.
    pub(crate) indexes: Vec<(String, String)>,
    /// PostgreSQL: the LISTEN/NOTIFY channel released locks are announced on.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
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

/// The `kind` of a holds-table row that is not a hold but a waiter's place: a waiting
/// writer's (its `fence` is 0), while which no new shared hold or permit is granted
/// (writer preference), or a waiting permit request's (its `fence` is the number of
/// permits it asks for), while which no later request for more permits is granted.
pub(crate) const WAITING: &str = "waiting";

/// The statements of the holds table (`<prefix>_holds` beside the lease table), which keeps
/// the shared holds and semaphore permits: one row per grant (`name`, `request`: the
/// request id; `owner`, `kind`: `shared`, `permit:<n>` with the permits the grant asked
/// for (a plain `permit` from an earlier version bounds nobody) or [`WAITING`]; `fence`:
/// the token, shared by the grants of one owner's re-entered hold, or a place's number
/// of permits; `expires_us`). The fence counter stays in the lease row, so every grant of
/// any kind takes the next token of one counter.
///
/// Every change to a name's holds runs in a transaction that first locks the name's lease
/// row (`lock`, then `locked` on MySQL), so the statements after it read the holds as the
/// last transaction left them, and decide and write without anyone slipping in between.
/// The lease row's `shared_us` carries the latest expiry of the live holds to the
/// exclusive statements, which read no other table: raised by every grant and renewal to
/// the very expiry it gives the row ([`Param::ExpiresUs`], computed once from the clock
/// `lock` read), so that it is never below a live row's, and recomputed from the rows by
/// every release (`recount`).
///
/// - `lock` makes the lease row if missing (its fence starting at the clock, as
///   `acquire`'s does) and locks it, answering (PostgreSQL, SQLite) `(owner, holds,
///   remaining_us, fence, now_us)` of the exclusive hold; on MySQL `locked` reads them
///   after it.
/// - `live` answers `(request, owner, kind, fence, remaining_us)` of every live row.
/// - `bump` takes the next token and raises `shared_us` to the new hold's expiry,
///   answering with the token (a row, or MySQL's `LAST_INSERT_ID`).
/// - `insert` records one grant with its expiry (over the request's own place, if any).
/// - `touch` keeps the live rows of one hold (owner and token) until the expiry given;
///   `extend` raises `shared_us` to match.
/// - `release` deletes a live grant (owner, request id, token); `give_back` deletes the row
///   of a request id whatever it is (a grant of unknown token, or a waiting place);
///   `recount` then sets `shared_us` from the rows left (to the time of the release when
///   none is left, the name's last use for the sweep).
/// - `wait` records (or refreshes) a waiter's place for its lapse; `unwait` deletes it.
/// - `evict` deletes every row of the name.
/// - `store_result` is the lease table's `store_result` for a hold of this table.
/// - `notify` (PostgreSQL) announces at commit that holds of the name were given up.
#[derive(Debug, Clone)]
pub(crate) struct HoldSql {
    pub(crate) lock: Stmt,
    pub(crate) locked: Option<Stmt>,
    pub(crate) live: Stmt,
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

/// What a sweep of the lease-table backend deletes, each statement at most
/// [`SWEEP_BATCH`] rows (the results table's expired rows are its `sweep`):
///
/// - `holds`: rows of the holds table past their expiry (holds nobody renewed, places
///   nobody refreshed);
/// - `leases`: lease rows of idle names: no live exclusive hold, no live shared hold or
///   permit (`shared_us` has passed, which covers every live row of the holds table), no
///   live place, and neither expiry (the time of the last release, or the expiry of the
///   last grant or renewal) within the keep time ([`Param::KeepUs`]).
///
/// The conditions are judged on the lease row as it is when the statement locks it
/// (PostgreSQL `FOR UPDATE SKIP LOCKED`, whose re-check reads the latest version; MySQL's
/// locking reads; SQLite's single writer), and every grant raises `expires_us` or
/// `shared_us` under that row's lock, so a sweep never deletes a row a grant is using. A
/// name whose row is gone starts again from the database's clock in microseconds, above
/// every token the row gave (a counter rises by one a grant, never faster than the
/// clock), as long as the clock does not step back by the keep time.
#[derive(Debug, Clone)]
pub(crate) struct SweepSql {
    pub(crate) holds: Stmt,
    pub(crate) leases: Stmt,
}

/// The statements of the advisory variant's table `<prefix>_advisory` (`id`, `name`,
/// `owner`, `fence`, `used_us`: when the name was last granted) that the sweep concerns:
///
/// - `create` makes the table; `upgrade` adds `used_us` to a table of an earlier version;
///   `indexes` the index on `used_us` (a probe, and the `CREATE`).
/// - `resolve` finds the name's row, making it if missing with its fence at the clock.
/// - `try_lock` takes the lock on a session and, when it did, raises the fence and
///   records the owner and the time (see `AdvisoryBackend::try_lock` for its answer).
/// - `sweep` deletes up to [`SWEEP_BATCH`] rows granted last before the keep time that no
///   session holds, proving it by taking the lock itself for the rest of the statement
///   (PostgreSQL: a transaction-level advisory lock on the same key; MySQL:
///   `IS_FREE_LOCK` under the row lock, which every grant holds while it takes the lock).
/// - `orphan` (PostgreSQL): lets go of the lock a session took on a key whose row was
///   deleted under it, and answers whether the row is gone.
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[derive(Debug, Clone)]
pub(crate) struct AdvisorySql {
    pub(crate) create: String,
    pub(crate) upgrade: Vec<(String, String)>,
    pub(crate) indexes: Vec<(String, String)>,
    pub(crate) resolve: String,
    pub(crate) try_lock: String,
    pub(crate) sweep: Stmt,
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) orphan: Option<String>,
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl AdvisorySql {
    /// The statements of the advisory table `table`, whose PostgreSQL locks are of class
    /// `classid`.
    pub(crate) fn new(dialect: Dialect, table: &str, classid: i32) -> Self {
        match dialect {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => postgres::advisory_sql(table, classid),
            #[cfg(feature = "mysql")]
            Dialect::MySql => {
                let _ = classid;
                mysql::advisory_sql(table)
            }
            #[allow(unreachable_patterns)]
            other => unreachable!("{other:?} has no advisory locks"),
        }
    }
}

/// The most rows one sweep statement deletes, so that a sweep stays a short statement
/// however many rows have piled up.
pub(crate) const SWEEP_BATCH: u32 = 1_000;

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
/// `<prefix>_results` (with its index), the holds table `<prefix>_holds` and the indexes
/// the sweep of idle names reads, on `dialect`, for users who manage their schema with
/// migrations (then connect with `create_table=false`). Without the results table, locks
/// work and storing or loading a result fails with a database error; without the holds
/// table, so do shared holds and permits; without the indexes, a sweep reads whole tables.
/// A lease table made by an earlier version needs its new column too: `shared_us`, a
/// `BIGINT NOT NULL DEFAULT 0` (SQLite `INTEGER`). A client that finds an index missing
/// creates it as it connects, which holds writes to the table back while the index builds:
/// on a large table made by an earlier version, create it beforehand (on PostgreSQL with
/// `CREATE INDEX CONCURRENTLY`).
///
/// ```
/// use dlock_sql::{schema, Dialect};
///
/// let ddl = schema(Dialect::Postgres, "dlock");
/// assert!(ddl[0].starts_with("CREATE TABLE IF NOT EXISTS dlock_leases"));
/// assert!(ddl[1].starts_with("CREATE TABLE IF NOT EXISTS dlock_results"));
/// assert!(ddl.iter().any(|ddl| ddl.starts_with("CREATE INDEX IF NOT EXISTS dlock_leases_expires")));
/// ```
pub fn schema(dialect: Dialect, prefix: &str) -> Vec<String> {
    let (leases, results, holds) = (format!("{prefix}_leases"), format!("{prefix}_results"), format!("{prefix}_holds"));
    let sql = LeaseSql::new(dialect, Tables { leases: &leases, results: &results, holds: &holds });
    sql.create.into_iter().chain(sql.indexes.into_iter().map(|(_, create)| create)).collect()
}
