//! [`EtcdBackend`]: the atomic operations of the etcd backend and its wake-up.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dlock_core::backend::{Attempt, Backend, LostSignal, Release, Renewal, Request};
use dlock_core::{Capabilities, Holder, LeaseMode, LockError, LockInfo, LockName, LostReason};
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
    TxnResponse,
};

use crate::cluster::Cluster;
use crate::error::{is_lease_gone, EtcdError};
use crate::keys::{self, HoldValue};
use crate::queue::{self, EtcdTicket};
use crate::registry::{EtcdHold, KeyState, Registry};
use crate::session::{Check, Probe, Session, SessionEvents, Sessions};

/// Attempts to retry when the lease turned out gone under a request.
const LEASE_RETRIES: usize = 3;
/// Compare-and-swap rounds on a re-entrant key's count before giving up.
const CAS_ROUNDS: usize = 16;

/// The etcd backend of one client: its connection, sessions and held keys. Build one with
/// [`connect`](crate::connect), which wraps it in a [`Client`](dlock_core::Client).
pub struct EtcdBackend {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend").finish_non_exhaustive()
    }
}

/// What the backend, its sessions and its background tasks share.
pub(crate) struct Shared {
    pub(crate) cluster: Arc<Cluster>,
    pub(crate) prefix: String,
    pub(crate) op_timeout: Duration,
    pub(crate) sessions: Sessions,
    pub(crate) registry: Registry,
    seq: AtomicU64,
    me: Weak<Shared>,
}

impl EtcdBackend {
    pub(crate) fn new(cluster: Cluster, prefix: String, op_timeout: Duration) -> Self {
        let cluster = Arc::new(cluster);
        let shared = Arc::new_cyclic(|me: &Weak<Shared>| {
            let events: Weak<dyn SessionEvents> = me.clone();
            Shared {
                sessions: Sessions::new(cluster.clone(), op_timeout, events),
                cluster,
                prefix,
                op_timeout,
                registry: Registry::default(),
                seq: AtomicU64::new(1),
                me: me.clone(),
            }
        });
        EtcdBackend { shared }
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

impl SessionEvents for Shared {
    fn lease_gone(&self, lease: i64) {
        for signal in self.registry.signals_on_lease(lease) {
            signal.fire(LostReason::SessionExpired);
        }
    }

    fn round_done(&self) {
        let lost = self.registry.lost_unreleased();
        if lost.is_empty() {
            return;
        }
        let Some(me) = self.me.upgrade() else { return };
        tokio::spawn(async move {
            for hold in lost {
                if hold.take_release() {
                    tracing::debug!(key = %String::from_utf8_lossy(hold.lock_key()), "giving back a lost hold");
                    if let Err(err) = me.give_back_or_retry(hold.key()).await {
                        tracing::debug!(%err, "giving back a lost hold failed; its lease frees it");
                    }
                }
            }
        });
    }
}

/// What one step of an attempt came to.
pub(crate) enum Step {
    Done(Attempt<EtcdHold>),
    /// Our key is gone (its lease expired or was revoked, or it was deleted): queue anew.
    Requeue,
}

impl Shared {
    pub(crate) fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn dir(&self, name: &LockName) -> Vec<u8> {
        keys::lock_dir(&self.prefix, name)
    }

    /// A transaction that changes something (see [`Cluster::txn`]).
    pub(crate) async fn txn(&self, what: &str, txn: Txn) -> Result<TxnResponse, LockError> {
        self.cluster.txn(what, self.op_timeout, txn).await
    }

    /// A transaction that only reads (see [`Cluster::read`]).
    pub(crate) async fn read(&self, what: &str, txn: Txn) -> Result<TxnResponse, LockError> {
        self.cluster.read(what, self.op_timeout, txn).await
    }

    /// The session a new request of this mode puts its key on.
    pub(crate) async fn session_for(&self, mode: LeaseMode) -> Result<Arc<Session>, LockError> {
        let secs = keys::ttl_secs(mode.ttl());
        match mode {
            LeaseMode::Watchdog { .. } => self.sessions.shared(secs).await,
            LeaseMode::Fixed(_) => self.sessions.private(secs).await,
        }
    }

    async fn attempt(&self, req: &Request, slot: &mut Option<EtcdTicket>) -> Result<Attempt<EtcdHold>, LockError> {
        let since = Instant::now();
        let dir = self.dir(&req.name);
        if let Some(key) = self.registry.find_owned(&dir, &req.owner) {
            if let Some(granted) = self.reenter(req, &key, since).await? {
                if let Some(ticket) = slot.take() {
                    self.abandon(ticket).await;
                }
                return Ok(granted);
            }
        }
        for _ in 0..LEASE_RETRIES {
            let step = match slot {
                Some(ticket) if ticket.is_queued() => queue::recheck(self, req, slot, since).await?,
                _ => {
                    if let Some(uncertain) = slot.take() {
                        self.abandon(uncertain).await;
                    }
                    queue::enqueue(self, req, &dir, slot, since).await?
                }
            };
            match step {
                Step::Done(attempt) => return Ok(attempt),
                Step::Requeue => {
                    if let Some(ticket) = slot.take() {
                        ticket.forget();
                    }
                }
            }
        }
        Err(LockError::unavailable("etcd: the lease kept disappearing under the request"))
    }

    /// A re-entrant acquire of a key this client holds for the same owner: one more count,
    /// on a lease that lasts the request's ttl. `None` when the key turned out gone.
    async fn reenter(
        &self,
        req: &Request,
        key: &Arc<KeyState>,
        since: Instant,
    ) -> Result<Option<Attempt<EtcdHold>>, LockError> {
        let current = key.session();
        let target = if current.ttl() < req.ttl() { Some(self.session_for(req.mode).await?) } else { None };
        let lease = target.as_ref().unwrap_or(&current);
        for _ in 0..CAS_ROUNDS {
            let count = key.count();
            let put = match &target {
                Some(s) => PutOptions::new().with_lease(s.id()),
                None => PutOptions::new().with_ignore_lease(),
            };
            let txn = Txn::new()
                .when(counted(key, count))
                .and_then([TxnOp::put(key.key.clone(), HoldValue::encode(count + 1, &key.owner), Some(put))])
                .or_else([TxnOp::get(key.key.clone(), None)]);
            let (alive, resp) = futures::join!(lease.ensure(since, req.ttl()), self.txn("re-entrant acquire", txn));
            let resp = match resp {
                Err(err) if is_lease_gone(&err) => {
                    lease.mark_gone();
                    if target.is_some() {
                        return Err(err);
                    }
                    // The key went with its lease.
                    key.set_gone();
                    return Ok(None);
                }
                Err(err) => {
                    // The count may have gone up without a hold to bring it down again:
                    // let the key live no longer than the holds already on its lease.
                    current.retire();
                    if let Some(target) = &target {
                        target.retire();
                    }
                    return Err(err);
                }
                Ok(resp) => resp,
            };
            if resp.succeeded() {
                key.set_count(count + 1);
                if let Some(target) = &target {
                    key.set_session(target.clone());
                }
                match alive {
                    Ok(true) => {}
                    Ok(false) => {
                        key.set_gone();
                        return Ok(None);
                    }
                    Err(err) => {
                        let _ = self.give_back_or_retry(key).await;
                        return Err(err);
                    }
                }
                tracing::debug!(count = count + 1, "re-entrant acquire");
                return Ok(Some(Attempt::Granted { hold: EtcdHold::new(key.clone()), token: token_of(key.token) }));
            }
            match current_value(key, &resp)? {
                Some(value) if value.owner == key.owner && value.count > 0 => key.set_count(value.count),
                _ => {
                    key.set_gone();
                    return Ok(None);
                }
            }
        }
        Err(LockError::backend(EtcdError::Protocol("the hold count kept changing under a re-entrant acquire")))
    }

    /// Gives back one hold of `key`: the key goes when the count reaches zero.
    pub(crate) async fn give_back(&self, key: &Arc<KeyState>) -> Result<Release, LockError> {
        for _ in 0..CAS_ROUNDS {
            let count = key.count();
            let op = if count <= 1 {
                TxnOp::delete(key.key.clone(), None)
            } else {
                TxnOp::put(
                    key.key.clone(),
                    HoldValue::encode(count - 1, &key.owner),
                    Some(PutOptions::new().with_ignore_lease()),
                )
            };
            let txn = Txn::new().when(counted(key, count)).and_then([op]).or_else([TxnOp::get(key.key.clone(), None)]);
            let resp = self.txn("release", txn).await?;
            if resp.succeeded() {
                if count <= 1 {
                    key.set_count(0);
                    key.set_gone();
                } else {
                    key.set_count(count - 1);
                }
                return Ok(Release::Released);
            }
            match current_value(key, &resp)? {
                Some(value) if value.owner == key.owner && value.count > 0 => key.set_count(value.count),
                _ => {
                    key.set_gone();
                    return Ok(Release::NotHeld);
                }
            }
        }
        Err(LockError::backend(EtcdError::Protocol("the hold count kept changing under a release")))
    }

    async fn release(&self, hold: &EtcdHold) -> Result<Release, LockError> {
        if !hold.take_release() {
            return Ok(Release::NotHeld);
        }
        self.give_back_or_retry(hold.key()).await
    }

    /// [`give_back`](Self::give_back), and when it fails, takes the key's session out of
    /// service (the key may stay behind on a lease other holds keep alive) and keeps
    /// trying in the background while that lease lives.
    pub(crate) async fn give_back_or_retry(&self, key: &Arc<KeyState>) -> Result<Release, LockError> {
        let err = match self.give_back(key).await {
            Ok(release) => return Ok(release),
            Err(err) => err,
        };
        let session = key.session();
        session.retire();
        if let Some(me) = self.me.upgrade() {
            let key = key.clone();
            queue::retry_in_background(session, move || {
                let (me, key) = (me.clone(), key.clone());
                async move { me.give_back(&key).await.map(drop) }
            });
        }
        Err(err)
    }

    async fn renew(&self, hold: &EtcdHold, ttl: Duration) -> Result<Renewal, LockError> {
        let since = Instant::now();
        let key = hold.key();
        if hold.is_released() || key.is_gone() {
            return Ok(Renewal::Lost(LostReason::Expired));
        }
        let session = key.session();
        if ttl > session.ttl() {
            return self.move_to_longer_lease(key, &session, ttl, since).await;
        }
        let check = Check { key: key.key.clone(), token: key.token };
        Ok(match session.renew(since, ttl, check).await? {
            Probe::LeaseGone => {
                key.set_gone();
                Renewal::Lost(LostReason::SessionExpired)
            }
            Probe::Alive { held: Some(false) } => {
                key.set_gone();
                Renewal::Lost(LostReason::Expired)
            }
            Probe::Alive { .. } => Renewal::Renewed,
        })
    }

    /// `extend` past the lease's ttl: the key moves, value and create revision kept, to
    /// a lease of the longer ttl (the shared one, or a new private one for a `Fixed` hold).
    async fn move_to_longer_lease(
        &self,
        key: &Arc<KeyState>,
        current: &Arc<Session>,
        ttl: Duration,
        since: Instant,
    ) -> Result<Renewal, LockError> {
        let secs = keys::ttl_secs(ttl);
        let target =
            if current.is_private() { self.sessions.private(secs).await? } else { self.sessions.shared(secs).await? };
        let txn = Txn::new().when([Compare::create_revision(key.key.clone(), CompareOp::Equal, key.token)]).and_then([
            TxnOp::put(
                key.key.clone(),
                Vec::new(),
                Some(PutOptions::new().with_lease(target.id()).with_ignore_value()),
            ),
        ]);
        let (alive, resp) = futures::join!(target.ensure(since, ttl), self.txn("extend", txn));
        if !resp?.succeeded() {
            key.set_gone();
            return Ok(Renewal::Lost(LostReason::Expired));
        }
        key.set_session(target);
        if !alive? {
            key.set_gone();
            return Ok(Renewal::Lost(LostReason::SessionExpired));
        }
        tracing::debug!(?ttl, "hold moved to a longer lease");
        Ok(Renewal::Renewed)
    }

    async fn inspect(&self, name: &LockName) -> Result<LockInfo, LockError> {
        let dir = self.dir(name);
        let first = GetOptions::new().with_prefix().with_sort(SortTarget::Create, SortOrder::Ascend).with_limit(1);
        let txn = Txn::new().and_then([
            TxnOp::get(dir.clone(), Some(first)),
            TxnOp::get(dir, Some(GetOptions::new().with_prefix().with_count_only())),
        ]);
        let resp = self.read("inspect", txn).await?;
        let ops = resp.op_responses();
        let (Some(TxnOpResponse::Get(first)), Some(TxnOpResponse::Get(all))) = (ops.first(), ops.get(1)) else {
            return Err(EtcdError::Protocol("inspect answered too few reads").into());
        };
        let Some(kv) = first.kvs().first() else {
            return Ok(LockInfo { holder: None, waiters: Some(0) });
        };
        let value = HoldValue::decode(kv.key(), kv.value())?;
        let remaining = if kv.lease() != 0 {
            let ttl = self.cluster.time_to_live(self.op_timeout, kv.lease()).await?;
            Some(Duration::from_secs(u64::try_from(ttl).unwrap_or(0)))
        } else {
            None
        };
        let queued = usize::try_from(all.count()).unwrap_or(usize::MAX).saturating_sub(1);
        Ok(LockInfo {
            holder: Some(Holder {
                owner: value.owner,
                token: token_of(kv.create_revision()),
                count: value.count,
                remaining,
            }),
            waiters: Some(queued),
        })
    }

    /// Gives up a waiter's place: deletes its key (or revokes its private lease).
    pub(crate) async fn abandon(&self, ticket: EtcdTicket) {
        queue::abandon(self, ticket).await;
    }
}

/// The guard of a change to a held key's count: still ours, and still at this count.
fn counted(key: &KeyState, count: u32) -> Vec<Compare> {
    vec![
        Compare::create_revision(key.key.clone(), CompareOp::Equal, key.token),
        Compare::value(key.key.clone(), CompareOp::Equal, HoldValue::encode(count, &key.owner)),
    ]
}

/// The value of a held key from the `get` of a failed guarded transaction, if the key
/// still is the one we hold.
fn current_value(key: &KeyState, resp: &TxnResponse) -> Result<Option<HoldValue>, LockError> {
    let ops = resp.op_responses();
    let Some(TxnOpResponse::Get(get)) = ops.first() else {
        return Err(EtcdError::Protocol("a guarded transaction answered no read").into());
    };
    match get.kvs().first() {
        Some(kv) if kv.create_revision() == key.token => Ok(Some(HoldValue::decode(kv.key(), kv.value())?)),
        _ => Ok(None),
    }
}

pub(crate) fn token_of(revision: i64) -> dlock_core::FencingToken {
    dlock_core::FencingToken::new(u64::try_from(revision).unwrap_or(0))
}

pub(crate) fn first_kv(resp: &TxnResponse, op: usize) -> Option<KeyValue> {
    match resp.op_responses().into_iter().nth(op) {
        Some(TxnOpResponse::Get(get)) => get.kvs().first().cloned(),
        _ => None,
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

    async fn attempt(&self, req: &Request, ticket: &mut Option<EtcdTicket>) -> Result<Attempt<EtcdHold>, LockError> {
        self.shared.attempt(req, ticket).await
    }

    async fn wait(
        &self,
        req: &Request,
        ticket: &mut Option<EtcdTicket>,
        until: tokio::time::Instant,
    ) -> Result<(), LockError> {
        queue::wait(&self.shared, req, ticket, until).await
    }

    async fn abandon(&self, _req: &Request, ticket: EtcdTicket) {
        self.shared.abandon(ticket).await;
    }

    async fn renew(&self, hold: &EtcdHold, ttl: Duration) -> Result<Renewal, LockError> {
        self.shared.renew(hold, ttl).await
    }

    async fn release(&self, hold: &EtcdHold) -> Result<Release, LockError> {
        self.shared.release(hold).await
    }

    async fn inspect(&self, name: &LockName) -> Result<LockInfo, LockError> {
        self.shared.inspect(name).await
    }

    fn watch_hold(&self, hold: &EtcdHold, signal: LostSignal) {
        self.shared.registry.watch(hold, signal);
    }
}
