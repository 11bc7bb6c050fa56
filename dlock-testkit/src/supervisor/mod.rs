//! The server supervisor: real servers from installed binaries, on free loopback ports,
//! in temporary directories, with kill -9, SIGSTOP/SIGCONT and restart on the same data.
//!
//! One module per server kind builds on [`Node`] and [`Server`]. Environment variables named
//! `DLOCK_TEST_<KIND>_URL` point the suite at external servers instead (see [`external_url`]).

pub mod connection_gate;
pub mod etcd;
pub mod mariadb;
pub mod peer_gate;
pub mod pgbouncer;
pub mod postgres;
pub mod redis;
pub mod tls;
pub mod zookeeper;

use std::fs::File;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use dlock_core::backend::lock_unpoisoned;

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
                lock_unpoisoned(&RESERVED).push(reservation);
                return Ok(port);
            }
            Err(std::fs::TryLockError::WouldBlock) => continue,
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
    }
    Err(io::Error::other("no free loopback port could be reserved"))
}

/// Waits until something accepts TCP connections on `addr`, or the process exits, or the
/// timeout passes.
pub fn wait_for_port(addr: SocketAddr, server: &mut ServerProcess, timeout: Duration) -> io::Result<()> {
    server.wait_until(&format!("listening on {addr}"), timeout, Duration::from_millis(20), || {
        Ok(TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok())
    })
}

/// Starts a server on a free port, retrying with a fresh port (up to 5 times) when the
/// start fails, which is what happens when another process took the port first.
pub fn start_on_free_port<T>(mut start: impl FnMut(u16) -> io::Result<T>) -> io::Result<T> {
    retry(5, || start(free_port()?))
}

/// Runs `attempt` up to `attempts` times until it succeeds, else returns the last error:
/// a start that lost a port race to another process succeeds on fresh ports.
pub(crate) fn retry<T>(attempts: usize, mut attempt: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let mut last = None;
    for _ in 0..attempts {
        match attempt() {
            Ok(done) => return Ok(done),
            Err(err) => last = Some(err),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no attempt made")))
}

/// [`retry`] for a start that awaits (one that starts fault proxies on the runtime): up
/// to `attempts` tries, each failure but the last logged with `what`.
pub(crate) async fn retry_async<T, F, Fut>(attempts: usize, what: &str, mut attempt: F) -> io::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = io::Result<T>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        match attempt().await {
            Err(err) if tries < attempts => tracing::warn!("starting {what} failed, trying again: {err}"),
            done => return done,
        }
    }
}

/// Calls `check` every `every` until it yields a value (`Ok(Some(_))`) or fails, or until
/// `timeout` passes, which is `Ok(None)`: the caller knows what to say about the wait.
pub(crate) fn poll<T>(
    timeout: Duration,
    every: Duration,
    mut check: impl FnMut() -> io::Result<Option<T>>,
) -> io::Result<Option<T>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check()? {
            return Ok(Some(value));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(every);
    }
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

/// One server process of a kind, listening on a loopback address: a standalone server
/// (see [`Server`]) or a member of a cluster. `K` holds what is particular to the kind.
#[derive(Debug)]
pub struct Node<K> {
    kind: K,
    process: ServerProcess,
    addr: SocketAddr,
}

impl<K: Kind> Node<K> {
    /// A process just spawned; it may not serve yet (members of a cluster serve only once
    /// enough of them run, so they are all spawned before any is waited for).
    pub(crate) fn new(kind: K, process: ServerProcess, addr: SocketAddr) -> Self {
        Node { kind, process, addr }
    }

    /// Waits until the process serves.
    pub(crate) fn wait_ready(&mut self) -> io::Result<()> {
        self.kind.ready(self.addr, &mut self.process)
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

    /// kill -9, keeping the data.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Whether the process runs (it was not killed and has not exited).
    pub fn is_running(&mut self) -> bool {
        self.process.pid().is_some() && matches!(self.process.exit_status(), Ok(None))
    }

    /// Starts it again on the same port and data, and waits until it serves. A killed
    /// server's children may hold its data for a moment (PostgreSQL's backends do), and
    /// the new process then gives up at once: the start is retried for a while.
    pub fn start_again(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + K::START_TIMEOUT;
        loop {
            self.process.start_again()?;
            match self.wait_ready() {
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

/// A standalone server: a [`Node`] (whose methods it has) in a scratch directory that
/// outlives its process.
#[derive(Debug)]
pub struct Server<K> {
    node: Node<K>,
    // Dropped after the process (fields drop in order), so the data outlives the server.
    _dir: tempfile::TempDir,
}

impl<K: Kind> Server<K> {
    /// Spawns `program` with `args` in `dir` as `<name>:<port>`, logging to
    /// `<dir>/<name>.log`, and waits until it serves on `127.0.0.1:port`.
    pub(crate) fn spawn(
        kind: K,
        name: &str,
        program: &Path,
        args: Vec<String>,
        port: u16,
        dir: tempfile::TempDir,
    ) -> io::Result<Self> {
        let spec = CommandSpec::new(program).args(args).cwd(dir.path());
        let process = ServerProcess::spawn(format!("{name}:{port}"), spec, dir.path().join(format!("{name}.log")))?;
        Self::started(kind, process, port, dir)
    }

    /// Waits until the process just spawned serves on `127.0.0.1:port`.
    pub(crate) fn started(kind: K, process: ServerProcess, port: u16, dir: tempfile::TempDir) -> io::Result<Self> {
        let mut node = Node::new(kind, process, SocketAddr::from(([127, 0, 0, 1], port)));
        node.wait_ready()?;
        Ok(Server { node, _dir: dir })
    }
}

impl<K> Server<K> {
    /// The directory it keeps its data and log in.
    pub fn dir(&self) -> &Path {
        self._dir.path()
    }
}

impl<K> std::ops::Deref for Server<K> {
    type Target = Node<K>;

    fn deref(&self) -> &Node<K> {
        &self.node
    }
}

impl<K> std::ops::DerefMut for Server<K> {
    fn deref_mut(&mut self) -> &mut Node<K> {
        &mut self.node
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

    /// Calls `probe` every `every` until it says the server is `what` (a state such as
    /// `healthy` or `listening on <addr>`); fails, with the end of the log, when the process
    /// exits first or `timeout` passes.
    pub fn wait_until(
        &mut self,
        what: &str,
        timeout: Duration,
        every: Duration,
        mut probe: impl FnMut() -> io::Result<bool>,
    ) -> io::Result<()> {
        let ready = poll(timeout, every, || {
            if probe()? {
                return Ok(Some(()));
            }
            match self.exit_status()? {
                Some(status) => Err(io::Error::other(format!(
                    "{} exited with {status} before it was {what}; log:\n{}",
                    self.name,
                    self.log_tail()
                ))),
                None => Ok(None),
            }
        })?;
        ready.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{} was not {what} within {timeout:?}; log:\n{}", self.name, self.log_tail()),
            )
        })
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
    lock_unpoisoned(sender).send((cmd, reply_tx)).map_err(|_| io::Error::other("spawner thread is gone"))?;
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

/// [`find_program`], or an error that says how to install it.
pub(crate) fn program(name: &str, extra_dirs: &[&str]) -> io::Result<PathBuf> {
    find_program(name, extra_dirs).ok_or_else(|| {
        io::Error::new(io::ErrorKind::NotFound, format!("{name} not found; run scripts/install-backends"))
    })
}

/// `output` if its command succeeded, else an error with `what` and all it printed.
pub(crate) fn succeeded(what: &str, output: Output) -> io::Result<Output> {
    if output.status.success() {
        return Ok(output);
    }
    Err(io::Error::other(format!(
        "{what} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )))
}

/// `cp -a from to`: a server's own copy of a [`cached`] data directory.
pub(crate) fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    let status = Command::new("cp").arg("-a").arg(from).arg(to).status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("copying {} failed", from.display())))
    }
}
