//! [`SqlLink`]: a switch between one client and its database, for fault-injection tests.
//!
//! A networked database is hurt with a TCP proxy; an embedded SQLite file has no network
//! to hurt. The link plays the same [`Fault`]s at the client's edge, honestly for what the
//! client sees, with the semantics of the in-process reference backend
//! ([`dlock_core::memory`]):
//!
//! - a statement whose request got through runs to its end even if its caller gave up
//!   meanwhile, and its reply comes back only as the fault lets it (held back, delayed,
//!   or thrown away while the caller waits on);
//! - statements held back by a fault reach the database in the order they were sent, as
//!   over one connection, when the fault lifts;
//! - `cut` also closes every pooled connection (releasing the file locks they held) and
//!   fails every call with `Unavailable` at once, as a refused connection does; the next
//!   call after `restore` opens a fresh pool.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::backend::lock_unpoisoned;
use dlock_core::memory::Fault;
use dlock_core::LockError;
use tokio::sync::{oneshot, watch};

use crate::config::SqlConfig;
use crate::db::{Answer, Args, Pool, Warm};
use crate::dialect::Stmt;

/// The shared state of a client's connection: its pool and the fault it plays.
#[derive(Debug)]
pub(crate) struct Conn {
    config: SqlConfig,
    pool: Mutex<Option<Pool>>,
    /// What a fresh pool's connections prepare.
    warm: Warm,
    wire: Wire,
}

/// The fault, and the order of the statements held back by it.
#[derive(Debug)]
struct Wire {
    fault: watch::Sender<Fault>,
    /// Statements sent while a fault was (or statements were) held back, not yet through.
    held: AtomicU64,
    /// The sequence number the next such statement gets.
    next: AtomicU64,
    /// The sequence number of the statement allowed through next.
    through: watch::Sender<u64>,
}

/// Lets the next held statement through when the current one is done with, whatever path
/// it took.
struct Turn<'a>(&'a Wire);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.0.through.send_modify(|n| *n += 1);
        self.0.held.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Request,
    Reply,
}

impl Conn {
    pub(crate) fn new(config: SqlConfig, pool: Pool, warm: Warm) -> Arc<Self> {
        let wire = Wire {
            fault: watch::channel(Fault::None).0,
            held: AtomicU64::new(0),
            next: AtomicU64::new(0),
            through: watch::channel(0).0,
        };
        Arc::new(Conn { config, pool: Mutex::new(Some(pool)), warm, wire })
    }

    pub(crate) fn config(&self) -> &SqlConfig {
        &self.config
    }

    /// The pool, for work that does not go through [`Conn::run`] (a subscription, a
    /// dedicated session): waits while requests are held back, `Unavailable` while cut.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) async fn pool(&self) -> Result<Pool, LockError> {
        let mut fault = self.wire.fault.subscribe();
        match pass(&mut fault, Direction::Request).await {
            // Even a zero sleep waits for the timer's next tick (about a millisecond),
            // which every blocking PostgreSQL acquire would pay.
            Some(delay) if !delay.is_zero() => tokio::time::sleep(delay).await,
            Some(_) => {}
            None => return Err(self.cut_error()),
        }
        self.current_pool()
    }

    fn current_pool(&self) -> Result<Pool, LockError> {
        let mut slot = lock_unpoisoned(&self.pool);
        match &*slot {
            Some(pool) => Ok(pool.clone()),
            None => {
                let pool = Pool::connect_lazy(&self.config, self.config.pool_size, &self.warm)?;
                *slot = Some(pool.clone());
                Ok(pool)
            }
        }
    }

    fn cut_error(&self) -> LockError {
        LockError::unavailable(format!("the link to {} is cut", self.config.dialect.name()))
    }

    /// Runs one statement over the link (see the module docs).
    pub(crate) async fn run(self: &Arc<Self>, stmt: &Stmt, args: Args<'_>) -> Result<Answer, LockError> {
        let (stmt, args) = (stmt.clone(), args.to_owned());
        self.call(move |pool| async move { pool.run(&stmt, args.args()).await }).await
    }

    /// Sends one request: `op` runs on the pool when the request gets through (even if the
    /// caller has gone by then), and its answer comes back as the link lets it.
    async fn call<T, F, Fut>(self: &Arc<Self>, op: F) -> Result<T, LockError>
    where
        T: Send + 'static,
        F: FnOnce(Pool) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, LockError>> + Send + 'static,
    {
        let wire = &self.wire;
        if *wire.fault.borrow() == Fault::None && wire.held.load(Ordering::SeqCst) == 0 {
            return op(self.current_pool()?).await;
        }
        wire.held.fetch_add(1, Ordering::SeqCst);
        let turn = wire.next.fetch_add(1, Ordering::SeqCst);
        let (reply, answer) = oneshot::channel();
        let this = self.clone();
        tokio::spawn(async move {
            let wire = &this.wire;
            let mut fault = wire.fault.subscribe();
            let mut through = wire.through.subscribe();
            // Held or delayed requests wait side by side, then reach the database in order.
            let passage = pass(&mut fault, Direction::Request).await;
            if let Some(delay) = passage {
                tokio::time::sleep(delay).await;
            }
            let _ = through.wait_for(|n| *n == turn).await;
            let ours = Turn(wire);
            if passage.is_none() {
                let _ = reply.send(Err(this.cut_error()));
                return;
            }
            let outcome = match this.current_pool() {
                Ok(pool) => op(pool).await,
                Err(err) => Err(err),
            };
            drop(ours);
            match pass(&mut fault, Direction::Reply).await {
                Some(delay) => {
                    tokio::time::sleep(delay).await;
                    let _ = reply.send(outcome);
                }
                None if *fault.borrow() == Fault::DropReplies => {
                    // Thrown away with the connection still open: the caller waits on (an
                    // answer that never comes) until it gives up.
                    let _ = fault.changed().await;
                    drop(reply);
                }
                None => {
                    let _ = reply.send(Err(LockError::unavailable(format!(
                        "the link to {} was cut before the reply",
                        this.config.dialect.name()
                    ))));
                }
            }
        });
        match answer.await {
            Ok(outcome) => outcome,
            Err(_) => std::future::pending().await,
        }
    }
}

/// Waits until `direction` may pass: `Some(delay)` when it passes after that delay, `None`
/// when it never will (cut, or replies dropped).
async fn pass(fault: &mut watch::Receiver<Fault>, direction: Direction) -> Option<Duration> {
    loop {
        let current = *fault.borrow_and_update();
        let held = match (current, direction) {
            (Fault::None, _) => return Some(Duration::ZERO),
            (Fault::Cut, _) => return None,
            (Fault::Blackhole, _) => true,
            (Fault::BlackholeRequests, Direction::Request) | (Fault::BlackholeReplies, Direction::Reply) => true,
            (Fault::BlackholeRequests | Fault::BlackholeReplies, _) => false,
            (Fault::DropReplies, Direction::Request) => false,
            (Fault::DropReplies, Direction::Reply) => return None,
            (Fault::DelayReplies(d), Direction::Reply) | (Fault::Delay(d), _) => return Some(d),
            (Fault::DelayReplies(_), Direction::Request) => false,
            // A fault this link does not know yet holds everything back, as a blackhole.
            _ => true,
        };
        if !held {
            return Some(Duration::ZERO);
        }
        if fault.changed().await.is_err() {
            return None;
        }
    }
}

/// The fault switch of one client (see the module docs). Obtained from
/// [`SqlBackend::link`](crate::SqlBackend::link).
///
/// ```no_run
/// use dlock_core::memory::Fault;
///
/// # async fn demo(locker: dlock_sql::SqlLocker) {
/// let link = locker.backend().link();
/// link.set(Fault::DropReplies); // statements are applied, their replies lost
/// link.restore();
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct SqlLink {
    conn: Arc<Conn>,
}

impl SqlLink {
    pub(crate) fn new(conn: Arc<Conn>) -> Self {
        SqlLink { conn }
    }

    /// Plays `fault` from now on, for calls under way too. [`Fault::Cut`] also closes the
    /// client's pooled connections.
    pub fn set(&self, fault: Fault) {
        self.conn.wire.fault.send_replace(fault);
        if fault == Fault::Cut {
            let pool = lock_unpoisoned(&self.conn.pool).take();
            if let Some(pool) = pool {
                // Closing waits for connections in use; do not block the caller on it.
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(async move { pool.close().await });
                }
            }
        }
    }

    /// Closes the client's connections and fails every call with `Unavailable`.
    pub fn cut(&self) {
        self.set(Fault::Cut);
    }

    /// Makes every call stall until the link is restored or cut.
    pub fn blackhole(&self) {
        self.set(Fault::Blackhole);
    }

    /// Lets calls through again (with a fresh pool after a cut).
    pub fn restore(&self) {
        self.set(Fault::None);
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::Conn;
    use crate::config::SqlConfig;
    use crate::db::{Pool, Warm};

    /// A zero sleep is not ready at once (it waits for the timer's next tick, about a
    /// millisecond): a healthy link hands out its pool without one.
    #[tokio::test]
    async fn a_healthy_link_hands_out_its_pool_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let config = SqlConfig::from_url(&format!("sqlite://{}", dir.path().join("locks.db").display())).unwrap();
        let warm = Warm::default();
        let pool = Pool::connect_lazy(&config, 1, &warm).unwrap();
        let conn = Conn::new(config, pool, warm);
        let pool = futures::FutureExt::now_or_never(conn.pool());
        assert!(pool.is_some_and(|p| p.is_ok()), "the pool was not ready on the first poll");
    }
}
