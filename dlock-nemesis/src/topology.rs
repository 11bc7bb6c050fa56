//! The servers a run starts, and how a client's URL names them (through its proxies).

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

use dlock_testkit::supervisor::etcd::{EtcdConfig, EtcdServer};
use dlock_testkit::supervisor::mariadb::MariaDbServer;
use dlock_testkit::supervisor::postgres::PostgresServer;
use dlock_testkit::supervisor::redis::{RedisConfig, RedisMasters, RedisServer};
use dlock_testkit::supervisor::zookeeper::ZooKeeperServer;

/// The topologies `--topology` names.
pub(crate) const NAMES: &[&str] = &["sqlite", "postgres", "mariadb", "redis", "redlock", "zk", "etcd"];

/// Servers started for one run (or none: SQLite is a file, `--url` is someone else's).
#[derive(Debug)]
pub(crate) enum Topology {
    /// A URL the run did not start: clients reach it directly.
    External(String),
    /// The database file, in a directory removed when the run ends.
    Sqlite {
        _dir: tempfile::TempDir,
        path: PathBuf,
    },
    Postgres(PostgresServer),
    MariaDb(MariaDbServer),
    Redis(RedisServer),
    RedLock(RedisMasters),
    ZooKeeper(ZooKeeperServer),
    Etcd(EtcdServer),
}

impl Topology {
    /// Starts the servers of topology `name`. Redis keeps an append-only file synced on
    /// every write, so a killed server keeps its fencing counters.
    pub(crate) fn start(name: &str) -> io::Result<Self> {
        let persistent = RedisConfig { persistent: true, ..RedisConfig::default() };
        Ok(match name {
            "sqlite" => {
                let dir = tempfile::Builder::new().prefix("dlock-nemesis-").tempdir()?;
                let path = dir.path().join("locks.db");
                Topology::Sqlite { _dir: dir, path }
            }
            "postgres" => Topology::Postgres(PostgresServer::start(300)?),
            "mariadb" => Topology::MariaDb(MariaDbServer::start(300)?),
            "redis" => Topology::Redis(RedisServer::start(&persistent)?),
            "redlock" => Topology::RedLock(RedisMasters::start(5, &persistent)?),
            "zk" => Topology::ZooKeeper(ZooKeeperServer::start()?),
            "etcd" => Topology::Etcd(EtcdServer::start(&EtcdConfig::default())?),
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("no topology {other:?}; one of {}", NAMES.join(", ")),
                ))
            }
        })
    }

    /// The servers' addresses, which each client reaches through a proxy of its own.
    pub(crate) fn servers(&self) -> Vec<SocketAddr> {
        match self {
            Topology::External(_) | Topology::Sqlite { .. } => Vec::new(),
            Topology::Postgres(s) => vec![s.addr()],
            Topology::MariaDb(s) => vec![s.addr()],
            Topology::Redis(s) => vec![s.addr()],
            Topology::RedLock(s) => s.addrs(),
            Topology::ZooKeeper(s) => vec![s.addr()],
            Topology::Etcd(s) => vec![s.addr()],
        }
    }

    /// The URL naming the servers at `addrs` (the client's proxies, in the order of
    /// [`servers`](Self::servers)).
    pub(crate) fn url(&self, addrs: &[SocketAddr]) -> String {
        let joined = || addrs.iter().map(SocketAddr::to_string).collect::<Vec<_>>().join(",");
        match self {
            Topology::External(url) => url.clone(),
            Topology::Sqlite { path, .. } => format!("sqlite://{}", path.display()),
            Topology::Postgres(_) => format!("postgres://postgres@{}/postgres", joined()),
            Topology::MariaDb(_) => format!("mysql://root@{}/dlock", joined()),
            Topology::Redis(_) => format!("redis://{}", joined()),
            Topology::RedLock(_) => format!("redlock://{}", joined()),
            Topology::ZooKeeper(_) => format!("zk://{}", joined()),
            Topology::Etcd(_) => format!("etcd://{}", joined()),
        }
    }

    /// kill -9 of server `i`.
    pub(crate) fn kill(&mut self, i: usize) {
        match self {
            Topology::External(_) | Topology::Sqlite { .. } => {}
            Topology::Postgres(s) => s.kill(),
            Topology::MariaDb(s) => s.kill(),
            Topology::Redis(s) => s.kill(),
            Topology::RedLock(s) => s.kill(i),
            Topology::ZooKeeper(s) => s.kill(),
            Topology::Etcd(s) => s.kill(),
        }
    }

    /// Starts server `i` again on its data, and waits until it serves.
    pub(crate) fn start_again(&mut self, i: usize) -> io::Result<()> {
        match self {
            Topology::External(_) | Topology::Sqlite { .. } => Ok(()),
            Topology::Postgres(s) => s.start_again(),
            Topology::MariaDb(s) => s.start_again(),
            Topology::Redis(s) => s.start_again(),
            Topology::RedLock(s) => s.start_again(i),
            Topology::ZooKeeper(s) => s.start_again(),
            Topology::Etcd(s) => s.start_again(),
        }
    }
}
