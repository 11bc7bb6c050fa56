//! ZooKeeper servers on free loopback ports: one standalone server, or an ensemble of
//! members, each a `QuorumPeerMain` JVM started from the Debian package's jars in its own
//! temporary directory.
//!
//! The servers run with a short tick (100 ms) so that short session timeouts are honoured
//! (the server clamps a requested timeout into `[minSessionTimeout, maxSessionTimeout]`),
//! a large `maxSessionTimeout` (120 s) so that long leases are honoured too, the admin
//! server disabled, and the four-letter words whitelisted ([`four_letter_word`] sends them:
//! `srvr` to wait for readiness, `mntr` to count watch notifications).
//!
//! A standalone server can also serve TLS on a `secureClientPort` ([`ZooKeeperTls`]). It
//! keeps its plaintext client port then: the four-letter words, and so the readiness
//! check, are only answered there.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use dlock_conformance::Fault;
use tempfile::TempDir;

use super::{free_port, program, retry, retry_async, CommandSpec, Kind, Node, Server, ServerProcess};
use crate::proxy::FaultProxy;

/// The jar of the ZooKeeper server (its manifest names the other jars it needs).
const SERVER_JAR: &str = "/usr/share/java/zookeeper.jar";

/// A logging binding for the server's slf4j calls; without it the server logs nothing.
const LOG_JAR: &str = "/usr/share/java/slf4j-simple.jar";

/// A Netty jar the Debian server jar's manifest does not list but its TLS port needs: the
/// server starts without it, then fails every TLS connection with a `NoClassDefFoundError`
/// (`io/netty/handler/codec/ByteToMessageDecoder`, which Netty's `SslHandler` extends).
const NETTY_CODEC_JAR: &str = "/usr/share/java/netty-codec.jar";

/// TLS on a standalone server's `secureClientPort`, served by Netty (the NIO connection
/// factory that ZooKeeper uses otherwise has no TLS), beside the plaintext client port.
///
/// The server reads PEM files directly (`ssl.keyStore.type=PEM`), so the test PKI's
/// files need no conversion to a Java key store: the key and the certificate are copied
/// into one file, as the server wants them.
#[derive(Debug, Clone)]
pub struct ZooKeeperTls {
    /// The server certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM, PKCS#8).
    pub key: PathBuf,
    /// When set, clients must present a certificate signed by this CA (PEM)
    /// (`ssl.clientAuth=need`); otherwise the server asks for none (`ssl.clientAuth=none`).
    /// The server does not match a client certificate's names against the client's address
    /// (`ssl.hostnameVerification=false`): test client certificates name no host.
    pub client_ca: Option<PathBuf>,
}

impl ZooKeeperTls {
    /// Writes the key store (key, then certificate) into `dir`, and returns the `zoo.cfg`
    /// lines for a secure client port `port`.
    fn config_lines(&self, dir: &Path, port: u16) -> io::Result<Vec<String>> {
        let key_store = dir.join("server-keystore.pem");
        let mut pem = std::fs::read_to_string(&self.key)?;
        if !pem.ends_with('\n') {
            pem.push('\n');
        }
        pem.push_str(&std::fs::read_to_string(&self.cert)?);
        std::fs::write(&key_store, pem)?;
        let mut lines = vec![
            "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory".to_string(),
            format!("secureClientPort={port}"),
            "secureClientPortAddress=127.0.0.1".to_string(),
            format!("ssl.keyStore.location={}", key_store.display()),
            "ssl.keyStore.type=PEM".to_string(),
            "ssl.hostnameVerification=false".to_string(),
        ];
        match &self.client_ca {
            Some(ca) => lines.extend([
                "ssl.clientAuth=need".to_string(),
                format!("ssl.trustStore.location={}", ca.display()),
                "ssl.trustStore.type=PEM".to_string(),
            ]),
            None => lines.push("ssl.clientAuth=none".to_string()),
        }
        Ok(lines)
    }
}

/// How to run a ZooKeeper server or ensemble member.
#[derive(Debug, Clone)]
pub struct ZooKeeperConfig {
    /// The server's tick; session timeouts are tracked in ticks.
    pub tick: Duration,
    /// The shortest session timeout the server grants.
    pub min_session_timeout: Duration,
    /// The longest session timeout the server grants.
    pub max_session_timeout: Duration,
    /// How often the server deletes empty container nodes
    /// (`znode.container.checkIntervalMs`; the server's default is 60 s).
    pub container_check_interval: Duration,
    /// How many empty container nodes the server deletes per minute at most
    /// (`znode.container.maxPerMinute`; the server's default is 10,000).
    pub container_max_per_minute: u32,
    /// TLS on a secure client port besides the plaintext one (standalone servers only;
    /// an ensemble refuses it).
    pub tls: Option<ZooKeeperTls>,
    /// SASL DIGEST-MD5 users (name, password). When there are any, the server
    /// authenticates clients by SASL and closes every session that does not
    /// (`enforce.auth.schemes=sasl`).
    pub sasl_users: Vec<(String, String)>,
    /// More `key=value` lines for `zoo.cfg`.
    pub extra_config: Vec<String>,
}

impl Default for ZooKeeperConfig {
    fn default() -> Self {
        ZooKeeperConfig {
            tick: Duration::from_millis(100),
            min_session_timeout: Duration::from_millis(200),
            max_session_timeout: Duration::from_secs(120),
            container_check_interval: Duration::from_secs(60),
            container_max_per_minute: 10_000,
            tls: None,
            sasl_users: Vec::new(),
            extra_config: Vec::new(),
        }
    }
}

/// Sends a four-letter word (`srvr`, `mntr`, `ruok`, ...) to a server and returns its answer.
pub fn four_letter_word(addr: SocketAddr, word: &str, timeout: Duration) -> io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(word.as_bytes())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

/// The server's `mntr` metrics as a map (`zk_server_state` → `leader`, ...).
pub fn monitor(addr: SocketAddr) -> io::Result<HashMap<String, String>> {
    let text = four_letter_word(addr, "mntr", Duration::from_secs(5))?;
    Ok(text
        .lines()
        .filter_map(|line| line.split_once('\t'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect())
}

/// What `srvr` says the server is: `Some("standalone" | "leader" | "follower" | ...)`
/// while it serves clients, `None` while it does not (starting, or without a quorum).
pub fn serving_mode(addr: SocketAddr) -> Option<String> {
    let answer = four_letter_word(addr, "srvr", Duration::from_secs(2)).ok()?;
    answer.lines().find_map(|line| line.strip_prefix("Mode: ")).map(|mode| mode.trim().to_string())
}

fn java_command() -> io::Result<CommandSpec> {
    let java = program("java", &["/usr/bin"])?;
    if !Path::new(SERVER_JAR).is_file() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{SERVER_JAR} not found; run scripts/install-backends (Debian package zookeeper)"),
        ));
    }
    let mut classpath = SERVER_JAR.to_string();
    for jar in [LOG_JAR, NETTY_CODEC_JAR] {
        if Path::new(jar).is_file() {
            classpath.push(':');
            classpath.push_str(jar);
        }
    }
    // A small, fast-starting JVM: the servers hold little data and live for one test.
    Ok(CommandSpec::new(java).args([
        "-Xmx256m",
        "-Xss512k",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        "-Xshare:auto",
        "-Djava.net.preferIPv4Stack=true",
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-Dzookeeper.jmx.log4j.disable=true",
        "-cp",
        &classpath,
    ]))
}

/// One server's data directory and `zoo.cfg`.
struct MemberFiles {
    dir: PathBuf,
    cfg: PathBuf,
}

fn write_member_files(
    base: &Path,
    id: u32,
    client_port: u16,
    secure_port: Option<u16>,
    config: &ZooKeeperConfig,
    quorum: &[String],
) -> io::Result<MemberFiles> {
    let dir = base.join(format!("member-{id}"));
    let data = dir.join("data");
    std::fs::create_dir_all(&data)?;
    let mut cfg = vec![
        format!("tickTime={}", config.tick.as_millis()),
        "initLimit=50".to_string(),
        "syncLimit=20".to_string(),
        format!("dataDir={}", data.display()),
        format!("clientPort={client_port}"),
        "clientPortAddress=127.0.0.1".to_string(),
        format!("minSessionTimeout={}", config.min_session_timeout.as_millis()),
        format!("maxSessionTimeout={}", config.max_session_timeout.as_millis()),
        "admin.enableServer=false".to_string(),
        "4lw.commands.whitelist=*".to_string(),
        // The test data is throwaway; the page cache survives a kill -9 of the server.
        "forceSync=no".to_string(),
        "maxClientCnxns=0".to_string(),
    ];
    if !quorum.is_empty() {
        std::fs::write(data.join("myid"), format!("{id}\n"))?;
        cfg.extend(quorum.iter().cloned());
        // Elections on loopback are fast; do not wait long for a dead peer.
        cfg.push("cnxTimeout=1000".to_string());
    }
    match (&config.tls, secure_port) {
        (Some(tls), Some(port)) => cfg.extend(tls.config_lines(&dir, port)?),
        (None, _) => {}
        (Some(_), None) => return Err(io::Error::other("a TLS server needs a secure client port")),
    }
    if !config.sasl_users.is_empty() {
        std::fs::write(dir.join(JAAS_FILE), jaas_server_section(&config.sasl_users))?;
        cfg.extend([
            "authProvider.sasl=org.apache.zookeeper.server.auth.SASLAuthenticationProvider".to_string(),
            "enforce.auth.enabled=true".to_string(),
            "enforce.auth.schemes=sasl".to_string(),
        ]);
    }
    cfg.extend(config.extra_config.iter().cloned());
    let cfg_path = dir.join("zoo.cfg");
    std::fs::write(&cfg_path, cfg.join("\n") + "\n")?;
    Ok(MemberFiles { dir, cfg: cfg_path })
}

/// The JAAS file, in a member's directory, that holds its SASL users.
const JAAS_FILE: &str = "jaas.conf";

/// The JAAS `Server` section that the SASL provider reads its DIGEST-MD5 users from.
fn jaas_server_section(users: &[(String, String)]) -> String {
    let users: Vec<String> = users.iter().map(|(name, password)| format!("  user_{name}=\"{password}\"")).collect();
    format!("Server {{\n  org.apache.zookeeper.server.auth.DigestLoginModule required\n{};\n}};\n", users.join("\n"))
}

fn spawn_member(name: String, files: &MemberFiles, config: &ZooKeeperConfig) -> io::Result<ServerProcess> {
    let mut java = java_command()?;
    if !config.sasl_users.is_empty() {
        java = java.args([format!("-Djava.security.auth.login.config={}", files.dir.join(JAAS_FILE).display())]);
    }
    let spec = java
        .args([
            format!("-Dznode.container.checkIntervalMs={}", config.container_check_interval.as_millis()),
            format!("-Dznode.container.maxPerMinute={}", config.container_max_per_minute),
            "org.apache.zookeeper.server.quorum.QuorumPeerMain".to_string(),
            files.cfg.display().to_string(),
        ])
        .cwd(&files.dir);
    ServerProcess::spawn(name, spec, files.dir.join("server.log"))
}

/// Waits until the server answers `srvr` with a serving mode, or the process exits, or
/// the timeout passes.
fn wait_serving(addr: SocketAddr, process: &mut ServerProcess, timeout: Duration) -> io::Result<()> {
    process.wait_until("serving", timeout, Duration::from_millis(20), || Ok(serving_mode(addr).is_some()))
}

/// ZooKeeper as a [`Node`] kind: it serves once it answers `srvr` with a mode (and accepts
/// connections on its secure client port, when it has one).
#[derive(Debug, Default)]
pub struct ZooKeeper {
    secure_port: Option<u16>,
}

impl Kind for ZooKeeper {
    // What a JVM may take to start serving on a loaded machine.
    const START_TIMEOUT: Duration = Duration::from_secs(60);

    fn ready(&self, addr: SocketAddr, process: &mut ServerProcess) -> io::Result<()> {
        wait_serving(addr, process, Self::START_TIMEOUT)?;
        match self.secure_port {
            // The server opens its secure port just after the plaintext one.
            Some(port) => super::wait_for_port(loopback(port), process, Self::START_TIMEOUT),
            None => Ok(()),
        }
    }
}

/// A standalone ZooKeeper server in its own temporary directory.
pub type ZooKeeperServer = Server<ZooKeeper>;

impl Server<ZooKeeper> {
    /// Starts a standalone server with the default [`ZooKeeperConfig`] on a free port.
    pub fn start() -> io::Result<Self> {
        Self::start_with(&ZooKeeperConfig::default())
    }

    /// Starts a standalone server on a free port, retrying with another port when the
    /// chosen one was taken meanwhile.
    pub fn start_with(config: &ZooKeeperConfig) -> io::Result<Self> {
        super::start_on_free_port(|port| {
            let secure_port = config.tls.as_ref().map(|_| free_port()).transpose()?;
            let dir = tempfile::Builder::new().prefix("dlock-zk-").tempdir()?;
            let files = write_member_files(dir.path(), 0, port, secure_port, config, &[])?;
            let process = spawn_member(format!("zookeeper:{port}"), &files, config)?;
            Server::started(ZooKeeper { secure_port }, process, port, dir)
        })
    }

    /// `127.0.0.1:<secure client port>`, where the server speaks TLS, if it was started
    /// with [`ZooKeeperConfig::tls`].
    pub fn secure_addr(&self) -> Option<SocketAddr> {
        self.kind().secure_port.map(loopback)
    }

    /// `127.0.0.1:<port>`, a ZooKeeper connect string.
    pub fn connect_string(&self) -> String {
        self.addr().to_string()
    }

    /// `zk://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("zk://{}", self.addr())
    }

    /// The server's `mntr` metrics.
    pub fn monitor(&self) -> io::Result<HashMap<String, String>> {
        monitor(self.addr())
    }
}

/// An ensemble of ZooKeeper servers on loopback, each with its own data directory.
///
/// Started with [`start_linked`](Self::start_linked), each member reaches each other one
/// through fault proxies of its own (one for the quorum port, one for the election port),
/// so that a test can cut, black-hole or delay the links between two members, or
/// partition one member from the rest, while clients still reach every member.
pub struct ZooKeeperEnsemble {
    members: Vec<Node<ZooKeeper>>,
    /// `links[i][j]`: member `i`'s connections to member `j` (none from a member to
    /// itself, and none at all in an ensemble started without links).
    links: Vec<Vec<Option<PeerLink>>>,
    _dir: TempDir,
}

/// The proxies one member's quorum and election connections to another go through.
#[derive(Debug)]
struct PeerLink {
    quorum: FaultProxy,
    election: FaultProxy,
}

impl PeerLink {
    fn set(&self, fault: Fault) {
        self.quorum.set_fault(fault);
        self.election.set_fault(fault);
    }
}

/// A member's client, quorum and election ports.
#[derive(Debug, Clone, Copy)]
struct MemberPorts {
    client: u16,
    quorum: u16,
    election: u16,
}

fn member_ports(size: usize) -> io::Result<Vec<MemberPorts>> {
    (0..size).map(|_| Ok(MemberPorts { client: free_port()?, quorum: free_port()?, election: free_port()? })).collect()
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

impl ZooKeeperEnsemble {
    /// Starts an ensemble of `size` members and waits until every member serves (one
    /// leader, the others followers). Retries on fresh ports when a port was taken.
    pub fn start(size: usize, config: &ZooKeeperConfig) -> io::Result<Self> {
        refuse_tls(config)?;
        retry(3, || {
            let ports = member_ports(size)?;
            let quorum = quorum_lines(&ports, |j| (ports[j].quorum, ports[j].election));
            Self::launch(&ports, |_| quorum.clone(), Vec::new(), config)
        })
    }

    /// Starts an ensemble of `size` members whose links to each other go through fault
    /// proxies (see [`fault_between`](Self::fault_between) and
    /// [`isolate`](Self::isolate)), and waits until every member serves. Must run on a
    /// multi-threaded tokio runtime: the proxies run on it while the members start.
    pub async fn start_linked(size: usize, config: &ZooKeeperConfig) -> io::Result<Self> {
        refuse_tls(config)?;
        retry_async(3, "a linked ensemble", || Self::try_start_linked(size, config)).await
    }

    async fn try_start_linked(size: usize, config: &ZooKeeperConfig) -> io::Result<Self> {
        let ports = member_ports(size)?;
        let mut links = Vec::with_capacity(size);
        for i in 0..size {
            let mut row = Vec::with_capacity(size);
            for (j, to) in ports.iter().enumerate() {
                row.push(if i == j {
                    None
                } else {
                    Some(PeerLink {
                        quorum: FaultProxy::start(loopback(to.quorum)).await?,
                        election: FaultProxy::start(loopback(to.election)).await?,
                    })
                });
            }
            links.push(row);
        }
        let quorum_of = |i: usize| {
            quorum_lines(&ports, |j| match &links[i][j] {
                Some(link) => (link.quorum.addr().port(), link.election.addr().port()),
                None => (ports[j].quorum, ports[j].election),
            })
        };
        let quorums: Vec<Vec<String>> = (0..size).map(quorum_of).collect();
        tokio::task::block_in_place(|| Self::launch(&ports, |i| quorums[i].clone(), links, config))
    }

    /// Spawns every member (member `i` with the `server.N` lines `quorum(i)`), then waits
    /// until each serves.
    fn launch(
        ports: &[MemberPorts],
        quorum: impl Fn(usize) -> Vec<String>,
        links: Vec<Vec<Option<PeerLink>>>,
        config: &ZooKeeperConfig,
    ) -> io::Result<Self> {
        let dir = tempfile::Builder::new().prefix("dlock-zk-ensemble-").tempdir()?;
        let mut members = Vec::new();
        for (i, port) in ports.iter().enumerate() {
            let id = (i + 1) as u32;
            let files = write_member_files(dir.path(), id, port.client, None, config, &quorum(i))?;
            let process = spawn_member(format!("zookeeper-{id}:{}", port.client), &files, config)?;
            members.push(Node::new(ZooKeeper::default(), process, loopback(port.client)));
        }
        for member in &mut members {
            member.wait_ready()?;
        }
        Ok(ZooKeeperEnsemble { members, links, _dir: dir })
    }

    /// Plays `fault` on every link between members `a` and `b`, both ways. An ensemble
    /// started without links refuses.
    pub fn fault_between(&self, a: usize, b: usize, fault: Fault) -> io::Result<()> {
        for (from, to) in [(a, b), (b, a)] {
            match self.links.get(from).and_then(|row| row.get(to)) {
                Some(Some(link)) => link.set(fault),
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::Unsupported,
                        format!("no link from member {from} to member {to}: start the ensemble with start_linked"),
                    ))
                }
            }
        }
        Ok(())
    }

    /// Plays `fault` on every link between member `i` and the others: with a black hole,
    /// the member keeps its connections open and hears nothing, as when the network
    /// between hosts fails. Its clients still reach it.
    pub fn isolate(&self, i: usize, fault: Fault) -> io::Result<()> {
        (0..self.members.len()).filter(|&j| j != i).try_for_each(|j| self.fault_between(i, j, fault))
    }

    /// Lets every member reach every other again.
    pub fn heal(&self) {
        self.links.iter().flatten().flatten().for_each(|link| link.set(Fault::None));
    }

    /// The number of members.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// The client address of member `i` (0-based).
    pub fn addr(&self, i: usize) -> SocketAddr {
        self.members[i].addr()
    }

    /// Every member's client address, comma-separated: a ZooKeeper connect string.
    pub fn connect_string(&self) -> String {
        self.members.iter().map(|m| m.addr().to_string()).collect::<Vec<_>>().join(",")
    }

    /// `zk://<every member>`.
    pub fn url(&self) -> String {
        format!("zk://{}", self.connect_string())
    }

    /// The index of the member that says it leads, if one does.
    pub fn leader(&self) -> Option<usize> {
        (0..self.members.len()).find(|&i| serving_mode(self.members[i].addr()).as_deref() == Some("leader"))
    }

    /// kill -9 of member `i`, keeping its data.
    pub fn kill(&mut self, i: usize) {
        self.members[i].kill();
    }

    /// Starts member `i` again on its ports and data, and waits until it serves.
    pub fn start_again(&mut self, i: usize) -> io::Result<()> {
        self.members[i].start_again()
    }

    /// Waits until the members still running serve again (a quorum elected a leader).
    pub fn wait_serving(&mut self, timeout: Duration) -> io::Result<()> {
        for member in &mut self.members {
            if member.process.pid().is_some() {
                wait_serving(member.addr, &mut member.process, timeout)?;
            }
        }
        Ok(())
    }

    /// The `mntr` metrics of member `i`.
    pub fn monitor(&self, i: usize) -> io::Result<HashMap<String, String>> {
        monitor(self.members[i].addr())
    }
}

/// Ensembles serve plaintext only: TLS between clients and members is tested on a
/// standalone server, and members would need TLS between themselves too.
fn refuse_tls(config: &ZooKeeperConfig) -> io::Result<()> {
    match config.tls {
        Some(_) => Err(io::Error::new(io::ErrorKind::Unsupported, "TLS is for standalone ZooKeeper servers only")),
        None => Ok(()),
    }
}

/// The `server.N=host:quorum:election` lines of an ensemble, member `j` reached at the
/// ports `reach(j)`.
fn quorum_lines(ports: &[MemberPorts], reach: impl Fn(usize) -> (u16, u16)) -> Vec<String> {
    (0..ports.len())
        .map(|j| {
            let (quorum, election) = reach(j);
            format!("server.{}=127.0.0.1:{quorum}:{election}", j + 1)
        })
        .collect()
}

impl std::fmt::Debug for ZooKeeperEnsemble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZooKeeperEnsemble").field("members", &self.connect_string()).finish()
    }
}
