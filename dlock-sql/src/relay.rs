//! A loopback relay in front of one dedicated database connection, so that the client
//! learns at once when the server side closes it.
//!
//! A session-held advisory lock lives exactly as long as its connection, and the server
//! frees it the moment it sees the connection close. sqlx gives no way to watch an idle
//! connection, so the backend sends each holding connection through this relay: the relay
//! forwards bytes both ways and reports when the server's side ends (a kill, a restart, a
//! network cut, `pg_terminate_backend`, `KILL`), which fires the holder's lost signal.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A relay for one connection.
#[derive(Debug)]
pub(crate) struct Relay {
    /// Where the database client connects.
    pub(crate) addr: SocketAddr,
    /// Becomes `true` when the server's side of the connection has ended.
    pub(crate) closed: watch::Receiver<bool>,
}

/// Connects to `host:port` (within `timeout`) and starts relaying the first connection
/// made to the returned address.
pub(crate) async fn start(host: &str, port: u16, timeout: Duration) -> std::io::Result<Relay> {
    let timed_out = || std::io::Error::new(std::io::ErrorKind::TimedOut, "connecting to the database timed out");
    let server = tokio::time::timeout(timeout, TcpStream::connect((host, port))).await.map_err(|_| timed_out())??;
    server.set_nodelay(true)?;
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let (tx, closed) = watch::channel(false);
    tokio::spawn(async move {
        let accepted = tokio::time::timeout(timeout, listener.accept()).await;
        drop(listener);
        let Ok(Ok((client, _))) = accepted else {
            let _ = tx.send(true);
            return;
        };
        let _ = client.set_nodelay(true);
        let (mut client_read, mut client_write) = client.into_split();
        let (mut server_read, mut server_write) = server.into_split();
        tokio::select! {
            // The server's side ended: say so first, then close the client's side.
            _ = tokio::io::copy(&mut server_read, &mut client_write) => {}
            // The client closed the connection (released and dropped).
            _ = tokio::io::copy(&mut client_read, &mut server_write) => {}
        }
        let _ = tx.send(true);
    });
    Ok(Relay { addr, closed })
}
