//! The fenced register the clients write to, served by the run over loopback TCP: one
//! place that sees every write in the order it arrives, refuses tokens lower than the
//! highest it accepted, and records each write (and the writer's claim of validity) for
//! the verdict.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock::FencingToken;
use dlock_conformance::history::{FencedRegister, History};
use dlock_core::backend::lock_unpoisoned;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::client::parse_kind;

/// A writer's claim, made just before its write: its lease was valid until `valid_until`
/// as seen at `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Claim {
    pub(crate) process: usize,
    pub(crate) token: FencingToken,
    pub(crate) at: Duration,
    pub(crate) valid_until: Duration,
    /// When the writer means to let go.
    pub(crate) ends: Duration,
}

/// The register's service.
#[derive(Debug)]
pub(crate) struct Register {
    pub(crate) addr: SocketAddr,
    pub(crate) claims: Arc<Mutex<Vec<Claim>>>,
    /// The process that wrote last, plus one (0 before any write): the one a fault
    /// aimed at the holder hits.
    last_writer: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Register {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Shared {
    register: FencedRegister,
    values: AtomicU64,
    claims: Arc<Mutex<Vec<Claim>>>,
    last_writer: Arc<AtomicUsize>,
}

impl Register {
    pub(crate) async fn start(history: Arc<History>) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let claims = Arc::new(Mutex::new(Vec::new()));
        let last_writer = Arc::new(AtomicUsize::new(0));
        let shared = Arc::new(Shared {
            register: FencedRegister::new(history),
            values: AtomicU64::new(0),
            claims: claims.clone(),
            last_writer: last_writer.clone(),
        });
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(serve(socket, shared.clone()));
            }
        });
        Ok(Register { addr, claims, last_writer, task })
    }

    /// The process that wrote last, if any has.
    pub(crate) fn last_writer(&self) -> Option<usize> {
        self.last_writer.load(Ordering::Relaxed).checked_sub(1)
    }

    /// The process that wrote last if, by its own word, it holds the lock at `now` (time
    /// since the run's epoch) and for `ahead` more: its claimed validity has not run out,
    /// and it does not mean to let go before then.
    pub(crate) fn holder_at(&self, now: Duration, ahead: Duration) -> Option<usize> {
        let claims = lock_unpoisoned(&self.claims);
        claims.last().filter(|claim| claim.valid_until > now && claim.ends > now + ahead).map(|claim| claim.process)
    }
}

/// `W <process> <token> <at ns> <valid until ns> <kind> <ends ns>` → `OK` or `REFUSED`.
async fn serve(socket: TcpStream, shared: Arc<Shared>) {
    let (read, mut write) = socket.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let fields: Vec<&str> = line.split_whitespace().skip(1).collect();
        let [process, token, at, valid_until, kind, ends] = fields[..] else { break };
        let (Ok(process), Ok(token), Ok(at), Ok(valid_until), Some(kind), Ok(ends)) =
            (process.parse::<usize>(), token.parse(), at.parse(), valid_until.parse(), parse_kind(kind), ends.parse())
        else {
            break;
        };
        let token = FencingToken::new(token);
        lock_unpoisoned(&shared.claims).push(Claim {
            process,
            token,
            at: Duration::from_nanos(at),
            valid_until: Duration::from_nanos(valid_until),
            ends: Duration::from_nanos(ends),
        });
        shared.last_writer.store(process + 1, Ordering::Relaxed);
        let value = shared.values.fetch_add(1, Ordering::Relaxed);
        let reply = match shared.register.write_as(process, token, kind, value) {
            Ok(()) => "OK\n",
            Err(_) => "REFUSED\n",
        };
        if write.write_all(reply.as_bytes()).await.is_err() {
            break;
        }
    }
}
