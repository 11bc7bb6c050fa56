//! Mutants: deliberate defects a run plants in a backend or in its own clients, so that
//! a test can show the verdict catches each one. A harness that only ever reports zeros
//! proves nothing until it has reported something else.
//!
//! Server-side mutants are played by the run ([`crate::plan::Act::Mutate`]); client-side
//! ones by each client, through [`Watched`], a wrapper around the backend that also
//! counts the renewals every run reports.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock::{Capabilities, FencingToken, LockError, LockInfo, LockName, Locker, StoredResult};
use dlock_core::backend::{Attempt, Backend, Client, LostSignal, Release, Renewal, Request};
use dlock_core::Swept;
use tokio::time::Instant;

/// The defects `--mutant` can plant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Mutant {
    /// The server forgets a live hold (the lock's record is deleted, or its lease
    /// revoked) while the holder still believes it holds.
    Evict,
    /// The fence counter is set back to 1 (deleting it is not enough: every backend
    /// that keeps a counter restarts a missing one above every token it gave).
    FenceReset,
    /// Renewals do nothing and report success.
    NeverRenews,
    /// Clients write without checking that their lease is still valid.
    NoSelfCheck,
    /// The server expires holds at half their ttl, with no clock fault declared.
    HalfTtl,
    /// Clients write once more an eighth of a ttl after each release, with the released
    /// token and no validity claimed, and hold back each hold's first write for a quarter
    /// ttl: a late write then reaches the register after the next grant and before the
    /// next holder's first write, where fencing cannot refuse it.
    LateWrite,
}

impl fmt::Display for Mutant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Mutant::Evict => "evict",
            Mutant::FenceReset => "fence-reset",
            Mutant::NeverRenews => "never-renews",
            Mutant::NoSelfCheck => "no-self-check",
            Mutant::HalfTtl => "half-ttl",
            Mutant::LateWrite => "late-write",
        };
        f.write_str(name)
    }
}

/// A backend whose renewals are counted, and dropped when the mutant says so.
pub(crate) struct Watched<B> {
    inner: B,
    renewals: Arc<AtomicU64>,
    never_renews: bool,
}

impl<B: Backend> Watched<B> {
    /// Rebuilds `client` around its backend, wrapped.
    fn wrap(client: Client<B>, renewals: Arc<AtomicU64>, never_renews: bool) -> Result<Arc<dyn Locker>, LockError> {
        let (inner, config) =
            client.into_backend().map_err(|_| LockError::InvalidInput("a fresh client has no other handle".into()))?;
        Ok(Arc::new(Client::with_config(Watched { inner, renewals, never_renews }, config)))
    }
}

/// Connects to `url` with the renewals of every lease counted in `renewals`, and made
/// no-ops when `never_renews`.
pub(crate) async fn connect(
    url: &str,
    renewals: Arc<AtomicU64>,
    never_renews: bool,
) -> Result<Arc<dyn Locker>, LockError> {
    use dlock::{etcd, redis, sql, zk};
    match dlock::driver(url)?.name() {
        "sqlite" | "postgres" | "mysql" => {
            let config = sql::SqlConfig::from_url(url)?;
            match config.lock_kind() {
                sql::LockKind::Lease => Watched::wrap(sql::connect(config).await?, renewals, never_renews),
                sql::LockKind::Advisory => Watched::wrap(sql::connect_advisory(config).await?, renewals, never_renews),
            }
        }
        "redis" => Watched::wrap(redis::connect(redis::RedisConfig::from_url(url)?).await?, renewals, never_renews),
        "redlock" => {
            let config = redis::RedLockConfig::from_url(url)?;
            Watched::wrap(redis::redlock::connect(config).await?, renewals, never_renews)
        }
        "zookeeper" => Watched::wrap(zk::connect(zk::ZkConfig::from_url(url)?).await?, renewals, never_renews),
        "etcd" => Watched::wrap(etcd::connect(etcd::EtcdConfig::from_url(url)?).await?, renewals, never_renews),
        other => Err(LockError::InvalidInput(format!("the nemesis has no client for the {other} backend"))),
    }
}

#[async_trait]
impl<B: Backend> Backend for Watched<B> {
    type Hold = B::Hold;
    type Ticket = B::Ticket;

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn grants_in_request_order(&self, req: &Request) -> bool {
        self.inner.grants_in_request_order(req)
    }

    async fn attempt(
        &self,
        req: &Request,
        ticket: &mut Option<Self::Ticket>,
    ) -> Result<Attempt<Self::Hold>, LockError> {
        self.inner.attempt(req, ticket).await
    }

    async fn wait(&self, req: &Request, ticket: &mut Option<Self::Ticket>, until: Instant) -> Result<(), LockError> {
        self.inner.wait(req, ticket, until).await
    }

    async fn abandon(&self, req: &Request, ticket: Self::Ticket) {
        self.inner.abandon(req, ticket).await;
    }

    async fn give_back(&self, req: &Request, ticket: Option<Self::Ticket>) {
        self.inner.give_back(req, ticket).await;
    }

    async fn renew(&self, hold: &Self::Hold, ttl: Duration) -> Result<Renewal, LockError> {
        self.renewals.fetch_add(1, Ordering::Relaxed);
        if self.never_renews {
            return Ok(Renewal::Renewed);
        }
        self.inner.renew(hold, ttl).await
    }

    async fn renew_many(&self, holds: &[&Self::Hold], ttl: Duration) -> Vec<Result<Renewal, LockError>> {
        self.renewals.fetch_add(holds.len() as u64, Ordering::Relaxed);
        if self.never_renews {
            return holds.iter().map(|_| Ok(Renewal::Renewed)).collect();
        }
        self.inner.renew_many(holds, ttl).await
    }

    async fn release(&self, hold: &Self::Hold) -> Result<Release, LockError> {
        self.inner.release(hold).await
    }

    async fn inspect(&self, name: &LockName) -> Result<LockInfo, LockError> {
        self.inner.inspect(name).await
    }

    async fn store_result(
        &self,
        hold: &Self::Hold,
        token: FencingToken,
        value: &[u8],
        retention: Duration,
    ) -> Result<(), LockError> {
        self.inner.store_result(hold, token, value, retention).await
    }

    async fn load_result(&self, name: &LockName) -> Result<Option<StoredResult>, LockError> {
        self.inner.load_result(name).await
    }

    fn clock_drift(&self, ttl: Duration) -> Duration {
        self.inner.clock_drift(ttl)
    }

    fn effective_ttl(&self, hold: &Self::Hold, requested: Duration) -> Duration {
        self.inner.effective_ttl(hold, requested)
    }

    fn granted_since(&self, hold: &Self::Hold) -> Option<Instant> {
        self.inner.granted_since(hold)
    }

    async fn sweep(&self) -> Result<Swept, LockError> {
        self.inner.sweep().await
    }

    fn target(&self) -> String {
        self.inner.target()
    }

    fn watch_hold(&self, hold: &Self::Hold, signal: LostSignal) {
        self.inner.watch_hold(hold, signal);
    }
}
