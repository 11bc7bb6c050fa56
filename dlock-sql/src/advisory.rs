//! The advisory-lock variant: PostgreSQL's `pg_try_advisory_lock` and MySQL/MariaDB's
//! `GET_LOCK`, held by a database session.
//!
//! Each held lock has a dedicated connection (the session is the lease): it never goes
//! back to a pool while held, and the lock ends when the connection does. The server frees
//! it the moment it sees the connection close, so every holding connection goes through a
//! loopback relay that fires the lost signal (`SessionExpired`) as soon
//! as the server's side ends. A frozen holder must not keep the lock forever: the session
//! gets an idle timeout equal to the lease ttl (`idle_session_timeout` in milliseconds on
//! PostgreSQL ≥ 14; `wait_timeout` in whole seconds, rounded up, on MySQL/MariaDB), and
//! renewals are pings on the session that restart that timer. The server therefore ends a
//! session that went quiet no sooner than a ttl after its last renewal, after the holder's
//! own validity ran out; a `Fixed` lease is simply never pinged.
//!
//! Lock keys never collide within a database: each name gets a row (and an id) in `<prefix>_advisory`; the
//! PostgreSQL key is `(hash of the table name, id)`, the MySQL lock name `<table>:<id>`.
//! The same row's `fence` counter gives the fencing token: it is raised by the statement
//! that takes the lock, on the holding session, so tokens increase in grant order and
//! survive restarts. The statement also records when (`used_us`): a sweep deletes the row
//! of a name that no session holds and that was last granted before the keep time
//! ([`ConnectConfig::with_keep_idle`](dlock_core::ConnectConfig::with_keep_idle)), taking the lock
//! itself while it deletes, and a row made again starts its fence at the database's clock
//! in microseconds, above the tokens of the row it replaces. A client that still knows the
//! id of a deleted row learns of it from its next try and looks the name up again.
//! Not re-entrant (one session per hold), not fair, no notification
//! (waiters poll with backoff), no `extend` (see [`AdvisoryBackend`]'s capabilities: an
//! extension is a statement on the holding session, and one whose reply is lost breaks the
//! session and frees the lock).
//!
//! Stored results are rows of `<prefix>_advisory_results` (name, token, value,
//! expires_us; apart from the lease table's `<prefix>_results`, since the two lockers count
//! tokens apart), keyed by the same name as the advisory row. The store runs on the holding
//! session as one statement that writes only while that session holds the lock, the
//! advisory row's fence is the hold's token, and the stored result is of a lower token or
//! expired: the session cannot lose the lock while its statement runs (the lock ends only
//! with the session, which aborts the statement), so the check and the write are one
//! atomic step. Loads run on the pool. Ending the session (or releasing) leaves the result.
//!
//! Limits: the idle timeout needs PostgreSQL 14 or later (`idle_session_timeout`, at most
//! about 24.8 days of ttl); MySQL's `GET_LOCK` names are server-wide, so two databases on
//! one server that use the same table prefix share their advisory locks (give them
//! different prefixes); neither works through a transaction-pooling proxy (PgBouncer in
//! transaction mode, ProxySQL), nor with Galera or group replication, which do not
//! replicate `GET_LOCK`.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{lock_unpoisoned, Attempt, Backend, LostSignal, Release, Renewal, Request};
use dlock_core::{
    Capabilities, Client, FencingToken, Holder, LockError, LockInfo, LockName, LostReason, OwnerId, StoredResult, Swept,
};
use sqlx::{AssertSqlSafe, Connection};
use tokio::sync::watch;

use crate::config::{Dialect, SqlConfig, Target};
use crate::db::{Args, Pool, RollbackRetry, Warm};
#[cfg(feature = "postgres")]
use crate::dialect::record_key;
use crate::dialect::{advisory_store, AdvisorySql, ResultSql, SWEEP_BATCH};
use crate::error::{is_rolled_back, is_session_ended, is_unavailable, lock_error};
use crate::link::{Conn, SqlLink};
use crate::relay::{self, Relay};
use crate::results::Sweeper;

/// A lock client over advisory locks.
pub type AdvisoryLocker = Client<AdvisoryBackend>;

/// Connects an advisory-lock client (PostgreSQL or MySQL/MariaDB): `Unavailable` within the
/// connect timeout when the database cannot be reached; `InvalidInput` for SQLite.
pub async fn connect_advisory(config: SqlConfig) -> Result<AdvisoryLocker, LockError> {
    let client = config.common.client_config();
    let named = config.clone();
    let backend =
        AdvisoryBackend::connect(config).await.map_err(|err| err.at(|| named.describe(&named.advisory_table())))?;
    Ok(Client::with_config(backend, client))
}

/// The advisory-lock backend of one client (see the module docs).
#[derive(Debug, Clone)]
pub struct AdvisoryBackend {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    conn: Arc<Conn>,
    dialect: Dialect,
    table: String,
    /// The first key of PostgreSQL's two-key advisory locks: one per table.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    classid: i32,
    /// The row ids of names this client has used, at most [`MAX_IDS`] of them.
    ids: Mutex<HashMap<String, i32>>,
    /// Sessions that hold nothing, kept for the next acquire.
    idle: Mutex<Vec<Arc<Session>>>,
    /// Whether a spare session is being opened in the background.
    warming: std::sync::atomic::AtomicBool,
    /// The statements of `<prefix>_advisory` that the sweep concerns.
    sql: AdvisorySql,
    /// The statements of `<prefix>_advisory_results`.
    results: ResultSql,
    /// The store of a result on the holding session (see [`advisory_store`]).
    store: Arc<str>,
    sweeper: Sweeper,
    /// Where the locks live (see [`Backend::target`]).
    target: String,
}

/// How many row ids of names one client keeps: a service that locks a new name per
/// request must not grow its clients without bound. Past it the ids are forgotten and
/// looked up again as names are used.
const MAX_IDS: usize = 4096;

/// What one try of the lock on a session found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tried {
    /// Taken, with this fence.
    Granted(i64),
    /// Held by another session.
    Busy,
    /// The name's row is gone (swept since its id was looked up).
    Gone,
}

/// A dedicated connection and the watch on its server side.
#[derive(Debug)]
struct Session {
    conn: tokio::sync::Mutex<SessionConn>,
    closed: watch::Receiver<bool>,
    /// The idle timeout the session has now, in milliseconds (0: the server's default).
    idle_ms: Mutex<u64>,
}

#[derive(Debug)]
enum SessionConn {
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgConnection),
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlConnection),
}

/// A waiter's session, kept between its attempts.
#[derive(Debug)]
pub struct AdvisoryTicket {
    session: Option<Arc<Session>>,
}

/// A held advisory lock: its name, row id and session.
#[derive(Debug)]
pub struct AdvisoryHold {
    name: LockName,
    id: i32,
    session: Arc<Session>,
    released: watch::Sender<bool>,
}

impl Session {
    fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }
}

/// FNV-1a of the table name, as a positive 31-bit key.
fn classid(table: &str) -> i32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in table.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    (hash & 0x7fff_ffff) as i32
}

macro_rules! on_session {
    ($conn:expr, $c:ident => $body:expr) => {
        match $conn {
            #[cfg(feature = "postgres")]
            SessionConn::Postgres($c) => $body,
            #[cfg(feature = "mysql")]
            SessionConn::MySql($c) => $body,
        }
    };
}

impl AdvisoryBackend {
    /// Connects (within the connect timeout) and creates `<prefix>_advisory` when missing
    /// and the config allows it.
    pub async fn connect(config: SqlConfig) -> Result<Self, LockError> {
        if config.dialect == Dialect::Sqlite {
            return Err(LockError::InvalidInput("SQLite has no advisory locks".into()));
        }
        if config.transaction_pooler {
            return Err(LockError::InvalidInput(
                "advisory locks are held by a server session, which a transaction pooler hands to other clients \
                 after each transaction: use the lease table (lock=lease) behind pooler=transaction"
                    .into(),
            ));
        }
        let given_verifies =
            matches!(&config.target, Target::Given(given) if crate::tls::pool_verifies_host(given.get()));
        if crate::tls::verifies_host(&config.tls) || given_verifies {
            // Each session reaches the server through a relay on the loopback address,
            // which the server's certificate does not name.
            return Err(LockError::InvalidInput(
                "advisory locks cannot check the server's host name (sslmode=verify-full, ssl-mode=VERIFY_IDENTITY): \
                 use verify-ca / VERIFY_CA, or the lease table (lock=lease)"
                    .into(),
            ));
        }
        let pool = Pool::connect(&config, &Warm::default()).await?;
        let table = config.advisory_table();
        let results_table = format!("{}_advisory_results", config.common.prefix);
        let results = ResultSql::new(config.dialect, &results_table);
        let classid = classid(&table);
        let sql = AdvisorySql::new(config.dialect, &table, classid);
        if config.create_table {
            let creates = std::iter::once((sql.create.clone(), &table))
                .chain(results.create.iter().map(|ddl| (ddl.clone(), &results_table)));
            let timeout = config.common.connect_timeout;
            let work = async {
                for (create, table) in creates {
                    if let Err(err) = pool.run_plain(&create).await {
                        // Another client may have created it at the same moment.
                        if pool.run_plain(&format!("SELECT 1 FROM {table} WHERE 1 = 0")).await.is_err() {
                            return Err(lock_error(err));
                        }
                    }
                }
                let fixes = [sql.upgrade.as_slice(), sql.indexes.as_slice()].concat();
                crate::schema::fix(&pool, &fixes).await.map_err(lock_error)
            };
            tokio::time::timeout(timeout, work)
                .await
                .unwrap_or_else(|_| Err(LockError::unavailable("creating the advisory tables timed out")))?;
        }
        let store = Arc::from(advisory_store(config.dialect, &results_table, &table, classid));
        let target = config.describe(&table);
        let backend = AdvisoryBackend {
            shared: Arc::new(Shared {
                dialect: config.dialect,
                classid,
                target,
                sql,
                table,
                conn: Conn::new(config, pool, Warm::default()),
                ids: Mutex::default(),
                idle: Mutex::default(),
                warming: std::sync::atomic::AtomicBool::new(false),
                results,
                store,
                sweeper: Sweeper::default(),
            }),
        };
        // One spare session from the start, so the first acquire is one statement too.
        if let Ok(session) = backend.open_session().await {
            backend.recycle(session);
        }
        Ok(backend)
    }

    /// Opens a spare session in the background when none is idle, so that an acquire
    /// rarely waits for a new connection (on PostgreSQL, a new server process).
    fn warm_spare(&self) {
        use std::sync::atomic::Ordering;
        let empty = lock_unpoisoned(&self.shared.idle).is_empty();
        if !empty || self.shared.warming.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            if let Ok(session) = this.open_session().await {
                this.recycle(session);
            }
            this.shared.warming.store(false, Ordering::Release);
        });
    }

    /// The fault switch of this client's pool (see [`SqlLink`]).
    pub fn link(&self) -> SqlLink {
        self.shared.conn.link()
    }

    /// Ends the session holding `name`, as an operator would (`pg_terminate_backend`,
    /// `KILL`): the server frees the lock and the holder's lost signal fires. Returns once
    /// the server has let go of the lock (it ends the session after answering), or after
    /// the operation timeout. A stored result stays.
    pub async fn evict(&self, name: &LockName) -> Result<(), LockError> {
        let (_, _, session) = self.lookup(name).await?;
        let Some(session) = session else { return Ok(()) };
        let sql = match self.shared.dialect {
            Dialect::Postgres => format!("SELECT pg_terminate_backend({session})"),
            _ => format!("KILL {session}"),
        };
        let pool = self.shared.conn.pool().await?;
        pool.run_plain(&sql).await.map_err(lock_error)?;
        let until = tokio::time::Instant::now() + self.shared.conn.config().common.op_timeout;
        while self.lookup(name).await?.2 == Some(session) && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// The row of `name`: owner, fence, and the server session holding the lock (if any).
    ///
    /// The server shows a lock as taken while the statement that took it has not yet
    /// committed the row's new fence, so a plain read could pair the new holder's session
    /// with the previous holder's row. The read is therefore ordered after any grant of
    /// the name in flight: on PostgreSQL it first takes, in its own transaction, the
    /// name's record key in shared mode (every grant holds it exclusively until it
    /// commits) and then reads with a fresh snapshot; on MySQL it is a locking read of the
    /// row, which every grant holds locked from before it takes the lock until it commits.
    async fn lookup(&self, name: &LockName) -> Result<(Option<String>, i64, Option<i64>), LockError> {
        let pool = self.shared.conn.pool().await?;
        let found: Option<(Option<String>, i64, Option<i64>)> = match &pool {
            #[cfg(feature = "postgres")]
            Pool::Postgres(pg) => {
                let (table, classid) = (&self.shared.table, self.shared.classid);
                let record = format!(
                    "SELECT pg_advisory_xact_lock_shared({}) FROM {table} WHERE name = $1",
                    record_key(classid, "id")
                );
                let read = format!(
                    "SELECT a.owner, a.fence, l.pid::int8 FROM {table} a LEFT JOIN pg_locks l \
                     ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 \
                     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                     AND l.classid = {classid}::oid AND l.objid = a.id::oid WHERE a.name = $1"
                );
                async {
                    let mut tx = pg.begin().await?;
                    sqlx::query(AssertSqlSafe(record)).bind(name.as_str()).execute(&mut *tx).await?;
                    let found =
                        sqlx::query_as(AssertSqlSafe(read)).bind(name.as_str()).fetch_optional(&mut *tx).await?;
                    tx.commit().await?;
                    Ok(found)
                }
                .await
            }
            #[cfg(feature = "mysql")]
            Pool::MySql(my) => {
                let table = &self.shared.table;
                let sql = format!(
                    "SELECT CAST(owner AS CHAR), fence, IS_USED_LOCK(CONCAT('{table}:', id)) FROM {table} \
                     WHERE name = ? LOCK IN SHARE MODE"
                );
                sqlx::query_as::<_, (Option<String>, i64, Option<i64>)>(AssertSqlSafe(sql))
                    .bind(name.as_str())
                    .fetch_optional(my)
                    .await
            }
            #[allow(unreachable_patterns)]
            _ => return Err(LockError::InvalidInput("advisory locks need PostgreSQL or MySQL".into())),
        }
        .map_err(lock_error)?;
        Ok(found.unwrap_or((None, 0, None)))
    }

    /// The id of `name`'s row, creating the row on first use (its fence starting at the
    /// database's clock in microseconds, above every token a swept row of the name gave).
    async fn id(&self, pool: &Pool, name: &LockName) -> Result<i32, LockError> {
        if let Some(id) = lock_unpoisoned(&self.shared.ids).get(name.as_str()) {
            return Ok(*id);
        }
        let resolve = || async {
            let sql = AssertSqlSafe(self.shared.sql.resolve.clone());
            match pool {
                #[cfg(feature = "postgres")]
                Pool::Postgres(pg) => sqlx::query_scalar::<_, i64>(sql).bind(name.as_str()).fetch_one(pg).await,
                #[cfg(feature = "mysql")]
                Pool::MySql(my) => {
                    sqlx::query(sql).bind(name.as_str()).execute(my).await.map(|done| done.last_insert_id() as i64)
                }
                #[allow(unreachable_patterns)]
                _ => Err(sqlx::Error::Configuration("advisory locks need PostgreSQL or MySQL".into())),
            }
        };
        // Rows made at once for many names may deadlock on their indexes: a statement the
        // database rolled back made nothing, so it is sent again.
        let mut retry = RollbackRetry::default();
        let id = loop {
            match resolve().await {
                Err(err) if retry.again(&err).await => {}
                outcome => break outcome.map_err(lock_error)?,
            }
        };
        let id = i32::try_from(id).map_err(|_| LockError::backend("the advisory table ran out of 31-bit ids"))?;
        let mut ids = lock_unpoisoned(&self.shared.ids);
        if ids.len() >= MAX_IDS {
            ids.clear();
        }
        ids.insert(name.as_str().to_string(), id);
        Ok(id)
    }

    /// Forgets the id of `name`'s row, which a sweep deleted: the next use looks it up
    /// (and makes the row) again.
    fn forget(&self, name: &LockName, id: i32) {
        let mut ids = lock_unpoisoned(&self.shared.ids);
        if ids.get(name.as_str()) == Some(&id) {
            ids.remove(name.as_str());
        }
    }

    /// Whether the server ends `session` within the operation timeout (the relay sees its
    /// side close).
    async fn ended(&self, session: &Session) -> bool {
        let mut closed = session.closed.clone();
        let within = self.shared.conn.config().common.op_timeout;
        let ended = matches!(tokio::time::timeout(within, closed.wait_for(|c| *c)).await, Ok(Ok(_)));
        ended
    }

    /// An idle session, if there is one.
    fn idle_session(&self) -> Option<Arc<Session>> {
        loop {
            let idle = lock_unpoisoned(&self.shared.idle).pop();
            match idle {
                Some(session) if !session.is_closed() => {
                    self.warm_spare();
                    return Some(session);
                }
                Some(_) => continue,
                None => return None,
            }
        }
    }

    /// A new session through a fresh relay.
    async fn open_session(&self) -> Result<Arc<Session>, LockError> {
        // Go through the link, so a cut client cannot open sessions either.
        let _ = self.shared.conn.pool().await?;
        let config = self.shared.conn.config();
        // A session's connect options: the URL's, or the application pool's own.
        let given = match &config.target {
            Target::Server(url) => Options::Url(url),
            Target::Given(given) => Options::Pool(given.get()),
            _ => return Err(LockError::InvalidInput("advisory locks need a database server".into())),
        };
        let bad = |e: sqlx::Error| LockError::InvalidInput(format!("bad URL: {e}"));
        let unavailable = |e: std::io::Error| LockError::unavailable(format!("cannot reach the database: {e}"));
        let timeout = config.common.connect_timeout;
        let connect = async {
            Ok::<_, LockError>(match config.dialect {
                #[cfg(feature = "postgres")]
                Dialect::Postgres => {
                    let mut opts = match given {
                        Options::Url(url) => crate::tls::postgres(
                            sqlx::postgres::PgConnectOptions::from_str(url).map_err(bad)?,
                            &config.tls,
                        ),
                        Options::Pool(Pool::Postgres(pool)) => (*pool.connect_options()).clone(),
                        #[allow(unreachable_patterns)]
                        Options::Pool(_) => return Err(LockError::InvalidInput("not a PostgreSQL pool".into())),
                    };
                    if let Some((user, password)) = &config.credentials {
                        opts = opts.username(user).password(password);
                    }
                    let relay = relay::start(opts.get_host(), opts.get_port(), timeout).await.map_err(unavailable)?;
                    let conn =
                        sqlx::PgConnection::connect_with(&relayed_pg(opts, &relay.addr)).await.map_err(lock_error)?;
                    (SessionConn::Postgres(conn), relay)
                }
                #[cfg(feature = "mysql")]
                Dialect::MySql => {
                    let mut opts = match given {
                        Options::Url(url) => crate::tls::mysql(
                            sqlx::mysql::MySqlConnectOptions::from_str(url).map_err(bad)?,
                            &config.tls,
                        ),
                        Options::Pool(Pool::MySql(pool)) => (*pool.connect_options()).clone(),
                        #[allow(unreachable_patterns)]
                        Options::Pool(_) => return Err(LockError::InvalidInput("not a MySQL pool".into())),
                    };
                    if let Some((user, password)) = &config.credentials {
                        opts = opts.username(user).password(password);
                    }
                    let relay = relay::start(opts.get_host(), opts.get_port(), timeout).await.map_err(unavailable)?;
                    let opts = opts.host("127.0.0.1").port(relay.addr.port()).timezone(Some("+00:00".into()));
                    let conn = sqlx::MySqlConnection::connect_with(&opts).await.map_err(lock_error)?;
                    (SessionConn::MySql(conn), relay)
                }
                #[allow(unreachable_patterns)]
                _ => return Err(LockError::InvalidInput("advisory locks need PostgreSQL or MySQL".into())),
            })
        };
        let (conn, relay): (SessionConn, Relay) = tokio::time::timeout(timeout, connect)
            .await
            .map_err(|_| LockError::unavailable(format!("opening a session took over {timeout:?}")))??;
        Ok(Arc::new(Session { conn: tokio::sync::Mutex::new(conn), closed: relay.closed, idle_ms: Mutex::new(0) }))
    }

    /// Puts a session that holds nothing back for reuse.
    fn recycle(&self, session: Arc<Session>) {
        if session.is_closed() {
            return;
        }
        let mut idle = lock_unpoisoned(&self.shared.idle);
        if idle.len() < self.shared.conn.config().pool_size as usize {
            idle.push(session);
        }
    }

    /// Sets the session's idle timeout to `ttl` (rounded up) if it has another one.
    async fn set_idle_timeout(
        &self,
        session: &Session,
        conn: &mut SessionConn,
        ttl: Duration,
    ) -> Result<(), sqlx::Error> {
        let ms = match self.shared.dialect {
            Dialect::MySql => ttl.as_nanos().div_ceil(1_000_000_000) as u64 * 1000,
            _ => ttl.as_nanos().div_ceil(1_000_000) as u64,
        }
        .max(1);
        if *lock_unpoisoned(&session.idle_ms) == ms {
            return Ok(());
        }
        let sql = match self.shared.dialect {
            Dialect::MySql => format!("SET SESSION wait_timeout = {}", ms / 1000),
            _ => format!("SET idle_session_timeout = {ms}"),
        };
        on_session!(conn, c => sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut *c).await.map(drop))?;
        *lock_unpoisoned(&session.idle_ms) = ms;
        Ok(())
    }

    /// Tries the lock on `session`. One statement, which holds what
    /// [`lookup`](Self::lookup) waits for from before it takes the lock until it has
    /// committed the new fence: inspecting never pairs the new holder with the old fence.
    /// It also tells a lock held elsewhere from a row a sweep deleted since its id was
    /// looked up, letting go of a lock taken on such a row's key.
    async fn try_lock(&self, conn: &mut SessionConn, id: i32, owner: &str) -> Result<Tried, sqlx::Error> {
        let sql = AssertSqlSafe(self.shared.sql.try_lock.clone());
        match conn {
            #[cfg(feature = "postgres")]
            SessionConn::Postgres(c) => {
                let (fence, got, kept): (Option<i64>, bool, bool) =
                    sqlx::query_as(sql).bind(self.shared.classid).bind(id).bind(owner).fetch_one(&mut *c).await?;
                match (fence, got, kept) {
                    (Some(fence), _, _) => Ok(Tried::Granted(fence)),
                    (None, false, true) => Ok(Tried::Busy),
                    (None, false, false) => Ok(Tried::Gone),
                    // Taken on a key whose row went under the statement (it may still show
                    // in the statement's snapshot): answering busy would leave the session
                    // holding a lock of no row, and a try refused while the lock is free.
                    (None, true, _) => {
                        if let Some(orphan) = &self.shared.sql.orphan {
                            sqlx::query(AssertSqlSafe(orphan.clone())).execute(&mut *c).await?;
                        }
                        Ok(Tried::Gone)
                    }
                }
            }
            #[cfg(feature = "mysql")]
            SessionConn::MySql(c) => {
                let done = sqlx::query(sql).bind(owner).bind(id).execute(&mut *c).await?;
                Ok(match (done.rows_affected(), done.last_insert_id()) {
                    (0, 0) => Tried::Gone,
                    (0, _) => Tried::Busy,
                    (_, fence) => Tried::Granted(fence as i64),
                })
            }
        }
    }

    /// Sets the session's idle timeout to the request's ttl and tries the lock on it.
    async fn lock_on(&self, session: &Session, id: i32, req: &Request) -> Result<Tried, sqlx::Error> {
        let mut conn = session.conn.lock().await;
        self.set_idle_timeout(session, &mut conn, req.ttl()).await?;
        self.try_lock(&mut conn, id, req.owner.as_str()).await
    }

    /// Runs the store statement on the holding session: whether it stored.
    async fn store_on(
        &self,
        conn: &mut SessionConn,
        value: &[u8],
        retention_us: i64,
        id: i32,
        token: i64,
    ) -> Result<bool, sqlx::Error> {
        let sql = AssertSqlSafe(self.shared.store.clone());
        match conn {
            #[cfg(feature = "postgres")]
            SessionConn::Postgres(c) => sqlx::query(sql)
                .bind(value)
                .bind(retention_us)
                .bind(id)
                .bind(token)
                .fetch_optional(&mut *c)
                .await
                .map(|row| row.is_some()),
            #[cfg(feature = "mysql")]
            SessionConn::MySql(c) => sqlx::query(sql)
                .bind(value)
                .bind(retention_us)
                .bind(id)
                .bind(token)
                .execute(&mut *c)
                .await
                .map(|done| done.rows_affected() > 0),
        }
    }

    async fn unlock(&self, conn: &mut SessionConn, id: i32) -> Result<bool, sqlx::Error> {
        match conn {
            #[cfg(feature = "postgres")]
            SessionConn::Postgres(c) => {
                sqlx::query_scalar("SELECT pg_advisory_unlock($1, $2)")
                    .bind(self.shared.classid)
                    .bind(id)
                    .fetch_one(&mut *c)
                    .await
            }
            #[cfg(feature = "mysql")]
            SessionConn::MySql(c) => {
                let freed: Option<i64> = sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
                    .bind(format!("{}:{id}", self.shared.table))
                    .fetch_one(&mut *c)
                    .await?;
                Ok(freed == Some(1))
            }
        }
    }
}

/// Where a new session's connect options come from.
#[derive(Clone, Copy)]
enum Options<'a> {
    Url(&'a str),
    Pool(&'a Pool),
}

#[cfg(feature = "postgres")]
fn relayed_pg(
    opts: sqlx::postgres::PgConnectOptions,
    relay: &std::net::SocketAddr,
) -> sqlx::postgres::PgConnectOptions {
    opts.host("127.0.0.1").port(relay.port())
}

/// A failure on the holding session itself: the connection is gone, and the lock with it.
fn session_gone(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Io(_) | sqlx::Error::Protocol(_)) || is_unavailable(err)
}

#[async_trait]
impl Backend for AdvisoryBackend {
    type Hold = AdvisoryHold;
    type Ticket = AdvisoryTicket;

    fn name(&self) -> &'static str {
        match self.shared.dialect {
            Dialect::Postgres => "postgres-advisory",
            _ => "mysql-advisory",
        }
    }

    /// The server, database and advisory table (`postgres://10.0.0.5:5432/app table
    /// dlock_advisory`).
    fn target(&self) -> String {
        self.shared.target.clone()
    }

    /// Deletes expired results and the rows of names no session holds that were last
    /// granted before the keep time ([`ConnectConfig::with_keep_idle`](dlock_core::ConnectConfig::with_keep_idle)), up to a batch of each.
    async fn sweep(&self) -> Result<Swept, LockError> {
        let keep_us = crate::lease::ttl_us(self.shared.conn.config().common.keep_idle);
        let args = Args { keep_us, ..Args::name("") };
        let mut swept = Swept::default();
        for stmt in [&self.shared.results.sweep, &self.shared.sql.sweep] {
            let deleted = self.shared.conn.run(stmt, args).await?.matched(stmt.reply);
            swept.removed += deleted;
            swept.more |= deleted >= u64::from(SWEEP_BATCH);
        }
        Ok(swept)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            reentrant: false,
            fifo: false,
            notify: false,
            ttl: true,
            fixed: true,
            // Extending changes the session's idle timeout, a statement on the holding
            // session. A session whose reply is lost is a broken connection, and the server
            // ends it and frees the lock: an extension whose reply was lost would revoke the
            // hold it meant to lengthen. Watchdog renewals keep the ttl they started with.
            extend: false,
            queue_length: false,
            results: true,
            shared: false,
            permits: false,
        }
    }

    async fn attempt(
        &self,
        req: &Request,
        ticket: &mut Option<AdvisoryTicket>,
    ) -> Result<Attempt<AdvisoryHold>, LockError> {
        let pool = self.shared.conn.pool().await?;
        let mut id = self.id(&pool, &req.name).await?;
        let session = match ticket.as_mut().and_then(|t| t.session.take()) {
            Some(session) if !session.is_closed() => session,
            _ => match self.idle_session() {
                Some(session) => session,
                None if req.blocking => {
                    // Opening a session can take long (on PostgreSQL it starts a server
                    // process): open it outside the attempt that may grant, so the lease's
                    // validity is not eaten by it, and attempt again at once.
                    let session = self.open_session().await?;
                    *ticket = Some(AdvisoryTicket { session: Some(session) });
                    return Ok(Attempt::Busy { retry_after: Some(Duration::ZERO) });
                }
                None => self.open_session().await?,
            },
        };
        let (session, mut tried) = match self.lock_on(&session, id, req).await {
            Ok(tried) => (session, tried),
            // A session kept idle may have been ended by the server meanwhile (its idle
            // timeout is the last hold's ttl). The lock was not taken on it, and the lock
            // may well be free: try a fresh session rather than fail. So too when the
            // database rolled the statement back as a deadlock victim: MySQL's `GET_LOCK`
            // outlives a rollback, so the session, which may hold the lock now without its
            // fence, is closed with whatever it holds.
            Err(err) if session_gone(&err) || session.is_closed() || is_rolled_back(&err) => {
                drop(session);
                if req.blocking {
                    return Ok(Attempt::Busy { retry_after: Some(Duration::ZERO) });
                }
                let session = self.open_session().await?;
                let tried = self.lock_on(&session, id, req).await.map_err(lock_error)?;
                (session, tried)
            }
            Err(err) => return Err(lock_error(err)),
        };
        if tried == Tried::Gone {
            // A sweep deleted the name's row since this client looked up its id: look it up
            // (making the row again) and try once more.
            self.forget(&req.name, id);
            id = self.id(&pool, &req.name).await?;
            tried = self.lock_on(&session, id, req).await.map_err(lock_error)?;
        }
        match tried {
            Tried::Granted(fence) => {
                let token = u64::try_from(fence)
                    .ok()
                    .filter(|f| *f > 0)
                    .map(FencingToken::new)
                    .ok_or_else(|| LockError::backend(format!("invalid fence {fence}")))?;
                let hold = AdvisoryHold { name: req.name.clone(), id, session, released: watch::channel(false).0 };
                Ok(Attempt::Granted { hold, token })
            }
            Tried::Busy | Tried::Gone => {
                // Keep the session for this waiter's next attempt.
                if req.blocking {
                    *ticket = Some(AdvisoryTicket { session: Some(session) });
                } else {
                    self.recycle(session);
                }
                Ok(Attempt::Busy { retry_after: None })
            }
        }
    }

    async fn abandon(&self, _req: &Request, ticket: AdvisoryTicket) {
        if let Some(session) = ticket.session {
            self.recycle(session);
        }
    }

    /// A ping on the holding session, which restarts its idle timeout. One ping at a time:
    /// another renewal while one is on its way (the client sends one beside a renewal
    /// unanswered for an operation timeout) is refused at once rather than queued behind
    /// it on the same connection, where it could only come later still; the client tries
    /// again shortly, and the ping on its way renews the lease when it is answered.
    async fn renew(&self, hold: &AdvisoryHold, ttl: Duration) -> Result<Renewal, LockError> {
        if hold.session.is_closed() {
            return Ok(Renewal::Lost(LostReason::SessionExpired));
        }
        let Ok(mut conn) = hold.session.conn.try_lock() else {
            return Err(LockError::unavailable("a ping on the holding session is still unanswered"));
        };
        // A renewal that comes after the release (queued, or late) must not touch the
        // session: it may hold another lock by now, with another ttl as its idle timeout.
        // The release marks the hold before it takes the session, so checking under the
        // session's lock is enough.
        if *hold.released.borrow() {
            return Ok(Renewal::Lost(LostReason::Expired));
        }
        let ping = async {
            self.set_idle_timeout(&hold.session, &mut conn, ttl).await?;
            // The simple protocol: one round trip, no statement to prepare first.
            on_session!(&mut *conn, c => sqlx::raw_sql(AssertSqlSafe("SELECT 1")).execute(&mut *c).await.map(drop))
        };
        match ping.await {
            Ok(()) => Ok(Renewal::Renewed),
            Err(err) if session_gone(&err) || hold.session.is_closed() => Ok(Renewal::Lost(LostReason::SessionExpired)),
            Err(err) => Err(lock_error(err)),
        }
    }

    async fn release(&self, hold: &AdvisoryHold) -> Result<Release, LockError> {
        let _ = hold.released.send(true);
        if hold.session.is_closed() {
            return Ok(Release::NotHeld);
        }
        let freed = {
            let mut conn = hold.session.conn.lock().await;
            self.unlock(&mut conn, hold.id).await
        };
        match freed {
            Ok(true) => {
                self.recycle(hold.session.clone());
                Ok(Release::Released)
            }
            Ok(false) => Ok(Release::NotHeld),
            Err(err) if session_gone(&err) || hold.session.is_closed() => Ok(Release::NotHeld),
            Err(err) => Err(lock_error(err)),
        }
    }

    /// One statement on the holding session (see the module docs). `NotHeld` when the
    /// session has ended or let go of the lock, when the lock was granted again since, or
    /// when a result of this token or a later one is kept. A connection that breaks while
    /// the statement is on its way leaves its outcome unknown (`Unavailable`) unless the
    /// server ends the session within the operation timeout, after which the record kept
    /// tells.
    async fn store_result(
        &self,
        hold: &AdvisoryHold,
        token: FencingToken,
        value: &[u8],
        retention: Duration,
    ) -> Result<(), LockError> {
        let token = i64::try_from(token.get()).map_err(|_| LockError::not_held())?;
        let retention_us = crate::results::retention_us(retention);
        if hold.session.is_closed() {
            return Err(LockError::not_held());
        }
        let mut conn = hold.session.conn.lock().await;
        // Released: the session may hold this lock again by now, for another hold.
        if *hold.released.borrow() || hold.session.is_closed() {
            return Err(LockError::not_held());
        }
        let mut retry = RollbackRetry::default();
        let stored = loop {
            match self.store_on(&mut conn, value, retention_us, hold.id, token).await {
                Err(err) if retry.again(&err).await => {}
                outcome => break outcome,
            }
        };
        drop(conn);
        match stored {
            Ok(true) => {
                self.shared.sweeper.after_store(&self.shared.conn, &self.shared.results.sweep);
                Ok(())
            }
            Ok(false) => Err(LockError::not_held()),
            // The server ended the session instead of running the statement to its commit.
            Err(err) if is_session_ended(&err) => Err(LockError::not_held()),
            // The connection broke under the statement. Once the server has ended the
            // session too, the statement committed before that or never will: the record
            // kept tells which. (The server may end an idle session it was told to kill
            // without a word, before the relay has seen it go.)
            Err(err) if session_gone(&err) && self.ended(&hold.session).await => {
                match self.load_result(&hold.name).await? {
                    Some(kept) if kept.token == FencingToken::new(token as u64) && kept.value == value => Ok(()),
                    _ => Err(LockError::not_held()),
                }
            }
            Err(err) => Err(lock_error(err)),
        }
    }

    async fn load_result(&self, name: &LockName) -> Result<Option<StoredResult>, LockError> {
        let answer = self.shared.conn.run(&self.shared.results.load, Args::name(name.as_str())).await?;
        crate::results::record(&answer)
    }

    async fn inspect(&self, name: &LockName) -> Result<LockInfo, LockError> {
        let (owner, fence, session) = self.lookup(name).await?;
        let holder = match (owner, session) {
            (Some(owner), Some(_)) if fence > 0 => Some(Holder {
                owner: OwnerId::new(owner)?,
                token: FencingToken::new(fence as u64),
                count: 1,
                remaining: None,
            }),
            _ => None,
        };
        Ok(LockInfo { holder, waiters: None })
    }

    fn watch_hold(&self, hold: &AdvisoryHold, signal: LostSignal) {
        let mut closed = hold.session.closed.clone();
        let mut released = hold.released.subscribe();
        tokio::spawn(async move {
            tokio::select! {
                _ = closed.wait_for(|c| *c) => signal.fire(LostReason::SessionExpired),
                _ = released.wait_for(|r| *r) => {}
            }
        });
    }
}

impl AdvisoryHold {
    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }
}

impl Drop for AdvisoryHold {
    fn drop(&mut self) {
        // Stops the watch of a hold that was never released explicitly.
        let _ = self.released.send(true);
    }
}
