//! The one place that talks to sqlx for the lease table: a pool of whichever database the
//! URL named, and a way to run a [`Stmt`] with its parameters and read its answer, so that
//! the lease logic is written once for every dialect.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::LockError;
use futures::future::BoxFuture;
use sqlx::pool::PoolOptions;
use sqlx::{AssertSqlSafe, Row};

use crate::config::{Dialect, SqlConfig, Target};
use crate::dialect::{LeaseSql, Param, Reply, Stmt};
use crate::error::{connect_error, is_lock_contention, is_rolled_back, lock_error};

/// How many times a statement rolled back by a deadlock or serialization failure is sent
/// again before its error is returned.
const ROLLBACK_RETRIES: u32 = 5;

/// Statements every new connection of a pool prepares (see [`Pool::connect_lazy`]).
pub(crate) type Warm = Arc<[Arc<str>]>;

/// A pool of connections to one database.
#[derive(Clone, Debug)]
pub(crate) enum Pool {
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
    /// PostgreSQL behind a transaction pooler: every statement unprepared and in a
    /// transaction of its own, since only within a transaction does the pooler keep the
    /// client on one server session (sqlx parses and executes a statement in two round
    /// trips).
    #[cfg(feature = "postgres")]
    PostgresPooled(sqlx::PgPool),
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlPool),
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::SqlitePool),
}

/// A column value as the lease logic reads it. A binary column comes back as `Text` when
/// it holds UTF-8 (MySQL's `VARBINARY` names and owners), as `Bytes` otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Value {
    Null,
    Int(i64),
    Text(String),
    Bytes(Vec<u8>),
}

impl Value {
    pub(crate) fn int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }

    pub(crate) fn text(&self) -> Option<&str> {
        match self {
            Value::Text(s) => Some(s),
            _ => None,
        }
    }

    /// The bytes of a text or binary value.
    pub(crate) fn bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Text(s) => Some(s.as_bytes()),
            Value::Bytes(b) => Some(b),
            _ => None,
        }
    }
}

/// The parameters of one call, by meaning.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Args<'a> {
    pub(crate) name: &'a str,
    pub(crate) owner: &'a str,
    pub(crate) fence: i64,
    pub(crate) ttl_us: i64,
    pub(crate) grant: &'a str,
    pub(crate) batch: &'a str,
    pub(crate) value: &'a [u8],
    pub(crate) retention_us: i64,
    pub(crate) kind: &'a str,
    pub(crate) expires_us: i64,
    pub(crate) lapse_us: i64,
    pub(crate) keep_us: i64,
}

impl<'a> Args<'a> {
    pub(crate) fn name(name: &'a str) -> Self {
        Args {
            name,
            owner: "",
            fence: 0,
            ttl_us: 0,
            grant: "",
            batch: "",
            value: &[],
            retention_us: 0,
            kind: "",
            expires_us: 0,
            lapse_us: 0,
            keep_us: 0,
        }
    }

    pub(crate) fn batch(batch: &'a str) -> Self {
        Args { batch, ..Args::name("") }
    }

    pub(crate) fn to_owned(self) -> OwnedArgs {
        OwnedArgs {
            name: self.name.to_string(),
            owner: self.owner.to_string(),
            fence: self.fence,
            ttl_us: self.ttl_us,
            grant: self.grant.to_string(),
            batch: self.batch.to_string(),
            value: self.value.to_vec(),
            retention_us: self.retention_us,
            kind: self.kind.to_string(),
            expires_us: self.expires_us,
            lapse_us: self.lapse_us,
            keep_us: self.keep_us,
        }
    }
}

/// A transaction body for [`Pool::transact`] that runs `body` with the lease table's
/// statements and its own copy of `args`, so that it borrows nothing but the transaction
/// (the transaction may be run again after a rollback).
pub(crate) fn in_tx<T, B>(
    sql: &Arc<LeaseSql>,
    args: Args<'_>,
    body: B,
) -> impl Fn(&mut Tx) -> BoxFuture<'_, Result<T, LockError>> + Send + Sync + 'static
where
    T: Send + 'static,
    B: for<'t> Fn(&'t mut Tx, &'t LeaseSql, &'t OwnedArgs) -> BoxFuture<'t, Result<T, LockError>>
        + Send
        + Sync
        + 'static,
{
    let (sql, args, body) = (sql.clone(), args.to_owned(), Arc::new(body));
    move |tx| {
        let (sql, args, body) = (sql.clone(), args.clone(), body.clone());
        Box::pin(async move { body(tx, &sql, &args).await })
    }
}

/// [`Args`] that own their text, for a statement that outlives its caller.
#[derive(Debug, Clone)]
pub(crate) struct OwnedArgs {
    name: String,
    owner: String,
    fence: i64,
    ttl_us: i64,
    grant: String,
    batch: String,
    value: Vec<u8>,
    retention_us: i64,
    kind: String,
    expires_us: i64,
    lapse_us: i64,
    keep_us: i64,
}

impl OwnedArgs {
    pub(crate) fn args(&self) -> Args<'_> {
        Args {
            name: &self.name,
            owner: &self.owner,
            fence: self.fence,
            ttl_us: self.ttl_us,
            grant: &self.grant,
            batch: &self.batch,
            value: &self.value,
            retention_us: self.retention_us,
            kind: &self.kind,
            expires_us: self.expires_us,
            lapse_us: self.lapse_us,
            keep_us: self.keep_us,
        }
    }
}

/// What a statement answered.
#[derive(Debug, Default)]
pub(crate) struct Answer {
    pub(crate) rows: Vec<Vec<Value>>,
    /// Rows matched (MySQL reports matched rows: sqlx asks for `CLIENT_FOUND_ROWS`).
    pub(crate) affected: u64,
    /// MySQL's `LAST_INSERT_ID` of the statement.
    pub(crate) last_id: u64,
}

impl Answer {
    /// Rows returned or matched, whichever the statement reports.
    pub(crate) fn matched(&self, reply: Reply) -> u64 {
        match reply {
            Reply::Rows => self.rows.len() as u64,
            Reply::Done => self.affected,
        }
    }
}

macro_rules! bind_all {
    ($query:expr, $stmt:expr, $args:expr) => {{
        let mut q = $query;
        for p in $stmt.params {
            q = match p {
                Param::Name => q.bind($args.name),
                Param::Owner => q.bind($args.owner),
                Param::Fence => q.bind($args.fence),
                Param::TtlUs => q.bind($args.ttl_us),
                Param::Grant => q.bind($args.grant),
                Param::Batch => q.bind($args.batch),
                Param::Value => q.bind($args.value),
                Param::RetentionUs => q.bind($args.retention_us),
                Param::Kind => q.bind($args.kind),
                Param::ExpiresUs => q.bind($args.expires_us),
                Param::LapseUs => q.bind($args.lapse_us),
                Param::KeepUs => q.bind($args.keep_us),
            };
        }
        q
    }};
}

fn decode<R: Row>(row: &R) -> Vec<Value>
where
    usize: sqlx::ColumnIndex<R>,
    for<'r> Option<i64>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<Vec<u8>>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    (0..row.len())
        .map(|i| {
            if let Ok(v) = row.try_get::<Option<i64>, _>(i) {
                return v.map_or(Value::Null, Value::Int);
            }
            if let Ok(v) = row.try_get::<Option<String>, _>(i) {
                return v.map_or(Value::Null, Value::Text);
            }
            // Binary columns: MySQL's VARBINARY names and owners (UTF-8), stored results.
            match row.try_get::<Option<Vec<u8>>, _>(i) {
                Ok(Some(bytes)) => String::from_utf8(bytes).map_or_else(|e| Value::Bytes(e.into_bytes()), Value::Text),
                _ => Value::Null,
            }
        })
        .collect()
}

/// Runs one statement on an executor (a pool, or a transaction's connection) and reads its
/// answer; `$last_id` reads MySQL's `LAST_INSERT_ID` from the statement's result.
macro_rules! run_on {
    ($db:ty, $executor:expr, $stmt:expr, $args:expr, $last_id:expr) => {
        run_on!($db, $executor, $stmt, $args, $last_id, true)
    };
    ($db:ty, $executor:expr, $stmt:expr, $args:expr, $last_id:expr, $persistent:expr) => {{
        let q = sqlx::query::<$db>(AssertSqlSafe($stmt.sql.clone())).persistent($persistent);
        let q = bind_all!(q, $stmt, $args);
        match $stmt.reply {
            Reply::Rows => {
                Ok(Answer { rows: q.fetch_all($executor).await?.iter().map(decode).collect(), ..Default::default() })
            }
            Reply::Done => {
                let done = q.execute($executor).await?;
                #[allow(clippy::redundant_closure_call)]
                let last_id = ($last_id)(&done);
                Ok(Answer { affected: done.rows_affected(), last_id, rows: Vec::new() })
            }
        }
    }};
}

/// An open transaction (see [`Pool::transact`]).
#[derive(Debug)]
pub(crate) struct Tx {
    conn: TxConn,
    /// Whether statements are prepared under a name (not behind a transaction pooler).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    persistent: bool,
    /// Whether a statement failed because the database rolled the transaction back, so
    /// that [`Pool::transact`] runs it again rather than failing.
    rolled_back: bool,
}

#[derive(Debug)]
enum TxConn {
    #[cfg(feature = "postgres")]
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
    #[cfg(feature = "mysql")]
    MySql(sqlx::Transaction<'static, sqlx::MySql>),
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::Transaction<'static, sqlx::Sqlite>),
}

impl Tx {
    /// Runs one statement of the transaction.
    pub(crate) async fn run(&mut self, stmt: &Stmt, args: Args<'_>) -> Result<Answer, LockError> {
        let outcome: Result<Answer, sqlx::Error> = async {
            match &mut self.conn {
                #[cfg(feature = "postgres")]
                TxConn::Postgres(tx) => run_on!(sqlx::Postgres, &mut **tx, stmt, args, |_| 0, self.persistent),
                #[cfg(feature = "mysql")]
                TxConn::MySql(tx) => {
                    run_on!(sqlx::MySql, &mut **tx, stmt, args, |done: &sqlx::mysql::MySqlQueryResult| {
                        done.last_insert_id()
                    })
                }
                #[cfg(feature = "sqlite")]
                TxConn::Sqlite(tx) => run_on!(sqlx::Sqlite, &mut **tx, stmt, args, |_| 0),
            }
        }
        .await;
        outcome.map_err(|err: sqlx::Error| {
            self.rolled_back |= is_rolled_back(&err);
            lock_error(err)
        })
    }

    async fn commit(self) -> Result<(), sqlx::Error> {
        match self.conn {
            #[cfg(feature = "postgres")]
            TxConn::Postgres(tx) => tx.commit().await,
            #[cfg(feature = "mysql")]
            TxConn::MySql(tx) => tx.commit().await,
            #[cfg(feature = "sqlite")]
            TxConn::Sqlite(tx) => tx.commit().await,
        }
    }
}

/// Sends a statement again (a few times, after a short jittered pause) while the database
/// rolls it back as a deadlock victim or a serialization failure: it changed nothing then.
#[derive(Debug, Default)]
pub(crate) struct RollbackRetry {
    tries: u32,
}

impl RollbackRetry {
    /// Whether to send the statement that failed with `err` again, after the pause.
    pub(crate) async fn again(&mut self, err: &sqlx::Error) -> bool {
        self.again_if(is_rolled_back(err), err).await
    }

    /// Whether to run again what failed with `err`, given whether the database rolled it
    /// back, after the pause.
    async fn again_if(&mut self, rolled_back: bool, err: &(dyn std::fmt::Display + Sync)) -> bool {
        if !rolled_back || self.tries >= ROLLBACK_RETRIES {
            return false;
        }
        self.tries += 1;
        tracing::debug!(%err, tries = self.tries, "statement rolled back by the database; sending it again");
        tokio::time::sleep(Duration::from_millis(fastrand::u64(1..=5 * u64::from(self.tries)))).await;
        true
    }
}

/// A server connection may use TLS (PostgreSQL's default mode prefers it), the
/// application's pool's too: the crypto provider is chosen before any handshake.
fn tls_ready(config: &SqlConfig) {
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    if config.dialect != Dialect::Sqlite {
        dlock_core::tls::install_crypto_provider();
    }
    let _ = config;
}

impl Pool {
    /// Where the pool's connections go, without credentials: `postgres://host:port/db`,
    /// `sqlite:///path/file.db`.
    pub(crate) fn describe(&self) -> String {
        match self {
            #[cfg(feature = "postgres")]
            Pool::Postgres(p) | Pool::PostgresPooled(p) => {
                let o = p.connect_options();
                format!("postgres://{}:{}/{}", o.get_host(), o.get_port(), o.get_database().unwrap_or_default())
            }
            #[cfg(feature = "mysql")]
            Pool::MySql(p) => {
                let o = p.connect_options();
                format!("mysql://{}:{}/{}", o.get_host(), o.get_port(), o.get_database().unwrap_or_default())
            }
            #[cfg(feature = "sqlite")]
            Pool::Sqlite(p) => format!("sqlite://{}", p.connect_options().get_filename().display()),
        }
    }

    /// Opens a pool for `config` and checks that the database answers, within the connect
    /// timeout (`Unavailable` otherwise).
    pub(crate) async fn connect(config: &SqlConfig, warm: &Warm) -> Result<Pool, LockError> {
        if let Target::Given(given) = &config.target {
            tls_ready(config);
            return Self::check_given(config, given.get()).await;
        }
        let pool = Self::connect_lazy(config, config.pool_size, warm)?;
        // The last failed attempt, so that a server that stays unreachable is reported
        // with why (refused, no route) and not only with the time it took.
        let mut last = None;
        let ping = async {
            let mut pause = Duration::from_millis(10);
            loop {
                let opened = match &pool {
                    // A connection of its own rather than one of the pool: the pool tries
                    // again on a refused connection until its timeout and keeps no cause.
                    #[cfg(feature = "postgres")]
                    Pool::Postgres(p) | Pool::PostgresPooled(p) => {
                        match sqlx::ConnectOptions::connect(&*p.connect_options()).await {
                            Ok(conn) => sqlx::Connection::close(conn).await,
                            Err(err) => Err(err),
                        }
                    }
                    #[cfg(feature = "mysql")]
                    Pool::MySql(p) => match sqlx::ConnectOptions::connect(&*p.connect_options()).await {
                        Ok(conn) => sqlx::Connection::close(conn).await,
                        Err(err) => Err(err),
                    },
                    #[cfg(feature = "sqlite")]
                    Pool::Sqlite(p) => p.acquire().await.map(drop),
                };
                match opened {
                    // SQLite may answer "busy" at once, without waiting out its busy
                    // timeout, while other processes open the same new file (switching it
                    // to WAL): try again, within the connect timeout.
                    Err(err) if is_lock_contention(&err) => {
                        tokio::time::sleep(Duration::from_millis(fastrand::u64(5..=50))).await;
                    }
                    // A server that is starting refuses connections for a while.
                    Err(sqlx::Error::Io(err)) if err.kind() == std::io::ErrorKind::ConnectionRefused => {
                        last = Some(err);
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_millis(500));
                    }
                    other => return other,
                }
            }
        };
        match tokio::time::timeout(config.common.connect_timeout, ping).await {
            Ok(Ok(())) => Ok(pool),
            Ok(Err(err)) => Err(connect_error(err, crate::tls::is_off(&config.tls))),
            Err(_) => {
                let what = format!(
                    "{} did not answer within the connect timeout of {:?}",
                    config.dialect.name(),
                    config.common.connect_timeout
                );
                Err(match last {
                    Some(cause) => LockError::unavailable_because(what, cause),
                    None => LockError::unavailable(what),
                })
            }
        }
    }

    /// Checks the application's own pool: its dialect, that nothing is asked of it that
    /// only a pool of this crate's own could do, and that the database answers through it
    /// within the connect timeout.
    async fn check_given(config: &SqlConfig, pool: &Pool) -> Result<Pool, LockError> {
        config.check_prefix()?;
        if config.credentials.is_some() || !config.tls.is_empty() {
            return Err(LockError::InvalidInput(
                "credentials and TLS options belong to the application's pool, not to the lock's config".into(),
            ));
        }
        let opened = async {
            match pool {
                #[cfg(feature = "postgres")]
                Pool::Postgres(p) | Pool::PostgresPooled(p) => p.acquire().await.map(drop),
                #[cfg(feature = "mysql")]
                Pool::MySql(p) => p.acquire().await.map(drop),
                #[cfg(feature = "sqlite")]
                Pool::Sqlite(p) => p.acquire().await.map(drop),
            }
        };
        match tokio::time::timeout(config.common.connect_timeout, opened).await {
            Ok(Ok(())) => Ok(pool.clone().pooled(config.transaction_pooler)),
            Ok(Err(err)) => Err(lock_error(err)),
            Err(_) => Err(LockError::unavailable(format!(
                "the application's pool gave no connection within the connect timeout of {:?}",
                config.common.connect_timeout
            ))),
        }
    }

    /// A pool of up to `size` connections, opened as needed, each preparing the `warm`
    /// statements (on the servers) as it opens; the application's own pool, if it gave one.
    pub(crate) fn connect_lazy(config: &SqlConfig, size: u32, warm: &Warm) -> Result<Pool, LockError> {
        config.check_prefix()?;
        tls_ready(config);
        if let Target::Given(given) = &config.target {
            return Ok(given.get().clone().pooled(config.transaction_pooler));
        }
        crate::tls::check_files(config.dialect, &config.tls)?;
        let bad = |e: sqlx::Error| LockError::InvalidInput(format!("bad {} URL: {e}", config.dialect.name()));
        fn options<DB: sqlx::Database>(config: &SqlConfig, size: u32) -> PoolOptions<DB> {
            PoolOptions::<DB>::new()
                .max_connections(size)
                .min_connections(0)
                .acquire_timeout(config.common.connect_timeout)
                .idle_timeout(Some(Duration::from_secs(300)))
                .test_before_acquire(false)
        }
        // A statement not yet prepared on a connection costs a round trip more when it is
        // first sent (prepare, then execute): a renewal answered late would come twice as
        // late. The renewal statements are prepared when the connection opens, where the
        // time is the connect timeout's, not the lease's.
        #[cfg(any(feature = "postgres", feature = "mysql"))]
        fn prepared<DB: sqlx::Database>(options: PoolOptions<DB>, warm: &Warm) -> PoolOptions<DB>
        where
            for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
        {
            if warm.is_empty() {
                return options;
            }
            let warm = warm.clone();
            options.after_connect(move |conn, _| {
                let warm = warm.clone();
                Box::pin(async move {
                    for sql in warm.iter() {
                        let sql = sqlx::SqlSafeStr::into_sql_str(AssertSqlSafe(sql.clone()));
                        if let Err(err) = sqlx::Executor::prepare(&mut *conn, sql).await {
                            // Not fatal: the statement is prepared when first used (a table
                            // not created yet, a statement this server does not know).
                            tracing::debug!(%err, "preparing a statement on a new connection failed");
                        }
                    }
                    Ok(())
                })
            })
        }
        Ok(match (&config.target, config.dialect) {
            #[cfg(feature = "postgres")]
            (Target::Server(url), Dialect::Postgres) => {
                let mut opts = sqlx::postgres::PgConnectOptions::from_str(url).map_err(bad)?;
                opts = crate::tls::postgres(opts, &config.tls);
                if let Some((user, password)) = &config.credentials {
                    opts = opts.username(user).password(password);
                }
                if config.transaction_pooler {
                    // Named statements live in a server session, which a transaction
                    // pooler hands to another client after each transaction.
                    let opts = opts.statement_cache_capacity(0);
                    return Ok(Pool::PostgresPooled(options(config, size).connect_lazy_with(opts)));
                }
                Pool::Postgres(prepared(options(config, size), warm).connect_lazy_with(opts))
            }
            #[cfg(feature = "mysql")]
            (Target::Server(url), Dialect::MySql) => {
                let mut opts =
                    sqlx::mysql::MySqlConnectOptions::from_str(url).map_err(bad)?.timezone(Some("+00:00".into()));
                opts = crate::tls::mysql(opts, &config.tls);
                if let Some((user, password)) = &config.credentials {
                    opts = opts.username(user).password(password);
                }
                Pool::MySql(prepared(options(config, size), warm).connect_lazy_with(opts))
            }
            #[cfg(feature = "sqlite")]
            (target, Dialect::Sqlite) => {
                use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
                if config.credentials.is_some() {
                    return Err(LockError::InvalidInput("SQLite has no users: drop the credentials".into()));
                }
                let base = match target {
                    Target::File(path) => SqliteConnectOptions::new()
                        .filename(path)
                        .create_if_missing(true)
                        .journal_mode(SqliteJournalMode::Wal),
                    Target::Memory => SqliteConnectOptions::from_str("sqlite::memory:").map_err(bad)?,
                    Target::Server(_) | Target::Given(_) => unreachable!("SQLite URLs parse to files"),
                };
                // FULL: a commit is on disk before its statement answers, so a power cut
                // cannot take back a fence increment a resource may already have seen (in WAL
                // mode NORMAL may lose the last commits, and tokens would repeat).
                let opts = base.busy_timeout(config.busy_timeout()).synchronous(SqliteSynchronous::Full);
                // One connection for a private in-memory database: they would not share it.
                let size = if matches!(target, Target::Memory) { 1 } else { size };
                let _ = warm;
                Pool::Sqlite(options(config, size).connect_lazy_with(opts))
            }
            #[allow(unreachable_patterns)]
            (_, dialect) => {
                return Err(LockError::InvalidInput(format!("{} is not compiled into dlock-sql", dialect.name())))
            }
        })
    }

    /// Runs one statement with its parameters. A statement the database rolled back as a
    /// deadlock victim or a serialization failure changed nothing, so it is sent again
    /// (a few times, after a short jittered pause).
    pub(crate) async fn run(&self, stmt: &Stmt, args: Args<'_>) -> Result<Answer, LockError> {
        let mut retry = RollbackRetry::default();
        loop {
            match self.run_raw(stmt, args).await {
                Err(err) if retry.again(&err).await => {}
                outcome => return outcome.map_err(lock_error),
            }
        }
    }

    async fn run_raw(&self, stmt: &Stmt, args: Args<'_>) -> Result<Answer, sqlx::Error> {
        match self {
            #[cfg(feature = "postgres")]
            Pool::Postgres(pool) => run_on!(sqlx::Postgres, pool, stmt, args, |_| 0),
            #[cfg(feature = "postgres")]
            Pool::PostgresPooled(pool) => {
                let mut tx = pool.begin().await?;
                let answer: Result<Answer, sqlx::Error> = run_on!(sqlx::Postgres, &mut *tx, stmt, args, |_| 0, false);
                let answer = answer?;
                tx.commit().await?;
                Ok(answer)
            }
            #[cfg(feature = "mysql")]
            Pool::MySql(pool) => {
                run_on!(sqlx::MySql, pool, stmt, args, |done: &sqlx::mysql::MySqlQueryResult| done.last_insert_id())
            }
            #[cfg(feature = "sqlite")]
            Pool::Sqlite(pool) => run_on!(sqlx::Sqlite, pool, stmt, args, |_| 0),
        }
    }

    /// Runs `body` in a transaction on one connection, and commits what it did when it
    /// succeeds (a failure rolls it all back). A transaction the database rolled back as a
    /// deadlock victim or a serialization failure changed nothing, so it is run again, as
    /// [`Pool::run`] sends a statement again. SQLite's transaction takes the file's write
    /// lock at its start (`BEGIN IMMEDIATE`): one that read first and wrote later could
    /// fail at its first write when another connection wrote in between.
    pub(crate) async fn transact<T, F>(&self, body: &F) -> Result<T, LockError>
    where
        F: Fn(&mut Tx) -> BoxFuture<'_, Result<T, LockError>> + Sync,
    {
        let mut retry = RollbackRetry::default();
        loop {
            let mut tx = match self.begin().await {
                Ok(tx) => tx,
                Err(err) if retry.again(&err).await => continue,
                Err(err) => return Err(lock_error(err)),
            };
            match body(&mut tx).await {
                Ok(value) => match tx.commit().await {
                    Ok(()) => return Ok(value),
                    Err(err) if retry.again(&err).await => {}
                    Err(err) => return Err(lock_error(err)),
                },
                // Dropping the transaction rolls it back.
                Err(err) => {
                    let rolled_back = tx.rolled_back;
                    drop(tx);
                    if !retry.again_if(rolled_back, &err).await {
                        return Err(err);
                    }
                }
            }
        }
    }

    async fn begin(&self) -> Result<Tx, sqlx::Error> {
        let conn = match self {
            #[cfg(feature = "postgres")]
            Pool::Postgres(pool) | Pool::PostgresPooled(pool) => TxConn::Postgres(pool.begin().await?),
            #[cfg(feature = "mysql")]
            Pool::MySql(pool) => TxConn::MySql(pool.begin().await?),
            #[cfg(feature = "sqlite")]
            Pool::Sqlite(pool) => TxConn::Sqlite(pool.begin_with("BEGIN IMMEDIATE").await?),
        };
        Ok(Tx { conn, persistent: !self.is_pooled(), rolled_back: false })
    }

    /// The same pool, used as behind a transaction pooler if `pooled`.
    fn pooled(self, pooled: bool) -> Self {
        let _ = pooled;
        match self {
            #[cfg(feature = "postgres")]
            Pool::Postgres(pool) if pooled => Pool::PostgresPooled(pool),
            other => other,
        }
    }

    /// Whether this is PostgreSQL behind a transaction pooler.
    fn is_pooled(&self) -> bool {
        #[cfg(feature = "postgres")]
        if let Pool::PostgresPooled(_) = self {
            return true;
        }
        false
    }

    /// Whether this is an SQLite pool.
    pub(crate) fn is_sqlite(&self) -> bool {
        match self {
            #[cfg(feature = "sqlite")]
            Pool::Sqlite(_) => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The server's `VERSION()`.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) async fn version(&self) -> Result<String, LockError> {
        match self {
            #[cfg(feature = "mysql")]
            Pool::MySql(pool) => {
                let sql = AssertSqlSafe("SELECT VERSION()".to_string());
                let version: Vec<u8> = sqlx::query_scalar(sql).fetch_one(pool).await.map_err(lock_error)?;
                Ok(String::from_utf8_lossy(&version).into_owned())
            }
            #[allow(unreachable_patterns)]
            _ => Err(LockError::backend("VERSION() is only read on MySQL and MariaDB")),
        }
    }

    /// Runs DDL (or any statement without parameters).
    pub(crate) async fn run_plain(&self, sql: &str) -> Result<(), sqlx::Error> {
        let sql = AssertSqlSafe(Arc::<str>::from(sql));
        match self {
            #[cfg(feature = "postgres")]
            Pool::Postgres(pool) => sqlx::query(sql).execute(pool).await.map(drop),
            // The simple protocol: one round trip, nothing prepared.
            #[cfg(feature = "postgres")]
            Pool::PostgresPooled(pool) => sqlx::raw_sql(sql).execute(pool).await.map(drop),
            #[cfg(feature = "mysql")]
            Pool::MySql(pool) => sqlx::query(sql).execute(pool).await.map(drop),
            #[cfg(feature = "sqlite")]
            Pool::Sqlite(pool) => sqlx::query(sql).execute(pool).await.map(drop),
        }
    }

    /// Closes every connection; later calls fail with `Unavailable`.
    pub(crate) async fn close(&self) {
        match self {
            #[cfg(feature = "postgres")]
            Pool::Postgres(pool) | Pool::PostgresPooled(pool) => pool.close().await,
            #[cfg(feature = "mysql")]
            Pool::MySql(pool) => pool.close().await,
            #[cfg(feature = "sqlite")]
            Pool::Sqlite(pool) => pool.close().await,
        }
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;

    /// A fence increment must be on disk when its statement answers: a power cut must not
    /// take it back (tokens would repeat).
    #[tokio::test]
    async fn sqlite_commits_are_durable() {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = SqlConfig::sqlite_file(dir.path().join("locks.db"));
        let pool = Pool::connect(&config, &Warm::default()).await.expect("connect");
        #[allow(irrefutable_let_patterns)]
        let Pool::Sqlite(pool) = pool
        else {
            unreachable!("an SQLite config makes an SQLite pool")
        };
        let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous").fetch_one(&pool).await.expect("pragma");
        assert_eq!(synchronous, 2, "synchronous is not FULL");
    }
}
