//! One client's connection to the lease server: requests pipelined on one TCP connection,
//! answers matched by tag, a new connection when the old one broke.
//!
//! Nothing here has a timeout of its own but the connect timeout: the dlock client bounds
//! every operation by its operation timeout, and a renewal by the lease's validity, so
//! that an answer that comes late but in time still counts.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::backend::lock_unpoisoned;
use dlock_core::{HostPort, LockError};
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

use crate::protocol::{read_line, Reply, Request, VERSION};

/// How many requests may wait for the writer; past it callers wait (bounded by their
/// own timeouts) instead of queueing without bound behind a stalled connection.
const QUEUED_REQUESTS: usize = 1024;

/// An answer, and whether it came from a second delivery of the request (the first went
/// out on a connection that broke before its answer came).
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) reply: Reply,
    pub(crate) resent: bool,
}

/// The connection of one backend value, opened again when it breaks.
#[derive(Debug)]
pub(crate) struct Wire {
    server: HostPort,
    connect_timeout: Duration,
    current: tokio::sync::Mutex<Option<Arc<Connection>>>,
    tags: AtomicU64,
}

/// Why one delivery failed.
enum Failed {
    /// The connection broke (or could not be written to) before the answer came: the
    /// request may or may not have been applied, and may be sent again on a new one.
    Broke,
    /// No connection could be made.
    Unreachable(LockError),
}

impl Wire {
    /// Connects to `server` and checks that it speaks this protocol, within `timeout`.
    pub(crate) async fn connect(server: HostPort, timeout: Duration) -> Result<Self, LockError> {
        let wire = Wire { server, connect_timeout: timeout, current: Default::default(), tags: AtomicU64::new(1) };
        // A port that accepts and never answers (a frozen host) must fail here too.
        let hello = tokio::time::timeout(timeout, wire.call(&Request::Hello { version: VERSION })).await;
        match hello {
            Ok(Ok(Answer { reply: Reply::Hello { version: VERSION }, .. })) => Ok(wire),
            Ok(Ok(other)) => Err(LockError::backend(format!(
                "{} answered {:?} to HELLO: not a lease server of protocol {VERSION}",
                wire.server, other.reply
            ))),
            Ok(Err(err)) => Err(err),
            Err(_) => Err(LockError::unavailable(format!("{} did not answer within {timeout:?}", wire.server))),
        }
    }

    /// The server, for messages and the backend's target.
    pub(crate) fn server(&self) -> &HostPort {
        &self.server
    }

    /// Sends `request` and waits for its answer. When the connection breaks first, sends
    /// it once more on a new connection: every request is idempotent on the server (a
    /// grant, renewal or give-back is recorded under its request id or is a maximum; a
    /// release answers `NOTHELD` the second time, which callers read with `resent`).
    /// `ERR` answers become [`LockError::Backend`].
    pub(crate) async fn call(&self, request: &Request) -> Result<Answer, LockError> {
        for resent in [false, true] {
            match self.deliver(request).await {
                Ok(Reply::Err { message }) => {
                    return Err(LockError::backend(format!("{} refused the request: {message}", self.server)))
                }
                Ok(reply) => return Ok(Answer { reply, resent }),
                Err(Failed::Unreachable(err)) => return Err(err),
                Err(Failed::Broke) if resent => break,
                Err(Failed::Broke) => {}
            }
        }
        Err(LockError::unavailable(format!("the connection to {} broke before it answered", self.server)))
    }

    async fn deliver(&self, request: &Request) -> Result<Reply, Failed> {
        let connection = self.connection().await.map_err(Failed::Unreachable)?;
        let tag = self.tags.fetch_add(1, Ordering::Relaxed);
        let answer = connection.pending.expect(tag).ok_or(Failed::Broke)?;
        // If the caller gives up (its timeout), the tag is forgotten; a late answer is
        // then dropped by the reader.
        let _forget = Forget { pending: &connection.pending, tag };
        connection.requests.send(request.to_line(tag)).await.map_err(|_| Failed::Broke)?;
        answer.await.map_err(|_| Failed::Broke)
    }

    /// The open connection, or a new one when there is none or it broke.
    async fn connection(&self) -> Result<Arc<Connection>, LockError> {
        let mut current = self.current.lock().await;
        if let Some(connection) = current.as_ref().filter(|c| c.pending.is_open()) {
            return Ok(connection.clone());
        }
        let connection = Arc::new(Connection::open(&self.server, self.connect_timeout).await?);
        *current = Some(connection.clone());
        Ok(connection)
    }
}

/// One TCP connection: a task that writes the queued requests, one that reads answers.
#[derive(Debug)]
struct Connection {
    requests: mpsc::Sender<Vec<u8>>,
    pending: Arc<Pending>,
    tasks: [AbortHandle; 2],
}

impl Connection {
    async fn open(server: &HostPort, timeout: Duration) -> Result<Self, LockError> {
        let connect = TcpStream::connect((server.host.as_str(), server.port));
        let stream = match tokio::time::timeout(timeout, connect).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(err)) => return Err(LockError::unavailable_because(format!("cannot connect to {server}"), err)),
            Err(_) => return Err(LockError::unavailable(format!("connecting to {server} took over {timeout:?}"))),
        };
        let _ = stream.set_nodelay(true);
        let (read, write) = stream.into_split();
        let pending = Arc::new(Pending::default());
        let (requests, queued) = mpsc::channel(QUEUED_REQUESTS);
        let reader = tokio::spawn(read_answers(read, pending.clone())).abort_handle();
        let writer = tokio::spawn(write_requests(write, queued, pending.clone())).abort_handle();
        Ok(Connection { requests, pending, tasks: [reader, writer] })
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.pending.close();
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The callers waiting for answers on one connection, by tag.
#[derive(Debug, Default)]
struct Pending {
    waiting: Mutex<HashMap<u64, oneshot::Sender<Reply>>>,
    closed: AtomicBool,
}

impl Pending {
    fn is_open(&self) -> bool {
        !self.closed.load(Ordering::SeqCst)
    }

    /// Registers a caller for `tag`; `None` once the connection broke.
    fn expect(&self, tag: u64) -> Option<oneshot::Receiver<Reply>> {
        let mut waiting = lock_unpoisoned(&self.waiting);
        // Checked under the lock, so that `close` cannot miss a caller added meanwhile.
        if !self.is_open() {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        waiting.insert(tag, tx);
        Some(rx)
    }

    fn answer(&self, tag: u64, reply: Reply) {
        if let Some(caller) = lock_unpoisoned(&self.waiting).remove(&tag) {
            let _ = caller.send(reply);
        }
    }

    fn forget(&self, tag: u64) {
        lock_unpoisoned(&self.waiting).remove(&tag);
    }

    /// The connection broke: every caller still waiting learns it now.
    fn close(&self) {
        let mut waiting = lock_unpoisoned(&self.waiting);
        self.closed.store(true, Ordering::SeqCst);
        waiting.clear();
    }
}

struct Forget<'a> {
    pending: &'a Pending,
    tag: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.pending.forget(self.tag);
    }
}

async fn read_answers(read: OwnedReadHalf, pending: Arc<Pending>) {
    let mut reader = BufReader::new(read);
    let mut line = Vec::new();
    loop {
        match read_line(&mut reader, &mut line).await {
            Ok(true) => match Reply::parse(&line) {
                Ok((tag, reply)) => pending.answer(tag, reply),
                Err(why) => {
                    // After a garbled answer no later answer can be trusted to be its own.
                    tracing::debug!(%why, "leasemap: a garbled answer; dropping the connection");
                    break;
                }
            },
            Ok(false) => break,
            Err(err) => {
                tracing::debug!(%err, "leasemap: the connection broke");
                break;
            }
        }
    }
    pending.close();
}

/// Writes the queued requests, as many as are queued in one write.
async fn write_requests(write: OwnedWriteHalf, mut queued: mpsc::Receiver<Vec<u8>>, pending: Arc<Pending>) {
    let mut writer = BufWriter::new(write);
    'connection: while let Some(line) = queued.recv().await {
        if writer.write_all(&line).await.is_err() {
            break;
        }
        while let Ok(line) = queued.try_recv() {
            if writer.write_all(&line).await.is_err() {
                break 'connection;
            }
        }
        if writer.flush().await.is_err() {
            break;
        }
    }
    pending.close();
}
