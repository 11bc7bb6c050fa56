//! [`EtcdBackend`]: the handle of the etcd backend, and the [`Backend`] trait over the
//! lock recipe of [`lock`](crate::lock).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{Attempt, Backend, LostSignal, Release, Renewal, Request};
use dlock_core::{Capabilities, ConnectConfig, FencingToken, LockError, LockInfo, LockName, StoredResult};
use etcd_client::Client;

use crate::cluster::Cluster;
use crate::config::EtcdConfig;
use crate::lock::{EtcdTicket, Shared};
use crate::registry::EtcdHold;

/// The etcd backend of one client: its connection, sessions and held keys. Build one with
/// [`connect`](crate::connect), which wraps it in a [`Client`](dlock_core::Client).
pub struct EtcdBackend {
    pub(crate) shared: Arc<Shared>,
    /// The endpoints and key prefix, as [`Backend::target`] shows them.
    target: String,
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend").finish_non_exhaustive()
    }
}

impl EtcdBackend {
    pub(crate) fn new(cluster: Cluster, config: &EtcdConfig) -> Self {
        let shared = Shared::new(cluster, config.prefix().to_string(), config.op_timeout());
        EtcdBackend { shared, target: target(config) }
    }

    /// The etcd client of the member this backend talks to now, for users who keep their
    /// own data in etcd (see [`EtcdBackend::guarded_txn`]).
    pub async fn etcd(&self) -> Result<Client, LockError> {
        self.shared.cluster.pinned_client().await
    }

    /// The key prefix under which the locks live.
    pub fn prefix(&self) -> &str {
        &self.shared.prefix
    }
}

#[async_trait]
impl Backend for EtcdBackend {
    type Hold = EtcdHold;
    type Ticket = EtcdTicket;

    fn name(&self) -> &'static str {
        "etcd"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }

    /// Every waiter has a key in the name's queue, ordered by create revision, whichever client it came from.
    fn grants_in_request_order(&self, _req: &Request) -> bool {
        true
    }

    fn target(&self) -> String {
        self.target.clone()
    }

    async fn attempt(&self, req: &Request, ticket: &mut Option<EtcdTicket>) -> Result<Attempt<EtcdHold>, LockError> {
        self.shared.attempt(req, ticket).await
    }

    async fn wait(
        &self,
        _req: &Request,
        ticket: &mut Option<EtcdTicket>,
        until: tokio::time::Instant,
    ) -> Result<(), LockError> {
        self.shared.wait(ticket, until).await
    }

    async fn abandon(&self, req: &Request, ticket: EtcdTicket) {
        self.shared.abandon(req, ticket).await;
    }

    async fn give_back(&self, req: &Request, ticket: Option<EtcdTicket>) {
        if let Some(ticket) = ticket {
            self.shared.give_back(req, ticket).await;
        }
    }

    async fn renew(&self, hold: &EtcdHold, ttl: Duration) -> Result<Renewal, LockError> {
        let mut answers = self.shared.renew_many(&[hold], ttl).await;
        answers.pop().unwrap_or_else(|| Err(LockError::unavailable("etcd: a renewal went unanswered")))
    }

    async fn renew_many(&self, holds: &[&EtcdHold], ttl: Duration) -> Vec<Result<Renewal, LockError>> {
        self.shared.renew_many(holds, ttl).await
    }

    async fn release(&self, hold: &EtcdHold) -> Result<Release, LockError> {
        self.shared.release(hold).await
    }

    async fn inspect(&self, name: &LockName) -> Result<LockInfo, LockError> {
        self.shared.inspect(name).await
    }

    async fn store_result(
        &self,
        hold: &EtcdHold,
        token: FencingToken,
        value: &[u8],
        retention: Duration,
    ) -> Result<(), LockError> {
        self.shared.store_result(hold, token, value, retention).await
    }

    async fn load_result(&self, name: &LockName) -> Result<Option<StoredResult>, LockError> {
        self.shared.load_result(name).await
    }

    fn watch_hold(&self, hold: &EtcdHold, signal: LostSignal) {
        self.shared.registry.watch(hold, signal);
    }
}

/// Where a client of `config` keeps its locks (see [`Backend::target`]): the endpoints and
/// the key prefix.
pub(crate) fn target(config: &EtcdConfig) -> String {
    format!("{} prefix {}", config.endpoints().join(","), config.prefix())
}
