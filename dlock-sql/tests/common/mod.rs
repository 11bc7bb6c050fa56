//! The fixtures of the SQL backends: PostgreSQL and MariaDB servers started per test (or
//! the servers named by `DLOCK_TEST_POSTGRES_URL` / `DLOCK_TEST_MYSQL_URL`), and SQLite
//! files in a temporary directory.
//!
//! SQLite has no server and no network. Its fixture plays the faults at each client's edge
//! with [`SqlLink`] (every fault, as the in-process reference backend plays them: a statement
//! that got through is applied even when its reply is held back, delayed or lost; a cut
//! closes the client's pool); "stopping the backend" cuts every client's link (as when the disk holding the
//! file goes away: every process's calls fail) and "starting" it restores them, with the
//! file and its fence counters intact. An unreachable SQLite database is a file in a
//! directory that does not exist.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dlock_conformance::{Evict, Fault, Faults, FaultyClient, Fixture, Link, Restart, Storage, Timing};
use dlock_core::{ConnectConfig, LockError, LockName, Locker};
use dlock_sql::{Dialect, SqlConfig, SqlLink, SqlLocker};
use dlock_testkit::proxy::FaultProxy;
use dlock_testkit::supervisor::mariadb::MariaDbServer;
use dlock_testkit::supervisor::postgres::PostgresServer;
use dlock_testkit::supervisor::{external_url, free_port};

/// Which database a fixture runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Postgres,
    MariaDb,
    Sqlite,
}

enum Server {
    Postgres(PostgresServer),
    MariaDb(MariaDbServer),
}

/// A database under test and the means to hurt it.
pub(crate) struct SqlFixture {
    db: Kind,
    url: String,
    addr: Option<SocketAddr>,
    server: Mutex<Option<Server>>,
    _dir: Option<tempfile::TempDir>,
    admin: SqlLocker,
    links: Mutex<Vec<SqlLink>>,
    proxies: Mutex<Vec<FaultProxy>>,
}

/// Short, but not so short that a statement on a machine shared with other test runs
/// times out.
pub(crate) const OP_TIMEOUT: Duration = Duration::from_secs(2);

/// Opening a connection to a server that is starting up on a loaded machine can take a
/// while; a lock operation may not.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the fixtures' clients keep an idle name's row.
pub(crate) const IDLE: Duration = Duration::from_secs(1);

/// Every table a locker with the default prefix writes.
const TABLES: [&str; 5] = ["dlock_leases", "dlock_results", "dlock_holds", "dlock_advisory", "dlock_advisory_results"];

/// Room for the many sessions the advisory tests open.
const MAX_CONNECTIONS: u32 = 1200;

impl SqlFixture {
    pub(crate) async fn new(db: Kind) -> Self {
        let (url, addr, server, dir) = match db {
            Kind::Postgres | Kind::MariaDb => {
                let kind = if db == Kind::Postgres { "postgres" } else { "mysql" };
                match external_url(kind) {
                    Some(url) => {
                        let addr = authority(&url);
                        (url, addr, None, None)
                    }
                    None => {
                        let server = tokio::task::spawn_blocking(move || match db {
                            Kind::Postgres => PostgresServer::start(MAX_CONNECTIONS).map(Server::Postgres),
                            _ => MariaDbServer::start(MAX_CONNECTIONS).map(Server::MariaDb),
                        })
                        .await
                        .expect("server start task")
                        .expect("start the database server");
                        let (url, addr) = match &server {
                            Server::Postgres(s) => (s.url(), s.addr()),
                            Server::MariaDb(s) => (s.url(), s.addr()),
                        };
                        (url, Some(addr), Some(server), None)
                    }
                }
            }
            Kind::Sqlite => {
                let dir = tempfile::Builder::new().prefix("dlock-sqlite-").tempdir().expect("temp dir");
                let url = format!("sqlite://{}", dir.path().join("locks.db").display());
                (url, None, None, Some(dir))
            }
        };
        // A server that just started may drop the first connections while it finishes
        // starting up on a busy machine: wait for it to answer.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let admin = loop {
            match dlock_sql::connect(config(&url)).await {
                Ok(admin) => break admin,
                Err(e) if e.is_transient() && std::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("connect the admin client: {e}"),
            }
        };
        SqlFixture {
            db,
            url,
            addr,
            server: Mutex::new(server),
            _dir: dir,
            admin,
            links: Mutex::new(Vec::new()),
            proxies: Mutex::new(Vec::new()),
        }
    }

    /// How many rows the lock tables keep for names that start with `prefix` (a table the
    /// fixture's lockers have not made yet counts none).
    pub(crate) async fn records(&self, prefix: &str) -> usize {
        // Test names have no LIKE wildcards but `_`, which only widens the match.
        let pattern = format!("{prefix}%");
        let mut total = 0usize;
        for table in TABLES {
            let sql = format!("SELECT COUNT(*) FROM {table} WHERE name LIKE ?");
            let count: Result<i64, sqlx::Error> = match self.db {
                #[cfg(feature = "postgres")]
                Kind::Postgres => {
                    let pool = sqlx::PgPool::connect(&self.url).await.expect("connect");
                    let sql = sql.replace('?', "$1");
                    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.clone())).bind(&pattern).fetch_one(&pool).await
                }
                #[cfg(feature = "mysql")]
                Kind::MariaDb => {
                    let pool = sqlx::MySqlPool::connect(&self.url).await.expect("connect");
                    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.clone())).bind(&pattern).fetch_one(&pool).await
                }
                #[cfg(feature = "sqlite")]
                Kind::Sqlite => {
                    let pool = sqlx::SqlitePool::connect(&self.url).await.expect("connect");
                    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.clone())).bind(&pattern).fetch_one(&pool).await
                }
                #[allow(unreachable_patterns)]
                _ => panic!("{:?} is not compiled in", self.db),
            };
            match count {
                Ok(count) => total += usize::try_from(count).expect("a count"),
                Err(sqlx::Error::Database(e)) if missing_table(e.message()) => {}
                Err(e) => panic!("count the rows of {table}: {e}"),
            }
        }
        total
    }

    /// The first column of the first row `sql` answers (a query without parameters, in
    /// the fixture's dialect), or `None` when it answers no row or a NULL.
    pub(crate) async fn scalar(&self, sql: &str) -> Option<i64> {
        let sql = sqlx::AssertSqlSafe(sql.to_string());
        let found: Result<Option<Option<i64>>, sqlx::Error> = match self.db {
            #[cfg(feature = "postgres")]
            Kind::Postgres => {
                let pool = sqlx::PgPool::connect(&self.url).await.expect("connect");
                sqlx::query_scalar(sql).fetch_optional(&pool).await
            }
            #[cfg(feature = "mysql")]
            Kind::MariaDb => {
                let pool = sqlx::MySqlPool::connect(&self.url).await.expect("connect");
                sqlx::query_scalar(sql).fetch_optional(&pool).await
            }
            #[cfg(feature = "sqlite")]
            Kind::Sqlite => {
                let pool = sqlx::SqlitePool::connect(&self.url).await.expect("connect");
                sqlx::query_scalar(sql).fetch_optional(&pool).await
            }
            #[allow(unreachable_patterns)]
            _ => panic!("{:?} is not compiled in", self.db),
        };
        found.unwrap_or_else(|e| panic!("{e}")).flatten()
    }

    /// Microseconds since the epoch on the database's clock, as an SQL expression.
    pub(crate) fn now_us(&self) -> &'static str {
        match self.db {
            Kind::Postgres => "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::bigint",
            Kind::MariaDb => "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)",
            Kind::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)",
        }
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    pub(crate) fn dialect(&self) -> Dialect {
        match self.db {
            Kind::Postgres => Dialect::Postgres,
            Kind::MariaDb => Dialect::MySql,
            Kind::Sqlite => Dialect::Sqlite,
        }
    }

    pub(crate) fn admin(&self) -> &SqlLocker {
        &self.admin
    }

    pub(crate) async fn lease_client(&self) -> SqlLocker {
        let client = dlock_sql::connect(config(&self.url)).await.expect("connect a client");
        self.links.lock().unwrap().push(client.backend().link());
        client
    }

    /// A URL to the server through a new fault proxy, and the proxy's link.
    pub(crate) async fn proxied_url(&self) -> (String, Box<dyn Link>) {
        let addr = self.addr.expect("a server address");
        let proxy = FaultProxy::start(addr).await.expect("start a fault proxy");
        let url = self.url.replacen(&addr.to_string(), &proxy.addr().to_string(), 1);
        let link = Box::new(proxy.link());
        self.proxies.lock().unwrap().push(proxy);
        (url, link)
    }

    /// Why the backend cannot be stopped, if it cannot: an external server.
    pub(crate) fn cannot_restart(&self) -> Option<String> {
        let external = self.db != Kind::Sqlite && self.server.lock().unwrap().is_none();
        external.then(|| "DLOCK_TEST_POSTGRES_URL / DLOCK_TEST_MYSQL_URL names a server the tests cannot kill".into())
    }

    pub(crate) fn kill(&self) {
        match self.server.lock().unwrap().as_mut().expect("a local server (not DLOCK_TEST_*_URL)") {
            Server::Postgres(s) => s.kill(),
            Server::MariaDb(s) => s.kill(),
        }
    }

    pub(crate) fn start_again(&self) {
        match self.server.lock().unwrap().as_mut().expect("a local server (not DLOCK_TEST_*_URL)") {
            Server::Postgres(s) => s.start_again(),
            Server::MariaDb(s) => s.start_again(),
        }
        .expect("restart the database server");
    }

    pub(crate) fn cut_all(&self, cut: bool) {
        for link in self.links.lock().unwrap().iter() {
            if cut {
                link.cut();
            } else {
                link.restore();
            }
        }
    }

    pub(crate) async fn lease_faulty(&self) -> FaultyClient {
        if self.db == Kind::Sqlite {
            let client = self.lease_client().await;
            let link = client.backend().link();
            return FaultyClient { locker: Arc::new(client), link: Box::new(SqliteLink(link)) };
        }
        let (url, link) = self.proxied_url().await;
        let client = dlock_sql::connect(config(&url)).await.expect("connect through the proxy");
        FaultyClient { locker: Arc::new(client), link }
    }

    pub(crate) fn unreachable_url(&self) -> String {
        match self.db {
            Kind::Sqlite => "sqlite:///nonexistent-dlock-dir/for/sure/locks.db".to_string(),
            Kind::Postgres => format!("postgres://postgres@127.0.0.1:{}/postgres", free_port().expect("port")),
            Kind::MariaDb => format!("mysql://root@127.0.0.1:{}/dlock", free_port().expect("port")),
        }
    }
}

/// The fixtures' client settings: short operation and connect timeouts, and idle names
/// kept for [`IDLE`].
pub(crate) fn config(url: &str) -> SqlConfig {
    SqlConfig::from_url(url)
        .expect("url")
        .with_op_timeout(OP_TIMEOUT)
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_pool_size(10)
        .with_keep_idle(IDLE)
}

/// Whether a database error says the table does not exist (PostgreSQL, MariaDB, SQLite).
fn missing_table(message: &str) -> bool {
    message.contains("does not exist") || message.contains("doesn't exist") || message.contains("no such table")
}

/// `host:port` of a server URL.
fn authority(url: &str) -> Option<SocketAddr> {
    let rest = url.split_once("://")?.1;
    let host = rest.split('/').next()?.rsplit('@').next()?;
    use std::net::ToSocketAddrs;
    host.to_socket_addrs().ok()?.next()
}

struct SqliteLink(SqlLink);

impl Link for SqliteLink {
    fn set(&self, fault: Fault) {
        self.0.set(fault);
    }
}

/// The lease-table locker on one database.
pub(crate) struct LeaseFixture(pub SqlFixture);

impl LeaseFixture {
    pub(crate) async fn new(db: Kind) -> Self {
        LeaseFixture(SqlFixture::new(db).await)
    }
}

#[async_trait]
impl Fixture for LeaseFixture {
    fn timing(&self) -> Timing {
        // Renewals every 667 ms with 1.3 s to spare: reliable while other test processes
        // keep the database servers and the two cores busy.
        Timing { ttl: Duration::from_secs(2), margin: Duration::from_secs(4), op_timeout: OP_TIMEOUT, idle: IDLE }
    }

    async fn client(&self) -> Arc<dyn Locker> {
        Arc::new(self.0.lease_client().await)
    }
}

#[async_trait]
impl Evict for LeaseFixture {
    async fn evict(&self, name: &LockName) {
        self.0.admin.backend().evict(name).await.expect("evict");
    }
}

#[async_trait]
impl Storage for LeaseFixture {
    async fn records(&self, prefix: &str) -> usize {
        self.0.records(prefix).await
    }
}

#[async_trait]
impl Faults for LeaseFixture {
    async fn faulty_client(&self) -> FaultyClient {
        self.0.lease_faulty().await
    }

    async fn unreachable_client(&self, timeout: Duration) -> Result<Arc<dyn Locker>, LockError> {
        let config =
            SqlConfig::from_url(&self.0.unreachable_url())?.with_op_timeout(timeout).with_connect_timeout(timeout);
        Ok(Arc::new(dlock_sql::connect(config).await?))
    }
}

#[async_trait]
impl Restart for LeaseFixture {
    fn cannot_restart(&self) -> Option<String> {
        self.0.cannot_restart()
    }

    async fn stop_backend(&self) {
        match self.0.db {
            Kind::Sqlite => self.0.cut_all(true),
            _ => self.0.kill(),
        }
    }

    async fn start_backend(&self) {
        match self.0.db {
            Kind::Sqlite => self.0.cut_all(false),
            _ => tokio::task::block_in_place(|| self.0.start_again()),
        }
    }
}

/// The advisory clients' settings: an acquire may open a session, which on PostgreSQL
/// starts a server process; on a loaded machine that takes longer than a statement.
/// Operation timeout of the advisory fixtures' clients.
pub(crate) const ADVISORY_OP_TIMEOUT: Duration = Duration::from_secs(4);

pub(crate) fn advisory_config(url: &str) -> SqlConfig {
    config(url).with_op_timeout(ADVISORY_OP_TIMEOUT)
}

/// The advisory-lock locker on one database.
pub(crate) struct AdvisoryFixture(pub SqlFixture);

impl AdvisoryFixture {
    pub(crate) async fn new(db: Kind) -> Self {
        AdvisoryFixture(SqlFixture::new(db).await)
    }
}

#[async_trait]
impl Fixture for AdvisoryFixture {
    fn timing(&self) -> Timing {
        // Each held lock is a session of its own, opened on demand (on PostgreSQL a new
        // server process) and pinged within the ttl: holding a thousand of them at once on a
        // machine shared with other test runs needs more room than the lease table.
        Timing {
            ttl: Duration::from_secs(6),
            margin: Duration::from_secs(8),
            op_timeout: ADVISORY_OP_TIMEOUT,
            idle: IDLE,
        }
    }

    async fn client(&self) -> Arc<dyn Locker> {
        let client = dlock_sql::connect_advisory(advisory_config(&self.0.url)).await.expect("connect a client");
        Arc::new(client)
    }
}

#[async_trait]
impl Evict for AdvisoryFixture {
    async fn evict(&self, name: &LockName) {
        let admin = dlock_sql::connect_advisory(advisory_config(&self.0.url)).await.expect("connect the admin client");
        admin.backend().evict(name).await.expect("evict");
    }
}

#[async_trait]
impl Storage for AdvisoryFixture {
    async fn records(&self, prefix: &str) -> usize {
        self.0.records(prefix).await
    }
}

#[async_trait]
impl Faults for AdvisoryFixture {
    async fn faulty_client(&self) -> FaultyClient {
        let (url, link) = self.0.proxied_url().await;
        let client = dlock_sql::connect_advisory(advisory_config(&url)).await.expect("connect through the proxy");
        FaultyClient { locker: Arc::new(client), link }
    }

    async fn unreachable_client(&self, timeout: Duration) -> Result<Arc<dyn Locker>, LockError> {
        let config =
            SqlConfig::from_url(&self.0.unreachable_url())?.with_op_timeout(timeout).with_connect_timeout(timeout);
        Ok(Arc::new(dlock_sql::connect_advisory(config).await?))
    }
}

#[async_trait]
impl Restart for AdvisoryFixture {
    fn cannot_restart(&self) -> Option<String> {
        self.0.cannot_restart()
    }

    async fn stop_backend(&self) {
        self.0.kill();
    }

    async fn start_backend(&self) {
        tokio::task::block_in_place(|| self.0.start_again());
    }
}
