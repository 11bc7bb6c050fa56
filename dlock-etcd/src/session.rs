//! Sessions: the etcd leases that hold a client's lock keys.
//!
//! A client has one shared session per distinct ttl (in whole seconds), granted on first
//! use and shared by every watchdog lock and waiter of that ttl: the lease is granted once
//! per session, never once per lock. A `Fixed` lease gets a private session of its own,
//! which nobody keeps alive.
//!
//! Sessions are kept alive on demand. Whoever needs the lease to last `need` from an
//! instant `since` (an acquire that is about to grant, the renewals the scheduler found
//! due together, a waiter keeping its place) asks for it; a keepalive already on its way
//! that was sent after `since` serves every such request, otherwise a new one is sent at
//! once, beside any that hangs. A keepalive is skipped when the last one already covers
//! the need. The ownership checks of renewals due together are one listing of the
//! lease's keys, or a transaction of reads: renewing a thousand locks of one ttl costs
//! about one keepalive and one check per renewal period, not a thousand round trips.
//!
//! Keepalives and checks are not cut short by a timeout of the session's own: a late
//! answer still proves the lease lived from its send time, and the callers bound their
//! wait (an acquire by the operation timeout, a renewal by the lease's validity).
//!
//! A session that may hold a key nobody tracks (a delete that failed) is retired: it takes
//! no new requests, lives only as long as the holds and waiters already on it, and is
//! revoked when the last of them lets go. Any session is revoked when nothing uses it
//! any more.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use dlock_core::backend::lock_unpoisoned;
use dlock_core::LockError;
use etcd_client::{GetOptions, Txn, TxnOp, TxnOpResponse};
use futures::future::{BoxFuture, Shared};
use futures::FutureExt;

use crate::cluster::Cluster;
use crate::error::EtcdError;

/// Range operations per checking transaction (etcd allows 128 by default).
const CHECKS_PER_TXN: usize = 100;

/// What a session tells the rest of the backend.
pub(crate) trait SessionEvents: Send + Sync {
    /// The server says the lease no longer exists: every hold on it is gone.
    fn lease_gone(&self, lease: i64);
}

/// A renewal's ownership check: the key still exists with the token as create revision.
#[derive(Debug, Clone)]
pub(crate) struct Check {
    pub(crate) key: Vec<u8>,
    pub(crate) token: i64,
}

/// What a check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// The key exists, on this lease (0: none).
    On(i64),
    /// The key is gone.
    Gone,
}

/// A keepalive on its way, shared by everyone it serves.
type Keepalive = Shared<BoxFuture<'static, Result<bool, Arc<LockError>>>>;

struct State {
    /// A keepalive (or the grant) sent at this instant succeeded: the lease lasts at
    /// least the ttl from then.
    last_sent: Instant,
    /// The server said the lease is gone.
    gone: bool,
    /// No new request may use the lease (a key of ours may be on it untracked).
    retired: bool,
    /// The latest keepalive sent, while its answer is out.
    pending: Option<(Instant, Keepalive)>,
}

/// One etcd lease of this client.
pub(crate) struct Session {
    id: i64,
    ttl: Duration,
    private: bool,
    state: Mutex<State>,
    cluster: Arc<Cluster>,
    op_timeout: Duration,
    events: Weak<dyn SessionEvents>,
    /// Where a shared session is kept.
    home: Option<Weak<Slot>>,
}

/// The place of one ttl's shared session in a client's map.
type Slot = tokio::sync::Mutex<Option<Arc<Session>>>;

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("lease", &format_args!("{:x}", self.id)).field("ttl", &self.ttl).finish()
    }
}

impl Session {
    /// The lease id.
    pub(crate) fn id(&self) -> i64 {
        self.id
    }

    /// The ttl the server granted (whole seconds, at least what was asked).
    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Whether this is a `Fixed` lease's own session.
    pub(crate) fn is_private(&self) -> bool {
        self.private
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock_unpoisoned(&self.state)
    }

    /// Whether the server said the lease is gone.
    pub(crate) fn is_gone(&self) -> bool {
        self.state().gone
    }

    /// Until when the lease certainly exists (unless revoked).
    pub(crate) fn alive_until(&self) -> Instant {
        self.state().last_sent + self.ttl
    }

    /// When a waiter should next keep the lease alive: a third of the ttl after the last
    /// keepalive, as a watchdog would.
    pub(crate) fn keepalive_due(&self) -> Instant {
        self.state().last_sent + self.ttl / 3
    }

    /// Whether a new request may put a key on this lease now.
    fn usable(&self, now: Instant) -> bool {
        let state = self.state();
        !state.gone && !state.retired && now + Duration::from_millis(50) < state.last_sent + self.ttl
    }

    /// Takes a shared session out of its client's map, so that it lives only as long as
    /// the holds and waiters already on it (and is revoked when they let go).
    fn leave_home(&self) {
        let Some(slot) = self.home.as_ref().and_then(Weak::upgrade) else { return };
        let id = self.id;
        let clear = move |slot: &mut Option<Arc<Session>>| {
            if slot.as_ref().is_some_and(|s| s.id == id) {
                *slot = None;
            }
        };
        if let Ok(mut guard) = slot.try_lock() {
            clear(&mut guard);
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        runtime.spawn(async move { clear(&mut *slot.lock().await) });
    }

    /// Takes the lease out of service for new requests: a key of ours may be on it that
    /// nobody tracks (a delete that failed), and it must not be kept alive longer than
    /// the holds already on it need.
    pub(crate) fn retire(&self) {
        let newly = !std::mem::replace(&mut self.state().retired, true);
        if newly {
            tracing::debug!(lease = %format_args!("{:x}", self.id), "lease retired");
            self.leave_home();
        }
    }

    /// Records that the server says the lease is gone, and tells the holds on it.
    pub(crate) fn mark_gone(&self) {
        let newly = !std::mem::replace(&mut self.state().gone, true);
        if newly {
            tracing::debug!(lease = %format_args!("{:x}", self.id), "the lease is gone");
            self.leave_home();
            if let Some(events) = self.events.upgrade() {
                events.lease_gone(self.id);
            }
        }
    }

    /// Makes sure the lease lasts at least `need` from `since`, keeping it alive if the
    /// last keepalive does not cover that. `Ok(false)` when the lease is gone.
    pub(crate) async fn ensure(&self, since: Instant, need: Duration) -> Result<bool, LockError> {
        {
            let state = self.state();
            if state.gone {
                return Ok(false);
            }
            if state.last_sent + self.ttl >= since + need {
                return Ok(true);
            }
        }
        self.keep_alive_after(since).await
    }

    /// A keepalive sent no sooner than `since`: the one on its way if it was, else a new
    /// one (beside any that hangs). `Ok(false)` when the lease is gone.
    async fn keep_alive_after(&self, since: Instant) -> Result<bool, LockError> {
        let (sent, keepalive) = {
            let mut state = self.state();
            if state.gone {
                return Ok(false);
            }
            match &state.pending {
                Some((sent, keepalive)) if *sent >= since => (*sent, keepalive.clone()),
                _ => {
                    let sent = Instant::now();
                    let (cluster, id) = (self.cluster.clone(), self.id);
                    // A keepalive answered after the ttl proves nothing: that is its bound.
                    let limit = self.ttl;
                    let keepalive =
                        async move { cluster.keep_alive(limit, id).await.map_err(Arc::new) }.boxed().shared();
                    state.pending = Some((sent, keepalive.clone()));
                    (sent, keepalive)
                }
            }
        };
        let answer = keepalive.await;
        {
            let mut state = self.state();
            if state.pending.as_ref().is_some_and(|(at, _)| *at == sent) {
                state.pending = None;
            }
            if matches!(answer, Ok(true)) {
                state.last_sent = state.last_sent.max(sent);
            }
        }
        match answer {
            Ok(true) => Ok(true),
            Ok(false) => {
                self.mark_gone();
                Ok(false)
            }
            Err(err) => Err(unshare(&err)),
        }
    }

    /// Keeps the lease alive for `need` from `since` and finds each checked key: the
    /// renewals of holds on this lease that are due together. `None` when the lease is
    /// gone (with every key on it).
    pub(crate) async fn renew_many(
        &self,
        since: Instant,
        need: Duration,
        checks: &[Check],
    ) -> Result<Option<Vec<Found>>, LockError> {
        let (alive, found) = futures::join!(self.ensure(since, need), self.check(checks));
        if !alive? {
            return Ok(None);
        }
        found.map(Some)
    }

    /// Where each key is now. Many checks are answered by one request for the keys
    /// attached to the lease (request keys are never reused, so a key attached under its
    /// name is the one granted); a few, or keys the listing does not show on this lease,
    /// by transactions of up to [`CHECKS_PER_TXN`] reads.
    async fn check(&self, checks: &[Check]) -> Result<Vec<Found>, LockError> {
        if checks.len() <= CHECKS_PER_TXN {
            return self.read_keys(checks).await;
        }
        let attached: HashSet<Vec<u8>> = match self.cluster.lease_keys(self.ttl, self.id).await {
            Ok(Some(keys)) => keys.into_iter().collect(),
            // The keepalive sent along says so too.
            Ok(None) => HashSet::new(),
            Err(err) if err.is_transient() => return Err(err),
            Err(err) => {
                tracing::debug!(%err, "listing the lease's keys failed; reading them one by one");
                return self.read_keys(checks).await;
            }
        };
        let mut found: Vec<Option<Found>> =
            checks.iter().map(|c| attached.contains(&c.key).then_some(Found::On(self.id))).collect();
        // A key missing from the listing may have moved to another lease (an extension).
        let missing: Vec<Check> =
            checks.iter().zip(&found).filter(|(_, f)| f.is_none()).map(|(c, _)| c.clone()).collect();
        if !missing.is_empty() {
            let mut read = self.read_keys(&missing).await?.into_iter();
            for slot in found.iter_mut().filter(|f| f.is_none()) {
                *slot = read.next();
            }
        }
        Ok(found.into_iter().map(|f| f.unwrap_or(Found::Gone)).collect())
    }

    async fn read_keys(&self, checks: &[Check]) -> Result<Vec<Found>, LockError> {
        let txns = checks.chunks(CHECKS_PER_TXN).map(|chunk| {
            let ops: Vec<TxnOp> =
                chunk.iter().map(|c| TxnOp::get(c.key.clone(), Some(GetOptions::new().with_keys_only()))).collect();
            async move {
                let resp = self.cluster.read("renewal check", self.ttl, Txn::new().and_then(ops)).await?;
                let found = resp
                    .op_responses()
                    .into_iter()
                    .zip(chunk)
                    .map(|(op, c)| match op {
                        TxnOpResponse::Get(get) => match get.kvs().first() {
                            Some(kv) if kv.create_revision() == c.token => Found::On(kv.lease()),
                            _ => Found::Gone,
                        },
                        _ => Found::Gone,
                    })
                    .collect::<Vec<_>>();
                if found.len() == chunk.len() {
                    Ok(found)
                } else {
                    Err(LockError::backend(EtcdError::Protocol("a check transaction answered too few reads")))
                }
            }
        });
        let results = futures::future::try_join_all(txns).await?;
        Ok(results.into_iter().flatten().collect())
    }
}

impl Drop for Session {
    /// Revokes the lease once nothing uses it: its keys (waiters that gave up, keys whose
    /// delete failed) go at once instead of at expiry.
    fn drop(&mut self) {
        if lock_unpoisoned(&self.state).gone {
            return;
        }
        self.cluster.revoke_later(self.op_timeout, self.id, self.ttl);
    }
}

/// A shared failure, told to each of the requests it served (`LockError` is not `Clone`).
fn unshare(err: &Arc<LockError>) -> LockError {
    match &**err {
        LockError::Unavailable { what, .. } => LockError::unavailable_because(what.clone(), SharedError(err.clone())),
        other => LockError::backend(EtcdError::Round(other.to_string())),
    }
}

/// A failure shared by several requests, kept as their source.
#[derive(Debug)]
struct SharedError(Arc<LockError>);

impl std::fmt::Display for SharedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for SharedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&*self.0)
    }
}

/// The client's shared sessions, one per ttl in whole seconds.
pub(crate) struct Sessions {
    cluster: Arc<Cluster>,
    op_timeout: Duration,
    events: Weak<dyn SessionEvents>,
    /// One slot per ttl, so that a slow grant for one ttl holds up no other.
    slots: Mutex<HashMap<i64, Arc<Slot>>>,
}

impl Sessions {
    pub(crate) fn new(cluster: Arc<Cluster>, op_timeout: Duration, events: Weak<dyn SessionEvents>) -> Self {
        Sessions { cluster, op_timeout, events, slots: Mutex::new(HashMap::new()) }
    }

    /// The shared session of this ttl, granting its lease if there is none in service.
    pub(crate) async fn shared(&self, ttl_secs: i64) -> Result<Arc<Session>, LockError> {
        let slot = lock_unpoisoned(&self.slots).entry(ttl_secs).or_default().clone();
        let mut current = slot.lock().await;
        if let Some(session) = current.as_ref() {
            if session.usable(Instant::now()) {
                return Ok(session.clone());
            }
        }
        let session = self.grant(ttl_secs, Some(&slot)).await?;
        // The replaced session stays alive for whatever still uses it, and is revoked
        // when the last of them lets go (not here, under the slot's lock).
        let replaced = current.replace(session.clone());
        drop(current);
        drop(replaced);
        Ok(session)
    }

    /// A new private session (a `Fixed` lease of its own).
    pub(crate) async fn private(&self, ttl_secs: i64) -> Result<Arc<Session>, LockError> {
        self.grant(ttl_secs, None).await
    }

    /// Grants a lease: for a slot of the map, or private.
    async fn grant(&self, ttl_secs: i64, home: Option<&Arc<Slot>>) -> Result<Arc<Session>, LockError> {
        let sent = Instant::now();
        let resp = self.cluster.grant(self.op_timeout, ttl_secs).await?;
        // The server may raise a short ttl to its minimum; a shorter one would break the
        // promise that the hold outlasts the client's idea of it.
        let granted = resp.ttl;
        if granted < ttl_secs {
            let _ = self.cluster.revoke(self.op_timeout, resp.id).await;
            return Err(EtcdError::ShortLease { asked: ttl_secs, granted }.into());
        }
        let ttl = Duration::from_secs(u64::try_from(granted).unwrap_or(u64::MAX));
        tracing::debug!(lease = %format_args!("{:x}", resp.id), ?ttl, shared = home.is_some(), "lease granted");
        Ok(Arc::new(Session {
            id: resp.id,
            ttl,
            private: home.is_none(),
            state: Mutex::new(State { last_sent: sent, gone: false, retired: false, pending: None }),
            cluster: self.cluster.clone(),
            op_timeout: self.op_timeout,
            events: self.events.clone(),
            home: home.map(Arc::downgrade),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_testkit::supervisor::etcd::{EtcdConfig, EtcdServer};
    use etcd_client::{ConnectOptions, PutOptions};

    struct Quiet;

    impl SessionEvents for Quiet {
        fn lease_gone(&self, _lease: i64) {}
    }

    /// The sum of a gRPC server counter over every label set of one method.
    fn counter(metrics: &str, name: &str, method: &str) -> u64 {
        let label = format!("grpc_method=\"{method}\"");
        metrics
            .lines()
            .filter(|line| line.starts_with(&format!("{name}{{")) && line.contains(&label))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn renewals_due_together_take_one_keepalive_and_one_listing() {
        let mut server = tokio::task::spawn_blocking(|| EtcdServer::start(&EtcdConfig::default()))
            .await
            .expect("spawn_blocking")
            .expect("start etcd");
        let limit = Duration::from_secs(2);
        let cluster = Arc::new(Cluster::new(vec![server.endpoint()], ConnectOptions::new(), limit, limit));
        let events: Arc<dyn SessionEvents> = Arc::new(Quiet);
        let sessions = Sessions::new(cluster.clone(), limit, Arc::downgrade(&events));
        let ttl = Duration::from_secs(60);
        let session = sessions.shared(60).await.expect("grant");

        const HOLDS: usize = 450;
        let mut checks = Vec::new();
        for chunk in (0..HOLDS).collect::<Vec<_>>().chunks(100) {
            let keys: Vec<Vec<u8>> = chunk.iter().map(|i| format!("renewal-test/{i}").into_bytes()).collect();
            let puts: Vec<TxnOp> = keys
                .iter()
                .map(|key| TxnOp::put(key.clone(), "1 owner", Some(PutOptions::new().with_lease(session.id()))))
                .collect();
            let resp = cluster.txn("put", limit, Txn::new().and_then(puts)).await.expect("put");
            let revision = resp.header().expect("header").revision();
            checks.extend(keys.into_iter().map(|key| Check { key, token: revision }));
        }
        // One key is gone, as if an operator deleted it.
        cluster
            .txn("delete", limit, Txn::new().and_then([TxnOp::delete(checks[7].key.clone(), None)]))
            .await
            .expect("delete");

        let before = server.member().metrics().expect("metrics");
        let since = Instant::now();
        let answers = session.renew_many(since, ttl, &checks).await.expect("renewal").expect("the lease lives");
        let after = server.member().metrics().expect("metrics");

        for (i, answer) in answers.into_iter().enumerate() {
            let expected = if i == 7 { Found::Gone } else { Found::On(session.id()) };
            assert_eq!(answer, expected, "hold {i}");
        }
        let keepalives = counter(&after, "grpc_server_msg_received_total", "LeaseKeepAlive")
            - counter(&before, "grpc_server_msg_received_total", "LeaseKeepAlive");
        let txns =
            counter(&after, "grpc_server_started_total", "Txn") - counter(&before, "grpc_server_started_total", "Txn");
        let listings = counter(&after, "grpc_server_started_total", "LeaseTimeToLive")
            - counter(&before, "grpc_server_started_total", "LeaseTimeToLive");
        assert_eq!(keepalives, 1, "{HOLDS} renewals due together take one keepalive");
        // The one key missing from the listing is read, in case it moved to another lease.
        assert_eq!((listings, txns), (1, 1), "their checks take one listing of the lease's keys");
        assert!(session.alive_until() >= since + ttl);
    }
}
