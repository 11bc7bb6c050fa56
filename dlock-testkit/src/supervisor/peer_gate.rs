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
        lock_unpoisoned(&self.state.refused).insert(sender.to_string());
        let open = lock_unpoisoned(&self.state.open);
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
    if lock_unpoisoned(&state.refused).contains(&sender) || state.stopped.load(Ordering::SeqCst) {
        return inbound.shutdown(Shutdown::Both);
    }
    inbound.set_read_timeout(None)?;
    let mut outbound = TcpStream::connect_timeout(&target, Duration::from_secs(1))?;
    outbound.write_all(&head)?;
    let id = state.next_id.fetch_add(1, Ordering::Relaxed);
    {
        let mut open = lock_unpoisoned(&state.open);
        open.push((id, sender.clone(), inbound.try_clone()?));
        open.push((id, sender, outbound.try_clone()?));
    }
    let (mut from_peer, mut to_member) = (inbound.try_clone()?, outbound.try_clone()?);
    let upstream = thread::Builder::new().name("peer-gate-up".into()).spawn(move || {
        let _ = io::copy(&mut from_peer, &mut to_member);
        let _ = to_member.shutdown(Shutdown::Write);
    })?;
    let _ = io::copy(&mut outbound, &mut inbound);
    let _ = inbound.shutdown(Shutdown::Both);
    let _ = outbound.shutdown(Shutdown::Both);
    let _ = upstream.join();
    lock_unpoisoned(&state.open).retain(|(open, _, _)| *open != id);
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
    use super::sender_of;

    #[test]
    fn the_sender_is_read_from_the_first_request_only() {
        let head = b"GET /raft/stream/message/1 HTTP/1.1\r\nHost: x\r\nx-server-from: 8e9e05c52164694d\r\n\r\nX-Server-From: other";
        assert_eq!(sender_of(head).as_deref(), Some("8e9e05c52164694d"));
        assert_eq!(sender_of(b"GET /health HTTP/1.1\r\n\r\n"), None);
    }
}
