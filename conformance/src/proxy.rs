//! A TCP fault proxy to put between a client and a server. It plays every
//! [`Fault`]: both directions cut, black-holed or delayed, or one direction alone
//! black-holed, dropped or delayed, so that a request can be applied while its reply is
//! lost, the fault the suite calls an ambiguous outcome.

use std::net::SocketAddr;
use std::time::Duration;

use crate::{Fault, Link};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// A running proxy. Dropping it stops it and closes its connections.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    fault: watch::Sender<Fault>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port forwarding to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let (fault, rx) = watch::channel(Fault::None);
        let task = tokio::spawn(accept_loop(listener, target, rx));
        Ok(FaultProxy { addr, fault, task })
    }

    /// The address clients should connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Plays `fault` from now on, for open connections too.
    pub fn set_fault(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// A [`Link`] that drives this proxy.
    pub fn link(&self) -> ProxyLink {
        ProxyLink { fault: self.fault.clone() }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.set_fault(Fault::Cut);
        self.task.abort();
    }
}

/// The [`Link`] of a [`FaultProxy`]; it keeps working after the proxy value is moved.
#[derive(Debug, Clone)]
pub struct ProxyLink {
    fault: watch::Sender<Fault>,
}

impl Link for ProxyLink {
    fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }
}

impl Link for FaultProxy {
    fn set(&self, fault: Fault) {
        self.set_fault(fault);
    }
}

async fn accept_loop(listener: TcpListener, target: SocketAddr, fault: watch::Receiver<Fault>) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let Ok((client, _)) = listener.accept().await else { continue };
        if *fault.borrow() == Fault::Cut {
            drop(client);
        } else {
            conns.spawn(forward(client, target, fault.clone()));
        }
        // Reap finished connections so the set does not grow without bound.
        while conns.try_join_next().is_some() {}
    }
}

/// Which way bytes go: requests from the client, replies from the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Requests,
    Replies,
}

/// What a fault does to one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Pass,
    /// Stall: nothing flows until the fault changes, then the held bytes flow on.
    Hold,
    /// Read and throw away.
    Drop,
    /// Deliver each chunk this long after it was read.
    Delay(Duration),
    /// Close the connection.
    Close,
}

fn flow(fault: Fault, direction: Direction) -> Flow {
    use Direction::{Replies, Requests};
    match (fault, direction) {
        (Fault::Cut, _) => Flow::Close,
        (Fault::Blackhole, _) | (Fault::BlackholeRequests, Requests) | (Fault::BlackholeReplies, Replies) => Flow::Hold,
        (Fault::DropReplies, Replies) => Flow::Drop,
        (Fault::DelayReplies(d), Replies) | (Fault::Delay(d), _) => Flow::Delay(d),
        _ => Flow::Pass,
    }
}

async fn forward(client: TcpStream, target: SocketAddr, fault: watch::Receiver<Fault>) {
    let Ok(server) = TcpStream::connect(target).await else { return };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // When either direction ends, both sockets are dropped and closed.
    tokio::select! {
        _ = pump(client_read, server_write, fault.clone(), Direction::Requests) => {}
        _ = pump(server_read, client_write, fault, Direction::Replies) => {}
    }
}

/// Waits while the direction is held. Like a frozen peer under TCP, nothing is lost:
/// bytes stall (the kernel buffers fill and flow control stops the sender) and flow
/// again, late, when the fault lifts. Returns the flow to apply, never `Hold`.
async fn unheld(fault: &mut watch::Receiver<Fault>, direction: Direction) -> Flow {
    loop {
        let current = flow(*fault.borrow_and_update(), direction);
        if current != Flow::Hold {
            return current;
        }
        if fault.changed().await.is_err() {
            return Flow::Close;
        }
    }
}

/// Moves bytes one way. Reading and writing run apart, joined by a queue of chunks each
/// stamped with when it may be written, so that a delay holds every chunk back by the
/// same time without adding up (a delay line, not one pause per chunk), and order is kept.
async fn pump(from: OwnedReadHalf, to: OwnedWriteHalf, fault: watch::Receiver<Fault>, direction: Direction) {
    let (chunks, queued) = mpsc::channel::<(Instant, Vec<u8>)>(256);
    let writing = write_side(to, queued, fault.clone(), direction);
    tokio::pin!(writing);
    tokio::select! {
        _ = read_side(from, chunks, fault, direction) => {}
        _ = &mut writing => return,
    }
    // The stream ended (or a fault closed it): what was read before still goes out, as
    // TCP delivers the bytes sent before a close (a ZooKeeper member sends its id and
    // closes at once, expecting the peer to call back), unless the fault is a cut.
    writing.await;
}

async fn read_side(
    mut from: OwnedReadHalf,
    chunks: mpsc::Sender<(Instant, Vec<u8>)>,
    mut fault: watch::Receiver<Fault>,
    direction: Direction,
) {
    let mut buf = vec![0u8; 64 * 1024];
    // Bytes thrown away break the stream for good (the peer would read a reply as the
    // answer to another request): once the drop ends, the connection closes, as a real
    // connection that lost bytes would be reset.
    let mut dropped = false;
    loop {
        match unheld(&mut fault, direction).await {
            Flow::Close => return,
            Flow::Drop => {}
            _ if dropped => return,
            _ => {}
        }
        let n = tokio::select! {
            n = from.read(&mut buf) => match n { Ok(0) | Err(_) => return, Ok(n) => n },
            changed = fault.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
        };
        // The fault at the moment a chunk arrives decides its fate.
        let due = match unheld(&mut fault, direction).await {
            Flow::Close => return,
            Flow::Drop => {
                dropped = true;
                continue;
            }
            Flow::Delay(d) => Instant::now() + d,
            Flow::Pass | Flow::Hold => Instant::now(),
        };
        if chunks.send((due, buf[..n].to_vec())).await.is_err() {
            return;
        }
    }
}

async fn write_side(
    mut to: OwnedWriteHalf,
    mut queued: mpsc::Receiver<(Instant, Vec<u8>)>,
    mut fault: watch::Receiver<Fault>,
    direction: Direction,
) {
    while let Some((due, chunk)) = queued.recv().await {
        tokio::time::sleep_until(due).await;
        // A chunk queued before a hold or a cut began obeys it too; one queued before a
        // drop began still goes (it was on the wire already).
        if unheld(&mut fault, direction).await == Flow::Close {
            return;
        }
        if to.write_all(&chunk).await.is_err() {
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

    /// Bytes a client sends just before it closes reach the server: the close does not
    /// overtake them in the proxy.
    #[tokio::test]
    async fn bytes_sent_before_a_close_are_delivered() {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let target = listener.local_addr().unwrap();
        let proxy = FaultProxy::start(target).await.unwrap();
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        client.write_all(b"hello, then goodbye").await.unwrap();
        drop(client);
        let (mut server, _) = listener.accept().await.unwrap();
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), server.read_to_end(&mut got)).await.unwrap().unwrap();
        assert_eq!(got, b"hello, then goodbye");
    }

    /// A server that counts the bytes it receives and answers each chunk with "ok".
    async fn counting_server() -> (SocketAddr, watch::Receiver<usize>) {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (count, seen) = watch::channel(0usize);
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            while let Ok(n) = s.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                count.send_modify(|c| *c += n);
                if s.write_all(b"ok").await.is_err() {
                    break;
                }
            }
        });
        (addr, seen)
    }

    async fn roundtrip(s: &mut TcpStream, wait: Duration) -> std::io::Result<Vec<u8>> {
        s.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        let n = tokio::time::timeout(wait, s.read(&mut buf))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer"))??;
        Ok(buf[..n].to_vec())
    }

    #[tokio::test]
    async fn passes_cuts_blackholes_and_restores() {
        let proxy = FaultProxy::start(echo_server().await).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        let wait = Duration::from_millis(300);
        assert_eq!(roundtrip(&mut s, wait).await.unwrap(), b"ping");

        proxy.blackhole();
        assert_eq!(roundtrip(&mut s, wait).await.unwrap_err().kind(), std::io::ErrorKind::TimedOut);

        // Nothing was lost: the stalled bytes arrive once the blackhole lifts.
        proxy.restore();
        let mut late = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut late)).await.unwrap().unwrap();
        assert_eq!(&late, b"ping");

        proxy.cut();
        // A cut closes the connection: the read ends with 0 bytes or an error.
        assert!(roundtrip(&mut s, wait).await.map(|v| v.is_empty()).unwrap_or(true));

        proxy.restore();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut s, wait).await.unwrap(), b"ping");
    }

    #[tokio::test]
    async fn dropped_replies_leave_requests_applied() {
        let (server, mut received) = counting_server().await;
        let proxy = FaultProxy::start(server).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        let wait = Duration::from_millis(300);
        assert_eq!(roundtrip(&mut s, wait).await.unwrap(), b"ok");

        proxy.set_fault(Fault::DropReplies);
        assert_eq!(roundtrip(&mut s, wait).await.unwrap_err().kind(), std::io::ErrorKind::TimedOut);
        // The request reached the server although its reply never came.
        tokio::time::timeout(Duration::from_secs(5), received.wait_for(|n| *n == 8)).await.unwrap().unwrap();

        // The stream lost bytes: when the drop ends, the connection closes rather than
        // hand the next request an answer that is not its own.
        proxy.restore();
        assert!(roundtrip(&mut s, wait).await.map(|v| v.is_empty()).unwrap_or(true));
    }

    #[tokio::test]
    async fn one_way_blackholes_hold_one_direction() {
        let (server, mut received) = counting_server().await;
        let proxy = FaultProxy::start(server).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        let wait = Duration::from_millis(300);

        // Requests held: the server sees nothing until the fault lifts.
        proxy.set_fault(Fault::BlackholeRequests);
        assert_eq!(roundtrip(&mut s, wait).await.unwrap_err().kind(), std::io::ErrorKind::TimedOut);
        assert_eq!(*received.borrow(), 0);
        proxy.restore();
        let mut late = [0u8; 2];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut late)).await.unwrap().unwrap();
        assert_eq!(*received.borrow_and_update(), 4);

        // Replies held: the server sees the request, the client waits for the answer.
        proxy.set_fault(Fault::BlackholeReplies);
        assert_eq!(roundtrip(&mut s, wait).await.unwrap_err().kind(), std::io::ErrorKind::TimedOut);
        tokio::time::timeout(Duration::from_secs(5), received.wait_for(|n| *n == 8)).await.unwrap().unwrap();
        proxy.restore();
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut late)).await.unwrap().unwrap();
        assert_eq!(&late, b"ok");
    }

    #[tokio::test]
    async fn delayed_replies_arrive_late_and_in_order() {
        let proxy = FaultProxy::start(echo_server().await).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        let delay = Duration::from_millis(300);
        proxy.set_fault(Fault::DelayReplies(delay));
        let started = Instant::now();
        // Ten requests in quick succession: each reply is late by the delay, not by the
        // sum of the delays (which would be 3 s).
        for i in 0..10u8 {
            s.write_all(&[b'0' + i]).await.unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut got = [0u8; 10];
        tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut got)).await.unwrap().unwrap();
        let took = started.elapsed();
        assert_eq!(&got, b"0123456789");
        assert!(took >= delay, "replies came after {took:?}, before the delay of {delay:?}");
        assert!(took < delay * 8, "the delays added up: {took:?}");
    }
}
