//! [`SqlLink`]: a switch between one client and its database, for fault-injection tests.
//!
//! A networked database is hurt with a TCP proxy; an embedded SQLite file has no network
//! to hurt. The link plays the same [`Fault`]s at the client's edge, honestly for what the
//! client sees, with the semantics of the in-process reference backend
//! ([`dlock_core::memory`]), over the same [`Wire`]:
//!
//! - a statement whose request got through runs to its end even if its caller gave up
//!   meanwhile, and its reply comes back only as the fault lets it (held back, delayed,
//!   or thrown away while the caller waits on);
//! - statements held back by a fault reach the database in the order they were sent, as
//!   over one connection, when the fault lifts;
//! - `cut` also closes every pooled connection (releasing the file locks they held) and
//!   fails every call with `Unavailable` at once, as a refused connection does; the next
//!   call after `restore` opens a fresh pool.
//!
//! [`Fault`]: dlock_core::wire::Fault

use std::sync::{Arc, Mutex};

use dlock_core::backend::lock_unpoisoned;
use dlock_core::wire::{Switch, Wire};
use dlock_core::LockError;
use futures::future::BoxFuture;

use crate::config::SqlConfig;
use crate::db::{Answer, Args, Pool, Tx, Warm};
use crate::dialect::Stmt;

/// The shared state of a client's connection: its pool and the fault it plays.
#[derive(Debug)]
pub(crate) struct Conn {
    config: SqlConfig,
    /// Shared with the wire, which empties it when the link is cut.
    pool: Arc<Mutex<Option<Pool>>>,
    /// What a fresh pool's connections prepare.
    warm: Warm,
    wire: Wire,
}

impl Conn {
    pub(crate) fn new(config: SqlConfig, pool: Pool, warm: Warm) -> Arc<Self> {
        let pool = Arc::new(Mutex::new(Some(pool)));
        let slot = pool.clone();
        // The application's own pool is the application's to close.
        let own = !matches!(config.target, crate::config::Target::Given(_));
        let wire = Wire::with_cut_hook(format!("the link to {}", config.dialect.name()), move || {
            let pool = lock_unpoisoned(&slot).take();
            if let Some(pool) = pool.filter(|_| own) {
                // Closing waits for connections in use; do not block the caller on it.
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(async move { pool.close().await });
                }
            }
        });
        Arc::new(Conn { config, pool, warm, wire })
    }

    /// The fault switch on this connection (see [`SqlLink`]).
    pub(crate) fn link(&self) -> SqlLink {
        self.wire.switch()
    }

    pub(crate) fn config(&self) -> &SqlConfig {
        &self.config
    }

    /// The pool, for work that does not go through [`Conn::run`] (a subscription, a
    /// dedicated session): waits while requests are held back, `Unavailable` while cut.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) async fn pool(&self) -> Result<Pool, LockError> {
        self.wire.admit().await?;
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

    /// Runs one statement over the link (see the module docs).
    pub(crate) async fn run(self: &Arc<Self>, stmt: &Stmt, args: Args<'_>) -> Result<Answer, LockError> {
        let (stmt, args, this) = (stmt.clone(), args.to_owned(), self.clone());
        // The pool is looked up when the statement gets through: a cut may have closed
        // the one there was when it was sent.
        self.wire
            .carry(move || async move {
                let pool = this.current_pool()?;
                pool.run(&stmt, args.args()).await
            })
            .await
    }

    /// Runs `body` in one transaction over the link (see [`Pool::transact`]): as one
    /// statement is, the whole transaction is one request that is applied or not.
    pub(crate) async fn transact<T, F>(self: &Arc<Self>, body: F) -> Result<T, LockError>
    where
        T: Send + 'static,
        F: Fn(&mut Tx) -> BoxFuture<'_, Result<T, LockError>> + Send + Sync + 'static,
    {
        let this = self.clone();
        self.wire
            .carry(move || async move {
                let pool = this.current_pool()?;
                pool.transact(&body).await
            })
            .await
    }
}

/// The fault switch of one client (see the module docs). Obtained from
/// [`SqlBackend::link`](crate::SqlBackend::link). A cut also closes the client's pooled
/// connections; the first call after `restore` opens a fresh pool.
///
/// ```no_run
/// use dlock_core::wire::Fault;
///
/// # async fn demo(locker: dlock_sql::SqlLocker) {
/// let link = locker.backend().link();
/// link.set(Fault::DropReplies); // statements are applied, their replies lost
/// link.restore();
/// # }
/// ```
pub type SqlLink = Switch;

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
