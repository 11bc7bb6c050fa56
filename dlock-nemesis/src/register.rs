//! The fenced register the clients write to, served by the run over loopback TCP: one
//! place that sees every write in the order it arrives, refuses tokens lower than the
//! highest it accepted, and records each write (and the writer's claim of validity) for
//! the verdict.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock::FencingToken;
use dlock_conformance::history::{FencedRegister, History};
use dlock_core::backend::lock_unpoisoned;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// A writer's claim, made just before its write: its lease was valid until `valid_until`
/// as seen at `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Claim {
    pub(crate) process: usize,
    pub(crate) token: FencingToken,
    pub(crate) at: Duration,
    pub(crate) valid_until: Duration,
}

/// The register's service.
#[derive(Debug)]
pub(crate) struct Register {
    pub(crate) addr: SocketAddr,
    pub(crate) claims: Arc<Mutex<Vec<Claim>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Register {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Register {
    pub(crate) async fn start(history: Arc<History>) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let claims = Arc::new(Mutex::new(Vec::new()));
        let shared = Arc::new((FencedRegister::new(history), AtomicU64::new(0), claims.clone()));
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(serve(socket, shared.clone()));
            }
        });
        Ok(Register { addr, claims, task })
    }
}

type Shared = Arc<(FencedRegister, AtomicU64, Arc<Mutex<Vec<Claim>>>)>;

/// `W <process> <token> <at ns> <valid until ns>` → `OK` or `REFUSED`.
async fn serve(socket: TcpStream, shared: Shared) {
    let (register, values, claims) = &*shared;
    let (read, mut write) = socket.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let fields: Vec<u64> = line.split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
        let [process, token, at, valid_until] = fields[..] else { break };
        let token = FencingToken::new(token);
        let process = process as usize;
        lock_unpoisoned(claims).push(Claim {
            process,
            token,
            at: Duration::from_nanos(at),
            valid_until: Duration::from_nanos(valid_until),
        });
        let value = values.fetch_add(1, Ordering::Relaxed);
        let reply = match register.write(process, token, value) {
            Ok(()) => "OK\n",
            Err(_) => "REFUSED\n",
        };
        if write.write_all(reply.as_bytes()).await.is_err() {
            break;
        }
    }
}
