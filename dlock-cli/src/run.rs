//! `dlock run`: a command under a lock, like flock(1) and `etcdctl lock`.

use std::process::{ExitCode, ExitStatus};
use std::time::Duration;

use clap::Args;
use dlock::{Lease, LockName, LockOptions, LostReason};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

use crate::exit::{Failure, LOST, TEMPFAIL, UNAVAILABLE};
use crate::{duration_arg, target};

/// How long a command gets to exit after SIGTERM before it is killed.
const GRACE: Duration = Duration::from_secs(10);

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The lease ttl: the watchdog renews it every ttl/3 while the command runs.
    #[arg(long, default_value = "30s", value_parser = duration_arg)]
    ttl: Duration,
    /// How long to wait for the lock; 0 tries once. Default: wait as long as it takes.
    #[arg(long, value_parser = wait_arg)]
    wait: Option<Duration>,
    /// A fixed lease: not renewed, lost when the ttl runs out.
    #[arg(long)]
    fixed: bool,
    /// The lock's name.
    name: String,
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
    let name = LockName::new(&args.name)?;
    let opts = if args.fixed { LockOptions::fixed(args.ttl) } else { LockOptions::watchdog(args.ttl) };
    let locker = dlock::connect(&url).await?;

    let lease = match args.wait {
        Some(wait) if wait.is_zero() => locker.try_acquire(&name, &opts).await?,
        Some(wait) => match locker.acquire(&name, &opts.wait(wait)).await {
            Err(dlock::LockError::Timeout) => None,
            other => Some(other?),
        },
        None => Some(locker.acquire(&name, &opts).await?),
    };
    let Some(lease) = lease else {
        let waited = args.wait.map_or("at once".to_string(), |w| format!("within {w:?}"));
        return Err(Failure::new(TEMPFAIL, format!("lock {name} is held elsewhere; not acquired {waited}")));
    };

    let mut child = Command::new(&args.command[0])
        .args(&args.command[1..])
        .env("DLOCK_NAME", name.as_str())
        .env("DLOCK_TOKEN", lease.token().to_string())
        .env("DLOCK_URL", &url)
        // Its own process group, so that a lost lease stops the command's children too.
        .process_group(0)
        .spawn()
        .map_err(|e| {
            let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
            Failure::new(code, format!("cannot run {}: {e}", args.command[0]))
        })?;

    match supervise(&mut child, &lease).await? {
        Outcome::Exited(status) => match lease.release().await {
            Ok(()) => Ok(exit_code(status)),
            Err(dlock::LockError::NotHeld) => Err(Failure::new(
                LOST,
                format!("the lease on {name} was lost before the command finished; its work may have overlapped another holder's"),
            )),
            Err(e) => {
                eprintln!("dlock: releasing {name} failed ({e}); its ttl will free it");
                Ok(exit_code(status))
            }
        },
        Outcome::Lost(reason) => {
            Err(Failure::new(LOST, format!("the lease on {name} was lost ({reason}); the command was sent SIGTERM")))
        }
    }
}

enum Outcome {
    Exited(ExitStatus),
    Lost(LostReason),
}

/// Waits for the command, forwarding SIGINT/SIGTERM/SIGHUP to it, and stops it if the
/// lease is lost.
async fn supervise(child: &mut Child, lease: &Lease) -> Result<Outcome, Failure> {
    let group = child.id().and_then(|id| i32::try_from(id).ok()).map(Pid::from_raw);
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
                let status = status.map_err(|e| Failure::new(UNAVAILABLE, format!("waiting for the command: {e}")))?;
                return Ok(Outcome::Exited(status));
            }
            reason = lease.lost() => {
                stop(child, group).await;
                return Ok(Outcome::Lost(reason));
            }
            _ = int.recv() => forward(group, Signal::SIGINT),
            _ = term.recv() => forward(group, Signal::SIGTERM),
            _ = hup.recv() => forward(group, Signal::SIGHUP),
        }
    }
}

fn forward(group: Option<Pid>, signal: Signal) {
    if let Some(group) = group {
        let _ = killpg(group, signal);
    }
}

/// SIGTERM to the command's process group, SIGKILL after the grace period.
async fn stop(child: &mut Child, group: Option<Pid>) {
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
