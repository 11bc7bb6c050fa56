//! ZooKeeper servers on free loopback ports: one standalone server, or an ensemble of
//! members, each a `QuorumPeerMain` JVM started from the Debian package's jars in its own
//! temporary directory.
//!
//! The servers run with a short tick (100 ms) so that short session timeouts are honoured
//! (the server clamps a requested timeout into `[minSessionTimeout, maxSessionTimeout]`),
//! a large `maxSessionTimeout` (120 s) so that long leases are honoured too, the admin
//! server disabled, and the four-letter words whitelisted ([`four_letter_word`] sends them:
//! `srvr` to wait for readiness, `mntr` to count watch notifications).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;

use super::{free_port, program, retry, CommandSpec, Kind, Node, Server, ServerProcess};

/// The jar of the ZooKeeper server (its manifest names the other jars it needs).
const SERVER_JAR: &str = "/usr/share/java/zookeeper.jar";

/// A logging binding for the server's slf4j calls; without it the server logs nothing.
const LOG_JAR: &str = "/usr/share/java/slf4j-simple.jar";

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
    if Path::new(LOG_JAR).is_file() {
        classpath.push(':');
        classpath.push_str(LOG_JAR);
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
    cfg.extend(config.extra_config.iter().cloned());
    let cfg_path = dir.join("zoo.cfg");
    std::fs::write(&cfg_path, cfg.join("\n") + "\n")?;
    Ok(MemberFiles { dir, cfg: cfg_path })
}

fn spawn_member(name: String, files: &MemberFiles, config: &ZooKeeperConfig) -> io::Result<ServerProcess> {
    let spec = java_command()?
        .args([
            format!("-Dznode.container.checkIntervalMs={}", config.container_check_interval.as_millis()),
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

/// ZooKeeper as a [`Node`] kind: it serves once it answers `srvr` with a mode.
#[derive(Debug)]
pub struct ZooKeeper;

impl Kind for ZooKeeper {
    // What a JVM may take to start serving on a loaded machine.
    const START_TIMEOUT: Duration = Duration::from_secs(60);

    fn ready(&self, addr: SocketAddr, process: &mut ServerProcess) -> io::Result<()> {
        wait_serving(addr, process, Self::START_TIMEOUT)
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
            let dir = tempfile::Builder::new().prefix("dlock-zk-").tempdir()?;
            let files = write_member_files(dir.path(), 0, port, config, &[])?;
            let process = spawn_member(format!("zookeeper:{port}"), &files, config)?;
            Server::started(ZooKeeper, process, port, dir)
        })
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
pub struct ZooKeeperEnsemble {
    members: Vec<Node<ZooKeeper>>,
    _dir: TempDir,
}

impl ZooKeeperEnsemble {
    /// Starts an ensemble of `size` members and waits until every member serves (one
    /// leader, the others followers). Retries on fresh ports when a port was taken.
    pub fn start(size: usize, config: &ZooKeeperConfig) -> io::Result<Self> {
        retry(3, || Self::try_start(size, config))
    }

    fn try_start(size: usize, config: &ZooKeeperConfig) -> io::Result<Self> {
        let dir = tempfile::Builder::new().prefix("dlock-zk-ensemble-").tempdir()?;
        let mut ports = Vec::new();
        for _ in 0..size {
            ports.push((free_port()?, free_port()?, free_port()?));
        }
        let quorum: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer, election))| format!("server.{}=127.0.0.1:{peer}:{election}", i + 1))
            .collect();
        let mut members = Vec::new();
        for (i, (client, _, _)) in ports.iter().enumerate() {
            let id = (i + 1) as u32;
            let files = write_member_files(dir.path(), id, *client, config, &quorum)?;
            let process = spawn_member(format!("zookeeper-{id}:{client}"), &files, config)?;
            members.push(Node::new(ZooKeeper, process, SocketAddr::from(([127, 0, 0, 1], *client))));
        }
        for member in &mut members {
            member.wait_ready()?;
        }
        Ok(ZooKeeperEnsemble { members, _dir: dir })
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

impl std::fmt::Debug for ZooKeeperEnsemble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZooKeeperEnsemble").field("members", &self.connect_string()).finish()
    }
}
