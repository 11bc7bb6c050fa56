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
use dlock_testkit::supervisor::redis::{RedisCluster, RedisConfig, RedisMasters, RedisServer, SentinelGroup};
use dlock_testkit::supervisor::zookeeper::{ZooKeeperConfig, ZooKeeperEnsemble, ZooKeeperServer};

/// The topologies `--topology` names.
pub(crate) const NAMES: &[&str] = &[
    "sqlite",
    "postgres",
    "postgres-advisory",
    "mariadb",
    "redis",
    "redis-sentinel",
    "redlock",
    "redlock-volatile",
    "redis-sentinel-async",
    "redis-cluster",
    "redis-cluster-async",
    "zk",
    "zk-ensemble",
    "etcd",
    "etcd-cluster",
];

/// The replicas of each primary of a Cluster.
const CLUSTER_REPLICAS: usize = 1;

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
    /// PostgreSQL's session-level advisory locks (`lock=advisory`) instead of the lease table.
    PostgresAdvisory(PostgresServer),
    MariaDb(MariaDbServer),
    Redis(RedisServer),
    /// A master and a replica under three Sentinels; clients list the Sentinels and,
    /// unless `acked` is false, ask for a replica's acknowledgement of every grant and
    /// renewal (`wait_replicas=1`).
    Sentinel {
        group: SentinelGroup,
        acked: bool,
    },
    /// Five masters, one of which ([`FAST_MASTER`]) has a clock running fast; with
    /// `durable` false, masters keep nothing on disk and restart empty.
    RedLock {
        masters: RedisMasters,
        durable: bool,
        /// Kept running for as long as the run.
        _fast: FastClock,
    },
    /// Three primaries with a replica each, every node keeping an append-only file synced
    /// on every write. Each client reaches every node through a proxy of its own: its URL
    /// tells it where each node the Cluster announces is reached (`node_address`), so a
    /// fault on a client's links hits its commands, `WAIT`s and sharded subscriptions on
    /// every node alike. Unless `acked` is false, clients ask the replica's
    /// acknowledgement of every grant and renewal (`wait_replicas=1`).
    Cluster {
        cluster: RedisCluster,
        /// The slot of the lock's keys.
        slot: u16,
        acked: bool,
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
            "redis-sentinel" | "redis-sentinel-async" => {
                let persistent = RedisConfig { persistent: true, ..RedisConfig::default() };
                let group = SentinelGroup::start(&persistent, "locks").await?;
                return Ok(Topology::Sentinel { group, acked: name == "redis-sentinel" });
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
            "postgres-advisory" => Topology::PostgresAdvisory(PostgresServer::start(300)?),
            "mariadb" => Topology::MariaDb(MariaDbServer::start(300)?),
            "redis" => Topology::Redis(RedisServer::start(&persistent)?),
            "redis-cluster" | "redis-cluster-async" => {
                let cluster = RedisCluster::start_persistent_with_replicas(3, CLUSTER_REPLICAS)?;
                let hold = crate::strike::lock_keys(&cluster.url()).map_err(io::Error::other)?.hold;
                let slot = cluster.slot_of(&hold)?;
                Topology::Cluster { cluster, slot, acked: name == "redis-cluster" }
            }
            "redlock" | "redlock-volatile" => {
                let durable = name == "redlock";
                let config = if durable { persistent } else { RedisConfig::default() };
                let masters = RedisMasters::start(5, &config)?;
                let fast = FastClock::start(masters.addrs()[FAST_MASTER], FAST_FACTOR)?;
                Topology::RedLock { masters, durable, _fast: fast }
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
            Topology::Postgres(s) | Topology::PostgresAdvisory(s) => vec![s.addr()],
            Topology::MariaDb(s) => vec![s.addr()],
            Topology::Redis(s) => vec![s.addr()],
            Topology::Sentinel { group, .. } => group.sentinel_addrs(),
            Topology::RedLock { masters: s, .. } => s.addrs(),
            Topology::Cluster { cluster, .. } => cluster.addrs(),
            Topology::ZooKeeper(s) => vec![s.addr()],
            Topology::ZkEnsemble(e) => (0..e.size()).map(|i| e.addr(i)).collect(),
            Topology::Etcd(s) => vec![s.addr()],
            Topology::EtcdCluster(c) => c.addrs(),
        }
    }

    /// How many servers the schedule may kill, restart or partition.
    pub(crate) fn servers(&self) -> usize {
        match self {
            Topology::Sentinel { .. } => 2,
            other => other.endpoints().len(),
        }
    }

    /// Whether a server's clock can jump ([`jump`](Self::jump)).
    pub(crate) fn clock_jumps(&self) -> bool {
        matches!(self, Topology::Redis(_) | Topology::RedLock { .. })
    }

    /// How many times too fast a server's clock runs all run long, if one does.
    pub(crate) fn fast_clock(&self) -> Option<f64> {
        matches!(self, Topology::RedLock { .. }).then_some(FAST_FACTOR)
    }

    /// How many of the servers must agree on a grant: a majority of RedLock's masters,
    /// else one.
    pub(crate) fn quorum(&self) -> usize {
        match self {
            Topology::RedLock { masters, .. } => masters.addrs().len() / 2 + 1,
            _ => 1,
        }
    }

    /// How many servers going down together lose the quorum, where the backend needs one.
    pub(crate) fn quorum_loss(&self) -> Option<usize> {
        match self {
            Topology::RedLock { masters, .. } => Some(masters.addrs().len() / 2 + 1),
            Topology::ZkEnsemble(e) => Some(e.size() / 2 + 1),
            Topology::EtcdCluster(c) => Some(c.addrs().len() / 2 + 1),
            Topology::Sentinel { .. } => Some(2),
            _ => None,
        }
    }

    /// The leader or primary now, where there is one to aim at.
    pub(crate) fn leader(&mut self) -> Option<usize> {
        match self {
            Topology::ZkEnsemble(e) => e.leader(),
            Topology::EtcdCluster(c) => c.leader(),
            Topology::Sentinel { group, .. } => group.master(),
            Topology::Cluster { cluster, slot, .. } => cluster.owner(*slot).ok(),
            _ => None,
        }
    }

    /// Why a topology is known to lose grants under the faults the run plays, if it is;
    /// its runs are labelled so and kept out of the table of safe topologies.
    pub(crate) fn documented_unsafe(&self) -> Option<&'static str> {
        match self {
            Topology::RedLock { durable: false, .. } => {
                Some("RedLock masters that restart without their data forget the holds they had")
            }
            Topology::Sentinel { acked: false, .. } => {
                Some("a Sentinel failover without wait_replicas may promote a replica that never saw a grant")
            }
            Topology::Cluster { acked: false, .. } => {
                Some("a Cluster primary killed without wait_replicas may leave its slots to a replica that never saw a grant")
            }
            _ => None,
        }
    }

    /// Makes every server that holds the lock expire keys at twice the pace (the
    /// `half-ttl` mutant) for as long as the clocks returned live: Redis's servers,
    /// every RedLock master.
    pub(crate) fn halve_ttls(&self) -> io::Result<Vec<FastClock>> {
        let addrs = match self {
            Topology::Redis(s) => vec![s.addr()],
            Topology::Sentinel { group, .. } => group.server_addrs(),
            Topology::RedLock { masters, .. } => masters.addrs(),
            Topology::Cluster { cluster, .. } => cluster.addrs(),
            _ => return Err(io::Error::other("the half-ttl mutant needs a Redis topology")),
        };
        addrs.into_iter().map(|addr| FastClock::start(addr, 2.0)).collect()
    }

    /// The addresses of the servers that keep the lock, reached directly.
    pub(crate) fn servers_direct(&self) -> Vec<SocketAddr> {
        match self {
            Topology::Sentinel { group, .. } => group.server_addrs(),
            other => other.endpoints(),
        }
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
            Topology::PostgresAdvisory(_) => format!("postgres://postgres@{}/postgres?lock=advisory", joined()),
            Topology::MariaDb(_) => format!("mysql://root@{}/dlock", joined()),
            Topology::Redis(_) => format!("redis://{}", joined()),
            Topology::Sentinel { group, acked: true } => {
                format!("redis+sentinel://{}/{}?wait_replicas=1&wait_timeout=250ms", joined(), group.name())
            }
            Topology::Sentinel { group, acked: false } => format!("redis+sentinel://{}/{}", joined(), group.name()),
            Topology::Cluster { cluster, acked, .. } => {
                // The seeds are the nodes themselves, each reached at the client's proxy.
                let nodes = cluster.addrs();
                let mut options: Vec<String> = nodes
                    .iter()
                    .zip(addrs)
                    .filter(|(node, reached)| node != reached)
                    .map(|(node, reached)| format!("node_address={node}={reached}"))
                    .collect();
                if *acked {
                    options.push("wait_replicas=1&wait_timeout=250ms".into());
                }
                let seeds = nodes.iter().map(SocketAddr::to_string).collect::<Vec<_>>().join(",");
                match options.is_empty() {
                    true => format!("redis+cluster://{seeds}"),
                    false => format!("redis+cluster://{seeds}?{}", options.join("&")),
                }
            }
            Topology::RedLock { .. } => format!("redlock://{}", joined()),
            Topology::ZooKeeper(_) | Topology::ZkEnsemble(_) => format!("zk://{}", joined()),
            Topology::Etcd(_) | Topology::EtcdCluster(_) => format!("etcd://{}", joined()),
        }
    }

    /// kill -9 of server `i`. A Cluster primary that has a replica stays down until the
    /// replica is promoted (a second or two past the node timeout), so that each kill of a
    /// primary is a failover in which the replica has only what it was sent.
    pub(crate) fn kill(&mut self, i: usize) -> io::Result<()> {
        match self {
            Topology::External(_) | Topology::Sqlite { .. } => {}
            Topology::Postgres(s) | Topology::PostgresAdvisory(s) => s.kill(),
            Topology::MariaDb(s) => s.kill(),
            Topology::Redis(s) => s.kill(),
            Topology::Sentinel { group, .. } => group.kill(i),
            Topology::RedLock { masters: s, .. } => s.kill(i),
            Topology::Cluster { cluster, .. } => {
                if cluster.primaries()?.contains(&i) && !cluster.replicas_of(i)?.is_empty() {
                    cluster.kill_primary(i)?;
                } else {
                    cluster.kill(i);
                }
            }
            Topology::ZooKeeper(s) => s.kill(),
            Topology::ZkEnsemble(e) => e.kill(i),
            Topology::Etcd(s) => s.kill(),
            Topology::EtcdCluster(c) => c.member(i).kill(),
        }
        Ok(())
    }

    /// Starts server `i` again on its data, and waits until it serves (a Cluster node:
    /// until the Cluster is whole again, the node known to every other and in sync).
    pub(crate) fn start_again(&mut self, i: usize) -> io::Result<()> {
        match self {
            Topology::External(_) | Topology::Sqlite { .. } => Ok(()),
            Topology::Postgres(s) | Topology::PostgresAdvisory(s) => s.start_again(),
            Topology::MariaDb(s) => s.start_again(),
            Topology::Redis(s) => s.start_again(),
            Topology::Sentinel { group, .. } => group.start_again(i),
            Topology::RedLock { masters: s, .. } => s.start_again(i),
            Topology::Cluster { cluster, .. } => {
                cluster.start_again(i)?;
                cluster.wait_until_whole(CLUSTER_REPLICAS)
            }
            Topology::ZooKeeper(s) => s.start_again(),
            Topology::ZkEnsemble(e) => e.start_again(i),
            Topology::Etcd(s) => s.start_again(),
            Topology::EtcdCluster(c) => c.member(i).start_again(),
        }
    }

    /// Whether a primary can be failed over to its replica ([`fail_over`](Self::fail_over))
    /// and the lock's slot moved to another primary ([`migrate`](Self::migrate)).
    pub(crate) fn slot_moves(&self) -> bool {
        matches!(self, Topology::Cluster { .. })
    }

    /// A failover by hand (`CLUSTER FAILOVER` on the replica): server `i` takes over its
    /// primary's slots if it is a replica; if it is a primary, its replica takes over
    /// from it. Returns once every node sees the new primary and the Cluster is whole
    /// (the old primary a replica of the new one, in sync).
    pub(crate) fn fail_over(&mut self, i: usize) -> io::Result<()> {
        let Topology::Cluster { cluster, .. } = self else { return Ok(()) };
        let primaries = cluster.primaries()?;
        let primary = match primaries.contains(&i) {
            true => i,
            false => *primaries
                .iter()
                .find(|p| cluster.replicas_of(**p).is_ok_and(|r| r.contains(&i)))
                .ok_or_else(|| io::Error::other(format!("node {i} is neither a primary nor a replica")))?,
        };
        cluster.fail_over(primary)?;
        cluster.wait_until_whole(CLUSTER_REPLICAS)
    }

    /// Moves the lock's slot (its keys with it) to another primary: the first at or after
    /// server `i` in the order of the servers (wrapping) that does not serve it now.
    pub(crate) fn migrate(&mut self, i: usize) -> io::Result<()> {
        let Topology::Cluster { cluster, slot, .. } = self else { return Ok(()) };
        let owner = cluster.owner(*slot)?;
        let primaries = cluster.primaries()?;
        let count = cluster.addrs().len();
        let to = (0..count)
            .map(|k| (i + k) % count)
            .find(|n| *n != owner && primaries.contains(n))
            .ok_or_else(|| io::Error::other("no other primary to move the lock's slot to"))?;
        cluster.migrate_slot(*slot, to)
    }

    /// Whether servers can be cut off from each other ([`isolate`](Self::isolate)).
    pub(crate) fn partitions(&self) -> bool {
        matches!(self, Topology::EtcdCluster(_) | Topology::ZkEnsemble(_) | Topology::Sentinel { .. })
    }

    /// Cuts server `i` off from the other servers (its clients still reach it): etcd's
    /// peers refuse its connections; a ZooKeeper member's links are black-holed, so that
    /// it learns of the partition only when its peers fall silent. A Redis server of a
    /// Sentinel group is black-holed for everyone: its replica, the Sentinels, clients.
    pub(crate) fn isolate(&mut self, i: usize) -> io::Result<()> {
        match self {
            Topology::EtcdCluster(c) => c.isolate(i),
            Topology::ZkEnsemble(e) => e.isolate(i, Fault::Blackhole),
            Topology::Sentinel { group, .. } => {
                group.isolate(i);
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
            Topology::Sentinel { group, .. } => group.heal(),
            _ => {}
        }
    }
}
