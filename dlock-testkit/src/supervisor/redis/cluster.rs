//! A Redis Cluster: primaries (and replicas) on free loopback ports, and what an operator
//! does to one: move a slot to another primary, fail a primary over to its replica.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use super::{cli, wait_until, Cluster, RedisConfig, RedisGroup, RedisServer};
use crate::supervisor::{free_port, retry};

/// The node timeout of a cluster with replicas: a primary that stops answering is failed
/// over within a few seconds.
const FAILOVER_NODE_TIMEOUT: Duration = Duration::from_millis(1000);

/// The node timeout of a cluster without replicas (nothing to fail over to).
const NODE_TIMEOUT: Duration = Duration::from_millis(2000);

/// How long a topology change (a slot moved, a replica promoted) may take to be seen by
/// every node.
const AGREEMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// How many keys one `MIGRATE` moves.
const MIGRATE_BATCH: usize = 100;

impl RedisGroup<Cluster> {
    /// Starts `masters` cluster-enabled servers (at least 3, as Redis demands), spreads the
    /// 16384 slots over them with `redis-cli --cluster create`, and waits until every
    /// node reports the cluster as ok.
    pub fn start(masters: usize) -> io::Result<Self> {
        Self::start_nodes(masters, 0, NODE_TIMEOUT, false)
    }

    /// Starts a cluster of `masters` primaries (at least 3) with `replicas` replicas each,
    /// and waits until every node reports the cluster as ok and every replica has synced
    /// with its primary. The node timeout is short (1 s), so that a primary killed is
    /// failed over to its replica within seconds.
    pub fn start_with_replicas(masters: usize, replicas: usize) -> io::Result<Self> {
        Self::start_nodes(masters, replicas, FAILOVER_NODE_TIMEOUT, false)
    }

    /// As [`start_with_replicas`](Self::start_with_replicas), with every node keeping an
    /// append-only file synced on every write. Without it a primary killed and started
    /// again before its replica is promoted comes back empty and still serving its slots
    /// (and its replica then copies the empty data set); with it, the node comes back with
    /// every write it acknowledged.
    pub fn start_persistent_with_replicas(masters: usize, replicas: usize) -> io::Result<Self> {
        Self::start_nodes(masters, replicas, FAILOVER_NODE_TIMEOUT, true)
    }

    fn start_nodes(masters: usize, replicas: usize, node_timeout: Duration, persistent: bool) -> io::Result<Self> {
        let count = masters * (1 + replicas);
        let started: Vec<io::Result<RedisServer>> = std::thread::scope(|scope| {
            let starts: Vec<_> =
                (0..count).map(|_| scope.spawn(|| start_cluster_node(node_timeout, persistent))).collect();
            starts
                .into_iter()
                .map(|start| start.join().unwrap_or_else(|_| Err(io::Error::other("a node start panicked"))))
                .collect()
        });
        let nodes = started.into_iter().collect::<io::Result<Vec<_>>>()?;
        let mut create: Vec<String> = vec!["--cluster".into(), "create".into()];
        create.extend(nodes.iter().map(|n| n.addr().to_string()));
        create.extend(["--cluster-replicas".into(), replicas.to_string(), "--cluster-yes".into()]);
        let args: Vec<&str> = create.iter().map(String::as_str).collect();
        cli(nodes[0].addr(), &args)?;
        let cluster = Self::of(nodes);
        cluster.wait_until_whole(replicas)?;
        Ok(cluster)
    }

    /// Waits until the cluster is whole again (after a node was killed and started again,
    /// a failover, a slot moved): every node answers and reports the cluster as ok, sees
    /// every primary and every replica (`replicas` per primary) and none of them failed,
    /// and every replica's link to its primary is up (its sync done).
    pub fn wait_until_whole(&self, replicas: usize) -> io::Result<()> {
        let masters = self.addrs().len() / (1 + replicas);
        for node in self.nodes() {
            wait_until(AGREEMENT_TIMEOUT, "the cluster state is ok", || {
                Ok(cli(node.addr(), &["CLUSTER", "INFO"])?.contains("cluster_state:ok"))
            })?;
        }
        wait_until(AGREEMENT_TIMEOUT, "every node knows every primary and replica", || {
            Ok(self.addrs().iter().all(|addr| {
                view(*addr).is_ok_and(|nodes| {
                    nodes.iter().filter(|n| n.primary && !n.failed).count() == masters
                        && nodes.iter().filter(|n| !n.primary && !n.failed).count() == masters * replicas
                })
            }))
        })?;
        wait_until(AGREEMENT_TIMEOUT, "every replica is in sync with its primary", || {
            Ok(self.addrs().iter().all(|addr| {
                cli(*addr, &["INFO", "replication"])
                    .is_ok_and(|info| info.contains("role:master") || info.contains("master_link_status:up"))
            }))
        })
    }

    /// The index of the node at `addr`.
    pub fn index_of(&self, addr: SocketAddr) -> Option<usize> {
        self.addrs().iter().position(|a| *a == addr)
    }

    /// The slot of `key` (`CLUSTER KEYSLOT` on a node that answers).
    pub fn slot_of(&self, key: &str) -> io::Result<u16> {
        self.first_answer(|addr| {
            let out = cli(addr, &["CLUSTER", "KEYSLOT", key])?;
            out.trim().parse().map_err(|e| io::Error::other(format!("CLUSTER KEYSLOT {key}: {out:?}: {e}")))
        })
    }

    /// The index of the primary serving `slot`, as a node that answers sees it.
    pub fn owner(&self, slot: u16) -> io::Result<usize> {
        self.first_answer(|addr| {
            let nodes = view(addr)?;
            let owner = nodes
                .iter()
                .find(|n| n.primary && !n.failed && n.serves(slot))
                .ok_or_else(|| io::Error::other(format!("no primary serves slot {slot} for {addr}")))?;
            self.index_of(owner.addr).ok_or_else(|| io::Error::other(format!("{} is not ours", owner.addr)))
        })
    }

    /// The indexes of the primaries now, as a node that answers sees them.
    pub fn primaries(&self) -> io::Result<Vec<usize>> {
        self.first_answer(|addr| {
            Ok(view(addr)?.iter().filter(|n| n.primary && !n.failed).filter_map(|n| self.index_of(n.addr)).collect())
        })
    }

    /// The indexes of the replicas of primary `index`, as a node that answers sees them.
    pub fn replicas_of(&self, index: usize) -> io::Result<Vec<usize>> {
        let primary = self.addrs()[index];
        self.first_answer(|addr| {
            let nodes = view(addr)?;
            let id = nodes
                .iter()
                .find(|n| n.addr == primary)
                .map(|n| n.id.clone())
                .ok_or_else(|| io::Error::other(format!("{addr} does not know {primary}")))?;
            Ok(nodes.iter().filter(|n| !n.primary && n.master == id).filter_map(|n| self.index_of(n.addr)).collect())
        })
    }

    /// Waits until every replica of primary `index` has all the writes the primary had
    /// when this was called (its replication offset), so that a failover loses none.
    pub fn wait_for_replicas(&self, index: usize) -> io::Result<()> {
        let offset = |info: &str, field: &str| {
            info.lines().find_map(|l| l.strip_prefix(field)).and_then(|v| v.trim().parse::<u64>().ok())
        };
        let primary = cli(self.addrs()[index], &["INFO", "replication"])?;
        let wanted = offset(&primary, "master_repl_offset:")
            .ok_or_else(|| io::Error::other(format!("no replication offset in {primary:?}")))?;
        for replica in self.replicas_of(index)? {
            wait_until(AGREEMENT_TIMEOUT, "the replica has the primary's writes", || {
                let info = cli(self.addrs()[replica], &["INFO", "replication"])?;
                Ok(offset(&info, "slave_repl_offset:").is_some_and(|at| at >= wanted))
            })?;
        }
        Ok(())
    }

    /// Moves `slot` to primary `to` as `redis-cli --cluster reshard` would: the target
    /// imports it, the source migrates it, its keys are `MIGRATE`d in batches, and every
    /// primary is told the new owner (`CLUSTER SETSLOT <slot> NODE`, the target first).
    /// Returns once every node that answers sees `to` serving the slot.
    pub fn migrate_slot(&self, slot: u16, to: usize) -> io::Result<()> {
        let from = self.owner(slot)?;
        if from == to {
            return Ok(());
        }
        let (source, target) = (self.addrs()[from], self.addrs()[to]);
        let (source_id, target_id) = (my_id(source)?, my_id(target)?);
        let slot_arg = slot.to_string();
        cli_ok(target, &["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &source_id])?;
        cli_ok(source, &["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &target_id])?;
        loop {
            let batch = MIGRATE_BATCH.to_string();
            let out = cli(source, &["CLUSTER", "GETKEYSINSLOT", &slot_arg, &batch])?;
            let keys: Vec<&str> = out.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let (host, port) = (target.ip().to_string(), target.port().to_string());
            let mut args = vec!["MIGRATE", host.as_str(), port.as_str(), "", "0", "5000", "KEYS"];
            args.extend(keys);
            cli_ok(source, &args)?;
        }
        let mut primaries = self.primaries()?;
        primaries.sort_by_key(|p| (*p != to, *p != from));
        for primary in primaries {
            cli_ok(self.addrs()[primary], &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &target_id])?;
        }
        self.wait_for_owner(slot, to, "the slot's new owner")
    }

    /// Fails primary `index` over to its first replica with `CLUSTER FAILOVER` (the
    /// primary hands over its writes and becomes a replica), and waits until every node
    /// that answers sees the replica serving the primary's slots. Returns the new
    /// primary's index.
    pub fn fail_over(&self, index: usize) -> io::Result<usize> {
        let (replica, slot) = self.replica_and_slot(index)?;
        cli_ok(self.addrs()[replica], &["CLUSTER", "FAILOVER"])?;
        self.wait_for_owner(slot, replica, "the replica taking over")?;
        Ok(replica)
    }

    /// Kills primary `index` (kill -9) and waits until the cluster has promoted its first
    /// replica: every node that answers sees it serving the primary's slots. Returns the
    /// new primary's index.
    pub fn kill_primary(&mut self, index: usize) -> io::Result<usize> {
        let (replica, slot) = self.replica_and_slot(index)?;
        self.kill(index);
        self.wait_for_owner(slot, replica, "the replica's promotion")?;
        Ok(replica)
    }

    /// The first replica of primary `index` and a slot the primary serves.
    fn replica_and_slot(&self, index: usize) -> io::Result<(usize, u16)> {
        let primary = self.addrs()[index];
        let replica = *self
            .replicas_of(index)?
            .first()
            .ok_or_else(|| io::Error::other(format!("{primary} has no replica to fail over to")))?;
        let slot = view(primary)?
            .iter()
            .find(|n| n.addr == primary)
            .and_then(|n| n.slots.first().map(|range| range.0))
            .ok_or_else(|| io::Error::other(format!("{primary} serves no slot")))?;
        Ok((replica, slot))
    }

    /// Waits until every node that answers sees primary `owner` serving `slot`.
    fn wait_for_owner(&self, slot: u16, owner: usize, what: &str) -> io::Result<()> {
        let expected = self.addrs()[owner];
        wait_until(AGREEMENT_TIMEOUT, what, || {
            let mut answered = 0;
            for addr in self.addrs() {
                let Ok(nodes) = view(addr) else { continue };
                answered += 1;
                let serving = nodes.iter().find(|n| n.primary && !n.failed && n.serves(slot)).map(|n| n.addr);
                if serving != Some(expected) {
                    return Ok(false);
                }
            }
            Ok(answered > 0)
        })
    }

    /// The first answer of the nodes, tried in turn (some may be down).
    fn first_answer<T>(&self, mut ask: impl FnMut(SocketAddr) -> io::Result<T>) -> io::Result<T> {
        let mut last = io::Error::other("no node");
        for addr in self.addrs() {
            match ask(addr) {
                Ok(answer) => return Ok(answer),
                Err(err) => last = err,
            }
        }
        Err(last)
    }
}

/// A cluster node's bus port is its own free port (not port + 10000, which may be taken
/// or out of range); a start that loses a port race is retried with fresh ports. The
/// nodes serve their slots while another is down (`cluster-require-full-coverage no`),
/// as a production cluster whose failed primary has a replica to promote would.
fn start_cluster_node(node_timeout: Duration, persistent: bool) -> io::Result<RedisServer> {
    retry(5, || {
        let bus = free_port()?;
        let config = RedisConfig {
            persistent,
            extra_args: [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                &node_timeout.as_millis().to_string(),
                "--cluster-require-full-coverage",
                "no",
                "--cluster-port",
                &bus.to_string(),
                // A replica syncs at once, without waiting for others to join.
                "--repl-diskless-sync-delay",
                "0",
            ]
            .map(String::from)
            .to_vec(),
        };
        RedisServer::start(&config)
    })
}

/// `CLUSTER MYID` of the node at `addr`.
fn my_id(addr: SocketAddr) -> io::Result<String> {
    Ok(cli(addr, &["CLUSTER", "MYID"])?.trim().to_string())
}

/// Runs a command that answers `OK`; anything else (an error reply, which redis-cli
/// prints and exits 0 on) is an error.
fn cli_ok(addr: SocketAddr, args: &[&str]) -> io::Result<()> {
    let out = cli(addr, args)?;
    match out.trim() {
        "OK" | "NOKEY" => Ok(()),
        other => Err(io::Error::other(format!("{args:?} on {addr}: {other}"))),
    }
}

/// One line of `CLUSTER NODES`, as one node sees another.
#[derive(Debug)]
struct NodeView {
    id: String,
    addr: SocketAddr,
    primary: bool,
    /// Flagged `fail` (or `fail?`, `noaddr`, `handshake`): not counted.
    failed: bool,
    /// The id of its primary, for a replica.
    master: String,
    /// The slot ranges it serves (migrating and importing markers left out).
    slots: Vec<(u16, u16)>,
}

impl NodeView {
    fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|(start, end)| (*start..=*end).contains(&slot))
    }
}

/// The cluster as the node at `addr` sees it (`CLUSTER NODES`).
fn view(addr: SocketAddr) -> io::Result<Vec<NodeView>> {
    let out = cli(addr, &["CLUSTER", "NODES"])?;
    let mut nodes = Vec::new();
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 {
            return Err(io::Error::other(format!("CLUSTER NODES on {addr}: {line:?}")));
        }
        // ip:port@cport[,hostname]
        let endpoint = fields[1].split(['@', ',']).next().unwrap_or_default();
        let Ok(node_addr) = endpoint.parse::<SocketAddr>() else { continue };
        let flags: Vec<&str> = fields[2].split(',').collect();
        let slots = fields[8..]
            .iter()
            .filter(|s| !s.starts_with('['))
            .filter_map(|s| match s.split_once('-') {
                Some((start, end)) => Some((start.parse().ok()?, end.parse().ok()?)),
                None => s.parse().ok().map(|slot| (slot, slot)),
            })
            .collect();
        nodes.push(NodeView {
            id: fields[0].to_string(),
            addr: node_addr,
            primary: flags.contains(&"master"),
            failed: flags.iter().any(|f| ["fail", "fail?", "noaddr", "handshake"].contains(f)),
            master: fields[3].to_string(),
            slots,
        });
    }
    Ok(nodes)
}
