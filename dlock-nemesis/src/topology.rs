//! The servers a run starts, and how a client's URL names them (through its proxies).

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use dlock_conformance::Fault;

use crate::skew::{self, FastClock};
use dlock_testkit::supervisor::etcd::{EtcdCluster, EtcdConfig, EtcdServer};
use dlock_testkit::supervisor::mariadb::MariaDbServer;
use dlock_testkit::supervisor::postgres::PostgresServer;
use dlock_testkit::supervisor::redis::{RedisConfig, RedisMasters, RedisServer, SentinelGroup};
use dlock_testkit::supervisor::zookeeper::{ZooKeeperConfig, ZooKeeperEnsemble, ZooKeeperServer};

/// The topologies `--topology` names.
pub(crate) const NAMES: &[&str] = &[
    "sqlite",
    "postgres",
    "mariadb",
    "redis",
    "redis-sentinel",
    "redlock",
    "zk",
    "zk-ensemble",
    "etcd",
    "etcd-cluster",
];

/// The RedLock master whose clock runs fast, and how fast.
const FAST_MASTER: usize = 2;
const FAST_FACTOR: f64 = 2.0;

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
    /// A master and a replica under three Sentinels; clients list the Sentinels and ask
    /// for a replica's acknowledgement of every grant and renewal (`wait_replicas=1`).
    Sentinel(SentinelGroup),
    /// Five masters, one of which ([`FAST_MASTER`]) has a clock running fast.
    RedLock {
        masters: RedisMasters,
        /// Kept running for as long as the run.
        _fast: FastClock,
    },
    ZooKeeper(ZooKeeperServer),
    /// Three ZooKeeper members whose links to each other go through fault proxies;
    /// clients list all of them.
    ZkEnsemble(ZooKeeperEnsemble),
    Etcd(EtcdServer),
    /// Three etcd members whose peer links can be cut member by member.
    EtcdCluster(EtcdCluster),
}

impl Topology {
    /// Starts the servers of topology `name`. Redis keeps an append-only file synced on
    /// every write, so a killed server keeps its fencing counters.
    pub(crate) async fn start(name: &str) -> io::Result<Self> {
        match name {
            "zk-ensemble" => {
                let ensemble = ZooKeeperEnsemble::start_linked(3, &ZooKeeperConfig::default()).await?;
                return Ok(Topology::ZkEnsemble(ensemble));
            }
            "redis-sentinel" => {
                let persistent = RedisConfig { persistent: true, ..RedisConfig::default() };
                return Ok(Topology::Sentinel(SentinelGroup::start(&persistent, "locks").await?));
            }
            _ => {}
        }
        tokio::task::block_in_place(|| Self::start_blocking(name))
    }

    fn start_blocking(name: &str) -> io::Result<Self> {
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
            "redlock" => {
                let masters = RedisMasters::start(5, &persistent)?;
                let fast = FastClock::start(masters.addrs()[FAST_MASTER], FAST_FACTOR)?;
                Topology::RedLock { masters, _fast: fast }
            }
            "zk" => Topology::ZooKeeper(ZooKeeperServer::start()?),
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

    /// The addresses clients dial, each through a proxy of its own: the servers, or for
    /// a Sentinel group the Sentinels (which name the master, reached directly).
    pub(crate) fn endpoints(&self) -> Vec<SocketAddr> {
        match self {
            Topology::External(_) | Topology::Sqlite { .. } => Vec::new(),
            Topology::Postgres(s) => vec![s.addr()],
            Topology::MariaDb(s) => vec![s.addr()],
            Topology::Redis(s) => vec![s.addr()],
            Topology::Sentinel(g) => g.sentinel_addrs(),
            Topology::RedLock { masters: s, .. } => s.addrs(),
            Topology::ZooKeeper(s) => vec![s.addr()],
            Topology::ZkEnsemble(e) => (0..e.size()).map(|i| e.addr(i)).collect(),
            Topology::Etcd(s) => vec![s.addr()],
            Topology::EtcdCluster(c) => c.addrs(),
        }
    }

    /// How many servers the schedule may kill, restart or partition.
    pub(crate) fn servers(&self) -> usize {
        match self {
            Topology::Sentinel(_) => 2,
            other => other.endpoints().len(),
        }
    }

    /// Whether a server's clock can jump ([`jump`](Self::jump)).
    pub(crate) fn clock_jumps(&self) -> bool {
        matches!(self, Topology::Redis(_) | Topology::RedLock { .. })
    }

    /// Whether some server's clock runs fast for the whole run.
    pub(crate) fn fast_clock(&self) -> bool {
        matches!(self, Topology::RedLock { .. })
    }

    /// Server `i`'s clock jumps forward by `by`: every key with a ttl loses that much.
    pub(crate) fn jump(&self, i: usize, by: Duration) -> io::Result<()> {
        match self {
            Topology::Redis(s) => skew::shorten(s.addr(), by),
            Topology::RedLock { masters: s, .. } => skew::shorten(s.addrs()[i], by),
            _ => Ok(()),
        }
    }

    /// The URL naming the endpoints at `addrs` (the client's proxies, in the order of
    /// [`endpoints`](Self::endpoints)).
    pub(crate) fn url(&self, addrs: &[SocketAddr]) -> String {
        let joined = || addrs.iter().map(SocketAddr::to_string).collect::<Vec<_>>().join(",");
        match self {
            Topology::External(url) => url.clone(),
            Topology::Sqlite { path, .. } => format!("sqlite://{}", path.display()),
            Topology::Postgres(_) => format!("postgres://postgres@{}/postgres", joined()),
            Topology::MariaDb(_) => format!("mysql://root@{}/dlock", joined()),
            Topology::Redis(_) => format!("redis://{}", joined()),
            Topology::Sentinel(g) => {
                format!("redis+sentinel://{}/{}?wait_replicas=1&wait_timeout=250ms", joined(), g.name())
            }
            Topology::RedLock { .. } => format!("redlock://{}", joined()),
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
            Topology::Sentinel(g) => g.kill(i),
            Topology::RedLock { masters: s, .. } => s.kill(i),
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
            Topology::Sentinel(g) => g.start_again(i),
            Topology::RedLock { masters: s, .. } => s.start_again(i),
            Topology::ZooKeeper(s) => s.start_again(),
            Topology::ZkEnsemble(e) => e.start_again(i),
            Topology::Etcd(s) => s.start_again(),
            Topology::EtcdCluster(c) => c.member(i).start_again(),
        }
    }

    /// Whether servers can be cut off from each other ([`isolate`](Self::isolate)).
    pub(crate) fn partitions(&self) -> bool {
        matches!(self, Topology::EtcdCluster(_) | Topology::ZkEnsemble(_) | Topology::Sentinel(_))
    }

    /// Cuts server `i` off from the other servers (its clients still reach it): etcd's
    /// peers refuse its connections; a ZooKeeper member's links are black-holed, so that
    /// it learns of the partition only when its peers fall silent. A Redis server of a
    /// Sentinel group is black-holed for everyone: its replica, the Sentinels, clients.
    pub(crate) fn isolate(&mut self, i: usize) -> io::Result<()> {
        match self {
            Topology::EtcdCluster(c) => c.isolate(i),
            Topology::ZkEnsemble(e) => e.isolate(i, Fault::Blackhole),
            Topology::Sentinel(g) => {
                g.isolate(i);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Lets every server reach every other again.
    pub(crate) fn heal(&mut self) {
        match self {
            Topology::EtcdCluster(c) => c.heal(),
            Topology::ZkEnsemble(e) => e.heal(),
            Topology::Sentinel(g) => g.heal(),
            _ => {}
        }
    }
}
