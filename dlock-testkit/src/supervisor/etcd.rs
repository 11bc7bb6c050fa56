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
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::{find_program, free_port, CommandSpec, ServerProcess};

/// How long a member may take to become healthy.
const START_TIMEOUT: Duration = Duration::from_secs(20);

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

/// One etcd process of a single server or a cluster.
#[derive(Debug)]
pub struct EtcdMember {
    name: String,
    process: ServerProcess,
    client: SocketAddr,
    health: SocketAddr,
    tls: bool,
}

impl EtcdMember {
    /// The member's name (`m0`, `m1`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The client address.
    pub fn addr(&self) -> SocketAddr {
        self.client
    }

    /// The client endpoint: `http://127.0.0.1:<port>` (`https://` with TLS).
    pub fn endpoint(&self) -> String {
        format!("{}://{}", if self.tls { "https" } else { "http" }, self.client)
    }

    /// The process, for kill, pause and restart.
    pub fn process(&mut self) -> &mut ServerProcess {
        &mut self.process
    }

    /// kill -9 (the data directory stays).
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Whether the process runs.
    pub fn is_running(&mut self) -> bool {
        self.process.pid().is_some() && matches!(self.process.exit_status(), Ok(None))
    }

    /// Starts the member again on the same ports and data, and waits until it is healthy
    /// (it has a leader, itself or another member).
    pub fn start_again(&mut self) -> io::Result<()> {
        self.process.start_again()?;
        self.wait_healthy(START_TIMEOUT)
    }

    /// Whether `/health` reports the member healthy now.
    pub fn is_healthy(&self) -> bool {
        http_get(self.health, "/health").is_ok_and(|reply| reply.contains("\"health\":\"true\""))
    }

    /// The member's Prometheus metrics (the text of `/metrics`), for tests that count the
    /// requests the server handled.
    pub fn metrics(&self) -> io::Result<String> {
        http_get(self.health, "/metrics")
    }

    /// Whether the member is the leader now (`etcd_server_is_leader`).
    pub fn is_leader(&self) -> bool {
        self.metrics().is_ok_and(|m| m.lines().any(|l| l.trim() == "etcd_server_is_leader 1"))
    }

    /// Waits until `/health` reports the member healthy.
    pub fn wait_healthy(&mut self, timeout: Duration) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.is_healthy() {
                return Ok(());
            }
            if let Some(status) = self.process.exit_status()? {
                return Err(io::Error::other(format!(
                    "{} exited with {status} before it was healthy; log:\n{}",
                    self.process.name(),
                    self.process.log_tail()
                )));
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{} was not healthy within {timeout:?}; log:\n{}",
                        self.process.name(),
                        self.process.log_tail()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A single etcd server in its own temporary directory.
#[derive(Debug)]
pub struct EtcdServer {
    member: EtcdMember,
    // Dropped after the process (fields drop in order), so the data outlives the server.
    _dir: TempDir,
}

impl EtcdServer {
    /// Starts a single-member etcd on free ports and waits until it is healthy.
    pub fn start(config: &EtcdConfig) -> io::Result<Self> {
        let (mut members, dir) = start_members(1, config)?;
        Ok(EtcdServer { member: members.remove(0), _dir: dir })
    }

    /// The client address.
    pub fn addr(&self) -> SocketAddr {
        self.member.addr()
    }

    /// The client endpoint, `http://127.0.0.1:<port>` (`https://` with TLS).
    pub fn endpoint(&self) -> String {
        self.member.endpoint()
    }

    /// `etcd://127.0.0.1:<port>` (`etcds://` with TLS), the URL form of dlock's etcd backend.
    pub fn url(&self) -> String {
        format!("{}://{}", if self.member.tls { "etcds" } else { "etcd" }, self.member.addr())
    }

    /// The member, for kill, pause and restart.
    pub fn member(&mut self) -> &mut EtcdMember {
        &mut self.member
    }

    /// kill -9.
    pub fn kill(&mut self) {
        self.member.kill();
    }

    /// Starts it again on the same port and data, and waits until it is healthy.
    pub fn start_again(&mut self) -> io::Result<()> {
        self.member.start_again()
    }
}

/// A cluster of etcd members on loopback ports, sharing one temporary directory.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<EtcdMember>,
    _dir: TempDir,
}

impl EtcdCluster {
    /// Starts `size` members and waits until every one is healthy.
    pub fn start(size: usize, config: &EtcdConfig) -> io::Result<Self> {
        if size == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a cluster needs at least one member"));
        }
        let (members, dir) = start_members(size, config)?;
        Ok(EtcdCluster { members, _dir: dir })
    }

    /// How many members the cluster has.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the cluster has no member (never true for a started cluster).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Every member's client endpoint.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(EtcdMember::endpoint).collect()
    }

    /// `etcd://host:port,host:port,...` listing every member.
    pub fn url(&self) -> String {
        let tls = self.members.first().is_some_and(|m| m.tls);
        let hosts: Vec<String> = self.members.iter().map(|m| m.addr().to_string()).collect();
        format!("{}://{}", if tls { "etcds" } else { "etcd" }, hosts.join(","))
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
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(leader) = self.leader() {
                let healthy =
                    (0..self.members.len()).all(|i| !self.members[i].is_running() || self.members[i].is_healthy());
                if healthy {
                    return Ok(leader);
                }
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(io::ErrorKind::TimedOut, format!("no etcd leader within {timeout:?}")));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
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

/// Starts `size` members, retrying the whole set on fresh ports when one fails to start
/// (which is what happens when another process took a port first).
fn start_members(size: usize, config: &EtcdConfig) -> io::Result<(Vec<EtcdMember>, TempDir)> {
    let program = find_program("etcd", &["/usr/bin", "/usr/local/bin"])
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "etcd not found; run scripts/install-backends"))?;
    let mut last = None;
    for _ in 0..5 {
        let dir = data_root()?;
        match try_start(&program, size, config, dir.path()) {
            Ok(members) => return Ok((members, dir)),
            Err(err) => last = Some(err),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no attempt made")))
}

fn try_start(program: &Path, size: usize, config: &EtcdConfig, dir: &Path) -> io::Result<Vec<EtcdMember>> {
    let ports = (0..size)
        .map(|_| Ok(Ports { client: free_port()?, peer: free_port()?, health: free_port()? }))
        .collect::<io::Result<Vec<_>>>()?;
    let token = format!("dlock-{:016x}", fastrand::u64(..));
    let initial_cluster: Vec<String> =
        ports.iter().enumerate().map(|(i, p)| format!("m{i}=http://127.0.0.1:{}", p.peer)).collect();
    let initial_cluster = initial_cluster.join(",");
    let scheme = if config.tls.is_some() { "https" } else { "http" };

    let mut members = Vec::with_capacity(size);
    for (i, p) in ports.iter().enumerate() {
        let name = format!("m{i}");
        let client_url = format!("{scheme}://127.0.0.1:{}", p.client);
        let peer_url = format!("http://127.0.0.1:{}", p.peer);
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
            peer_url,
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
        members.push(EtcdMember {
            name,
            process,
            client: SocketAddr::from(([127, 0, 0, 1], p.client)),
            health: SocketAddr::from(([127, 0, 0, 1], p.health)),
            tls: config.tls.is_some(),
        });
    }
    for member in &mut members {
        // On failure the members are dropped, which kills them.
        member.wait_healthy(START_TIMEOUT)?;
    }
    Ok(members)
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
