//! [`SqlLink`]: a switch between one client and its database, for fault-injection tests.
//!
//! A networked database is cut off with a TCP proxy; an embedded SQLite file has no
//! network to cut. The link plays the same faults at the client's edge, honestly for what
//! the client sees: `cut` closes every pooled connection (releasing the file locks they
//! held) and makes every call fail with `Unavailable` at once, as a refused connection
//! does; `blackhole` makes every call stall (bounded only by the client's operation
//! timeout), as a frozen host does; `restore` opens a fresh pool.

use std::sync::{Arc, Mutex};

use dlock_core::LockError;
use tokio::sync::watch;

use crate::config::SqlConfig;
use crate::db::Pool;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Up,
    Cut,
    Blackhole,
}

/// The shared state of a client's connection: its pool and the fault switch.
#[derive(Debug)]
pub(crate) struct Conn {
    config: SqlConfig,
    pool: Mutex<Option<Pool>>,
    state: watch::Sender<State>,
}

impl Conn {
    pub(crate) fn new(config: SqlConfig, pool: Pool) -> Arc<Self> {
        Arc::new(Conn { config, pool: Mutex::new(Some(pool)), state: watch::channel(State::Up).0 })
    }

    /// The pool to use now, after waiting out a blackhole; `Unavailable` while cut.
    pub(crate) async fn pool(&self) -> Result<Pool, LockError> {
        let mut rx = self.state.subscribe();
        let state = *rx.wait_for(|s| *s != State::Blackhole).await.map_err(|_| closed())?;
        if state == State::Cut {
            return Err(LockError::unavailable(format!("the link to {} is cut", self.config.dialect.name())));
        }
        let mut slot = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        match &*slot {
            Some(pool) => Ok(pool.clone()),
            None => {
                let pool = Pool::connect_lazy(&self.config, self.config.pool_size)?;
                *slot = Some(pool.clone());
                Ok(pool)
            }
        }
    }

    pub(crate) fn config(&self) -> &SqlConfig {
        &self.config
    }
}

fn closed() -> LockError {
    LockError::unavailable("the client is closed")
}

/// The fault switch of one client (see the module docs). Obtained from
/// [`SqlBackend::link`](crate::SqlBackend::link).
#[derive(Debug, Clone)]
pub struct SqlLink {
    conn: Arc<Conn>,
}

impl SqlLink {
    pub(crate) fn new(conn: Arc<Conn>) -> Self {
        SqlLink { conn }
    }

    /// Closes the client's connections and fails every call with `Unavailable`.
    pub fn cut(&self) {
        self.conn.state.send_replace(State::Cut);
        let pool = self.conn.pool.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(pool) = pool {
            // Closing waits for connections in use; do not block the caller on it.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move { pool.close().await });
            }
        }
    }

    /// Makes every call stall until the link is restored or cut.
    pub fn blackhole(&self) {
        self.conn.state.send_replace(State::Blackhole);
    }

    /// Lets calls through again (with a fresh pool after a cut).
    pub fn restore(&self) {
        self.conn.state.send_replace(State::Up);
    }
}
