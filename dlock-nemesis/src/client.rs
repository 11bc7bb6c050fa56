//! A client process of a run: loops acquire → fenced writes spread over the hold →
//! release until the run ends (or runs `idempotent` work, in that mode), writing what it
//! did to its events file. It runs in a process of its own so that the nemesis can
//! pause it.

use std::fs::File;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use dlock::{HoldKind, Lease, LockError, LockName, LockOptions, Locker, LostReason};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::clock::{now_ns, since};
use crate::mutant::Mutant;

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
    /// What the client does with the lock.
    #[arg(long, value_enum, default_value_t = Mode::Lock)]
    pub(crate) mode: Mode,
    /// A defect this client plants in itself.
    #[arg(long, value_enum)]
    pub(crate) mutant: Option<Mutant>,
}

/// What the clients of a run do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Mode {
    /// Exclusive holds of one lock.
    Lock,
    /// Readers (three in four holds) and writers of one read-write lock.
    Rw,
    /// Permits of one semaphore, each hold asking for 1, 2 or 3.
    Permits,
    /// `idempotent` work on a few dozen keys: each key's work must run once.
    Idempotent,
}

/// The lock every client of a run contends for.
pub(crate) const LOCK: &str = "nemesis";

pub(crate) struct Log {
    file: File,
    epoch_ns: u64,
}

impl Log {
    /// Another handle on the same file, for a task that logs beside the loop.
    pub(crate) fn try_clone(&self) -> std::io::Result<Self> {
        Ok(Log { file: self.file.try_clone()?, epoch_ns: self.epoch_ns })
    }

    /// One line per event, written at once: a client killed or paused mid-run has
    /// everything up to that moment on disk.
    pub(crate) fn event(&mut self, op: &str, phase: &str, token: Option<u64>, extra: &str) {
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
    /// When the client means to let go (ns since the run's epoch), which the register
    /// keeps so that a fault aimed at the holder finds one that is not about to release.
    ends_ns: u64,
}

/// `BackendUnavailable` → `backend_unavailable`.
pub(crate) fn reason_name(reason: LostReason) -> String {
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
/// signal has fired yet. Returns whether the hold goes on.
async fn write(hold: &mut Hold<'_>, args: &ClientArgs, lease: &Lease, kind: HoldKind) -> bool {
    let check = now_ns();
    let remaining = lease.remaining();
    if args.mutant != Some(Mutant::NoSelfCheck) && (lease.is_lost() || remaining.is_zero()) {
        if !hold.lost_logged.swap(true, Ordering::SeqCst) {
            let reason = lease.lost_reason().map_or_else(|| "ran_out".to_string(), reason_name);
            hold.log.event("lost", "ok", Some(lease.token().get()), &reason);
        }
        return false;
    }
    let at = check - args.epoch_ns;
    let claim = (at, at + remaining.as_nanos() as u64);
    send(&mut *hold.register, &mut *hold.log, args, (lease.token().get(), kind), claim, hold.ends_ns).await;
    true
}

/// Sends one write line: the token and kind, the claim (checked at, valid until, in ns
/// since the run's epoch) and when the writer means to let go.
async fn send(
    register: &mut Option<BufReader<TcpStream>>,
    log: &mut Log,
    args: &ClientArgs,
    (token, kind): (u64, HoldKind),
    (at, valid_until): (u64, u64),
    ends_ns: u64,
) {
    let line = format!("W {} {token} {at} {valid_until} {} {ends_ns}\n", args.id, kind_spec(kind));
    if register.is_none() {
        *register = TcpStream::connect(args.register).await.ok().map(BufReader::new);
    }
    let mut reply = String::new();
    let sent = match register.as_mut() {
        Some(conn) => {
            conn.get_mut().write_all(line.as_bytes()).await.is_ok() && conn.read_line(&mut reply).await.is_ok()
        }
        None => false,
    };
    if !sent || reply.is_empty() {
        // The verdict fails a run whose register could not be reached: a write that
        // went nowhere was judged by nobody.
        *register = None;
        log.event("unsent", "fail", Some(token), "");
    }
}

/// `x` for an exclusive hold, `s` for a shared one, `p<n>` for a permit of `n`.
pub(crate) fn kind_spec(kind: HoldKind) -> String {
    match kind {
        HoldKind::Shared => "s".to_string(),
        HoldKind::Permit { permits } => format!("p{permits}"),
        _ => "x".to_string(),
    }
}

/// The kind a [`kind_spec`] names.
pub(crate) fn parse_kind(spec: &str) -> Option<HoldKind> {
    match spec {
        "x" => Some(HoldKind::Exclusive),
        "s" => Some(HoldKind::Shared),
        _ => spec.strip_prefix('p')?.parse().ok().map(|permits| HoldKind::Permit { permits }),
    }
}

/// How long a hold lasts: most are short, one in four outlasts several renewals, so that
/// renewal and the lost signal are exercised on every backend.
fn hold_length(rng: &mut fastrand::Rng, ttl: Duration) -> Duration {
    if rng.u32(..4) == 0 {
        ttl.mul_f64(0.25 + rng.f64() * 1.75)
    } else {
        ttl.mul_f64(rng.f64() / 4.0)
    }
}

/// What the next hold asks for, in the run's mode.
fn next_kind(mode: Mode, rng: &mut fastrand::Rng) -> HoldKind {
    match mode {
        Mode::Rw if rng.u32(..4) != 0 => HoldKind::Shared,
        Mode::Permits => HoldKind::Permit { permits: 1 + rng.u32(..3) },
        _ => HoldKind::Exclusive,
    }
}

async fn connect(args: &ClientArgs, renewals: Arc<AtomicU64>) -> Result<Arc<dyn Locker>, Box<dyn std::error::Error>> {
    let never_renews = args.mutant == Some(Mutant::NeverRenews);
    loop {
        match crate::mutant::connect(&args.url, renewals.clone(), never_renews).await {
            Ok(locker) => return Ok(locker),
            Err(_) if now_ns() < args.until_ns => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(err) => return Err(err.into()),
        }
    }
}

pub(crate) async fn run(args: ClientArgs) -> Result<(), Box<dyn std::error::Error>> {
    let mut log = Log { file: File::create(&args.events)?, epoch_ns: args.epoch_ns };
    let renewals = Arc::new(AtomicU64::new(0));
    let locker = connect(&args, renewals.clone()).await?;
    let mut rng = fastrand::Rng::with_seed(args.id as u64);
    if args.mode == Mode::Idempotent {
        crate::work::run(&args, &*locker, &mut log, &mut rng).await?;
    } else {
        locks(&args, &*locker, &mut log, &mut rng).await?;
    }
    log.event("renewals", "ok", Some(renewals.load(Ordering::Relaxed)), "");
    Ok(())
}

/// The loop of the lock modes: acquire, write now and then while holding, release.
async fn locks(
    args: &ClientArgs,
    locker: &dyn Locker,
    log: &mut Log,
    rng: &mut fastrand::Rng,
) -> Result<(), Box<dyn std::error::Error>> {
    let ttl = Duration::from_millis(args.ttl_ms);
    let name = LockName::new(LOCK)?;
    let mut register = None;
    while now_ns() < args.until_ns {
        let kind = next_kind(args.mode, rng);
        let opts = match kind {
            HoldKind::Shared => LockOptions::watchdog(ttl).read(),
            HoldKind::Permit { permits } => LockOptions::watchdog(ttl).permits(permits),
            _ => LockOptions::watchdog(ttl),
        }
        .wait(ttl * 3);
        log.event("kind", "ok", None, &kind_spec(kind));
        log.event("acquire", "invoke", None, "");
        let lease = match locker.acquire(&name, &opts).await {
            Ok(lease) => lease,
            Err(LockError::Timeout { .. }) => {
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
            let mut log = log.try_clone()?;
            let lost_logged = lost_logged.clone();
            tokio::spawn(async move {
                let reason = handle.lost().await;
                if !lost_logged.swap(true, Ordering::SeqCst) {
                    log.event("lost", "ok", Some(token), &reason_name(reason));
                }
            })
        };
        // Writes every quarter ttl or so over the hold, each after the validity check.
        let length = hold_length(rng, ttl);
        let until = tokio::time::Instant::now() + length;
        let ends_ns = now_ns().saturating_sub(args.epoch_ns) + length.as_nanos() as u64;
        let late_write = args.mutant == Some(Mutant::LateWrite);
        if late_write {
            tokio::time::sleep(ttl / 4).await;
        }
        let mut hold = Hold { register: &mut register, log: &mut *log, lost_logged, ends_ns };
        while write(&mut hold, args, &lease, kind).await {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break;
            }
            tokio::time::sleep(left.min(ttl.mul_f64(0.1 + rng.f64() * 0.2))).await;
        }
        watcher.abort();
        let _ = watcher.await;
        log.event("release", "invoke", Some(token), "");
        match lease.release().await {
            Ok(()) => log.event("release", "ok", Some(token), ""),
            Err(err) => log.event("release", "fail", Some(token), &format!("{err}").replace(['\n', ' '], "_")),
        }
        if late_write {
            // Late enough for a waiter to have been granted, early enough to beat its
            // first write (held back a quarter ttl).
            tokio::time::sleep(ttl / 8).await;
            let at = now_ns().saturating_sub(args.epoch_ns);
            send(&mut register, log, args, (token, kind), (at, at), ends_ns).await;
        }
    }
    Ok(())
}
