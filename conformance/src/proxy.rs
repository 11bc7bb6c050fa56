//! A TCP fault proxy to put between a client and a server: pass, cut, blackhole, delay.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::fixture::Link;

/// What the proxy does to traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward everything.
    Pass,
    /// Close every connection and refuse new ones (they are accepted and closed at once).
    Cut,
    /// Keep connections open and forward nothing, in either direction, until the mode
    /// changes: then the stalled bytes flow on (restore) or the connections close (cut).
    Blackhole,
    /// Forward everything after this delay per chunk.
    Delay(Duration),
}

/// A running proxy. Dropping it stops it and closes its connections.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port forwarding to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let (mode, rx) = watch::channel(Mode::Pass);
        let task = tokio::spawn(accept_loop(listener, target, rx));
        Ok(FaultProxy { addr, mode, task })
    }

    /// The address clients should connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Changes what the proxy does, for open connections too.
    pub fn set_mode(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// A [`Link`] that drives this proxy.
    pub fn link(&self) -> ProxyLink {
        ProxyLink { mode: self.mode.clone() }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.set_mode(Mode::Cut);
        self.task.abort();
    }
}

/// The [`Link`] of a [`FaultProxy`]; it keeps working after the proxy value is moved.
#[derive(Debug, Clone)]
pub struct ProxyLink {
    mode: watch::Sender<Mode>,
}

impl Link for ProxyLink {
    fn cut(&self) {
        self.mode.send_replace(Mode::Cut);
    }

    fn blackhole(&self) {
        self.mode.send_replace(Mode::Blackhole);
    }

    fn restore(&self) {
        self.mode.send_replace(Mode::Pass);
    }
}

impl Link for FaultProxy {
    fn cut(&self) {
        self.set_mode(Mode::Cut);
    }

    fn blackhole(&self) {
        self.set_mode(Mode::Blackhole);
    }

    fn restore(&self) {
        self.set_mode(Mode::Pass);
    }
}

async fn accept_loop(listener: TcpListener, target: SocketAddr, mode: watch::Receiver<Mode>) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let Ok((client, _)) = listener.accept().await else { continue };
        if *mode.borrow() == Mode::Cut {
            drop(client);
        } else {
            conns.spawn(forward(client, target, mode.clone()));
        }
        // Reap finished connections so the set does not grow without bound.
        while conns.try_join_next().is_some() {}
    }
}

async fn forward(client: TcpStream, target: SocketAddr, mode: watch::Receiver<Mode>) {
    let Ok(server) = TcpStream::connect(target).await else { return };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // When either direction ends, both sockets are dropped and closed.
    tokio::select! {
        _ = pump(client_read, server_write, mode.clone()) => {}
        _ = pump(server_read, client_write, mode) => {}
    }
}

/// Waits out a blackhole. Like a frozen peer under TCP, nothing is lost: bytes stall
/// (the kernel buffers fill and flow control stops the sender) and flow again, late,
/// on restore. Returns false when the connection must close.
async fn passable(mode: &mut watch::Receiver<Mode>) -> bool {
    loop {
        let current = *mode.borrow_and_update();
        match current {
            Mode::Cut => return false,
            Mode::Blackhole => {
                if mode.changed().await.is_err() {
                    return false;
                }
            }
            Mode::Pass | Mode::Delay(_) => return true,
        }
    }
}

async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut mode: watch::Receiver<Mode>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if !passable(&mut mode).await {
            return;
        }
        let n = tokio::select! {
            n = from.read(&mut buf) => match n { Ok(0) | Err(_) => return, Ok(n) => n },
            changed = mode.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
        };
        if !passable(&mut mode).await {
            return;
        }
        let current = *mode.borrow();
        if let Mode::Delay(d) = current {
            tokio::time::sleep(d).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn roundtrip(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
        s.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        let n = tokio::time::timeout(Duration::from_millis(300), s.read(&mut buf))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer"))??;
        Ok(buf[..n].to_vec())
    }

    #[tokio::test]
    async fn passes_cuts_blackholes_and_restores() {
        let proxy = FaultProxy::start(echo_server().await).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut s).await.unwrap(), b"ping");

        proxy.blackhole();
        assert_eq!(roundtrip(&mut s).await.unwrap_err().kind(), std::io::ErrorKind::TimedOut);

        // Nothing was lost: the stalled bytes arrive once the blackhole lifts.
        proxy.restore();
        let mut late = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut late)).await.unwrap().unwrap();
        assert_eq!(&late, b"ping");

        proxy.cut();
        // A cut closes the connection: the read ends with 0 bytes or an error.
        assert!(roundtrip(&mut s).await.map(|v| v.is_empty()).unwrap_or(true));

        proxy.restore();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut s).await.unwrap(), b"ping");
    }
}
