//! An uncontended acquire+release costs exactly 2 statements, on pooled connections (no
//! new connection per lock), and storing or loading a result 1 each, counted on the wire by a relay that reads the client's side
//! of the protocol: PostgreSQL `Execute`/`Query` messages, MySQL `COM_STMT_EXECUTE`/
//! `COM_QUERY` commands. Pool health pings are not statements and are not counted.

// The shared fixtures start every kind of server; the tests need every database feature.
#![cfg(all(feature = "postgres", feature = "mysql", feature = "sqlite"))]

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{Kind, SqlFixture};
use dlock_core::{LockName, LockOptions, Locker};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    statements: AtomicU64,
}

/// Splits the client's byte stream into protocol messages and counts the statements.
struct Framer {
    db: Kind,
    buf: Vec<u8>,
    /// PostgreSQL: the startup messages have no type byte.
    started: bool,
}

impl Framer {
    fn feed(&mut self, bytes: &[u8], counters: &Counters) {
        self.buf.extend_from_slice(bytes);
        loop {
            let used = match self.db {
                Kind::Postgres => self.postgres(counters),
                _ => self.mysql(counters),
            };
            match used {
                Some(n) => {
                    self.buf.drain(..n);
                }
                None => return,
            }
        }
    }

    fn postgres(&mut self, counters: &Counters) -> Option<usize> {
        if !self.started {
            let len = u32::from_be_bytes(self.buf.get(..4)?.try_into().unwrap()) as usize;
            let code = u32::from_be_bytes(self.buf.get(4..8)?.try_into().unwrap());
            if self.buf.len() < len {
                return None;
            }
            // SSLRequest and GSSENCRequest precede the real startup message.
            if code != 80877103 && code != 80877104 {
                self.started = true;
            }
            return Some(len);
        }
        let kind = *self.buf.first()?;
        let len = u32::from_be_bytes(self.buf.get(1..5)?.try_into().unwrap()) as usize;
        if self.buf.len() < 1 + len {
            return None;
        }
        if kind == b'E' {
            counters.statements.fetch_add(1, Ordering::SeqCst);
        }
        Some(1 + len)
    }

    fn mysql(&mut self, counters: &Counters) -> Option<usize> {
        let header = self.buf.get(..4)?;
        let len = usize::from(header[0]) | usize::from(header[1]) << 8 | usize::from(header[2]) << 16;
        let seq = header[3];
        if self.buf.len() < 4 + len {
            return None;
        }
        // A command starts a new sequence; handshake and auth packets have seq > 0.
        if seq == 0 && self.buf.get(4) == Some(&0x17) {
            counters.statements.fetch_add(1, Ordering::SeqCst);
        }
        Some(4 + len)
    }
}

async fn counting_relay(db: Kind, target: SocketAddr) -> (SocketAddr, Arc<Counters>) {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counters = Arc::new(Counters::default());
    let shared = counters.clone();
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else { return };
            shared.connections.fetch_add(1, Ordering::SeqCst);
            let counters = shared.clone();
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(target).await else { return };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let upstream = async {
                    let mut framer = Framer { db, buf: Vec::new(), started: false };
                    let mut buf = vec![0u8; 16 * 1024];
                    loop {
                        let n = match cr.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        framer.feed(&buf[..n], &counters);
                        if sw.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                };
                tokio::select! {
                    _ = upstream => {}
                    _ = tokio::io::copy(&mut sr, &mut cw) => {}
                }
            });
        }
    });
    (addr, counters)
}

const POOL_SIZE: u32 = 4;

/// A lease client whose statements are counted, and its counters.
async fn counted_client(fixture: &SqlFixture, db: Kind) -> (dlock_sql::SqlLocker, Arc<Counters>) {
    let (url, _link) = fixture.proxied_url().await;
    // The fault proxy forwards to the server; the counting relay sits in front of it.
    let proxy_addr: SocketAddr = url.split('@').nth(1).unwrap().split('/').next().unwrap().parse().unwrap();
    let (relay, counters) = counting_relay(db, proxy_addr).await;
    let url = url.replacen(&proxy_addr.to_string(), &relay.to_string(), 1);
    let locker = dlock_sql::connect(common::config(&url).with_pool_size(POOL_SIZE)).await.expect("connect");
    (locker, counters)
}

async fn two_statements(db: Kind) {
    let fixture = SqlFixture::new(db).await;
    let (locker, counters) = counted_client(&fixture, db).await;
    let name = LockName::new("statements/uncontended").unwrap();
    let opts = LockOptions::watchdog(Duration::from_secs(30)).wait(Duration::from_secs(5));
    for _ in 0..20 {
        locker.acquire(&name, &opts).await.expect("acquire").release().await.expect("release");
    }
    const ROUNDS: u64 = 100;
    let statements = counters.statements.load(Ordering::SeqCst);
    for _ in 0..ROUNDS {
        locker.acquire(&name, &opts).await.expect("acquire").release().await.expect("release");
    }
    assert_eq!(counters.statements.load(Ordering::SeqCst) - statements, 2 * ROUNDS, "statements per acquire+release");
    // Connections come from the pool: it grows to its size while a connection is busy with
    // its health ping, and replaces one that fails it, but never opens one per lock.
    let opened = counters.connections.load(Ordering::SeqCst);
    assert!(opened <= 2 * u64::from(POOL_SIZE), "{opened} connections opened for {} locks", ROUNDS + 20);
}

/// Storing a result and loading it are one statement each.
async fn one_statement_per_result_call(db: Kind) {
    let fixture = SqlFixture::new(db).await;
    let (locker, counters) = counted_client(&fixture, db).await;
    let name = LockName::new("statements/results").unwrap();
    let opts = LockOptions::watchdog(Duration::from_secs(30)).wait(Duration::from_secs(5));
    let round = || async {
        let lease = locker.acquire(&name, &opts).await.expect("acquire");
        lease.store_result(b"done", Duration::from_secs(60)).await.expect("store");
        lease.release().await.expect("release");
        locker.load_result(&name).await.expect("load").expect("stored");
    };
    for _ in 0..10 {
        round().await;
    }
    // The client's first store also sweeps expired results, in the background: wait for
    // the wire to go quiet.
    let mut seen = counters.statements.load(Ordering::SeqCst);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = counters.statements.load(Ordering::SeqCst);
        if now == seen {
            break;
        }
        seen = now;
    }
    const ROUNDS: u64 = 50;
    for _ in 0..ROUNDS {
        round().await;
    }
    let statements = counters.statements.load(Ordering::SeqCst) - seen;
    assert_eq!(statements, 4 * ROUNDS, "statements per acquire+store+release+load");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_acquire_release_is_two_statements() {
    two_statements(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_acquire_release_is_two_statements() {
    two_statements(Kind::MariaDb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_and_load_are_one_statement_each() {
    one_statement_per_result_call(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_store_and_load_are_one_statement_each() {
    one_statement_per_result_call(Kind::MariaDb).await;
}
