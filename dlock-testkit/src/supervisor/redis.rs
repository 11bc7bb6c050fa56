//! redis-server instances on free loopback ports: single servers (optionally replicas
//! of another), independent masters for RedLock, a small Redis Cluster (with replicas,
//! slot migration and failover, see [`cluster`]), and a Sentinel.

pub mod cluster;

use std::io;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use dlock_conformance::Fault;

use super::{
    free_port, poll, program, retry_async, start_on_free_port, succeeded, wait_for_port, Kind, Server, ServerProcess,
};
use crate::proxy::FaultProxy;

const BIN_DIRS: &[&str] = &["/usr/bin", "/usr/local/bin"];

/// How to run a redis-server.
#[derive(Debug, Clone, Default)]
pub struct RedisConfig {
    /// Append-only file with fsync on every write, so a kill -9 loses nothing
    /// (the fence counters survive a restart).
    pub persistent: bool,
    /// More `--option value` arguments.
    pub extra_args: Vec<String>,
}

/// redis-server as a [`Server`] kind.
#[derive(Debug)]
pub struct Redis;

impl Kind for Redis {
    fn ready(&self, addr: SocketAddr, process: &mut ServerProcess) -> io::Result<()> {
        wait_for_port(addr, process, Self::START_TIMEOUT)?;
        // Another process may have taken the port first and be the one answering: only
        // our own log says that this server is listening (else it exits, unable to bind).
        let log = process.log_path().to_owned();
        process.wait_until("ready", Self::START_TIMEOUT, Duration::from_millis(5), || {
            Ok(std::fs::read_to_string(&log)?.contains("Ready to accept connections"))
        })
    }
}

/// A running redis-server in its own temporary directory.
pub type RedisServer = Server<Redis>;

impl Server<Redis> {
    /// Starts a redis-server on a free port.
    pub fn start(config: &RedisConfig) -> io::Result<Self> {
        start_on_free_port(|port| Self::start_at(port, config))
    }

    /// Starts a redis-server on `port`, which must be free.
    pub fn start_at(port: u16, config: &RedisConfig) -> io::Result<Self> {
        let program = program("redis-server", BIN_DIRS)?;
        {
            let dir = tempfile::Builder::new().prefix("dlock-redis-").tempdir()?;
            let mut args = vec![
                "--port".to_string(),
                port.to_string(),
                "--bind".into(),
                "127.0.0.1".into(),
                "--dir".into(),
                dir.path().display().to_string(),
                "--save".into(),
                String::new(),
                "--protected-mode".into(),
                "no".into(),
            ];
            if config.persistent {
                args.extend(["--appendonly", "yes", "--appendfsync", "always"].map(String::from));
            } else {
                args.extend(["--appendonly", "no"].map(String::from));
            }
            args.extend(config.extra_args.iter().cloned());
            Server::spawn(Redis, "redis-server", &program, args, port, dir)
        }
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr())
    }

    /// Starts a server that replicates `master`, and waits until the master counts it
    /// among its connected replicas.
    pub fn start_replica_of(master: &RedisServer, config: &RedisConfig) -> io::Result<Self> {
        Self::start_replica_via(master, master.addr(), config)
    }

    /// Starts a server that replicates `master` through `link` (a fault proxy in front of
    /// the master, so that the replication link can fail), and waits until the master
    /// counts it among its connected replicas.
    pub fn start_replica_via(master: &RedisServer, link: SocketAddr, config: &RedisConfig) -> io::Result<Self> {
        cli(master.addr(), &["CONFIG", "SET", "repl-diskless-sync-delay", "0"])?;
        let mut config = config.clone();
        config.extra_args.extend(["--replicaof".into(), link.ip().to_string(), link.port().to_string()]);
        let replica = RedisServer::start(&config)?;
        wait_for_acknowledgement(master.addr())?;
        Ok(replica)
    }

    /// Runs a command with redis-cli and returns its output.
    pub fn cli(&self, args: &[&str]) -> io::Result<String> {
        cli(self.addr(), args)
    }
}

/// Waits until a replica of the master at `master` acknowledges a write. Connected is not
/// enough: for a moment after the initial sync a replica does not acknowledge writes yet.
fn wait_for_acknowledgement(master: SocketAddr) -> io::Result<()> {
    // The master waits 5 s by default for more replicas before a diskless full sync.
    cli(master, &["CONFIG", "SET", "repl-diskless-sync-delay", "0"])?;
    wait_until(Duration::from_secs(20), "the replica acknowledges writes", || {
        let out = cli_stdin(master, "SET dlock-supervisor:replica-probe 1\nWAIT 1 100\n")?;
        Ok(out.lines().nth(1).is_some_and(|acked| acked.trim() == "1"))
    })?;
    cli(master, &["DEL", "dlock-supervisor:replica-probe"]).map(drop)
}

/// Runs `redis-cli -h 127.0.0.1 -p <port> <args>`, failing on a non-zero exit.
pub fn cli(addr: SocketAddr, args: &[&str]) -> io::Result<String> {
    let output = cli_command(addr)?.args(args).output()?;
    let output = succeeded(&format!("redis-cli {args:?} on {addr}"), output)?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Runs the commands in `script` (one per line) on one redis-cli connection.
fn cli_stdin(addr: SocketAddr, script: &str) -> io::Result<String> {
    use std::io::Write;
    let mut child = cli_command(addr)?.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    child.stdin.take().ok_or_else(|| io::Error::other("no stdin"))?.write_all(script.as_bytes())?;
    let output = succeeded(&format!("redis-cli on {addr}"), child.wait_with_output()?)?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn cli_command(addr: SocketAddr) -> io::Result<Command> {
    let mut command = Command::new(program("redis-cli", BIN_DIRS)?);
    command.args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string()]);
    Ok(command)
}

/// Waits until `check` holds; a failing check (a server not answering yet) is tried again,
/// and the last failure is told when the time is up.
fn wait_until(timeout: Duration, what: &str, mut check: impl FnMut() -> io::Result<bool>) -> io::Result<()> {
    let mut last = String::new();
    let held = poll(timeout, Duration::from_millis(50), || {
        Ok(match check() {
            Ok(held) => {
                last.clear();
                held.then_some(())
            }
            Err(err) => {
                last = err.to_string();
                None
            }
        })
    })?;
    held.ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, format!("{what}: not within {timeout:?} {last}")))
}

/// What a group of redis-servers is for: the URL scheme that names all of them.
pub trait GroupKind {
    /// `redlock`, `redis+cluster`.
    const SCHEME: &'static str;
}

/// Independent masters, as RedLock uses them.
#[derive(Debug)]
pub struct Masters;

impl GroupKind for Masters {
    const SCHEME: &'static str = "redlock";
}

/// The masters of a Redis Cluster.
#[derive(Debug)]
pub struct Cluster;

impl GroupKind for Cluster {
    const SCHEME: &'static str = "redis+cluster";
}

/// Several redis-servers named by one URL.
#[derive(Debug)]
pub struct RedisGroup<G> {
    nodes: Vec<RedisServer>,
    _kind: std::marker::PhantomData<G>,
}

/// Independent redis-servers (no replication, no cluster), as RedLock uses them.
pub type RedisMasters = RedisGroup<Masters>;

/// A Redis Cluster: primaries, and replicas if started with them, each a [`RedisServer`]
/// on free ports (see [`cluster`] for what it can do).
pub type RedisCluster = RedisGroup<Cluster>;

impl<G: GroupKind> RedisGroup<G> {
    fn of(nodes: Vec<RedisServer>) -> Self {
        RedisGroup { nodes, _kind: std::marker::PhantomData }
    }

    /// The servers.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The servers, for kill and restart.
    pub fn nodes_mut(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }

    /// Every server's address.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(|node| node.addr()).collect()
    }

    /// `<scheme>://<node>,<node>,...`.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self.addrs().iter().map(SocketAddr::to_string).collect();
        format!("{}://{}", G::SCHEME, nodes.join(","))
    }

    /// kill -9 of server `index`.
    pub fn kill(&mut self, index: usize) {
        self.nodes[index].kill();
    }

    /// Starts server `index` again on its port and data, and waits until it listens.
    pub fn start_again(&mut self, index: usize) -> io::Result<()> {
        self.nodes[index].start_again()
    }
}

impl RedisGroup<Masters> {
    /// Starts `count` servers with `config`, all at once.
    pub fn start(count: usize, config: &RedisConfig) -> io::Result<Self> {
        let started: Vec<io::Result<RedisServer>> = std::thread::scope(|scope| {
            let starts: Vec<_> = (0..count).map(|_| scope.spawn(|| RedisServer::start(config))).collect();
            starts
                .into_iter()
                .map(|start| start.join().unwrap_or_else(|_| Err(io::Error::other("a server start panicked"))))
                .collect()
        });
        Ok(Self::of(started.into_iter().collect::<io::Result<Vec<_>>>()?))
    }
}

/// A Redis Sentinel as a [`Server`] kind: the name of the master it monitors.
#[derive(Debug)]
pub struct Sentinel {
    master: String,
}

impl Kind for Sentinel {}

/// A Redis Sentinel monitoring one master, in its own temporary directory.
pub type RedisSentinel = Server<Sentinel>;

impl Server<Sentinel> {
    /// Starts a Sentinel that monitors `master` under the name `name`, with a quorum of
    /// one and short timeouts (a master is down after 1 s without answers), and waits
    /// until it answers for the master.
    pub fn start(master: SocketAddr, name: &str) -> io::Result<Self> {
        Self::start_with_quorum(master, name, 1)
    }

    /// Starts a Sentinel as [`start`](Self::start) does, one of a group in which
    /// `quorum` Sentinels must agree that the master is down.
    pub fn start_with_quorum(master: SocketAddr, name: &str, quorum: usize) -> io::Result<Self> {
        Self::start_with_config(master, name, quorum, &[])
    }

    /// Starts a Sentinel as [`start_with_quorum`](Self::start_with_quorum) does, with
    /// `extra` lines in its config file (such as `sentinel auth-user <name> <user>`).
    pub fn start_with_config(master: SocketAddr, name: &str, quorum: usize, extra: &[&str]) -> io::Result<Self> {
        let program = program("redis-server", BIN_DIRS)?;
        start_on_free_port(|port| {
            let dir = tempfile::Builder::new().prefix("dlock-sentinel-").tempdir()?;
            let conf = dir.path().join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {dir}\n\
                     sentinel monitor {name} {ip} {master_port} {quorum}\n\
                     sentinel down-after-milliseconds {name} 1000\n\
                     sentinel failover-timeout {name} 5000\n\
                     sentinel parallel-syncs {name} 1\n{extra}",
                    dir = dir.path().display(),
                    ip = master.ip(),
                    master_port = master.port(),
                    extra = extra.iter().map(|line| format!("{line}\n")).collect::<String>(),
                ),
            )?;
            let args = vec![conf.display().to_string(), "--sentinel".into()];
            let sentinel =
                Server::spawn(Sentinel { master: name.to_string() }, "redis-sentinel", &program, args, port, dir)?;
            wait_until(Duration::from_secs(10), "the sentinel knows the master", || {
                Ok(sentinel.master_addr().is_ok_and(|a| a == master))
            })?;
            Ok(sentinel)
        })
    }

    /// `redis+sentinel://127.0.0.1:<port>/<master name>`.
    pub fn url(&self) -> String {
        format!("redis+sentinel://{}/{}", self.addr(), self.kind().master)
    }

    /// The master's address as the Sentinel sees it now.
    pub fn master_addr(&self) -> io::Result<SocketAddr> {
        let out = cli(self.addr(), &["SENTINEL", "get-master-addr-by-name", &self.kind().master])?;
        let mut lines = out.lines();
        let (Some(ip), Some(port)) = (lines.next(), lines.next()) else {
            return Err(io::Error::other(format!("no master address in {out:?}")));
        };
        format!("{ip}:{port}").parse().map_err(|e| io::Error::other(format!("master address {ip}:{port}: {e}")))
    }

    /// What the Sentinel says of the master (`SENTINEL MASTER`): `ip`, `port`, `flags`,
    /// `config-epoch` and the rest. During a failover it led, `ip` and `port` name the old
    /// master until the switch, while [`master_addr`](Self::master_addr) names the new one.
    pub fn master_info(&self) -> io::Result<std::collections::HashMap<String, String>> {
        let out = cli(self.addr(), &["SENTINEL", "MASTER", &self.kind().master])?;
        let lines: Vec<&str> = out.lines().collect();
        if lines.len() < 2 || !lines.len().is_multiple_of(2) {
            return Err(io::Error::other(format!("no master fields in {out:?}")));
        }
        Ok(lines.chunks(2).map(|pair| (pair[0].to_string(), pair[1].to_string())).collect())
    }

    /// Waits until the Sentinel knows `replicas` replicas of the master.
    pub fn wait_for_replicas(&self, replicas: usize) -> io::Result<()> {
        wait_until(Duration::from_secs(30), "the sentinel knows the replicas", || {
            let out = cli(self.addr(), &["SENTINEL", "replicas", &self.kind().master])?;
            Ok(out.matches("flags\nslave\n").count() >= replicas)
        })
    }

    /// Forces a failover (`SENTINEL FAILOVER`) and waits until the Sentinel names a
    /// master other than `old`; returns the new master's address.
    pub fn failover(&self, old: SocketAddr) -> io::Result<SocketAddr> {
        cli(self.addr(), &["SENTINEL", "FAILOVER", &self.kind().master])?;
        let mut new = old;
        wait_until(Duration::from_secs(30), "the sentinel promotes a replica", || {
            new = self.master_addr()?;
            Ok(new != old)
        })?;
        Ok(new)
    }
}

/// A master and one replica watched by three Sentinels (two must agree that the master is
/// down), as a small production group runs. Each of the two servers is reached by
/// everyone (its replica, the Sentinels, clients) through a fault proxy in front of it,
/// and announces itself at that proxy, so that [`isolate`](Self::isolate) partitions a
/// server from the whole group whichever role it has by then.
#[derive(Debug)]
pub struct SentinelGroup {
    servers: Vec<RedisServer>,
    fronts: Vec<FaultProxy>,
    sentinels: Vec<RedisSentinel>,
    name: String,
}

impl SentinelGroup {
    /// Starts the group (server 0 the first master, server 1 its replica) with the
    /// monitored name `name`, and waits until every Sentinel knows the replica. Must run
    /// on a multi-threaded tokio runtime: the proxies run on it.
    pub async fn start(config: &RedisConfig, name: &str) -> io::Result<Self> {
        retry_async(3, "a Sentinel group", || Self::try_start(config, name)).await
    }

    async fn try_start(config: &RedisConfig, name: &str) -> io::Result<Self> {
        let mut ports = Vec::new();
        let mut fronts = Vec::new();
        for _ in 0..2 {
            let port = free_port()?;
            fronts.push(FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], port))).await?);
            ports.push(port);
        }
        let front_ports: Vec<String> = fronts.iter().map(|f| f.addr().port().to_string()).collect();
        let announce = |i: usize| {
            let mut config = config.clone();
            let front = &front_ports[i];
            config
                .extra_args
                .extend(["--replica-announce-ip", "127.0.0.1", "--replica-announce-port", front].map(String::from));
            config
        };
        let master_front = fronts[0].addr();
        tokio::task::block_in_place(|| {
            let master = RedisServer::start_at(ports[0], &announce(0))?;
            let mut replica_config = announce(1);
            replica_config.extra_args.extend([
                "--replicaof".into(),
                master_front.ip().to_string(),
                master_front.port().to_string(),
            ]);
            let replica = RedisServer::start_at(ports[1], &replica_config)?;
            wait_for_acknowledgement(master.addr())?;
            let sentinels = (0..3)
                .map(|_| RedisSentinel::start_with_quorum(master_front, name, 2))
                .collect::<io::Result<Vec<_>>>()?;
            for sentinel in &sentinels {
                sentinel.wait_for_replicas(1)?;
            }
            Ok(SentinelGroup { servers: vec![master, replica], fronts, sentinels, name: name.to_string() })
        })
    }

    /// The Sentinels' addresses.
    pub fn sentinel_addrs(&self) -> Vec<SocketAddr> {
        self.sentinels.iter().map(|s| s.addr()).collect()
    }

    /// The name the Sentinels monitor.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The two servers' own addresses (not their fronts), for an operator's commands.
    pub fn server_addrs(&self) -> Vec<SocketAddr> {
        self.servers.iter().map(|s| s.addr()).collect()
    }

    /// The index of the server the Sentinels name as the master now, if one answers.
    pub fn master(&self) -> Option<usize> {
        let named = self.sentinels.iter().find_map(|s| s.master_addr().ok())?;
        self.fronts.iter().position(|front| front.addr() == named)
    }

    /// kill -9 of server `index` (0: the first master, 1: the first replica).
    pub fn kill(&mut self, index: usize) {
        self.servers[index].kill();
    }

    /// Starts server `index` again on its port and data; the Sentinels give it its role.
    pub fn start_again(&mut self, index: usize) -> io::Result<()> {
        self.servers[index].start_again()
    }

    /// Black-holes every connection to server `index`: its replica, the Sentinels and
    /// clients hear nothing from it, as when its host is partitioned away.
    pub fn isolate(&self, index: usize) {
        self.fronts[index].set_fault(Fault::Blackhole);
    }

    /// Lets everyone reach both servers again.
    pub fn heal(&self) {
        self.fronts.iter().for_each(|front| front.set_fault(Fault::None));
    }
}
