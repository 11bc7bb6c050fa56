//! `dlock run`: a command under a lock, like flock(1) and `etcdctl lock`; as a reader
//! (`--read`) or one of N (`--permits`); under several locks at once (`--names`); or at
//! most once per key (`--once`). `dlock elect`: a command while this process leads.

use std::process::{ExitCode, ExitStatus};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use dlock::{
    campaign, idempotent, IdempotentError, IdempotentOptions, Leadership, Lease, LeaseHandle, LockError, LockName,
    LockOptions, Locker, LostReason, MultiLease, MultiLock, RunOutcome,
};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};
use tokio::task::JoinHandle;

use dlock_core::backend::lock_unpoisoned;

use crate::exit::{Failure, ALREADY_RAN, LOST, TEMPFAIL, UNAVAILABLE};
use crate::{duration_arg, target};

/// How long a command gets to exit after SIGTERM before it is killed.
const GRACE: Duration = Duration::from_secs(10);

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("lock").required(true).args(["name", "names", "once"])))]
pub(crate) struct RunArgs {
    /// The lease ttl: the watchdog renews it every ttl/3 while the command runs.
    #[arg(long, default_value = "30s", value_parser = duration_arg)]
    ttl: Duration,
    /// How long to wait for the lock; 0 tries once. Default: wait as long as it takes.
    /// Not used with --once, which never waits.
    #[arg(long, value_parser = wait_arg)]
    wait: Option<Duration>,
    /// A fixed lease: not renewed, lost when the ttl runs out.
    #[arg(long)]
    fixed: bool,
    /// Hold all of these locks (comma-separated) while the command runs, taken all or
    /// nothing in one global order; the command sees DLOCK_NAMES and DLOCK_TOKENS.
    #[arg(long, value_delimiter = ',', num_args = 1.., conflicts_with_all = ["name", "once"])]
    names: Vec<String>,
    /// Run the command at most once per KEY: a later run of the same key exits 79 and
    /// prints the stored exit status; a run while another is under way exits 75. A
    /// command that fails (non-zero exit) stores nothing, so the next run tries again.
    #[arg(long, value_name = "KEY", conflicts_with = "name")]
    once: Option<String>,
    /// With --once: how long a successful run is remembered.
    #[arg(long, default_value = "24h", value_parser = duration_arg, requires = "once")]
    retention: Duration,
    /// Take the lock as one of its readers: readers hold together, and a writer (a plain
    /// `dlock run` of the same name, or --write) waits for them; a waiting writer keeps
    /// new readers out.
    #[arg(long, conflicts_with_all = ["names", "once", "permits"])]
    read: bool,
    /// Take the lock as its writer: alone, as a plain `dlock run` does (for scripts that
    /// say which side they are).
    #[arg(long, conflicts_with_all = ["read", "names", "once", "permits"])]
    write: bool,
    /// Take one of N permits of the name (a semaphore): up to N commands run at once.
    #[arg(long, value_name = "N", conflicts_with_all = ["names", "once"])]
    permits: Option<u32>,
    /// The lock's name.
    name: Option<String>,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

fn wait_arg(text: &str) -> Result<Duration, String> {
    if text.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    duration_arg(text)
}

pub(crate) async fn run(url: Option<String>, args: RunArgs) -> Result<ExitCode, Failure> {
    let url = target::resolve(url)?;
    let opts = if args.fixed { LockOptions::fixed(args.ttl) } else { LockOptions::watchdog(args.ttl) };
    let opts = match (args.read, args.permits) {
        (true, _) => opts.read(),
        (false, Some(permits)) => opts.permits(permits),
        (false, None) => opts.write(),
    };
    let locker = dlock::connect(&url).await?;
    if let Some(key) = &args.once {
        return run_once(&*locker, &LockName::new(key)?, opts, &args, &url).await;
    }
    let held = if args.names.is_empty() {
        let name = LockName::new(args.name.as_deref().unwrap_or_default())?;
        acquire_one(&*locker, &name, opts, args.wait).await?.map(Held::One)
    } else {
        let names = args.names.iter().map(LockName::new).collect::<Result<Vec<_>, _>>()?;
        let multi = MultiLock::on(locker, names)?;
        acquire_many(&multi, opts, args.wait).await?.map(Held::Many)
    };
    let Some(held) = held else {
        let waited = args.wait.map_or("at once".to_string(), |w| format!("within {w:?}"));
        return Err(Failure::new(TEMPFAIL, format!("{} held elsewhere; not acquired {waited}", held_what(&args))));
    };
    hold_while(held, &args.command, &url).await
}

/// Runs `command` while `held` lasts: a lost lease stops it; its exit releases `held`.
async fn hold_while(held: Held, command: &[String], url: &str) -> Result<ExitCode, Failure> {
    let what = held.what();
    // The command never starts on a lease that is lost already.
    if let Some(reason) = held.lost_reason() {
        let _ = held.release().await;
        return Err(Failure::new(LOST, format!("the lease on {what} was lost ({reason}) before the command started")));
    }
    let child = spawn(command, &held.env(url))?;
    match supervise(child, held.lost()).await? {
        Outcome::Exited(status) => match held.release().await {
            Ok(()) => Ok(exit_code(status)),
            Err(LockError::NotHeld { .. }) => Err(Failure::new(
                LOST,
                format!(
                    "the lease on {what} was lost before the command finished; its work may have overlapped another holder's"
                ),
            )),
            Err(e) => {
                eprintln!("dlock: releasing {what} failed ({e}); its ttl will free it");
                Ok(exit_code(status))
            }
        },
        Outcome::Lost(reason) => Err(Failure::new(
            LOST,
            format!("the lease on {} was lost ({reason}); the command was sent SIGTERM", held.what()),
        )),
    }
}

fn held_what(args: &RunArgs) -> String {
    match &args.name {
        Some(name) => format!("lock {name} is"),
        None => format!("one of the locks {} is", args.names.join(", ")),
    }
}

async fn acquire_one(
    locker: &dyn Locker,
    name: &LockName,
    opts: LockOptions,
    wait: Option<Duration>,
) -> Result<Option<Lease>, LockError> {
    match wait {
        Some(wait) if wait.is_zero() => locker.try_acquire(name, &opts).await,
        Some(wait) => timed_out_is_none(locker.acquire(name, &opts.wait(wait)).await),
        None => locker.acquire(name, &opts).await.map(Some),
    }
}

async fn acquire_many(
    multi: &MultiLock,
    opts: LockOptions,
    wait: Option<Duration>,
) -> Result<Option<MultiLease>, LockError> {
    match wait {
        Some(wait) if wait.is_zero() => multi.try_acquire(&opts).await,
        Some(wait) => timed_out_is_none(multi.acquire(&opts.wait(wait)).await),
        None => multi.acquire(&opts).await.map(Some),
    }
}

fn timed_out_is_none<T>(outcome: Result<T, LockError>) -> Result<Option<T>, LockError> {
    match outcome {
        Err(LockError::Timeout { .. }) => Ok(None),
        other => other.map(Some),
    }
}

/// Runs a command while this process leads an election (`dlock elect`).
#[derive(Debug, Args)]
pub(crate) struct ElectArgs {
    /// The leadership's lease ttl: renewed every ttl/3 while the command runs; a leader
    /// that cannot renew stops its command before another is elected.
    #[arg(long, default_value = "30s", value_parser = duration_arg)]
    ttl: Duration,
    /// How long to campaign; default: until elected.
    #[arg(long, value_parser = duration_arg)]
    wait: Option<Duration>,
    /// What observers see as the leader (default: this host's name and process id).
    #[arg(long)]
    value: Option<String>,
    /// The election's name.
    name: String,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

pub(crate) async fn elect(url: Option<String>, args: ElectArgs) -> Result<ExitCode, Failure> {
    let url = target::resolve(url)?;
    let name = LockName::new(&args.name)?;
    let value = args.value.clone().unwrap_or_else(default_value);
    let locker = dlock::connect(&url).await?;
    let mut opts = LockOptions::watchdog(args.ttl);
    if let Some(wait) = args.wait {
        opts = opts.wait(wait);
    }
    let leadership = match campaign(&*locker, &name, value.as_bytes(), &opts).await {
        Ok(leadership) => leadership,
        Err(LockError::Timeout { .. }) => {
            return Err(Failure::new(TEMPFAIL, format!("not elected leader of {name} within {:?}", args.wait)))
        }
        Err(e) => return Err(e.into()),
    };
    hold_while(Held::Leader(leadership), &args.command, &url).await
}

/// `<host>:<pid>`, what a leader is known by unless told otherwise.
fn default_value() -> String {
    let host = nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "localhost".into());
    format!("{host}:{}", std::process::id())
}

/// One lock or several, or a leadership, held while the command runs.
enum Held {
    One(Lease),
    Many(MultiLease),
    Leader(Leadership),
}

impl Held {
    fn what(&self) -> String {
        match self {
            Held::One(lease) => lease.name().to_string(),
            Held::Many(lease) => lease.tokens().iter().map(|(name, _)| name.as_str()).collect::<Vec<_>>().join(", "),
            Held::Leader(leadership) => format!("the leadership of {}", leadership.lease().name()),
        }
    }

    fn env(&self, url: &str) -> Vec<(&'static str, String)> {
        let mut env = vec![("DLOCK_URL", url.to_string())];
        match self {
            Held::One(lease) => {
                env.push(("DLOCK_NAME", lease.name().to_string()));
                env.push(("DLOCK_TOKEN", lease.token().to_string()));
            }
            Held::Many(lease) => {
                let tokens = lease.tokens();
                let names = tokens.iter().map(|(name, _)| name.to_string()).collect::<Vec<_>>();
                let pairs = tokens.iter().map(|(name, token)| format!("{name}={token}")).collect::<Vec<_>>();
                env.push(("DLOCK_NAMES", names.join(",")));
                env.push(("DLOCK_TOKENS", pairs.join(",")));
            }
            Held::Leader(leadership) => {
                env.push(("DLOCK_NAME", leadership.lease().name().to_string()));
                env.push(("DLOCK_TERM", leadership.term().to_string()));
                env.push(("DLOCK_TOKEN", leadership.term().to_string()));
            }
        }
        env
    }

    fn lost_reason(&self) -> Option<LostReason> {
        match self {
            Held::One(lease) => lease.lost_reason(),
            Held::Many(lease) => lease.lost_reason(),
            Held::Leader(leadership) => leadership.lease().lost_reason(),
        }
    }

    async fn lost(&self) -> LostReason {
        match self {
            Held::One(lease) => lease.lost().await,
            Held::Many(lease) => lease.lost().await,
            Held::Leader(leadership) => leadership.lost().await,
        }
    }

    async fn release(self) -> Result<(), LockError> {
        match self {
            Held::One(lease) => lease.release().await,
            Held::Many(lease) => lease.release().await,
            Held::Leader(leadership) => leadership.resign().await,
        }
    }
}

/// What `--once` stores for a key: the run's exit status and when it finished.
#[derive(Debug, Serialize, Deserialize)]
struct OnceRecord {
    status: i32,
    finished_unix_ms: u64,
}

/// A command that exited non-zero: not stored, so the key is free for another try.
struct CommandFailed(ExitStatus);

async fn run_once(
    locker: &dyn Locker,
    key: &LockName,
    opts: LockOptions,
    args: &RunArgs,
    url: &str,
) -> Result<ExitCode, Failure> {
    let settings = IdempotentOptions::new().with_lock(opts).with_retention(args.retention);
    let stopping = Arc::new(Mutex::new(None));
    let work = |lease: LeaseHandle| {
        let env = [
            ("DLOCK_URL", url.to_string()),
            ("DLOCK_NAME", key.to_string()),
            ("DLOCK_TOKEN", lease.token().to_string()),
        ];
        let stopping = stopping.clone();
        async move {
            let child = spawn(&args.command, &env).map_err(Err)?;
            // The recipe drops this future when the lease is lost: the guard then stops
            // the command as a lost lease stops it in a plain run.
            let mut running = Running { child: Some(child), stopping };
            let status = running.wait().await.map_err(Err)?;
            if !status.success() {
                return Err(Ok(CommandFailed(status)));
            }
            let finished_unix_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
            Ok(OnceRecord { status: 0, finished_unix_ms })
        }
    };
    let outcome = idempotent(locker, key, &settings, work, || OnceRecord { status: -1, finished_unix_ms: 0 }).await;
    let stop = lock_unpoisoned(&stopping).take();
    if let Some(stop) = stop {
        let _ = stop.await;
    }
    match outcome {
        Ok(RunOutcome::Ran(record)) => Ok(ExitCode::from(record.status as u8)),
        Ok(RunOutcome::Stored(record)) => Err(Failure::new(
            ALREADY_RAN,
            format!(
                "{key} already ran: exit status {} (stored at {} ms since the epoch)",
                record.status, record.finished_unix_ms
            ),
        )),
        Ok(RunOutcome::InProgress(_)) => {
            Err(Failure::new(TEMPFAIL, format!("another run of {key} is in progress; not run")))
        }
        Err(IdempotentError::Work(Ok(CommandFailed(status)))) => Ok(exit_code(status)),
        Err(IdempotentError::Work(Err(failure))) => Err(failure),
        Err(IdempotentError::Lock(LockError::Lost { reason, .. })) => Err(Failure::new(
            LOST,
            format!(
                "the lease on {key} was lost ({reason}); the command was sent SIGTERM and its run was not recorded"
            ),
        )),
        Err(IdempotentError::Lock(err)) => Err(err.into()),
        Err(IdempotentError::TooLarge { size, limit }) => {
            Err(Failure::new(UNAVAILABLE, format!("{key}: a record of {size} bytes is over {limit}")))
        }
        Err(IdempotentError::Codec(err)) => {
            Err(Failure::new(UNAVAILABLE, format!("{key}: the stored record is not one of dlock run --once: {err}")))
        }
    }
}

/// A command running under `--once`; dropped before it exits, it is stopped in the
/// background and the handle of that is left in `stopping`.
struct Running {
    child: Option<Child>,
    stopping: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl Running {
    async fn wait(&mut self) -> Result<ExitStatus, Failure> {
        let child = self.child.as_mut().expect("waited once");
        let status = forwarding_signals(child).await?;
        self.child = None;
        Ok(status)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let stop = tokio::spawn(async move { stop(&mut child).await });
            *lock_unpoisoned(&self.stopping) = Some(stop);
        }
    }
}

fn spawn(command: &[String], env: &[(&'static str, String)]) -> Result<Child, Failure> {
    Command::new(&command[0])
        .args(&command[1..])
        .envs(env.iter().map(|(k, v)| (k, v)))
        // Its own process group, so that a lost lease stops the command's children too.
        .process_group(0)
        .spawn()
        .map_err(|e| {
            let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
            Failure::new(code, format!("cannot run {}: {e}", command[0]))
        })
}

enum Outcome {
    Exited(ExitStatus),
    Lost(LostReason),
}

/// Waits for the command, forwarding SIGINT/SIGTERM/SIGHUP to it, and stops it if the
/// lease is lost.
async fn supervise(mut child: Child, lost: impl std::future::Future<Output = LostReason>) -> Result<Outcome, Failure> {
    tokio::select! {
        status = forwarding_signals(&mut child) => Ok(Outcome::Exited(status?)),
        reason = lost => {
            stop(&mut child).await;
            Ok(Outcome::Lost(reason))
        }
    }
}

/// Waits for the command to exit, forwarding SIGINT/SIGTERM/SIGHUP to its process group.
async fn forwarding_signals(child: &mut Child) -> Result<ExitStatus, Failure> {
    let group = group(child);
    let signal_stream =
        |kind| signal(kind).map_err(|e| Failure::new(UNAVAILABLE, format!("cannot watch signals: {e}")));
    let (mut int, mut term, mut hup) = (
        signal_stream(SignalKind::interrupt())?,
        signal_stream(SignalKind::terminate())?,
        signal_stream(SignalKind::hangup())?,
    );
    loop {
        tokio::select! {
            status = child.wait() => {
                return status.map_err(|e| Failure::new(UNAVAILABLE, format!("waiting for the command: {e}")));
            }
            _ = int.recv() => forward(group, Signal::SIGINT),
            _ = term.recv() => forward(group, Signal::SIGTERM),
            _ = hup.recv() => forward(group, Signal::SIGHUP),
        }
    }
}

fn group(child: &Child) -> Option<Pid> {
    child.id().and_then(|id| i32::try_from(id).ok()).map(Pid::from_raw)
}

fn forward(group: Option<Pid>, signal: Signal) {
    if let Some(group) = group {
        let _ = killpg(group, signal);
    }
}

/// SIGTERM to the command's process group, SIGKILL after the grace period.
async fn stop(child: &mut Child) {
    let group = group(child);
    forward(group, Signal::SIGTERM);
    if tokio::time::timeout(GRACE, child.wait()).await.is_err() {
        forward(group, Signal::SIGKILL);
        let _ = child.wait().await;
    }
}

/// The command's exit code, or 128 + the signal that killed it, as shells report it.
fn exit_code(status: ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    let code = status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(1);
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
