//! redis-server instances on free loopback ports.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tempfile::TempDir;

use super::{find_program, start_on_free_port, wait_for_port, CommandSpec, ServerProcess};

/// How to run a redis-server.
#[derive(Debug, Clone, Default)]
pub struct RedisConfig {
    /// Append-only file with fsync on every write, so a kill -9 loses nothing
    /// (the fence counters survive a restart).
    pub persistent: bool,
    /// More `--option value` arguments.
    pub extra_args: Vec<String>,
}

/// A running redis-server in its own temporary directory.
#[derive(Debug)]
pub struct RedisServer {
    process: ServerProcess,
    addr: SocketAddr,
    // Dropped after the process (fields drop in order), so the data outlives the server.
    _dir: TempDir,
}

impl RedisServer {
    /// Starts a redis-server on a free port.
    pub fn start(config: &RedisConfig) -> io::Result<Self> {
        let program = find_program("redis-server", &["/usr/bin", "/usr/local/bin"]).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "redis-server not found; run scripts/install-backends")
        })?;
        start_on_free_port(|port| {
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
            let spec = CommandSpec::new(&program).args(args).cwd(dir.path());
            let mut process = ServerProcess::spawn(format!("redis-server:{port}"), spec, dir.path().join("redis.log"))?;
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            wait_for_port(addr, &mut process, Duration::from_secs(10))?;
            Ok(RedisServer { process, addr, _dir: dir })
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// The process, for kill, pause and restart.
    pub fn process(&mut self) -> &mut ServerProcess {
        &mut self.process
    }

    /// kill -9.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Starts it again on the same port and data, and waits until it listens.
    pub fn start_again(&mut self) -> io::Result<()> {
        self.process.start_again()?;
        wait_for_port(self.addr, &mut self.process, Duration::from_secs(10))
    }
}
