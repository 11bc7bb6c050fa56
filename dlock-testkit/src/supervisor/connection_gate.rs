//! A gate in front of a server that carries the connections it let through and, once
//! told to [`hold_new`](ConnectionGate::hold_new), accepts new ones but never forwards
//! them: their requests go unanswered, as behind a firewall or a load balancer whose
//! table of flows is full. A client's connections opened before keep working; one it
//! opens after (a second connection of its own, for pub/sub say) hangs.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use dlock_core::backend::lock_unpoisoned;

/// A running gate; dropping it stops accepting and closes every connection.
#[derive(Debug)]
pub struct ConnectionGate {
    addr: SocketAddr,
    state: Arc<State>,
}

#[derive(Debug, Default)]
struct State {
    holding: AtomicBool,
    stopped: AtomicBool,
    /// Every connection accepted (both ends of a forwarded one), to close on drop.
    open: Mutex<Vec<TcpStream>>,
}

impl ConnectionGate {
    /// Starts a gate on a free loopback port forwarding to `target`.
    pub fn start(target: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State::default());
        let accepting = state.clone();
        thread::Builder::new().name(format!("connection-gate-{}", addr.port())).spawn(move || {
            for conn in listener.incoming() {
                if accepting.stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                if accepting.holding.load(Ordering::SeqCst) {
                    // Kept open and unread: the client waits for answers that never come.
                    lock_unpoisoned(&accepting.open).push(conn);
                    continue;
                }
                // A connection that fails to set up is simply closed.
                let _ = forward(conn, target, &accepting);
            }
        })?;
        Ok(ConnectionGate { addr, state })
    }

    /// The address clients should connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// From now on, new connections are accepted and held unanswered; those already
    /// through keep flowing.
    pub fn hold_new(&self) {
        self.state.holding.store(true, Ordering::SeqCst);
    }
}

impl Drop for ConnectionGate {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::SeqCst);
        // Wake the accept loop so that it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(100));
        for stream in lock_unpoisoned(&self.state.open).drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

/// Connects to `target` and copies bytes both ways until either side closes.
fn forward(client: TcpStream, target: SocketAddr, state: &State) -> io::Result<()> {
    let server = TcpStream::connect(target)?;
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    {
        let mut open = lock_unpoisoned(&state.open);
        open.push(client.try_clone()?);
        open.push(server.try_clone()?);
    }
    let (client_in, server_out) = (client.try_clone()?, server.try_clone()?);
    thread::Builder::new().name("connection-gate-up".into()).spawn(move || pump(client_in, server_out))?;
    thread::Builder::new().name("connection-gate-down".into()).spawn(move || pump(server, client))?;
    Ok(())
}

fn pump(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}
