//! etcd servers on free loopback ports: a single member, or a cluster of several, each
//! with its data directory on a RAM-backed filesystem when one is available (so the
//! fsyncs of many test servers do not queue on one disk; a kill -9 loses nothing either way).
//!
//! Members start with a short heartbeat (100 ms) and election timeout (600 ms): etcd's
//! shortest lease is 1.5 election timeouts rounded up to whole seconds, so these servers
//! honour 1 s leases, and a new leader is elected within about a second of a kill.
//! Readiness is read from `/health` on a plain-HTTP metrics listener, which works the same
//! whether clients speak TLS or not.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;

use super::peer_gate::PeerGate;
use super::{free_port, poll, program, retry, CommandSpec, Kind, Node, Server, ServerProcess};

/// Server-side TLS for the client port.
#[derive(Debug, Clone)]
pub struct EtcdTls {
    /// The server certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// When set, clients must present a certificate signed by this CA (PEM).
    pub client_ca: Option<PathBuf>,
}

/// How to run etcd members.
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    /// Raft heartbeat interval.
    pub heartbeat: Duration,
    /// Raft election timeout; the shortest lease the server grants is 1.5 times this,
    /// rounded up to whole seconds.
    pub election: Duration,
    /// TLS on the client port (`https://` endpoints), if any.
    pub tls: Option<EtcdTls>,
    /// More `--flag value` arguments.
    pub extra_args: Vec<String>,
}

impl Default for EtcdConfig {
    /// 100 ms heartbeats, 600 ms election timeout (1 s leases are honoured), no TLS.
    fn default() -> Self {
        EtcdConfig {
            heartbeat: Duration::from_millis(100),
            election: Duration::from_millis(600),
            tls: None,
            extra_args: Vec::new(),
        }
    }
}

/// etcd as a [`Node`] kind: the member's name, its plain-HTTP metrics listener (where
/// it reports its health), and whether clients speak TLS.
#[derive(Debug)]
pub struct Etcd {
    name: String,
    health: SocketAddr,
    tls: bool,
}

impl Kind for Etcd {
    const START_TIMEOUT: Duration = Duration::from_secs(20);

    fn ready(&self, _addr: SocketAddr, process: &mut ServerProcess) -> io::Result<()> {
        wait_healthy(self.health, process, Self::START_TIMEOUT)
    }
}

/// One etcd process of a single server or a cluster. [`start_again`](Node::start_again)
/// waits until it is healthy (it has a leader, itself or another member).
pub type EtcdMember = Node<Etcd>;

impl Node<Etcd> {
    /// The member's name (`m0`, `m1`, ...).
    pub fn name(&self) -> &str {
        &self.kind().name
    }

    /// The client endpoint: `http://127.0.0.1:<port>` (`https://` with TLS).
    pub fn endpoint(&self) -> String {
        format!("{}://{}", if self.kind().tls { "https" } else { "http" }, self.addr())
    }

    /// Whether `/health` reports the member healthy now.
    pub fn is_healthy(&self) -> bool {
        is_healthy(self.kind().health)
    }

    /// The member's Prometheus metrics (the text of `/metrics`), for tests that count the
    /// requests the server handled.
    pub fn metrics(&self) -> io::Result<String> {
        http_get(self.kind().health, "/metrics")
    }

    /// Whether the member is the leader now (`etcd_server_is_leader`).
    pub fn is_leader(&self) -> bool {
        self.metrics().is_ok_and(|m| m.lines().any(|l| l.trim() == "etcd_server_is_leader 1"))
    }

    /// Waits until `/health` reports the member healthy.
    pub fn wait_healthy(&mut self, timeout: Duration) -> io::Result<()> {
        wait_healthy(self.kind.health, &mut self.process, timeout)
    }
}

fn is_healthy(health: SocketAddr) -> bool {
    http_get(health, "/health").is_ok_and(|reply| reply.contains("\"health\":\"true\""))
}

fn wait_healthy(health: SocketAddr, process: &mut ServerProcess, timeout: Duration) -> io::Result<()> {
    process.wait_until("healthy", timeout, Duration::from_millis(20), || Ok(is_healthy(health)))
}

/// `etcd://host:port,host:port,...` (`etcds://` with TLS) listing `members`.
fn url(members: &[EtcdMember]) -> String {
    let tls = members.first().is_some_and(|m| m.kind().tls);
    let hosts: Vec<String> = members.iter().map(|m| m.addr().to_string()).collect();
    format!("{}://{}", if tls { "etcds" } else { "etcd" }, hosts.join(","))
}

/// A single etcd server in its own temporary directory.
pub type EtcdServer = Server<Etcd>;

impl Server<Etcd> {
    /// Starts a single-member etcd on free ports and waits until it is healthy.
    pub fn start(config: &EtcdConfig) -> io::Result<Self> {
        let (mut members, _, dir) = start_members(1, config)?;
        Ok(Server { node: members.remove(0), _dir: dir })
    }

    /// `etcd://127.0.0.1:<port>` (`etcds://` with TLS), the URL form of dlock's etcd backend.
    pub fn url(&self) -> String {
        url(std::slice::from_ref(&self.node))
    }

    /// The member, for kill, pause and restart.
    pub fn member(&mut self) -> &mut EtcdMember {
        &mut self.node
    }
}

/// A cluster of etcd members on loopback ports, sharing one temporary directory. Each
/// member's peers reach it through a [`PeerGate`], so that members can be partitioned
/// from each other ([`isolate`](EtcdCluster::isolate)).
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<EtcdMember>,
    gates: Vec<PeerGate>,
    /// Each member's id as its peers name it, learnt at start.
    ids: Vec<String>,
    _dir: TempDir,
}

impl EtcdCluster {
    /// Starts `size` members and waits until every one is healthy.
    pub fn start(size: usize, config: &EtcdConfig) -> io::Result<Self> {
        if size == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a cluster needs at least one member"));
        }
        let (members, gates, dir) = start_members(size, config)?;
        let mut cluster = EtcdCluster { members, gates, ids: Vec::new(), _dir: dir };
        // Learnt while every member is up and the machine is as calm as it will be.
        if size > 1 {
            cluster.member_ids()?;
        }
        Ok(cluster)
    }

    /// Cuts member `index` off from every other member, both ways: its peers refuse its
    /// connections and it refuses theirs. Its clients still reach it.
    pub fn isolate(&mut self, index: usize) -> io::Result<()> {
        let ids = self.member_ids()?;
        for (i, gate) in self.gates.iter().enumerate() {
            if i == index {
                ids.iter().enumerate().filter(|&(j, _)| j != index).for_each(|(_, id)| gate.refuse(id));
            } else {
                gate.refuse(&ids[index]);
            }
        }
        Ok(())
    }

    /// Lets every member reach every other again.
    pub fn heal(&mut self) {
        self.gates.iter().for_each(PeerGate::admit_all);
    }

    /// The members' ids (in member order), as each reports its own on its metrics
    /// listener (`etcd_server_id`), read once (at start; again only if that failed).
    fn member_ids(&mut self) -> io::Result<Vec<String>> {
        if self.ids.is_empty() {
            self.ids = (0..self.members.len())
                .map(|i| {
                    let member = &self.members[i];
                    poll(Duration::from_secs(10), Duration::from_millis(100), || Ok(own_id(&member.metrics()?)))?
                        .ok_or_else(|| io::Error::other(format!("m{i} did not report its id within 10 s")))
                })
                .collect::<io::Result<_>>()?;
        }
        Ok(self.ids.clone())
    }

    /// How many members the cluster has.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the cluster has no member (never true for a started cluster).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Every member's client address.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.members.iter().map(EtcdMember::addr).collect()
    }

    /// Every member's client endpoint.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(EtcdMember::endpoint).collect()
    }

    /// `etcd://host:port,host:port,...` listing every member.
    pub fn url(&self) -> String {
        url(&self.members)
    }

    /// One member.
    pub fn member(&mut self, index: usize) -> &mut EtcdMember {
        &mut self.members[index]
    }

    /// Every member.
    pub fn members(&mut self) -> &mut [EtcdMember] {
        &mut self.members
    }

    /// The index of the member that is the leader now, if a running one says so.
    pub fn leader(&mut self) -> Option<usize> {
        (0..self.members.len()).find(|&i| self.members[i].is_running() && self.members[i].is_leader())
    }

    /// Waits until some running member is the leader and every running member is healthy;
    /// returns the leader's index.
    pub fn wait_for_leader(&mut self, timeout: Duration) -> io::Result<usize> {
        let leader = poll(timeout, Duration::from_millis(20), || {
            let Some(leader) = self.leader() else { return Ok(None) };
            Ok(self.members.iter_mut().all(|m| !m.is_running() || m.is_healthy()).then_some(leader))
        })?;
        leader.ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, format!("no etcd leader within {timeout:?}")))
    }
}

fn data_root() -> io::Result<TempDir> {
    let shm = Path::new("/dev/shm");
    let builder = {
        let mut b = tempfile::Builder::new();
        b.prefix("dlock-etcd-");
        b
    };
    if shm.is_dir() {
        if let Ok(dir) = builder.tempdir_in(shm) {
            return Ok(dir);
        }
    }
    builder.tempdir()
}

struct Ports {
    client: u16,
    peer: u16,
    health: u16,
}

/// The member's own id, hex, from its metrics (`etcd_server_id{server_id="<hex>"} 1`),
/// as peers send it in `X-Server-From`.
fn own_id(metrics: &str) -> Option<String> {
    let line = metrics.lines().find(|l| l.starts_with("etcd_server_id{"))?;
    let id = line.split("server_id=\"").nth(1)?.split('"').next()?;
    Some(id.to_string())
}

/// Starts `size` members, retrying the whole set on fresh ports when one fails to start
/// (which is what happens when another process took a port first). A cluster of more
/// than one member gets a gate in front of each member's peer listener.
fn start_members(size: usize, config: &EtcdConfig) -> io::Result<(Vec<EtcdMember>, Vec<PeerGate>, TempDir)> {
    let program = program("etcd", &["/usr/bin", "/usr/local/bin"])?;
    retry(5, || {
        let dir = data_root()?;
        let (members, gates) = try_start(&program, size, config, dir.path())?;
        Ok((members, gates, dir))
    })
}

fn try_start(
    program: &Path,
    size: usize,
    config: &EtcdConfig,
    dir: &Path,
) -> io::Result<(Vec<EtcdMember>, Vec<PeerGate>)> {
    let ports = (0..size)
        .map(|_| Ok(Ports { client: free_port()?, peer: free_port()?, health: free_port()? }))
        .collect::<io::Result<Vec<_>>>()?;
    let gates = if size > 1 {
        ports.iter().map(|p| PeerGate::start(SocketAddr::from(([127, 0, 0, 1], p.peer)))).collect::<io::Result<_>>()?
    } else {
        Vec::new()
    };
    // What peers dial: the member's gate when it has one.
    let advertised = |i: usize| match gates.get(i) {
        Some(gate) => format!("http://{}", gate.addr()),
        None => format!("http://127.0.0.1:{}", ports[i].peer),
    };
    let token = format!("dlock-{:016x}", fastrand::u64(..));
    let initial_cluster: Vec<String> = (0..size).map(|i| format!("m{i}={}", advertised(i))).collect();
    let initial_cluster = initial_cluster.join(",");
    let scheme = if config.tls.is_some() { "https" } else { "http" };

    let mut members = Vec::with_capacity(size);
    for (i, p) in ports.iter().enumerate() {
        let name = format!("m{i}");
        let client_url = format!("{scheme}://127.0.0.1:{}", p.client);
        let peer_url = format!("http://127.0.0.1:{}", p.peer);
        let advertised_peer_url = advertised(i);
        let mut args = vec![
            "--name".to_string(),
            name.clone(),
            "--data-dir".into(),
            dir.join(&name).display().to_string(),
            "--listen-client-urls".into(),
            client_url.clone(),
            "--advertise-client-urls".into(),
            client_url,
            "--listen-peer-urls".into(),
            peer_url.clone(),
            "--initial-advertise-peer-urls".into(),
            advertised_peer_url,
            "--listen-metrics-urls".into(),
            format!("http://127.0.0.1:{}", p.health),
            "--initial-cluster".into(),
            initial_cluster.clone(),
            "--initial-cluster-state".into(),
            "new".into(),
            "--initial-cluster-token".into(),
            token.clone(),
            "--heartbeat-interval".into(),
            config.heartbeat.as_millis().to_string(),
            "--election-timeout".into(),
            config.election.as_millis().to_string(),
            "--logger".into(),
            "zap".into(),
            "--log-level".into(),
            "warn".into(),
        ];
        if let Some(tls) = &config.tls {
            args.extend([
                "--cert-file".to_string(),
                tls.cert.display().to_string(),
                "--key-file".into(),
                tls.key.display().to_string(),
            ]);
            if let Some(ca) = &tls.client_ca {
                args.extend(["--client-cert-auth".to_string(), "--trusted-ca-file".into(), ca.display().to_string()]);
            }
        }
        args.extend(config.extra_args.iter().cloned());
        let spec = CommandSpec::new(program).args(args).cwd(dir);
        let process = ServerProcess::spawn(format!("etcd-{name}:{}", p.client), spec, dir.join(format!("{name}.log")))?;
        let kind = Etcd { name, health: SocketAddr::from(([127, 0, 0, 1], p.health)), tls: config.tls.is_some() };
        members.push(Node::new(kind, process, SocketAddr::from(([127, 0, 0, 1], p.client))));
    }
    for member in &mut members {
        // On failure the members are dropped, which kills them.
        member.wait_ready()?;
    }
    Ok((members, gates))
}

/// A `GET` over plain HTTP/1.0 (so the body is never chunked) to the metrics listener;
/// the whole reply, headers included.
fn http_get(addr: SocketAddr, path: &str) -> io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(200))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_millis(500)))?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply)?;
    Ok(reply)
}
