//! A gate in front of one cluster member's peer listener that admits or refuses each
//! connection by the member that opened it, so that a test can partition members from
//! each other pair by pair although they all live on 127.0.0.1.
//!
//! etcd's peer transport names the sending member in an `X-Server-From` header on every
//! request, and a connection only ever carries one sender's requests, so the gate reads
//! the first request's headers, decides, and then copies bytes both ways untouched.
//! Refusing a sender also closes the connections it already has open. A connection that
//! names no sender (a probe) is let through.

use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use dlock_core::backend::lock_unpoisoned;

/// The most header bytes read before a connection that names no sender is let through.
const MAX_HEAD: usize = 16 * 1024;

/// A running gate; dropping it stops accepting and closes every connection.
#[derive(Debug)]
pub struct PeerGate {
    addr: SocketAddr,
    state: Arc<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The senders refused now.
    refused: Mutex<HashSet<String>>,
    /// Open connections (an id, the sender or `""` when it named none, the stream), to
    /// close on refusal.
    open: Mutex<Vec<(u64, String, TcpStream)>>,
    next_id: std::sync::atomic::AtomicU64,
    stopped: AtomicBool,
}

impl PeerGate {
    /// Starts a gate on a free loopback port forwarding to `target`.
    pub fn start(target: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State::default());
        let accepting = state.clone();
        thread::Builder::new().name(format!("peer-gate-{}", addr.port())).spawn(move || {
            for conn in listener.incoming() {
                if accepting.stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let state = accepting.clone();
                // A connection that fails to set up is simply closed, as a refused one.
                let _ = thread::Builder::new().name("peer-gate-conn".into()).spawn(move || serve(conn, target, &state));
            }
        })?;
        Ok(PeerGate { addr, state })
    }

    /// The address peers should dial.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Refuses connections from the member `sender` (an etcd member id in hex), closing
    /// the ones it has open.
    pub fn refuse(&self, sender: &str) {
        // Under the lock a new connection registers under (see `serve`), so that no
        // connection can pass the check before this and register after the closing.
        let open = lock_unpoisoned(&self.state.open);
        lock_unpoisoned(&self.state.refused).insert(sender.to_string());
        for (_, from, stream) in open.iter() {
            if from == sender {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
    }

    /// Admits every sender again.
    pub fn admit_all(&self) {
        lock_unpoisoned(&self.state.refused).clear();
    }
}

impl Drop for PeerGate {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::SeqCst);
        // Wake the accept loop so that it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(100));
        for (_, _, stream) in lock_unpoisoned(&self.state.open).drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

fn serve(mut inbound: TcpStream, target: SocketAddr, state: &State) -> io::Result<()> {
    inbound.set_read_timeout(Some(Duration::from_secs(5)))?;
    let head = read_head(&mut inbound)?;
    let sender = sender_of(&head).unwrap_or_default();
    let id = state.next_id.fetch_add(1, Ordering::Relaxed);
    {
        // Checked and registered in one step: a refusal either comes first and this
        // connection is closed here, or comes after and closes it with the others.
        let mut open = lock_unpoisoned(&state.open);
        if lock_unpoisoned(&state.refused).contains(&sender) || state.stopped.load(Ordering::SeqCst) {
            return inbound.shutdown(Shutdown::Both);
        }
        open.push((id, sender.clone(), inbound.try_clone()?));
    }
    let relayed = relay(&inbound, &head, target, (id, &sender), state);
    let _ = inbound.shutdown(Shutdown::Both);
    lock_unpoisoned(&state.open).retain(|(open, _, _)| *open != id);
    relayed
}

/// Copies the registered connection `inbound` to and from a new connection to `target`
/// until either side closes (a refusal shuts both).
fn relay(
    inbound: &TcpStream,
    head: &[u8],
    target: SocketAddr,
    (id, sender): (u64, &str),
    state: &State,
) -> io::Result<()> {
    inbound.set_read_timeout(None)?;
    let mut outbound = TcpStream::connect_timeout(&target, Duration::from_secs(1))?;
    {
        // A refusal since `inbound` registered closed it, but not this new side.
        let mut open = lock_unpoisoned(&state.open);
        if lock_unpoisoned(&state.refused).contains(sender) {
            return outbound.shutdown(Shutdown::Both);
        }
        open.push((id, sender.to_string(), outbound.try_clone()?));
    }
    outbound.write_all(head)?;
    let (mut from_peer, mut to_member) = (inbound.try_clone()?, outbound.try_clone()?);
    let upstream = thread::Builder::new().name("peer-gate-up".into()).spawn(move || {
        let _ = io::copy(&mut from_peer, &mut to_member);
        let _ = to_member.shutdown(Shutdown::Write);
    })?;
    let _ = io::copy(&mut outbound, &mut inbound.try_clone()?);
    let _ = outbound.shutdown(Shutdown::Both);
    let _ = upstream.join();
    Ok(())
}

/// Reads until the end of the first request's headers (or [`MAX_HEAD`] bytes, or the
/// end of the stream), returning everything read.
fn read_head(stream: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 2048];
    while head.len() < MAX_HEAD && !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    Ok(head)
}

/// The `X-Server-From` header's value, if the request has one.
fn sender_of(head: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(head);
    let end = text.find("\r\n\r\n").unwrap_or(text.len());
    text[..end].lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim().eq_ignore_ascii_case("x-server-from").then(|| value.trim().to_string())
    })
}

#[cfg(test)]
mod tests {
    use std::io::{ErrorKind, Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::thread;
    use std::time::Duration;

    use super::{sender_of, PeerGate};

    /// Connections from one sender opened while it is being refused: each one is either
    /// refused at its start or closed with the others, never left through.
    #[test]
    fn no_connection_slips_past_a_refusal() {
        let member = TcpListener::bind("127.0.0.1:0").unwrap();
        let target = member.local_addr().unwrap();
        // The member keeps every connection open and answers nothing.
        thread::spawn(move || {
            let mut held = Vec::new();
            for conn in member.incoming().flatten() {
                held.push(conn);
            }
        });
        for round in 0..200 {
            let gate = PeerGate::start(target).unwrap();
            let sender = format!("m{round}");
            let dialers: Vec<_> = (0..4)
                .map(|_| {
                    let (addr, sender) = (gate.addr(), sender.clone());
                    thread::spawn(move || {
                        let mut conn = TcpStream::connect(addr).unwrap();
                        let head = format!("GET /raft/stream/message/1 HTTP/1.1\r\nX-Server-From: {sender}\r\n\r\n");
                        conn.write_all(head.as_bytes()).unwrap();
                        conn
                    })
                })
                .collect();
            thread::sleep(Duration::from_micros(fastrand::u64(0..400)));
            gate.refuse(&sender);
            for dialer in dialers {
                let mut conn = dialer.join().unwrap();
                conn.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
                let closed = match conn.read(&mut [0u8; 16]) {
                    Ok(n) => n == 0,
                    Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
                };
                assert!(closed, "round {round}: a connection from a refused sender stays open");
            }
        }
    }

    #[test]
    fn the_sender_is_read_from_the_first_request_only() {
        let head = b"GET /raft/stream/message/1 HTTP/1.1\r\nHost: x\r\nx-server-from: 8e9e05c52164694d\r\n\r\nX-Server-From: other";
        assert_eq!(sender_of(head).as_deref(), Some("8e9e05c52164694d"));
        assert_eq!(sender_of(b"GET /health HTTP/1.1\r\n\r\n"), None);
    }
}
