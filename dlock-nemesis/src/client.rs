//! A client process of a run: loops acquire → fenced write → work → fenced write →
//! release until the run ends, writing what it did to its events file. It runs in a
//! process of its own so that the nemesis can pause it.

use std::fs::File;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use dlock::{Lease, LockError, LockName, LockOptions, LostReason};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::clock::{now_ns, since};

/// What a client is told by the run.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ClientArgs {
    /// This client's number.
    #[arg(long)]
    pub(crate) id: usize,
    /// The backend, through this client's proxies.
    #[arg(long)]
    pub(crate) url: String,
    /// Where the fenced register listens.
    #[arg(long)]
    pub(crate) register: SocketAddr,
    /// The run's epoch on the monotonic clock.
    #[arg(long)]
    pub(crate) epoch_ns: u64,
    /// When to stop, on the monotonic clock.
    #[arg(long)]
    pub(crate) until_ns: u64,
    /// The lease ttl, in milliseconds.
    #[arg(long)]
    pub(crate) ttl_ms: u64,
    /// The file to write events to.
    #[arg(long)]
    pub(crate) events: PathBuf,
}

/// The lock every client of a run contends for.
pub(crate) const LOCK: &str = "nemesis";

struct Log {
    file: File,
    epoch_ns: u64,
}

impl Log {
    /// One line per event, written at once: a client killed or paused mid-run has
    /// everything up to that moment on disk.
    fn event(&mut self, op: &str, phase: &str, token: Option<u64>, extra: &str) {
        let at = since(self.epoch_ns).as_nanos();
        let token = token.map_or_else(|| "-".to_string(), |t| t.to_string());
        let _ = writeln!(self.file, "{op} {phase} {at} {token} {extra}");
    }
}

/// What a write needs besides the lease.
struct Hold<'a> {
    register: &'a mut Option<BufReader<TcpStream>>,
    log: &'a mut Log,
    /// Whether this hold's end was logged (by the lost watcher or by a write that found
    /// the lease gone), so that it is logged once.
    lost_logged: Arc<AtomicBool>,
}

/// `BackendUnavailable` → `backend_unavailable`.
fn reason_name(reason: LostReason) -> String {
    let mut name = String::new();
    for (i, c) in format!("{reason:?}").chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_lowercase());
    }
    name
}

/// Sends one fenced write to the register; the register judges and records it.
///
/// A holder that finds its lease lost or run out (it was paused, say) does not write,
/// and logs that it knows: its hold ends there in the history, whether or not the lost
/// signal has fired yet.
async fn write(hold: &mut Hold<'_>, args: &ClientArgs, lease: &Lease) -> bool {
    let check = now_ns();
    let remaining = lease.remaining();
    if lease.is_lost() || remaining.is_zero() {
        if !hold.lost_logged.swap(true, Ordering::SeqCst) {
            let reason = lease.lost_reason().map_or_else(|| "ran_out".to_string(), reason_name);
            hold.log.event("lost", "ok", Some(lease.token().get()), &reason);
        }
        return false;
    }
    let register = &mut *hold.register;
    let valid_until = check - args.epoch_ns + remaining.as_nanos() as u64;
    let line = format!("W {} {} {} {}\n", args.id, lease.token().get(), check - args.epoch_ns, valid_until);
    if register.is_none() {
        *register = TcpStream::connect(args.register).await.ok().map(BufReader::new);
    }
    let Some(conn) = register.as_mut() else { return true };
    let mut reply = String::new();
    let sent = conn.get_mut().write_all(line.as_bytes()).await;
    if sent.is_err() || conn.read_line(&mut reply).await.is_err() {
        *register = None;
    }
    true
}

pub(crate) async fn run(args: ClientArgs) -> Result<(), Box<dyn std::error::Error>> {
    let mut log = Log { file: File::create(&args.events)?, epoch_ns: args.epoch_ns };
    let ttl = Duration::from_millis(args.ttl_ms);
    let name = LockName::new(LOCK)?;
    let opts = LockOptions::watchdog(ttl).wait(ttl * 3);
    let locker = loop {
        match dlock::connect(&args.url).await {
            Ok(locker) => break locker,
            Err(_) if now_ns() < args.until_ns => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(err) => return Err(err.into()),
        }
    };
    let mut register = None;
    let mut rng = fastrand::Rng::with_seed(args.id as u64);
    while now_ns() < args.until_ns {
        log.event("acquire", "invoke", None, "");
        let lease = match locker.acquire(&name, &opts).await {
            Ok(lease) => lease,
            Err(LockError::Timeout) => {
                log.event("acquire", "fail", None, "timeout");
                continue;
            }
            Err(err) => {
                let phase = if err.is_transient() { "unknown" } else { "fail" };
                log.event("acquire", phase, None, &format!("{err}").replace(['\n', ' '], "_"));
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let token = lease.token().get();
        log.event("acquire", "ok", Some(token), "");
        // The lost signal ends the hold in the history; it is watched until the release
        // begins, so that it never ends a later hold of this client.
        let lost_logged = Arc::new(AtomicBool::new(false));
        let watcher = {
            let handle = lease.handle();
            let mut log = Log { file: log.file.try_clone()?, epoch_ns: args.epoch_ns };
            let lost_logged = lost_logged.clone();
            tokio::spawn(async move {
                let reason = handle.lost().await;
                if !lost_logged.swap(true, Ordering::SeqCst) {
                    log.event("lost", "ok", Some(token), &reason_name(reason));
                }
            })
        };
        let mut hold = Hold { register: &mut register, log: &mut log, lost_logged };
        if write(&mut hold, &args, &lease).await {
            tokio::time::sleep(ttl.mul_f64(rng.f64() / 4.0)).await;
            write(&mut hold, &args, &lease).await;
        }
        watcher.abort();
        let _ = watcher.await;
        log.event("release", "invoke", Some(token), "");
        match lease.release().await {
            Ok(()) => log.event("release", "ok", Some(token), ""),
            Err(err) => log.event("release", "fail", Some(token), &format!("{err}").replace(['\n', ' '], "_")),
        }
    }
    Ok(())
}
