//! [`SqlConfig`]: which database, how to reach it, and how to keep its locks, from a URL.

use std::path::PathBuf;
use std::time::Duration;

use dlock_core::{parse_duration, BackendUrl, ConnectConfig, ConnectOptions, Given, LockError};

use crate::db::Pool;
use crate::tls;

/// The SQL dialects this crate speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// PostgreSQL (`postgres://`, `postgresql://`).
    Postgres,
    /// MySQL 8 or MariaDB 10.5+ (`mysql://`, `mariadb://`).
    MySql,
    /// SQLite 3 (`sqlite://path`, `sqlite::memory:`).
    Sqlite,
}

impl Dialect {
    /// A short name, such as `"postgres"`.
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Postgres => "postgres",
            Dialect::MySql => "mysql",
            Dialect::Sqlite => "sqlite",
        }
    }

    fn enabled(self) -> bool {
        match self {
            Dialect::Postgres => cfg!(feature = "postgres"),
            Dialect::MySql => cfg!(feature = "mysql"),
            Dialect::Sqlite => cfg!(feature = "sqlite"),
        }
    }
}

/// Which kind of lock a URL asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LockKind {
    /// A row of the lease table per lock (the default): ttl, fencing, re-entrancy.
    #[default]
    Lease,
    /// The database's session-held advisory locks (`pg_try_advisory_lock`, `GET_LOCK`).
    Advisory,
}

/// Where the database is: a server address or an SQLite file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// The database URL handed to sqlx, without this crate's options.
    Server(String),
    /// An SQLite file.
    File(PathBuf),
    /// A private in-memory SQLite database (one per connect).
    Memory,
    /// The application's own pool: its connections are used for the lock statements, and
    /// it is never closed by this crate.
    Given(Given<Pool>),
}

/// How to reach a SQL database and keep locks in it.
///
/// URLs: `postgres://user:pass@host:5432/db`, `mysql://user:pass@host:3306/db` (MariaDB too,
/// also as `mariadb://`), `sqlite://path/to/file.db` (relative), `sqlite:///abs/file.db`,
/// `sqlite::memory:`. Query options: the common `connect_timeout`, `op_timeout` and `prefix`
/// (the lock table is `<prefix>_leases`, stored results are in `<prefix>_results`, shared
/// holds and permits in `<prefix>_holds`; letters,
/// digits and `_` only; see
/// [`ConnectConfig`]), and `pool_size` (connections per client, default 10),
/// `create_table` (`true`/`false`, default `true`: create the tables if missing), `lock`
/// (`lease` or `advisory`), `busy_timeout` (SQLite: how long a statement waits for the
/// file's write lock, default the operation timeout), `keep_idle` (how long the row of a
/// name nobody uses any more is kept after its last hold ended, default an hour; see
/// [`ConnectConfig::with_keep_idle`]), `pooler` (`transaction` behind PgBouncer's
/// transaction mode: see [`SqlConfig::with_transaction_pooler`]), and the TLS options in
/// each database's own names (PostgreSQL: `sslmode`, `sslrootcert`, `sslcert`, `sslkey`;
/// MySQL: `ssl-mode`, `ssl-ca`, `ssl-cert`, `ssl-key`). Durations read as `500ms`, `5s`,
/// `2m`, `1h`. Unknown options are rejected.
///
/// ```
/// use std::time::Duration;
/// use dlock_core::ConnectConfig;
/// use dlock_sql::{Dialect, SqlConfig};
///
/// let config = SqlConfig::from_url("postgres://app@db:5432/shop?prefix=shop&pool_size=4&op_timeout=2s")?
///     .with_credentials("app", "secret");
/// assert_eq!(config.dialect(), Dialect::Postgres);
/// assert_eq!(config.table(), "shop_leases");
/// assert_eq!(config.results_table(), "shop_results");
/// assert_eq!(config.pool_size(), 4);
/// assert_eq!(config.op_timeout(), Duration::from_secs(2));
///
/// let embedded = SqlConfig::from_url("sqlite://locks.db?keep_idle=2h")?.with_pool_size(2);
/// assert_eq!(embedded.dialect(), Dialect::Sqlite);
/// assert_eq!(embedded.keep_idle(), Duration::from_secs(7200));
/// # Ok::<(), dlock_core::LockError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct SqlConfig {
    pub(crate) dialect: Dialect,
    pub(crate) target: Target,
    pub(crate) common: ConnectOptions,
    pub(crate) pool_size: u32,
    pub(crate) create_table: bool,
    pub(crate) kind: LockKind,
    pub(crate) busy_timeout: Option<Duration>,
    pub(crate) credentials: Option<(String, String)>,
    /// TLS options of the URL, in the database's own names, handed on to the driver.
    pub(crate) tls: Vec<(String, String)>,
    /// The server is reached through a transaction pooler (PgBouncer's transaction mode).
    pub(crate) transaction_pooler: bool,
}

impl std::fmt::Debug for SqlConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Neither the URL's password nor the credentials' is printed.
        let target = match &self.target {
            Target::Server(url) => format!("Server({})", dlock_core::redact(url)),
            other => format!("{other:?}"),
        };
        f.debug_struct("SqlConfig")
            .field("dialect", &self.dialect)
            .field("target", &target)
            .field("common", &self.common)
            .field("pool_size", &self.pool_size)
            .field("create_table", &self.create_table)
            .field("kind", &self.kind)
            .field("busy_timeout", &self.busy_timeout)
            .field("user", &self.credentials.as_ref().map(|(user, _)| user))
            .field("tls", &self.tls)
            .field("transaction_pooler", &self.transaction_pooler)
            .finish()
    }
}

impl ConnectConfig for SqlConfig {
    fn common(&self) -> &ConnectOptions {
        &self.common
    }

    fn common_mut(&mut self) -> &mut ConnectOptions {
        &mut self.common
    }
}

impl SqlConfig {
    /// Parses a URL (see the type's docs). `InvalidInput` on a bad URL or option, or on a
    /// database whose cargo feature is not enabled.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let (common, rest) = ConnectOptions::from_query(query)?;
        let (dialect, target) = parse_target(base)?;
        let mut config = SqlConfig::new(dialect, target);
        config.common = common;
        config.check_prefix()?;
        for (key, value) in rest {
            match key.as_str() {
                "pool_size" => {
                    let size: u32 = value.parse().map_err(|_| bad_option(&key, &value))?;
                    if size == 0 || size > 10_000 {
                        return Err(bad_option(&key, &value));
                    }
                    config = config.with_pool_size(size);
                }
                "create_table" => {
                    config.create_table = match value.as_str() {
                        "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => false,
                        _ => return Err(bad_option(&key, &value)),
                    }
                }
                "lock" => {
                    config.kind = match value.as_str() {
                        "lease" => LockKind::Lease,
                        "advisory" => LockKind::Advisory,
                        _ => return Err(bad_option(&key, &value)),
                    }
                }
                "busy_timeout" => config.busy_timeout = Some(parse_duration(&value)?),
                "pooler" => {
                    config.transaction_pooler = match value.as_str() {
                        "transaction" => true,
                        "session" | "none" => false,
                        _ => return Err(bad_option(&key, &value)),
                    }
                }
                _ if tls::is_option(dialect, &key) => {
                    tls::check(dialect, &key, &value)?;
                    config.tls.push((key, value));
                }
                _ => return Err(LockError::InvalidInput(unknown_option(dialect, &key))),
            }
        }
        if config.kind == LockKind::Advisory && dialect == Dialect::Sqlite {
            return Err(LockError::InvalidInput("SQLite has no advisory locks; use lock=lease".into()));
        }
        if config.transaction_pooler && dialect != Dialect::Postgres {
            return Err(LockError::InvalidInput("pooler=transaction is for PostgreSQL behind PgBouncer".into()));
        }
        Ok(config)
    }

    /// An SQLite database in a file (created if missing).
    pub fn sqlite_file(path: impl Into<PathBuf>) -> Self {
        SqlConfig::new(Dialect::Sqlite, Target::File(path.into()))
    }

    /// A private in-memory SQLite database, for tests: it lives as long as the client.
    pub fn sqlite_memory() -> Self {
        SqlConfig::new(Dialect::Sqlite, Target::Memory)
    }

    /// Locks in the database of the application's own PostgreSQL pool (sqlx 0.9, also
    /// re-exported as [`crate::sqlx`]).
    ///
    /// The lease-table client runs its statements on the pool's connections (at most as
    /// many as the pool allows; waiters hold none while they wait) and opens one more
    /// connection of its own, with the pool's connect options, to `LISTEN` for releases.
    /// An advisory client (`with_lock_kind(LockKind::Advisory)`) uses the pool for its
    /// tables and opens one session per lock it holds, also with the pool's options (see
    /// [`with_pool_size`](Self::with_pool_size) for how many it keeps idle). The pool's
    /// options (TLS, credentials, size) are the pool's: the URL options of this crate
    /// that set them do not apply, and dropping or closing the client never closes the pool.
    ///
    /// ```no_run
    /// use dlock_sql::{sqlx::PgPool, SqlConfig};
    /// use dlock_core::{ConnectConfig, LockName, LockOptions, Locker};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = PgPool::connect("postgres://app@db/shop?sslmode=verify-full").await?;
    /// let locker = dlock_sql::connect(SqlConfig::from_pg_pool(pool.clone()).with_prefix("shop")).await?;
    /// let lease = locker.acquire(&LockName::new("orders/42")?, &LockOptions::new()).await?;
    /// // ... the same pool serves the application's own queries ...
    /// lease.release().await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    pub fn from_pg_pool(pool: sqlx::PgPool) -> Self {
        SqlConfig::new(Dialect::Postgres, Target::Given(Given::new(Pool::Postgres(pool))))
    }

    /// Locks in the database of the application's own MySQL/MariaDB pool; as
    /// [`from_pg_pool`](Self::from_pg_pool), except that waiters poll (MySQL has no
    /// `LISTEN`), so the client opens no connection of its own for the lease table.
    #[cfg(feature = "mysql")]
    pub fn from_mysql_pool(pool: sqlx::MySqlPool) -> Self {
        SqlConfig::new(Dialect::MySql, Target::Given(Given::new(Pool::MySql(pool))))
    }

    /// Locks in the application's own SQLite pool; as [`from_pg_pool`](Self::from_pg_pool),
    /// except that waiters poll and the client opens no connection of its own. The pool's
    /// busy timeout is the pool's (set it with `SqliteConnectOptions::busy_timeout`).
    #[cfg(feature = "sqlite")]
    pub fn from_sqlite_pool(pool: sqlx::SqlitePool) -> Self {
        SqlConfig::new(Dialect::Sqlite, Target::Given(Given::new(Pool::Sqlite(pool))))
    }

    fn new(dialect: Dialect, target: Target) -> Self {
        SqlConfig {
            dialect,
            target,
            common: ConnectOptions::default(),
            pool_size: 10,
            create_table: true,
            kind: LockKind::Lease,
            busy_timeout: None,
            credentials: None,
            tls: Vec::new(),
            transaction_pooler: false,
        }
    }

    /// Checks the common options ([`ConnectOptions::validate`]) and the table prefix
    /// ([`ConnectConfig::with_prefix`]): letters, digits and `_`, starting with a letter or
    /// `_`, at most 40 bytes; anything else is `InvalidInput`. The URL parser and every
    /// connect check it.
    pub(crate) fn check_prefix(&self) -> Result<(), LockError> {
        self.common.validate()?;
        let prefix = &self.common.prefix;
        let valid = !prefix.is_empty()
            && prefix.len() <= 40
            && prefix.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !prefix.as_bytes()[0].is_ascii_digit();
        if valid {
            Ok(())
        } else {
            Err(LockError::InvalidInput(format!(
                "SQL table prefix {prefix:?} must be 1-40 letters, digits or '_', not starting with a digit"
            )))
        }
    }

    /// Connections in each client's pool (default 10; at least 1). An advisory client also
    /// opens one more connection per lock it holds.
    pub fn with_pool_size(mut self, size: u32) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// Whether `connect` creates the tables when they are missing (default `true`). Turn it
    /// off when the schema is managed by migrations (see [`crate::schema`]).
    pub fn with_create_table(mut self, create: bool) -> Self {
        self.create_table = create;
        self
    }

    /// Says that the database is reached through a transaction pooler (PgBouncer with
    /// `pool_mode = transaction`, or a proxy that works the same way; URL option
    /// `pooler=transaction`), where each transaction may run on another server session,
    /// so nothing of a session may be relied on. The lease table then sends its
    /// statements unprepared (the pooler would mix up prepared statements between
    /// clients), and its waiters poll (a `LISTEN` through the pooler would listen on a
    /// session that is soon someone else's). Advisory locks, which are held by a session,
    /// refuse to connect. PostgreSQL only; behind a pooler in session mode, leave it off.
    /// See `docs/poolers.md`.
    pub fn with_transaction_pooler(mut self, pooler: bool) -> Self {
        self.transaction_pooler = pooler;
        self
    }

    /// See [`with_transaction_pooler`](Self::with_transaction_pooler).
    pub fn transaction_pooler(&self) -> bool {
        self.transaction_pooler
    }

    /// The kind of lock [`crate::connect_any`] makes.
    pub fn with_lock_kind(mut self, kind: LockKind) -> Self {
        self.kind = kind;
        self
    }

    /// SQLite: how long a statement waits for the write lock of the file (default: the
    /// operation timeout).
    pub fn with_busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = Some(timeout);
        self
    }

    /// The user name and password to log in with (PostgreSQL, MySQL/MariaDB), in place of
    /// the URL's. SQLite has no users: a connect with credentials is `InvalidInput`.
    pub fn with_credentials(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials = Some((user.into(), password.into()));
        self
    }

    /// The database kind.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The lease table's name.
    pub fn table(&self) -> String {
        format!("{}_leases", self.common.prefix)
    }

    /// The table of the advisory client's fence counters and idle rows.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) fn advisory_table(&self) -> String {
        format!("{}_advisory", self.common.prefix)
    }

    /// The name of the table beside the lease table that keeps stored results.
    pub fn results_table(&self) -> String {
        format!("{}_results", self.common.prefix)
    }

    /// The name of the table beside the lease table that keeps the shared holds and
    /// semaphore permits (and the places of waiting writers).
    pub fn holds_table(&self) -> String {
        format!("{}_holds", self.common.prefix)
    }

    /// See [`with_pool_size`](Self::with_pool_size).
    pub fn pool_size(&self) -> u32 {
        self.pool_size
    }

    /// See [`with_create_table`](Self::with_create_table).
    pub fn create_table(&self) -> bool {
        self.create_table
    }

    /// See [`with_lock_kind`](Self::with_lock_kind).
    pub fn lock_kind(&self) -> LockKind {
        self.kind
    }

    /// See [`with_busy_timeout`](Self::with_busy_timeout): the busy timeout SQLite
    /// statements use.
    pub fn busy_timeout(&self) -> Duration {
        self.busy_timeout.unwrap_or(self.common.op_timeout)
    }

    /// Where the database and `table` are, without credentials: `postgres://host:5432/db
    /// table <table>`, `sqlite:///abs/path.db table <table>` (the file's canonical path once
    /// it exists). Each private in-memory SQLite database is told apart by a number.
    pub(crate) fn describe(&self, table: &str) -> String {
        let place = match &self.target {
            Target::Server(url) => {
                let default_port = if self.dialect == Dialect::MySql { 3306 } else { 5432 };
                match BackendUrl::parse(url, default_port) {
                    Ok(url) => {
                        let hosts: Vec<String> = url.hosts.iter().map(ToString::to_string).collect();
                        format!("{}://{}{}", url.scheme, hosts.join(","), url.path)
                    }
                    Err(_) => dlock_core::redact(url),
                }
            }
            Target::File(path) => {
                let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
                format!("sqlite://{}", path.display())
            }
            Target::Memory => {
                static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
                format!("sqlite::memory: #{}", NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
            }
            Target::Given(given) => given.get().describe(),
        };
        format!("{place} table {table}")
    }

    /// The user name given by [`with_credentials`](Self::with_credentials), if any.
    pub fn user(&self) -> Option<&str> {
        self.credentials.as_ref().map(|(user, _)| user.as_str())
    }
}

fn unknown_option(dialect: Dialect, key: &str) -> String {
    let tls = match dialect {
        Dialect::Postgres => " (TLS options: sslmode, sslrootcert, sslcert, sslkey)",
        Dialect::MySql => " (TLS options: ssl-mode, ssl-ca, ssl-cert, ssl-key)",
        Dialect::Sqlite => "",
    };
    format!("unknown option {key:?} in a SQL URL{tls}")
}

fn bad_option(key: &str, value: &str) -> LockError {
    LockError::InvalidInput(format!("bad value {value:?} for SQL URL option {key:?}"))
}

fn parse_target(base: &str) -> Result<(Dialect, Target), LockError> {
    let (scheme, rest) = base.split_once(':').ok_or_else(|| {
        LockError::InvalidInput(format!("{base:?} is not a SQL URL (postgres://, mysql://, sqlite://)"))
    })?;
    let (dialect, target) = match scheme {
        "postgres" | "postgresql" => (Dialect::Postgres, server_url("postgres", rest)?),
        "mysql" | "mariadb" => (Dialect::MySql, server_url("mysql", rest)?),
        "sqlite" => {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            let target = match path {
                ":memory:" => Target::Memory,
                "" => return Err(LockError::InvalidInput("an SQLite URL needs a file path".into())),
                path => Target::File(PathBuf::from(dlock_core::percent_decode(path)?)),
            };
            (Dialect::Sqlite, target)
        }
        other => return Err(LockError::InvalidInput(format!("unknown SQL URL scheme {other:?}"))),
    };
    if !dialect.enabled() {
        return Err(LockError::InvalidInput(format!("dlock-sql was built without its {:?} feature", dialect.name())));
    }
    Ok((dialect, target))
}

fn server_url(scheme: &str, rest: &str) -> Result<Target, LockError> {
    let Some(authority) = rest.strip_prefix("//") else {
        return Err(LockError::InvalidInput(format!("a {scheme} URL looks like {scheme}://user@host:port/database")));
    };
    let host = authority.split('/').next().unwrap_or("");
    let host = host.rsplit('@').next().unwrap_or("");
    if host.is_empty() {
        return Err(LockError::InvalidInput(format!("the {scheme} URL has no host")));
    }
    Ok(Target::Server(format!("{scheme}:{rest}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "postgres")]
    #[test]
    fn parses_postgres_urls() {
        let pg = SqlConfig::from_url("postgresql://u:p@h:5/db?connect_timeout=1s").unwrap();
        assert_eq!(pg.target, Target::Server("postgres://u:p@h:5/db".into()));
        assert_eq!(pg.connect_timeout(), Duration::from_secs(1));
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn parses_mysql_urls() {
        let my = SqlConfig::from_url("mariadb://root@127.0.0.1:3306/x?lock=advisory").unwrap();
        assert_eq!((my.dialect, my.kind), (Dialect::MySql, LockKind::Advisory));
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn parses_sqlite_urls() {
        assert_eq!(SqlConfig::from_url("sqlite::memory:").unwrap().target, Target::Memory);
        assert_eq!(SqlConfig::from_url("sqlite://a/b.db").unwrap().target, Target::File("a/b.db".into()));
        assert_eq!(SqlConfig::from_url("sqlite:///a/b.db").unwrap().target, Target::File("/a/b.db".into()));
    }

    #[test]
    fn a_database_not_built_in_names_its_feature() {
        for (url, feature, built) in [
            ("postgres://h/db", "postgres", cfg!(feature = "postgres")),
            ("mysql://h/db", "mysql", cfg!(feature = "mysql")),
            ("sqlite::memory:", "sqlite", cfg!(feature = "sqlite")),
        ] {
            match SqlConfig::from_url(url) {
                Ok(_) => assert!(built, "{url} was accepted without the {feature} feature"),
                Err(LockError::InvalidInput(why)) => {
                    assert!(!built && why.contains(feature), "{url}: {why}");
                }
                Err(other) => panic!("{url}: {other}"),
            }
        }
    }

    #[cfg(all(feature = "postgres", feature = "mysql"))]
    #[test]
    fn describes_the_server_without_credentials() {
        let pg = SqlConfig::from_url("postgresql://app:s3cret@10.0.0.5/shop?prefix=orders").unwrap();
        assert_eq!(pg.describe(&pg.table()), "postgres://10.0.0.5:5432/shop table orders_leases");
        let my = SqlConfig::from_url("mariadb://root:pw@[::1]:3307/x").unwrap().with_credentials("u", "p2");
        let described = my.describe("dlock_advisory");
        assert_eq!(described, "mysql://[::1]:3307/x table dlock_advisory");
        assert!(!described.contains("pw") && !described.contains("p2"));
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn describes_sqlite_by_its_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("a.db"), b"").unwrap();
        let inside = SqlConfig::sqlite_file(dir.path().join("sub/../a.db"));
        let direct = SqlConfig::sqlite_file(dir.path().join("a.db"));
        assert_eq!(inside.describe("t"), direct.describe("t"), "one file, one target");
        assert!(direct.describe("t").ends_with("a.db table t"));
        let memory = SqlConfig::sqlite_memory();
        assert_ne!(memory.describe("t"), memory.describe("t"), "each in-memory database is its own");
    }

    #[test]
    fn reads_the_keep_time() {
        let config = SqlConfig::from_url("sqlite::memory:?keep_idle=90s").unwrap();
        assert_eq!(config.keep_idle(), Duration::from_secs(90));
        assert_eq!(SqlConfig::sqlite_memory().keep_idle(), dlock_core::DEFAULT_KEEP_IDLE);
        assert!(matches!(
            SqlConfig::sqlite_memory().with_keep_idle(Duration::ZERO).check_prefix(),
            Err(LockError::InvalidInput(_))
        ));
        for bad in ["sqlite::memory:?keep_idle=0s", "sqlite::memory:?keep_idle=soon", "sqlite::memory:?keep_idle="] {
            assert!(matches!(SqlConfig::from_url(bad), Err(LockError::InvalidInput(_))), "{bad}");
        }
    }

    #[test]
    fn rejects_bad_urls() {
        for url in [
            "redis://x",
            "postgres:x",
            "postgres:///db",
            "sqlite://",
            "sqlite::memory:?lock=advisory",
            "postgres://h/db?pool_size=0",
            "postgres://h/db?pool_size=x",
            "postgres://h/db?prefix=a-b",
            "postgres://h/db?prefix=1a",
            "postgres://h/db?sslmode=required",
            "postgres://h/db?ssl-mode=REQUIRED",
            "mysql://h/db?sslmode=require",
            "mysql://h/db?ssl-mode=verify-full",
            "sqlite::memory:?sslmode=require",
            "mysql://h/db?create_table=maybe",
        ] {
            assert!(matches!(SqlConfig::from_url(url), Err(LockError::InvalidInput(_))), "{url}");
        }
    }
}
