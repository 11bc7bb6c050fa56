//! A gate in front of one cluster member's peer listener that admits or refuses each
//! connection by the member that opened it, so that a test can partition members from
//! each other pair by pair although they all live on 127.0.0.1.
//!
//! etcd's peer transport names the sending member in an `X-Server-From` header on every
//! request but its probes, and a connection only ever carries one sender's requests, so
//! the gate reads the first request's headers, decides, and then copies bytes both ways
//! untouched. A connection whose first request names no sender (a probe) is let through,
//! but watched: the transport keeps connections alive and sends messages over one a probe
//! opened, so the first sender a later request names decides for the connection then.
//! Refusing a sender also closes the connections it already has open.

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
                let _ = thread::Builder::new().name("peer-gate-conn".into()).spawn(move || serve(conn, target, state));
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
        // Under the lock a new connection registers under (see `State::admit`), so that
        // no connection can pass the check before this and register after the closing.
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

impl State {
    /// Registers `stream`, one side of connection `id` from `sender`, among the open ones,
    /// unless the sender is refused or the gate stopped. Checked and registered in one
    /// step, under the lock `refuse` closes connections under: a refusal either comes
    /// first and this answers false, or comes after and closes the stream with the others.
    fn admit(&self, id: u64, sender: &str, stream: &TcpStream) -> io::Result<bool> {
        let mut open = lock_unpoisoned(&self.open);
        if lock_unpoisoned(&self.refused).contains(sender) || self.stopped.load(Ordering::SeqCst) {
            return Ok(false);
        }
        open.push((id, sender.to_string(), stream.try_clone()?));
        Ok(true)
    }

    /// Names `sender` as the sender of connection `id`, admitted unnamed: false (and
    /// nothing changed) when the sender is refused, so that the caller closes it.
    fn name(&self, id: u64, sender: &str) -> bool {
        let mut open = lock_unpoisoned(&self.open);
        if lock_unpoisoned(&self.refused).contains(sender) {
            return false;
        }
        open.iter_mut().filter(|(open, _, _)| *open == id).for_each(|(_, from, _)| *from = sender.to_string());
        true
    }
}

fn serve(mut inbound: TcpStream, target: SocketAddr, state: Arc<State>) -> io::Result<()> {
    inbound.set_read_timeout(Some(Duration::from_secs(5)))?;
    let head = read_head(&mut inbound)?;
    let sender = named_in(&head).unwrap_or_default();
    let id = state.next_id.fetch_add(1, Ordering::Relaxed);
    if !state.admit(id, &sender, &inbound)? {
        return inbound.shutdown(Shutdown::Both);
    }
    let relayed = relay(&inbound, &head, target, (id, &sender), &state);
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
    state: &Arc<State>,
) -> io::Result<()> {
    inbound.set_read_timeout(None)?;
    let mut outbound = TcpStream::connect_timeout(&target, Duration::from_secs(1))?;
    // A refusal since `inbound` was admitted closed it, but not this new side.
    if !state.admit(id, sender, &outbound)? {
        return outbound.shutdown(Shutdown::Both);
    }
    let (mut from_peer, mut to_member) = (inbound.try_clone()?, outbound.try_clone()?);
    let (state, unnamed, head) = (state.clone(), sender.is_empty(), head.to_vec());
    let upstream = thread::Builder::new().name("peer-gate-up".into()).spawn(move || {
        let named = if unnamed {
            copy_until_named(&mut from_peer, &mut to_member, head, |s| state.name(id, s))
        } else {
            to_member.write_all(&head).map(|()| true)
        };
        if named.unwrap_or(false) {
            let _ = io::copy(&mut from_peer, &mut to_member);
            let _ = to_member.shutdown(Shutdown::Write);
        } else {
            let _ = from_peer.shutdown(Shutdown::Both);
            let _ = to_member.shutdown(Shutdown::Both);
        }
    })?;
    let _ = io::copy(&mut outbound, &mut inbound.try_clone()?);
    let _ = outbound.shutdown(Shutdown::Both);
    let _ = upstream.join();
    Ok(())
}

/// Copies `pending` and then what `from` sends to `to`, until a request names its sender
/// in a complete `X-Server-From` line: then asks `admit` about it, and answers whether it
/// was admitted (the request naming it is copied only then). Ok(true) too when `from`
/// ends first.
fn copy_until_named(
    from: &mut TcpStream,
    to: &mut TcpStream,
    mut pending: Vec<u8>,
    admit: impl Fn(&str) -> bool,
) -> io::Result<bool> {
    // The bytes copied already that a header line may have begun in.
    let mut tail = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let mut seen = std::mem::take(&mut tail);
        seen.extend_from_slice(&pending);
        if let Some(sender) = named_in(&seen) {
            if !admit(&sender) {
                return Ok(false);
            }
            to.write_all(&pending)?;
            return Ok(true);
        }
        to.write_all(&pending)?;
        tail = seen[seen.len().saturating_sub(MAX_HEADER_LINE)..].to_vec();
        let n = from.read(&mut buf)?;
        if n == 0 {
            return Ok(true);
        }
        pending = buf[..n].to_vec();
    }
}

/// The longest header line the gate looks for a sender in across reads.
const MAX_HEADER_LINE: usize = 256;

/// The value of the first complete `X-Server-From` header line anywhere in `bytes`.
fn named_in(bytes: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(bytes);
    let mut lines = text.split("\r\n").peekable();
    while let Some(line) = lines.next() {
        // The last piece has no line end yet: it may be cut short.
        lines.peek()?;
        if let Some((name, value)) = line.split_once(':') {
            if name.trim().eq_ignore_ascii_case("x-server-from") {
                return Some(value.trim().to_string());
            }
        }
    }
    None
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

#[cfg(test)]
mod tests {
    use std::io::{ErrorKind, Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::thread;
    use std::time::Duration;

    use super::{named_in, PeerGate};

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
    fn the_sender_is_the_first_complete_header_line_naming_one() {
        let head = b"GET /raft/stream/message/1 HTTP/1.1\r\nHost: x\r\nx-server-from: 8e9e05c52164694d\r\n\r\nX-Server-From: other\r\n";
        assert_eq!(named_in(head).as_deref(), Some("8e9e05c52164694d"));
        assert_eq!(named_in(b"GET /health HTTP/1.1\r\n\r\n"), None);
        let probe_then_message = b"GET /raft/probing HTTP/1.1\r\n\r\nPOST /raft HTTP/1.1\r\nX-Server-From: 2a\r\n";
        assert_eq!(named_in(probe_then_message).as_deref(), Some("2a"));
        assert_eq!(named_in(b"POST /raft HTTP/1.1\r\nX-Server-From: 2a"), None, "a line cut short names nobody yet");
    }

    /// A connection opened by a probe, which names no sender, and then kept alive for a
    /// refused sender's messages is closed before the message reaches the member.
    #[test]
    fn a_sender_named_after_a_probe_is_refused_too() {
        let member = TcpListener::bind("127.0.0.1:0").unwrap();
        let target = member.local_addr().unwrap();
        let (received, seen) = std::sync::mpsc::channel();
        thread::spawn(move || {
            for mut conn in member.incoming().flatten() {
                let received = received.clone();
                thread::spawn(move || {
                    let mut all = Vec::new();
                    let _ = conn.read_to_end(&mut all);
                    let _ = received.send(String::from_utf8_lossy(&all).to_string());
                });
            }
        });
        let gate = PeerGate::start(target).unwrap();
        gate.refuse("m1");
        let mut conn = TcpStream::connect(gate.addr()).unwrap();
        conn.write_all(b"GET /raft/probing HTTP/1.1\r\n\r\n").unwrap();
        thread::sleep(Duration::from_millis(100));
        // The header line arrives in two pieces.
        conn.write_all(b"POST /raft HTTP/1.1\r\nX-Server-").unwrap();
        thread::sleep(Duration::from_millis(50));
        conn.write_all(b"From: m1\r\nContent-Length: 0\r\n\r\n").unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let closed = match conn.read(&mut [0u8; 16]) {
            Ok(n) => n == 0,
            Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        };
        assert!(closed, "the connection of a refused sender stays open");
        let got = seen.recv_timeout(Duration::from_secs(3)).expect("the member's side closes");
        assert!(got.starts_with("GET /raft/probing"), "{got:?}");
        assert!(!got.contains("From: m1"), "the refused sender's message reached the member: {got:?}");
    }
}
