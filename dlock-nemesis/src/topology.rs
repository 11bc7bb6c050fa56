//! The servers a run starts, and how a client's URL names them (through its proxies).

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use dlock_testkit::supervisor::etcd::{EtcdCluster, EtcdConfig, EtcdServer};
use dlock_testkit::supervisor::mariadb::MariaDbServer;
use dlock_testkit::supervisor::postgres::PostgresServer;
use dlock_testkit::supervisor::redis::{RedisConfig, RedisMasters, RedisServer};
use dlock_testkit::supervisor::zookeeper::{ZooKeeperConfig, ZooKeeperEnsemble, ZooKeeperServer};

/// The topologies `--topology` names.
pub(crate) const NAMES: &[&str] =
    &["sqlite", "postgres", "mariadb", "redis", "redlock", "zk", "zk-ensemble", "etcd", "etcd-cluster"];

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
    /// Three ZooKeeper members; clients list all of them.
    ZkEnsemble(ZooKeeperEnsemble),
    Etcd(EtcdServer),
    /// Three etcd members whose peer links can be cut member by member.
    EtcdCluster(EtcdCluster),
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
            "zk-ensemble" => {
                let mut ensemble = ZooKeeperEnsemble::start(3, &ZooKeeperConfig::default())?;
                ensemble.wait_serving(Duration::from_secs(60))?;
                Topology::ZkEnsemble(ensemble)
            }
            "etcd" => Topology::Etcd(EtcdServer::start(&EtcdConfig::default())?),
            "etcd-cluster" => {
                let mut cluster = EtcdCluster::start(3, &EtcdConfig::default())?;
                cluster.wait_for_leader(Duration::from_secs(20))?;
                Topology::EtcdCluster(cluster)
            }
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
            Topology::ZkEnsemble(e) => (0..e.size()).map(|i| e.addr(i)).collect(),
            Topology::Etcd(s) => vec![s.addr()],
            Topology::EtcdCluster(c) => c.addrs(),
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
            Topology::ZooKeeper(_) | Topology::ZkEnsemble(_) => format!("zk://{}", joined()),
            Topology::Etcd(_) | Topology::EtcdCluster(_) => format!("etcd://{}", joined()),
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
            Topology::ZkEnsemble(e) => e.kill(i),
            Topology::Etcd(s) => s.kill(),
            Topology::EtcdCluster(c) => c.member(i).kill(),
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
            Topology::ZkEnsemble(e) => e.start_again(i),
            Topology::Etcd(s) => s.start_again(),
            Topology::EtcdCluster(c) => c.member(i).start_again(),
        }
    }

    /// Whether servers can be cut off from each other ([`isolate`](Self::isolate)).
    pub(crate) fn partitions(&self) -> bool {
        matches!(self, Topology::EtcdCluster(_))
    }

    /// Cuts server `i` off from the other servers (its clients still reach it).
    pub(crate) fn isolate(&mut self, i: usize) -> io::Result<()> {
        match self {
            Topology::EtcdCluster(c) => c.isolate(i),
            _ => Ok(()),
        }
    }

    /// Lets every server reach every other again.
    pub(crate) fn heal(&mut self) {
        if let Topology::EtcdCluster(c) = self {
            c.heal();
        }
    }
}
