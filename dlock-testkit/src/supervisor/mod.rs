//! The server supervisor: real servers from installed binaries, on free loopback ports,
//! in temporary directories, with kill -9, SIGSTOP/SIGCONT and restart on the same data.
//!
//! One module per server kind builds on [`ServerProcess`]. Environment variables named
//! `DLOCK_TEST_<KIND>_URL` point the suite at external servers instead (see [`external_url`]).

pub mod etcd;
pub mod mariadb;
pub mod postgres;
pub mod redis;
pub mod tls;
pub mod zookeeper;

use std::fs::File;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The URL of an external server to use instead of starting one, from
/// `DLOCK_TEST_<KIND>_URL` (for instance `DLOCK_TEST_REDIS_URL`), if set and not empty.
pub fn external_url(kind: &str) -> Option<String> {
    let var = format!("DLOCK_TEST_{}_URL", kind.to_ascii_uppercase());
    std::env::var(var).ok().filter(|v| !v.trim().is_empty())
}

/// A loopback port nobody listens on right now, and that no other test process of this
/// machine is handed while this one lives.
///
/// Test processes reserve the ports they hand out with a lock file (released by the
/// kernel when the process exits), so two tests never start servers on one port. A
/// process that is not a test may still take the port before the server binds it;
/// [`start_on_free_port`] retries with a new port when that happens.
pub fn free_port() -> io::Result<u16> {
    static RESERVED: Mutex<Vec<File>> = Mutex::new(Vec::new());
    let dir = std::env::temp_dir().join("dlock-test-ports");
    std::fs::create_dir_all(&dir)?;
    for _ in 0..100 {
        let port = TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port();
        let reservation =
            File::options().create(true).truncate(false).write(true).open(dir.join(format!("{port}.lock")))?;
        match reservation.try_lock() {
            Ok(()) => {
                RESERVED.lock().unwrap_or_else(|p| p.into_inner()).push(reservation);
                return Ok(port);
            }
            Err(std::fs::TryLockError::WouldBlock) => continue,
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
    }
    Err(io::Error::other("no free loopback port could be reserved"))
}

/// Waits until something accepts TCP connections on `addr`, or `child` exits, or the
/// timeout passes.
pub fn wait_for_port(addr: SocketAddr, server: &mut ServerProcess, timeout: Duration) -> io::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if let Some(status) = server.exit_status()? {
            return Err(io::Error::other(format!(
                "{} exited with {status} before listening on {addr}; log:\n{}",
                server.name,
                server.log_tail()
            )));
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{} did not listen on {addr} within {timeout:?}; log:\n{}", server.name, server.log_tail()),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts a server on a free port, retrying with a fresh port (up to 5 times) when the
/// start fails, which is what happens when another process took the port first.
pub fn start_on_free_port<T>(mut start: impl FnMut(u16) -> io::Result<T>) -> io::Result<T> {
    let mut last = None;
    for _ in 0..5 {
        match start(free_port()?) {
            Ok(server) => return Ok(server),
            Err(err) => last = Some(err),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no attempt made")))
}

/// A kind of server: how long it may take to come up, and how to tell that it has.
pub trait Kind {
    /// How long a start (or a start again) may take.
    const START_TIMEOUT: Duration = Duration::from_secs(30);

    /// Waits until the process serves on `addr`; by default, until it accepts connections.
    fn ready(&self, addr: SocketAddr, process: &mut ServerProcess) -> io::Result<()> {
        wait_for_port(addr, process, Self::START_TIMEOUT)
    }
}

/// A server on a loopback port, in a scratch directory that outlives its process: what
/// every kind of server shares. `K` holds what is particular to the kind (its start and
/// its URL live in the kind's module).
#[derive(Debug)]
pub struct Server<K> {
    kind: K,
    process: ServerProcess,
    addr: SocketAddr,
    // Dropped after the process (fields drop in order), so the data outlives the server.
    _dir: tempfile::TempDir,
}

impl<K: Kind> Server<K> {
    /// Waits until the process just spawned serves on `127.0.0.1:port`.
    pub(crate) fn started(kind: K, mut process: ServerProcess, port: u16, dir: tempfile::TempDir) -> io::Result<Self> {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        kind.ready(addr, &mut process)?;
        Ok(Server { kind, process, addr, _dir: dir })
    }

    pub(crate) fn kind(&self) -> &K {
        &self.kind
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The process, for kill, pause and restart.
    pub fn process(&mut self) -> &mut ServerProcess {
        &mut self.process
    }

    /// The directory it keeps its data and log in.
    pub fn dir(&self) -> &Path {
        self._dir.path()
    }

    /// kill -9, keeping the data.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Starts it again on the same port and data, and waits until it serves. A killed
    /// server's children may hold its data for a moment (PostgreSQL's backends do), and
    /// the new process then gives up at once: the start is retried for a while.
    pub fn start_again(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + K::START_TIMEOUT;
        loop {
            self.process.start_again()?;
            match self.kind.ready(self.addr, &mut self.process) {
                Ok(()) => return Ok(()),
                Err(err) if Instant::now() < deadline => {
                    tracing::debug!(%err, "{} did not start again yet; retrying", self.process.name());
                    self.process.kill();
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(err) => return Err(err),
            }
        }
    }
}

/// How to start a server process.
#[derive(Debug, Clone)]
pub struct CommandSpec {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// The working directory.
    pub cwd: Option<PathBuf>,
}

impl CommandSpec {
    /// A command with no arguments.
    pub fn new(program: impl Into<PathBuf>) -> Self {
        CommandSpec { program: program.into(), args: Vec::new(), env: Vec::new(), cwd: None }
    }

    /// Adds arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Adds an environment variable.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Sets the working directory.
    pub fn cwd(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cwd = Some(dir.into());
        self
    }
}

/// A server process the harness owns: killed when dropped, and by the kernel if the
/// test process dies first.
#[derive(Debug)]
pub struct ServerProcess {
    name: String,
    spec: CommandSpec,
    log: PathBuf,
    child: Option<Child>,
}

impl ServerProcess {
    /// Starts `spec`, sending its output to `log`.
    pub fn spawn(name: impl Into<String>, spec: CommandSpec, log: impl Into<PathBuf>) -> io::Result<Self> {
        let mut server = ServerProcess { name: name.into(), spec, log: log.into(), child: None };
        server.start()?;
        Ok(server)
    }

    fn start(&mut self) -> io::Result<()> {
        let out = File::options().create(true).append(true).open(&self.log)?;
        let err = out.try_clone()?;
        let mut cmd = Command::new(&self.spec.program);
        cmd.args(&self.spec.args).stdin(Stdio::null()).stdout(out).stderr(err);
        for (k, v) in &self.spec.env {
            cmd.env(k, v);
        }
        if let Some(dir) = &self.spec.cwd {
            cmd.current_dir(dir);
        }
        self.child = Some(spawn_tied_to_process(cmd).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot start {} ({}): {e}", self.name, self.spec.program.display()))
        })?);
        Ok(())
    }

    /// The server's name, for messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The exit status, if the process has exited.
    pub fn exit_status(&mut self) -> io::Result<Option<std::process::ExitStatus>> {
        match self.child.as_mut() {
            Some(child) => child.try_wait(),
            None => Ok(None),
        }
    }

    /// kill -9, then reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP: the process freezes, its sockets stay open.
    pub fn pause(&self) -> io::Result<()> {
        self.signal(libc::SIGSTOP)
    }

    /// SIGCONT after [`pause`](Self::pause).
    pub fn resume(&self) -> io::Result<()> {
        self.signal(libc::SIGCONT)
    }

    /// Sends a signal to the process.
    pub fn signal(&self, signal: i32) -> io::Result<()> {
        let pid = self.pid().ok_or_else(|| io::Error::other(format!("{} is not running", self.name)))?;
        signal_pid(pid, signal)
    }

    /// Kills the process if it runs, and starts it again with the same command (so on
    /// the same port and data directory).
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        self.start()
    }

    /// Starts the process again after [`kill`](Self::kill).
    pub fn start_again(&mut self) -> io::Result<()> {
        if self.child.is_some() {
            return Ok(());
        }
        self.start()
    }

    /// The last lines of the log, for error messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn signal_pid(pid: u32, signal: i32) -> io::Result<()> {
    let pid = i32::try_from(pid).map_err(|_| io::Error::other("pid out of range"))?;
    let status = Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("kill -{signal} {pid} failed")))
    }
}

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns `cmd` from one long-lived thread that asks the kernel to kill the child when
/// this thread dies, which is when the test process dies (a parent-death signal is tied
/// to the thread that forked, so a short-lived thread would kill servers early).
fn spawn_tied_to_process(cmd: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("dlock-test-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    tie_to_parent(&mut cmd);
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("spawner thread");
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    sender
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send((cmd, reply_tx))
        .map_err(|_| io::Error::other("spawner thread is gone"))?;
    reply_rx.recv().map_err(|_| io::Error::other("spawner thread is gone"))?
}

#[allow(unsafe_code)]
fn tie_to_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs between fork and exec and only calls prctl, which is
    // async-signal-safe; it touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A directory shared by test processes for slow-to-make things (database templates):
/// `dlock-test-cache` in the cargo target directory of the running test binary
/// (`target/<profile>/deps/<test>` → `target/dlock-test-cache`), else in the system's
/// temporary directory.
pub fn cache_dir() -> io::Result<PathBuf> {
    let beside_target = std::env::current_exe().ok().and_then(|exe| {
        let profile = exe.parent()?.parent()?;
        let target = profile.parent()?;
        target.join("CACHEDIR.TAG").exists().then(|| target.join("dlock-test-cache"))
    });
    let dir = beside_target.unwrap_or_else(|| std::env::temp_dir().join("dlock-test-cache"));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Runs `make` under an exclusive lock on `<cache_dir>/<key>.lock`, unless `<key>` already
/// exists; returns the path `<cache_dir>/<key>`. `make` receives a fresh path to fill,
/// which is renamed into place when it succeeds.
pub fn cached(key: &str, make: impl FnOnce(&Path) -> io::Result<()>) -> io::Result<PathBuf> {
    let dir = cache_dir()?;
    let target = dir.join(key);
    if target.exists() {
        return Ok(target);
    }
    let lock = File::options().create(true).truncate(false).write(true).open(dir.join(format!("{key}.lock")))?;
    lock.lock()?;
    if !target.exists() {
        let scratch = dir.join(format!("{key}.tmp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&scratch);
        make(&scratch)?;
        std::fs::rename(&scratch, &target)?;
    }
    lock.unlock()?;
    Ok(target)
}

/// Finds an executable by name on `PATH` or in the given extra directories.
pub fn find_program(name: &str, extra_dirs: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(extra_dirs.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}
