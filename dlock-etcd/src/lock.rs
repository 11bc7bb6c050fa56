//! The lock recipe: acquire, wait, re-enter, give back, release, renew and inspect, in
//! the order a lock goes through them.
//!
//! Every request is a key under the lock's range, put on the client's lease, whose name
//! says the kind of hold it asks for ([`keys::request_key`]). The keys queue in create
//! revision order, and a key holds when every key ahead of it holds and its kind is
//! compatible with theirs ([`holding`]): an exclusive key when it is first, a reader when
//! only readers are ahead of it, a permit request when only permit requests are ahead of
//! it, all of them holding, and fewer than its number of permits. The keys that hold are
//! thus always the oldest ones, so grants follow the queue (a waiting writer keeps later
//! readers out) and every grant's token, its key's create revision, is above every
//! earlier grant's.
//!
//! A waiter watches the deletes of the keys ahead of it whose deletion can let it in,
//! never the whole range: a writer the key just ahead of it, a reader the last key ahead
//! of it that is not a reader, a permit request the last key ahead of it that is not a
//! permit request or, behind permit requests only, the nearest `permits` of them: it
//! cannot be in while they all remain, and the delete of any of them may be the one that
//! lets it in, so no fewer will do.
//!
//! A request that waits does so on a short lease: its key moves (value and create
//! revision kept, so its place and its future token stay) to the client's shared lease
//! of the request's place lapse ([`Request::place_lapse`], at most
//! [`MAX_PLACE_LAPSE`](dlock_core::MAX_PLACE_LAPSE)), which the waiter keeps alive, and
//! back to a lease of its own ttl once it holds. A waiter that dies thus keeps the keys
//! behind it waiting for seconds, not for the ttl it asked for. Requests that hold at
//! once never move.
//!
//! A key's value names the owner and the requests holding the lock through it (several
//! for re-entrant holds), so that every change to a hold is a compare-and-swap that a
//! repeat cannot apply twice, and an acquire whose answer was lost can be undone
//! exactly: its key is request-scoped, its re-entry is named by its request id.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use dlock_core::backend::{Attempt, Release, Renewal, Request};
use dlock_core::{HoldKind, Holder, LeaseMode, LockError, LockInfo, LockName, LostReason};
use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
    TxnResponse, WatchFilterType, WatchOptions, WatchStream,
};
use futures::future::BoxFuture;
use futures::FutureExt;

use crate::cluster::Cluster;
use crate::error::{is_lease_gone, map_err, EtcdError};
use crate::keys::{self, first_kv, token_of, HoldValue};
use crate::registry::{EtcdHold, KeyState, Registry};
use crate::session::{Check, Found, Session, SessionEvents, Sessions};

/// Attempts to retry when the lease turned out gone under a request.
const LEASE_RETRIES: usize = 3;
/// Compare-and-swap rounds on a re-entrant key's value before giving up.
pub(crate) const CAS_ROUNDS: usize = 16;
/// How soon a waiter tries again to watch, or to keep its lease alive, after a failure.
const REWATCH: Duration = Duration::from_millis(200);
/// The first pause of a background clean-up.
const CLEANUP_FIRST: Duration = Duration::from_millis(100);
/// The most keys one waiter watches. A permit request behind more permit requests than
/// this, of which as many may have to go before it is in, watches the nearest ones and
/// also looks again every [`PARTIAL_WATCH_POLL`].
const WATCH_CAP: usize = 32;
/// How often a waiter that watches only some of the keys that can let it in looks again.
const PARTIAL_WATCH_POLL: Duration = Duration::from_millis(500);

/// What the backend, its sessions and its background tasks share.
pub(crate) struct Shared {
    pub(crate) cluster: Arc<Cluster>,
    pub(crate) prefix: String,
    pub(crate) op_timeout: Duration,
    sessions: Sessions,
    pub(crate) registry: Registry,
    seq: AtomicU64,
    me: Weak<Shared>,
}

/// A request's place between attempts: its key in the lock's queue, or a re-entry whose
/// answer is not in yet.
pub struct EtcdTicket(Place);

enum Place {
    Queued(QueuePlace),
    Reentry(Reentry),
}

/// A key of ours in a lock's queue.
struct QueuePlace {
    /// The lease the key is on now.
    session: Arc<Session>,
    /// The request's own lease, while the key waits on a short one (see
    /// [`Shared::wait_on_short_lease`]); the key moves back to it once it holds.
    holds_on: Option<Arc<Session>>,
    dir: Vec<u8>,
    key: Vec<u8>,
    kind: HoldKind,
    /// Our key's create revision, once the put is confirmed; `None` while it is uncertain.
    rev: Option<i64>,
    /// The keys ahead of ours whose delete we wait for, and the revision at which they
    /// were read.
    ahead: Option<(Vec<Vec<u8>>, i64)>,
    watch: Option<Box<AheadWatch>>,
}

/// A re-entrant acquire sent on a key this client holds: the lease it may have moved the
/// key to is kept until the outcome is known.
struct Reentry {
    key: Arc<KeyState>,
    target: Option<Arc<Session>>,
}

/// One watch stream of a waiter, with a watch on each key it waits for.
struct AheadWatch {
    keys: Vec<Vec<u8>>,
    stream: WatchStream,
}

impl std::fmt::Debug for EtcdTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Place::Queued(place) => f
                .debug_struct("EtcdTicket")
                .field("key", &String::from_utf8_lossy(&place.key))
                .field("rev", &place.rev)
                .field(
                    "ahead",
                    &place.ahead.as_ref().map(|(keys, _)| {
                        keys.iter().map(|k| String::from_utf8_lossy(k).into_owned()).collect::<Vec<_>>()
                    }),
                )
                .finish(),
            Place::Reentry(reentry) => {
                f.debug_struct("EtcdTicket").field("reentering", &String::from_utf8_lossy(&reentry.key.key)).finish()
            }
        }
    }
}

/// Renewal answers, each for the hold at an index of the renewed batch.
type Answers = Vec<(usize, Result<Renewal, LockError>)>;

/// What the keys ahead of a request, as one read found them, say about it.
enum Verdict {
    /// The request holds.
    Holds,
    /// It waits; see [`Wait`].
    Waits(Wait),
    /// A `try_acquire` that found the lock busy: nothing was put.
    Refused,
}

/// What a waiting request waits for: the delete of one of `keys`. `partial` when more
/// keys ahead can let it in than it watches.
struct Wait {
    keys: Vec<Vec<u8>>,
    partial: bool,
}

impl Wait {
    /// Waiting for the delete of this key, if it is known.
    fn on(key: Option<KeyValue>) -> Verdict {
        Verdict::Waits(Wait { keys: key.map(|kv| kv.key().to_vec()).into_iter().collect(), partial: false })
    }

    /// When to look again without a notification: at once when there is nothing to
    /// watch, soon when the watch does not cover every key that can let us in.
    fn retry_after(&self) -> Option<Duration> {
        if self.keys.is_empty() {
            Some(Duration::ZERO)
        } else if self.partial {
            Some(PARTIAL_WATCH_POLL)
        } else {
            None
        }
    }
}

/// What one step of an attempt came to.
enum Step {
    Done(Attempt<EtcdHold>),
    /// The server said our key is gone (its lease expired or was revoked, or it was
    /// deleted): queue anew.
    Requeue,
}

impl SessionEvents for Shared {
    fn lease_gone(&self, lease: i64) {
        for signal in self.registry.signals_on_lease(lease) {
            signal.fire(LostReason::SessionExpired);
        }
    }
}

impl Shared {
    pub(crate) fn new(cluster: Cluster, prefix: String, op_timeout: Duration) -> Arc<Self> {
        let cluster = Arc::new(cluster);
        Arc::new_cyclic(|me: &Weak<Shared>| {
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
        })
    }

    pub(crate) fn dir(&self, name: &LockName) -> Vec<u8> {
        keys::lock_dir(&self.prefix, name)
    }

    /// A transaction that changes something (see [`Cluster::txn`]).
    async fn txn(&self, what: &str, txn: Txn) -> Result<TxnResponse, LockError> {
        self.cluster.txn(what, self.op_timeout, txn).await
    }

    /// A transaction that only reads, or whose guard makes a repeat harmless.
    pub(crate) async fn read(&self, what: &str, txn: Txn) -> Result<TxnResponse, LockError> {
        self.cluster.read(what, self.op_timeout, txn).await
    }

    /// The session a new request of this mode puts its key on.
    async fn session_for(&self, mode: LeaseMode) -> Result<Arc<Session>, LockError> {
        let secs = keys::ttl_secs(mode.ttl());
        match mode {
            LeaseMode::Watchdog { .. } => self.sessions.shared(secs).await,
            LeaseMode::Fixed(_) => self.sessions.private(secs).await,
        }
    }

    // ---- Acquire -------------------------------------------------------------------

    /// One attempt: re-enter a key this client holds for the owner, or put our key in
    /// the queue (the first time) and see whether it holds (later times).
    pub(crate) async fn attempt(
        &self,
        req: &Request,
        slot: &mut Option<EtcdTicket>,
    ) -> Result<Attempt<EtcdHold>, LockError> {
        let since = Instant::now();
        let dir = self.dir(&req.name);
        if let Some(key) = self.registry.find_owned(&dir, &req.owner, req.kind) {
            // The owner already holds this kind through this client: one more hold on
            // its key (a place of ours in the queue is no longer needed). An owner that
            // holds another kind queues like anyone else.
            if let Some(ticket) = slot.take() {
                self.abandon(req, ticket).await;
            }
            if let Some(granted) = self.reenter(req, &key, since, slot).await? {
                return Ok(granted);
            }
        }
        for _ in 0..LEASE_RETRIES {
            let queued = matches!(slot, Some(EtcdTicket(Place::Queued(QueuePlace { rev: Some(_), .. }))));
            let step = if queued {
                self.recheck(req, slot, since).await?
            } else {
                if let Some(uncertain) = slot.take() {
                    self.give_back(req, uncertain).await;
                }
                self.enqueue(req, &dir, slot, since).await?
            };
            match step {
                Step::Done(attempt) => return Ok(attempt),
                // The server said the key is gone: nothing of ours is left to delete.
                Step::Requeue => *slot = None,
            }
        }
        Err(LockError::unavailable("etcd: the lease kept disappearing under the request"))
    }

    /// The first attempt of a request: puts its key, in one transaction that takes the
    /// lock when nothing ahead is incompatible with it, and otherwise queues (reading
    /// the keys ahead to watch) or, for a `try_acquire`, puts nothing. A permit request
    /// always puts its key and reads the permit requests ahead: whether fewer than its
    /// number hold is no comparison etcd makes.
    async fn enqueue(
        &self,
        req: &Request,
        dir: &[u8],
        slot: &mut Option<EtcdTicket>,
        since: Instant,
    ) -> Result<Step, LockError> {
        let session = self.session_for(req.mode).await?;
        let key = keys::request_key(dir, req.kind, session.id(), self.seq.fetch_add(1, Ordering::Relaxed));
        let value = HoldValue::new(req.owner.clone(), vec![req.id.to_string()]);
        let txn = acquire_txn(dir, &key, session.id(), &value, req.kind, req.blocking);
        // Before the put is sent, so that whatever happens to the answer, the key is
        // given back if the attempt fails.
        *slot = Some(EtcdTicket(Place::Queued(QueuePlace {
            session: session.clone(),
            holds_on: None,
            dir: dir.to_vec(),
            key: key.clone(),
            kind: req.kind,
            rev: None,
            ahead: None,
            watch: None,
        })));
        // Along with the put, a keepalive (unless the last one covers the new hold's ttl):
        // the client counts the hold's validity from the attempt's start.
        let (alive, resp) = futures::join!(session.ensure(since, req.ttl()), self.txn("acquire", txn));
        let resp = match resp {
            Err(err) if is_lease_gone(&err) => {
                session.mark_gone();
                return Ok(Step::Requeue);
            }
            other => other?,
        };
        let rev = resp.header().map(|h| h.revision()).ok_or(EtcdError::Protocol("a transaction without a header"))?;
        let verdict = read_acquire(&resp, dir, &key, req.kind, req.blocking)?;
        if !matches!(verdict, Verdict::Refused) && !alive? {
            // The lease died around the put: the key went with it.
            return Ok(Step::Requeue);
        }
        let wait = match verdict {
            Verdict::Refused => {
                *slot = None;
                return Ok(Step::Done(Attempt::Busy { retry_after: None }));
            }
            Verdict::Holds => return Ok(Step::Done(self.granted(req, slot, rev)?)),
            Verdict::Waits(wait) => wait,
        };
        let Some(EtcdTicket(Place::Queued(place))) = slot.as_mut() else {
            return Err(EtcdError::Protocol("the ticket vanished").into());
        };
        place.rev = Some(rev);
        let retry_after = wait.retry_after();
        place.ahead = (!wait.keys.is_empty()).then_some((wait.keys, rev));
        tracing::debug!(rev, "queued");
        if !self.wait_on_short_lease(req, place, since).await? {
            return Ok(Step::Requeue);
        }
        Ok(Step::Done(Attempt::Busy { retry_after }))
    }

    /// Moves a waiting key from the request's own lease to the shared lease of the
    /// request's place lapse ([`Request::place_lapse`]), when that is shorter: a waiter
    /// that dies then keeps the keys behind it waiting for seconds, not for the ttl it
    /// asked for (up to a year with a `Fixed` lease). The key moves back once it holds.
    /// `false` when the key is gone.
    async fn wait_on_short_lease(
        &self,
        req: &Request,
        place: &mut QueuePlace,
        since: Instant,
    ) -> Result<bool, LockError> {
        let secs = keys::ttl_secs(req.place_lapse());
        if place.holds_on.is_some() || secs >= keys::ttl_secs(place.session.ttl()) {
            return Ok(true);
        }
        let short = self.sessions.shared(secs).await?;
        if !self.move_waiting_key(place, &short, since, short.ttl()).await? {
            return Ok(false);
        }
        place.holds_on = Some(std::mem::replace(&mut place.session, short));
        Ok(true)
    }

    /// Moves a queued key, value and create revision kept, to the lease of `to`, which is
    /// kept alive for `need` from `since` alongside. `false` when the key is gone. On an
    /// error the key may be on either lease: the ticket's give-back deletes it by name.
    async fn move_waiting_key(
        &self,
        place: &QueuePlace,
        to: &Arc<Session>,
        since: Instant,
        need: Duration,
    ) -> Result<bool, LockError> {
        let Some(rev) = place.rev else { return Err(EtcdError::Protocol("moving a key not yet queued").into()) };
        let put = PutOptions::new().with_lease(to.id()).with_ignore_value();
        let txn = Txn::new()
            .when([Compare::create_revision(place.key.clone(), CompareOp::Equal, rev)])
            .and_then([TxnOp::put(place.key.clone(), Vec::new(), Some(put))]);
        // A repeat moves it to the same lease again.
        let (alive, resp) = futures::join!(to.ensure(since, need), self.read("move a waiting key", txn));
        let resp = match resp {
            Err(err) if is_lease_gone(&err) => {
                to.mark_gone();
                return Err(err);
            }
            other => other?,
        };
        if !resp.succeeded() {
            return Ok(false);
        }
        if !alive? {
            return Err(LockError::unavailable("etcd: the lease of a waiting key expired as it moved"));
        }
        Ok(true)
    }

    /// A later attempt of a queued request: in one read, whether our key still exists
    /// and which keys ahead of it keep it waiting, with a keepalive alongside. A waiter
    /// whose key or lease went away while it waited (etcd#11456) never takes the lock for
    /// that: it queues again, at the back.
    async fn recheck(&self, req: &Request, slot: &mut Option<EtcdTicket>, since: Instant) -> Result<Step, LockError> {
        let Some(EtcdTicket(Place::Queued(place))) = slot.as_mut() else { return Ok(Step::Requeue) };
        let Some(rev) = place.rev else { return Ok(Step::Requeue) };
        let mut reads = vec![TxnOp::get(place.key.clone(), Some(GetOptions::new().with_keys_only()))];
        reads.extend(ahead_reads(&place.dir, place.kind, rev));
        let txn = Txn::new().and_then(reads);
        let (alive, resp) = futures::join!(place.session.ensure(since, req.ttl()), self.read("acquire", txn));
        let resp = resp?;
        if !alive? {
            tracing::debug!(rev, "the waiter's lease is gone; queueing again");
            return Ok(Step::Requeue);
        }
        if first_kv(&resp, 0).is_none_or(|kv| kv.create_revision() != rev) {
            tracing::debug!(rev, "the waiter's key is gone; queueing again");
            return Ok(Step::Requeue);
        }
        let seen = resp.header().map(|h| h.revision()).ok_or(EtcdError::Protocol("a transaction without a header"))?;
        // Past the read of our own key.
        let ahead = resp.op_responses().into_iter().skip(1);
        match read_ahead(ahead, &place.dir, &place.key, place.kind)? {
            Verdict::Holds => {
                if let Some(mut own) = place.holds_on.take() {
                    // Back to a lease of the request's own: a fresh one if its own went
                    // while the key waited elsewhere.
                    for retry in 0..2 {
                        if own.is_gone() {
                            own = self.session_for(req.mode).await?;
                        }
                        match self.move_waiting_key(place, &own, since, req.ttl()).await {
                            Ok(true) => break,
                            Ok(false) => return Ok(Step::Requeue),
                            Err(err) if retry == 0 && is_lease_gone(&err) => {}
                            Err(err) => return Err(err),
                        }
                    }
                    place.session = own;
                }
                Ok(Step::Done(self.granted(req, slot, rev)?))
            }
            Verdict::Waits(wait) => {
                let retry_after = wait.retry_after();
                place.ahead = (!wait.keys.is_empty()).then_some((wait.keys, seen));
                Ok(Step::Done(Attempt::Busy { retry_after }))
            }
            Verdict::Refused => Err(EtcdError::Protocol("a queued request was refused").into()),
        }
    }

    /// Our key holds: the ticket becomes a hold.
    fn granted(&self, req: &Request, slot: &mut Option<EtcdTicket>, rev: i64) -> Result<Attempt<EtcdHold>, LockError> {
        let Some(EtcdTicket(Place::Queued(place))) = slot.take() else {
            return Err(EtcdError::Protocol("the ticket vanished").into());
        };
        let value = HoldValue::new(req.owner.clone(), vec![req.id.to_string()]);
        let key = KeyState::new(place.dir, place.key, place.kind, rev, value, place.session);
        self.registry.insert_key(&key);
        tracing::debug!(token = rev, "granted");
        Ok(Attempt::Granted { hold: EtcdHold::new(key, req.id.to_string()), token: token_of(rev) })
    }

    /// Waits for a key ahead that we watch to be deleted, keeping our lease alive
    /// meanwhile.
    ///
    /// The watches start at the revision of the read that found the keys ahead, so no
    /// delete is missed. A broken watch is opened again from the same revision, so a
    /// waiter rides out an election or a member going down. It gives up waiting (and lets
    /// the next check decide) only once its lease may have expired while etcd could not
    /// be reached.
    pub(crate) async fn wait(
        &self,
        slot: &mut Option<EtcdTicket>,
        until: tokio::time::Instant,
    ) -> Result<(), LockError> {
        let until = until.into_std();
        let Some(EtcdTicket(Place::Queued(place))) = slot.as_mut() else {
            tokio::time::sleep_until(until.into()).await;
            return Ok(());
        };
        let Some((ahead, seen)) = place.ahead.clone() else {
            // Nothing to watch: check again shortly.
            tokio::time::sleep_until(until.min(Instant::now() + Duration::from_millis(100)).into()).await;
            return Ok(());
        };
        let session = place.session.clone();
        let mut watch = place.watch.take().filter(|w| w.keys == ahead);
        let mut next_keepalive = session.keepalive_due();
        let mut next_watch = Instant::now();
        loop {
            let now = Instant::now();
            if now >= until {
                place.watch = watch;
                return Ok(());
            }
            if watch.is_none() && now >= next_watch {
                match self.watch_deletes(&ahead, seen).await {
                    Ok(stream) => watch = Some(Box::new(AheadWatch { keys: ahead.clone(), stream })),
                    Err(err) => {
                        if Instant::now() >= session.alive_until() {
                            return Ok(());
                        }
                        tracing::debug!(%err, "watching the keys ahead failed; trying again");
                        next_watch = Instant::now() + REWATCH;
                    }
                }
                continue;
            }
            let timer = until.min(next_keepalive).min(if watch.is_none() { next_watch } else { until });
            let woke = tokio::select! {
                message = next_message(&mut watch) => Some(message),
                _ = tokio::time::sleep_until(timer.into()) => None,
            };
            match woke {
                // The watch was created, or a progress report: nothing happened yet.
                Some(Ok(Some(resp))) if !resp.canceled() && resp.events().is_empty() => {}
                // A key ahead was deleted.
                Some(Ok(Some(resp))) if !resp.canceled() => return Ok(()),
                // The history since our read was compacted away: read the queue again.
                Some(Ok(Some(resp))) if resp.compact_revision() > 0 => return Ok(()),
                // Cancelled by the server (no leader) or broken: open it again.
                Some(_) => {
                    watch = None;
                    if Instant::now() >= session.alive_until() {
                        return Ok(());
                    }
                    next_watch = Instant::now() + REWATCH;
                }
                None if Instant::now() >= next_keepalive => {
                    let now = Instant::now();
                    match tokio::time::timeout(self.op_timeout, session.ensure(now, session.ttl())).await {
                        Ok(Ok(true)) => next_keepalive = session.keepalive_due().max(now + Duration::from_millis(10)),
                        // Our key went with the lease: the next check queues us again.
                        Ok(Ok(false)) => return Ok(()),
                        Ok(Err(err)) => {
                            tracing::debug!(%err, "keeping the waiter's lease alive failed; still waiting");
                            next_keepalive = now + REWATCH;
                        }
                        Err(_) => {
                            tracing::debug!("keeping the waiter's lease alive timed out; still waiting");
                            next_keepalive = now + REWATCH;
                        }
                    }
                }
                None => {}
            }
        }
    }

    /// One watch stream with a watch on the deletes of each of `keys` after `seen`: one
    /// stream per waiter, however many keys it watches.
    async fn watch_deletes(&self, keys: &[Vec<u8>], seen: i64) -> Result<WatchStream, LockError> {
        let options = WatchOptions::new().with_start_revision(seen + 1).with_filters([WatchFilterType::NoPut]);
        let Some((first, rest)) = keys.split_first() else {
            return Err(EtcdError::Protocol("a waiter with nothing to watch").into());
        };
        let mut stream = self.cluster.watch(self.op_timeout, first.clone(), options.clone()).await?;
        for key in rest {
            stream.watch(key.clone(), Some(options.clone())).await.map_err(map_err)?;
        }
        Ok(stream)
    }

    /// A re-entrant acquire of a key this client holds for the same owner: one more
    /// hold named in its value, on a lease that lasts the request's ttl. `None` when the
    /// key turned out gone.
    async fn reenter(
        &self,
        req: &Request,
        key: &Arc<KeyState>,
        since: Instant,
        slot: &mut Option<EtcdTicket>,
    ) -> Result<Option<Attempt<EtcdHold>>, LockError> {
        let current = key.session();
        let target = if current.ttl() < req.ttl() { Some(self.session_for(req.mode).await?) } else { None };
        // Before the change is sent: if its answer is lost, `give_back` finds this
        // request's hold by its id, and the lease the key may have moved to is kept.
        *slot = Some(EtcdTicket(Place::Reentry(Reentry { key: key.clone(), target: target.clone() })));
        let lease = target.as_ref().unwrap_or(&current);
        for _ in 0..CAS_ROUNDS {
            let seen = key.value();
            let mut next = seen.clone();
            next.holds.push(req.id.to_string());
            let put = match &target {
                Some(s) => PutOptions::new().with_lease(s.id()),
                None => PutOptions::new().with_ignore_lease(),
            };
            // Still our key, with the holds we saw: add ours.
            let txn = Txn::new()
                .when(unchanged(key, &seen))
                .and_then([TxnOp::put(key.key.clone(), next.encode(), Some(put))])
                .or_else([TxnOp::get(key.key.clone(), None)]);
            let (alive, resp) = futures::join!(lease.ensure(since, req.ttl()), self.txn("re-entrant acquire", txn));
            let resp = match resp {
                Err(err) if is_lease_gone(&err) => {
                    // Refused as a whole: nothing was applied.
                    *slot = None;
                    lease.mark_gone();
                    if target.is_some() {
                        return Err(err);
                    }
                    // The key went with its lease.
                    key.set_gone();
                    return Ok(None);
                }
                // The ticket stays in the slot for `give_back`.
                Err(err) => return Err(err),
                Ok(resp) => resp,
            };
            if resp.succeeded() {
                key.set_value(next);
                if let Some(target) = &target {
                    key.set_session(target.clone());
                }
                match alive {
                    Ok(true) => {}
                    Ok(false) => {
                        *slot = None;
                        key.set_gone();
                        return Ok(None);
                    }
                    // The hold exists but its lease may not last: the ticket stays in the
                    // slot, and `give_back` removes the hold again.
                    Err(err) => return Err(err),
                }
                *slot = None;
                tracing::debug!(count = key.value().count(), "re-entrant acquire");
                let hold = EtcdHold::new(key.clone(), req.id.to_string());
                return Ok(Some(Attempt::Granted { hold, token: token_of(key.token) }));
            }
            match current_kv(key, &resp)? {
                Some(kv) => self.adopt(key, &kv)?,
                None => {
                    *slot = None;
                    key.set_gone();
                    return Ok(None);
                }
            }
        }
        Err(LockError::backend(EtcdError::Protocol("the holds kept changing under a re-entrant acquire")))
    }

    // ---- Giving back ------------------------------------------------------------------

    /// Undoes what an attempt whose outcome is unknown may have done: its re-entry
    /// (found by the request id in the key's value), or its key in the queue (marked
    /// given back first, so that a put still on its way applies no more).
    pub(crate) async fn give_back(&self, req: &Request, ticket: EtcdTicket) {
        match ticket.0 {
            Place::Reentry(Reentry { key, target }) => {
                if let Some(target) = target {
                    // The key may be on it now: it must outlive the key, not be revoked.
                    key.add_spare(target);
                }
                match self.remove_hold(&key, req.id.as_str()).await {
                    Ok(Release::Released) => tracing::debug!("an ambiguous re-entry was given back"),
                    Ok(_) => {}
                    Err(err) => {
                        tracing::debug!(%err, "giving back an ambiguous re-entry failed; retrying in the background");
                        self.remove_in_background(key, req.id.to_string());
                    }
                }
            }
            Place::Queued(place) => self.leave_queue(place).await,
        }
    }

    /// Gives up a waiter's place (a timeout, a `try_acquire`, a cancellation).
    pub(crate) async fn abandon(&self, req: &Request, ticket: EtcdTicket) {
        self.give_back(req, ticket).await;
    }

    /// Deletes our key from the queue (or revokes a private lease, which takes the key
    /// with it, and fails any put still on its way).
    async fn leave_queue(&self, place: QueuePlace) {
        let QueuePlace { session, dir, key, rev, watch, .. } = place;
        drop(watch);
        if session.is_private() {
            if self.cluster.revoke(self.op_timeout, session.id()).await.is_ok() {
                session.mark_gone();
            }
            return;
        }
        let txn = if rev.is_some() {
            Txn::new().and_then([TxnOp::delete(key, None)])
        } else {
            // The put's answer never came: it may have landed, or land later.
            let marker = keys::given_back_key(&dir, &key);
            Txn::new().and_then([
                TxnOp::put(marker, Vec::new(), Some(PutOptions::new().with_lease(session.id()))),
                TxnOp::delete(key, None),
            ])
        };
        let cluster = self.cluster.clone();
        let limit = self.op_timeout;
        let leave = move || {
            let (cluster, txn) = (cluster.clone(), txn.clone());
            async move {
                match cluster.read("leave the queue", limit, txn).await {
                    // The lease is gone, and our key with it.
                    Err(err) if is_lease_gone(&err) => Ok(()),
                    other => other.map(drop),
                }
            }
        };
        if let Err(err) = leave().await {
            tracing::debug!(%err, "deleting a waiter's key failed; retrying in the background");
            // The key may stay behind on a lease other holds keep alive: no new request
            // goes on that lease.
            session.retire();
            retry_in_background(session, leave);
        }
    }

    // ---- Release ------------------------------------------------------------------------

    pub(crate) async fn release(&self, hold: &EtcdHold) -> Result<Release, LockError> {
        if !hold.take_release() {
            return Ok(Release::NotHeld);
        }
        self.release_or_retry(hold).await
    }

    /// Removes the hold from its key, and when that fails keeps trying in the background
    /// while the key's lease lives (the removal is named by the hold's id, so a repeat
    /// never removes another hold).
    async fn release_or_retry(&self, hold: &EtcdHold) -> Result<Release, LockError> {
        let key = hold.key().clone();
        match self.remove_hold(&key, hold.id()).await {
            Ok(release) => Ok(release),
            Err(err) => {
                // The key may stay behind on a lease other holds keep alive: no new
                // request goes on that lease.
                key.session().retire();
                self.remove_in_background(key, hold.id().to_string());
                Err(err)
            }
        }
    }

    fn remove_in_background(&self, key: Arc<KeyState>, id: String) {
        let Some(me) = self.me.upgrade() else { return };
        let session = key.session();
        retry_in_background(session, move || {
            let (me, key, id) = (me.clone(), key.clone(), id.clone());
            async move { me.remove_hold(&key, &id).await.map(drop) }
        });
    }

    /// Removes the hold `id` from the key's value; the key goes with its last hold.
    /// `NotHeld` when the key is gone or the hold is not in it (any more).
    async fn remove_hold(&self, key: &Arc<KeyState>, id: &str) -> Result<Release, LockError> {
        let mut fresh = false;
        for _ in 0..CAS_ROUNDS {
            if key.is_gone() {
                return Ok(Release::NotHeld);
            }
            let seen = key.value();
            if !seen.holds.iter().any(|h| h == id) {
                if fresh {
                    return Ok(Release::NotHeld);
                }
                // What we saw may be stale (an answer was lost): read the key.
                let resp =
                    self.read("read a held key", Txn::new().and_then([TxnOp::get(key.key.clone(), None)])).await?;
                match first_kv(&resp, 0).filter(|kv| kv.create_revision() == key.token) {
                    Some(kv) => self.adopt(key, &kv)?,
                    None => key.set_gone(),
                }
                fresh = true;
                continue;
            }
            let mut next = seen.clone();
            next.holds.retain(|h| h != id);
            let op = if next.holds.is_empty() {
                TxnOp::delete(key.key.clone(), None)
            } else {
                TxnOp::put(key.key.clone(), next.encode(), Some(PutOptions::new().with_ignore_lease()))
            };
            // Still our key, with the holds we saw: a repeat of this request finds them
            // changed and removes nothing more.
            let txn =
                Txn::new().when(unchanged(key, &seen)).and_then([op]).or_else([TxnOp::get(key.key.clone(), None)]);
            let resp = self.read("release", txn).await?;
            if resp.succeeded() {
                if next.holds.is_empty() {
                    key.set_gone();
                } else {
                    key.set_value(next);
                }
                return Ok(Release::Released);
            }
            match current_kv(key, &resp)? {
                Some(kv) => self.adopt(key, &kv)?,
                None => {
                    key.set_gone();
                    return Ok(Release::NotHeld);
                }
            }
            fresh = true;
        }
        Err(LockError::backend(EtcdError::Protocol("the holds kept changing under a release")))
    }

    /// Takes what the server shows of our key as the truth: its holds, and its lease when
    /// that is one the key may have moved to.
    pub(crate) fn adopt(&self, key: &KeyState, kv: &KeyValue) -> Result<(), LockError> {
        let value = HoldValue::decode(kv.key(), kv.value())?;
        if value.owner != key.owner {
            return Err(EtcdError::MalformedValue { key: String::from_utf8_lossy(kv.key()).into_owned() }.into());
        }
        key.set_value(value);
        if let Some(session) = key.known_lease(kv.lease()) {
            key.set_session(session);
        }
        Ok(())
    }

    // ---- Renewal ------------------------------------------------------------------------

    /// Renews holds due together: per lease, one keepalive and one check of all its keys
    /// (see [`Session::renew_many`]); holds asking for a longer ttl move to a longer lease.
    pub(crate) async fn renew_many(&self, holds: &[&EtcdHold], ttl: Duration) -> Vec<Result<Renewal, LockError>> {
        let since = Instant::now();
        let mut answers: Vec<Option<Result<Renewal, LockError>>> = holds.iter().map(|_| None).collect();
        let mut groups: HashMap<i64, (Arc<Session>, Vec<usize>)> = HashMap::new();
        let mut work: Vec<BoxFuture<'_, Answers>> = Vec::new();
        for (i, hold) in holds.iter().enumerate() {
            let key = hold.key();
            if hold.is_released() || key.is_gone() {
                answers[i] = Some(Ok(Renewal::Lost(LostReason::Expired)));
                continue;
            }
            let session = key.session();
            if ttl > session.ttl() {
                let key = key.clone();
                work.push(
                    async move { vec![(i, self.move_to_longer_lease(&key, &session, ttl, since).await)] }.boxed(),
                );
            } else {
                groups.entry(session.id()).or_insert_with(|| (session, Vec::new())).1.push(i);
            }
        }
        for (_, (session, members)) in groups {
            work.push(self.renew_on(session, members, holds, ttl, since).boxed());
        }
        for (i, answer) in futures::future::join_all(work).await.into_iter().flatten() {
            answers[i] = Some(answer);
        }
        self.sweep_lost();
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(EtcdError::Protocol("a renewal went unanswered").into())))
            .collect()
    }

    /// The renewals of the holds `members` (indices into `holds`), all on `session`.
    async fn renew_on(
        &self,
        session: Arc<Session>,
        members: Vec<usize>,
        holds: &[&EtcdHold],
        ttl: Duration,
        since: Instant,
    ) -> Answers {
        let checks: Vec<Check> =
            members.iter().map(|&i| Check { key: holds[i].key().key.clone(), token: holds[i].key().token }).collect();
        let found = match session.renew_many(since, ttl, &checks).await {
            Ok(found) => found,
            Err(err) => {
                // One failure for the whole group: the first renewal gets the error
                // itself, the others a copy of it.
                let (transient, why) = (err.is_transient(), err.to_string());
                let copy = || {
                    if transient {
                        LockError::unavailable(why.clone())
                    } else {
                        LockError::backend(EtcdError::Round(why.clone()))
                    }
                };
                let mut first = Some(err);
                return members.into_iter().map(|i| (i, Err(first.take().unwrap_or_else(copy)))).collect();
            }
        };
        let mut answers = Vec::with_capacity(members.len());
        for (n, i) in members.into_iter().enumerate() {
            let key = holds[i].key();
            let answer = match found.as_ref().map(|f| f[n]) {
                None => {
                    key.set_gone();
                    Ok(Renewal::Lost(LostReason::SessionExpired))
                }
                Some(Found::Gone) => {
                    key.set_gone();
                    Ok(Renewal::Lost(LostReason::Expired))
                }
                Some(Found::On(lease)) if lease == session.id() => Ok(Renewal::Renewed),
                // The key moved to another lease by a request whose answer was lost.
                Some(Found::On(lease)) => match key.known_lease(lease) {
                    Some(moved) => {
                        key.set_session(moved.clone());
                        match moved.ensure(since, ttl).await {
                            Ok(true) => Ok(Renewal::Renewed),
                            Ok(false) => {
                                key.set_gone();
                                Ok(Renewal::Lost(LostReason::SessionExpired))
                            }
                            Err(err) => Err(err),
                        }
                    }
                    None => {
                        key.set_gone();
                        Ok(Renewal::Lost(LostReason::Expired))
                    }
                },
            };
            answers.push((i, answer));
        }
        answers
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
        // Still our key: move it (a repeat moves it to the same lease again).
        let txn = Txn::new().when([Compare::create_revision(key.key.clone(), CompareOp::Equal, key.token)]).and_then([
            TxnOp::put(
                key.key.clone(),
                Vec::new(),
                Some(PutOptions::new().with_lease(target.id()).with_ignore_value()),
            ),
        ]);
        let (alive, resp) = futures::join!(target.ensure(since, ttl), self.read("extend", txn));
        let resp = match resp {
            Ok(resp) => resp,
            Err(err) => {
                // The key may be on the new lease now: never let that lease go while the
                // key lives; the next read of the key tells where it is.
                key.add_spare(target);
                return Err(err);
            }
        };
        if !resp.succeeded() {
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

    /// Gives back the holds the client counts as lost while they were not released (a
    /// lease kept past `max_hold`, renewals that failed until the validity ended): other
    /// holds renewing the same lease would keep their keys alive.
    fn sweep_lost(&self) {
        let lost = self.registry.lost_unreleased();
        if lost.is_empty() {
            return;
        }
        let Some(me) = self.me.upgrade() else { return };
        tokio::spawn(async move {
            for hold in lost {
                if hold.take_release() {
                    tracing::debug!(key = %String::from_utf8_lossy(hold.lock_key()), "giving back a lost hold");
                    if let Err(err) = me.release_or_retry(&hold).await {
                        tracing::debug!(%err, "giving back a lost hold failed; retrying in the background");
                    }
                }
            }
        });
    }

    // ---- Inspect ------------------------------------------------------------------------

    pub(crate) async fn inspect(&self, name: &LockName) -> Result<LockInfo, LockError> {
        let dir = self.dir(name);
        // The first key, and how many there are, in one read.
        let first = GetOptions::new().with_prefix().with_sort(SortTarget::Create, SortOrder::Ascend).with_limit(1);
        let txn = Txn::new().and_then([
            TxnOp::get(dir.clone(), Some(first)),
            TxnOp::get(dir.clone(), Some(GetOptions::new().with_prefix().with_count_only())),
        ]);
        let resp = self.read("inspect", txn).await?;
        let ops = resp.op_responses();
        let (Some(TxnOpResponse::Get(first)), Some(TxnOpResponse::Get(all))) = (ops.first(), ops.get(1)) else {
            return Err(EtcdError::Protocol("inspect answered too few reads").into());
        };
        let Some(first) = first.kvs().first() else {
            return Ok(LockInfo { holder: None, waiters: Some(0) });
        };
        let queued = usize::try_from(all.count()).unwrap_or(usize::MAX);
        // An exclusive key holds alone. Readers and permits hold in a run of keys at the
        // front, which takes a read of the queue to find; the newest of them is shown,
        // as the memory model shows its newest hold.
        let (kv, queued, holding) = if keys::kind_of(&dir, first.key())? == HoldKind::Exclusive {
            (first.clone(), queued, 1)
        } else {
            let every = GetOptions::new().with_prefix().with_sort(SortTarget::Create, SortOrder::Ascend);
            let queue = self.cluster.get("inspect", self.op_timeout, dir.clone(), every).await?;
            let kinds = queue.kvs().iter().map(|kv| keys::kind_of(&dir, kv.key())).collect::<Result<Vec<_>, _>>()?;
            let holding = holding(&kinds);
            match holding.checked_sub(1).and_then(|newest| queue.kvs().get(newest)) {
                Some(kv) => (kv.clone(), kinds.len(), holding),
                // Released meanwhile.
                None => return Ok(LockInfo { holder: None, waiters: Some(0) }),
            }
        };
        let value = HoldValue::decode(kv.key(), kv.value())?;
        let remaining = if kv.lease() != 0 {
            let ttl = self.cluster.time_to_live(self.op_timeout, kv.lease()).await?;
            Some(Duration::from_secs(u64::try_from(ttl).unwrap_or(0)))
        } else {
            None
        };
        let waiting = queued.saturating_sub(holding);
        Ok(LockInfo {
            holder: Some(Holder {
                count: value.count(),
                owner: value.owner,
                token: token_of(kv.create_revision()),
                remaining,
            }),
            waiters: Some(waiting),
        })
    }
}

/// The transaction that puts a request's key: it takes the lock when no key in the
/// range is incompatible with the request, and otherwise queues (blocking) or puts
/// nothing (`try_acquire`). For a permit request, "takes" means it reads the permit
/// requests ahead to count them.
fn acquire_txn(dir: &[u8], key: &[u8], lease: i64, value: &HoldValue, kind: HoldKind, blocking: bool) -> Txn {
    let put = TxnOp::put(key.to_vec(), value.encode(), Some(PutOptions::new().with_lease(lease)));
    // Nobody gave this request back: a put that reaches etcd after its caller gave up
    // on it (and marked it given back) applies no more.
    let not_given_back = Compare::create_revision(keys::given_back_key(dir, key), CompareOp::Equal, 0);
    // Nobody holds or waits whom the request must wait for (for an exclusive request,
    // nobody at all).
    let free = keys::blocker_ranges(dir, kind)
        .into_iter()
        .map(|(start, end)| Compare::create_revision(start, CompareOp::Equal, 0).with_range(end));
    let take = match kind {
        HoldKind::Permit { permits } => {
            // Ours and the `permits` newest ahead of it: more need not be read to know
            // that we are not in.
            let (start, end) = keys::permit_range(dir);
            let newest = GetOptions::new()
                .with_range(end)
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(i64::from(permits) + 1)
                .with_keys_only();
            vec![put.clone(), TxnOp::get(start, Some(newest))]
        }
        HoldKind::Exclusive | HoldKind::Shared => vec![put.clone()],
    };
    if blocking {
        // Busy: queue anyway, and read the key to watch: for an exclusive request the
        // two newest keys (ours, and the one just ahead of us), for the others the last
        // key of each range that holds them back.
        let mut queue = vec![put];
        match kind {
            HoldKind::Exclusive => {
                let newest = GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Descend)
                    .with_limit(2)
                    .with_keys_only();
                queue.push(TxnOp::get(dir.to_vec(), Some(newest)));
            }
            HoldKind::Shared | HoldKind::Permit { .. } => {
                queue.extend(keys::blocker_ranges(dir, kind).into_iter().map(|range| last_in(range, None)));
            }
        }
        let take_or_queue = Txn::new().when(free.collect::<Vec<_>>()).and_then(take).or_else(queue);
        Txn::new().when([not_given_back]).and_then([TxnOp::txn(take_or_queue)])
    } else {
        // A try_acquire puts nothing on a busy lock.
        Txn::new().when(std::iter::once(not_given_back).chain(free).collect::<Vec<_>>()).and_then(take)
    }
}

/// The read of the newest key in `[start, end)`, of those created before `before` when
/// it is given.
fn last_in((start, end): (Vec<u8>, Vec<u8>), before: Option<i64>) -> TxnOp {
    let mut options = GetOptions::new()
        .with_range(end)
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(1)
        .with_keys_only();
    if let Some(rev) = before {
        options = options.with_max_create_revision(rev - 1);
    }
    TxnOp::get(start, Some(options))
}

/// The reads of a queued request's later attempts, after the read of its own key: what
/// is ahead of the key of create revision `rev` that may keep it waiting.
fn ahead_reads(dir: &[u8], kind: HoldKind, rev: i64) -> Vec<TxnOp> {
    match kind {
        HoldKind::Exclusive => {
            let ahead = GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_max_create_revision(rev - 1)
                .with_limit(1)
                .with_keys_only();
            vec![TxnOp::get(dir.to_vec(), Some(ahead))]
        }
        HoldKind::Shared => {
            keys::blocker_ranges(dir, kind).into_iter().map(|range| last_in(range, Some(rev))).collect()
        }
        HoldKind::Permit { permits } => {
            let mut reads: Vec<TxnOp> =
                keys::blocker_ranges(dir, kind).into_iter().map(|range| last_in(range, Some(rev))).collect();
            let (start, end) = keys::permit_range(dir);
            let newest = GetOptions::new()
                .with_range(end)
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_max_create_revision(rev - 1)
                .with_limit(i64::from(permits))
                .with_keys_only();
            reads.push(TxnOp::get(start, Some(newest)));
            reads
        }
    }
}

/// What the answer of [`acquire_txn`] says about the request of key `key`.
fn read_acquire(
    resp: &TxnResponse,
    dir: &[u8],
    key: &[u8],
    kind: HoldKind,
    blocking: bool,
) -> Result<Verdict, LockError> {
    let (free, ops) = if blocking {
        if !resp.succeeded() {
            return Err(EtcdError::Protocol("a request was given back while it was being sent").into());
        }
        match resp.op_responses().into_iter().next() {
            Some(TxnOpResponse::Txn(inner)) => (inner.succeeded(), inner.op_responses()),
            _ => return Err(EtcdError::Protocol("the acquire's inner transaction is missing").into()),
        }
    } else if resp.succeeded() {
        (true, resp.op_responses())
    } else {
        return Ok(Verdict::Refused);
    };
    // The reads come after our put.
    let mut reads = ops.into_iter().skip(1);
    match (kind, free) {
        (HoldKind::Permit { permits }, true) => permit_verdict(dir, key, permits, &next_kvs(&mut reads)?),
        (_, true) => Ok(Verdict::Holds),
        (HoldKind::Exclusive, false) => match next_kvs(&mut reads)?.as_slice() {
            // Newest first: ours, then the one ahead of us (there is one: the range was
            // not empty).
            [ours, ahead] if ours.key() == key => Ok(Wait::on(Some(ahead.clone()))),
            _ => Ok(Wait::on(None)),
        },
        (HoldKind::Shared | HoldKind::Permit { .. }, false) => Ok(Wait::on(last_blocker(&mut reads)?)),
    }
}

/// What the reads of [`ahead_reads`] say about the request of key `key`.
fn read_ahead(
    mut reads: impl Iterator<Item = TxnOpResponse>,
    dir: &[u8],
    key: &[u8],
    kind: HoldKind,
) -> Result<Verdict, LockError> {
    let blocker = last_blocker(&mut reads.by_ref().take(match kind {
        HoldKind::Exclusive => 1,
        HoldKind::Shared | HoldKind::Permit { .. } => 2,
    }))?;
    match (kind, blocker) {
        (_, Some(blocker)) => Ok(Wait::on(Some(blocker))),
        (HoldKind::Permit { permits }, None) => permit_verdict(dir, key, permits, &next_kvs(&mut reads)?),
        (_, None) => Ok(Verdict::Holds),
    }
}

/// The keys the next read of a transaction found.
fn next_kvs(reads: &mut impl Iterator<Item = TxnOpResponse>) -> Result<Vec<KeyValue>, LockError> {
    match reads.next() {
        Some(TxnOpResponse::Get(mut get)) => Ok(get.take_kvs()),
        _ => Err(EtcdError::Protocol("the queue read is missing").into()),
    }
}

/// The newest of the keys that every read left in `reads` found.
fn last_blocker(reads: &mut impl Iterator<Item = TxnOpResponse>) -> Result<Option<KeyValue>, LockError> {
    let mut last: Option<KeyValue> = None;
    for read in reads {
        let TxnOpResponse::Get(mut get) = read else {
            return Err(EtcdError::Protocol("the queue read is missing").into());
        };
        for kv in get.take_kvs() {
            if last.as_ref().is_none_or(|l| kv.create_revision() > l.create_revision()) {
                last = Some(kv);
            }
        }
    }
    Ok(last)
}

/// Whether a permit request of key `own` for `permits` holds, with only permit requests
/// ahead of it: `newest_first` are they (and ours, which is skipped), read up to
/// `permits` of them. When it waits, it watches them all: the request is in only once
/// one of them is gone (if they are `permits`, it needs fewer ahead; if fewer, one of
/// them waits, and holds only once one ahead of it is gone).
fn permit_verdict(dir: &[u8], own: &[u8], permits: u32, newest_first: &[KeyValue]) -> Result<Verdict, LockError> {
    let ahead: Vec<&KeyValue> = newest_first.iter().filter(|kv| kv.key() != own).collect();
    let mut kinds = ahead.iter().rev().map(|kv| keys::kind_of(dir, kv.key())).collect::<Result<Vec<_>, _>>()?;
    kinds.push(HoldKind::Permit { permits });
    if holding(&kinds) == kinds.len() {
        return Ok(Verdict::Holds);
    }
    Ok(Verdict::Waits(Wait {
        keys: ahead.iter().take(WATCH_CAP).map(|kv| kv.key().to_vec()).collect(),
        partial: ahead.len() > WATCH_CAP,
    }))
}

/// How many of a queue's keys, of these kinds and oldest first, hold: the one grant rule
/// of every backend ([`HoldKind::granted_prefix`]). A key never holds before one older
/// than it: grants follow the queue.
fn holding(kinds: &[HoldKind]) -> usize {
    HoldKind::granted_prefix(kinds)
}

/// The guard of a change to a held key: still ours, and still with the holds we saw.
fn unchanged(key: &KeyState, seen: &HoldValue) -> Vec<Compare> {
    vec![
        Compare::create_revision(key.key.clone(), CompareOp::Equal, key.token),
        Compare::value(key.key.clone(), CompareOp::Equal, seen.encode()),
    ]
}

/// The held key from the `get` of a failed guarded transaction, if it still is ours.
fn current_kv(key: &KeyState, resp: &TxnResponse) -> Result<Option<KeyValue>, LockError> {
    let ops = resp.op_responses();
    let Some(TxnOpResponse::Get(get)) = ops.first() else {
        return Err(EtcdError::Protocol("a guarded transaction answered no read").into());
    };
    Ok(get.kvs().first().filter(|kv| kv.create_revision() == key.token).cloned())
}

async fn next_message(
    watch: &mut Option<Box<AheadWatch>>,
) -> Result<Option<etcd_client::WatchResponse>, etcd_client::Error> {
    match watch {
        Some(watch) => watch.stream.message().await,
        None => std::future::pending().await,
    }
}

/// Retries `op`, with a pause doubling from 100 ms to a third of the session's ttl, until
/// it succeeds or the session's lease may be gone (nobody keeps it alive any more: it
/// expires and takes its keys along).
fn retry_in_background<F, Fut>(session: Arc<Session>, op: F)
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), LockError>> + Send + 'static,
{
    tokio::spawn(async move {
        let longest = (session.ttl() / 3).max(CLEANUP_FIRST);
        let mut pause = CLEANUP_FIRST;
        loop {
            tokio::time::sleep(pause).await;
            if session.is_gone() || Instant::now() > session.alive_until() {
                return;
            }
            match op().await {
                Ok(()) => return,
                Err(err) => tracing::debug!(%err, "background clean-up failed; retrying"),
            }
            pause = (pause * 2).min(longest);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_core::OwnerId;
    use dlock_testkit::supervisor::etcd::{EtcdConfig, EtcdServer};
    use etcd_client::ConnectOptions;

    /// Keys hold in queue order: a run at the front of compatible kinds, each admitted
    /// beside those before it, as the memory model admits them.
    #[test]
    fn keys_hold_in_queue_order() {
        use HoldKind::{Exclusive as W, Shared as R};
        let p = |permits| HoldKind::Permit { permits };
        let cases: [(&[HoldKind], usize); 15] = [
            (&[], 0),
            (&[W], 1),
            (&[W, W], 1),
            (&[W, R], 1),
            (&[R, R, R], 3),
            // A waiting writer keeps later readers out.
            (&[R, R, W, R], 2),
            (&[R, p(5)], 1),
            (&[p(5), R], 1),
            (&[p(2), p(2), p(2)], 2),
            // No holder gets more company than its own number allows: a raised number
            // waits while holders of fewer are in; a lowered one waits, and so does
            // anyone behind it, whatever number it asked with.
            (&[p(2), p(2), p(3)], 2),
            (&[p(3), p(2), p(3)], 2),
            (&[p(3), p(3), p(3), p(2)], 3),
            (&[p(2), p(2), p(1), p(9)], 2),
            (&[p(1), p(3), p(3), p(3)], 1),
            (&[p(3), p(3), p(1), p(3)], 2),
        ];
        for (kinds, holds) in cases {
            assert_eq!(holding(kinds), holds, "{kinds:?}");
        }
    }

    /// A put that reaches etcd after its request was given back applies no more, and
    /// neither takes nor queues for the lock (review finding m4: the delete could be
    /// applied before a delayed put, leaving an orphan key that held the lock).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn put_landing_after_its_request_was_given_back_applies_no_more() {
        let server = tokio::task::spawn_blocking(|| EtcdServer::start(&EtcdConfig::default()))
            .await
            .expect("spawn_blocking")
            .expect("start etcd");
        let limit = Duration::from_secs(2);
        let cluster = Cluster::new(vec![server.endpoint()], ConnectOptions::new(), limit, limit);
        let shared = Shared::new(cluster, "late-put".to_string(), limit);
        let session = shared.sessions.shared(30).await.expect("grant");
        let dir = shared.dir(&LockName::new("orders/7").expect("name"));
        let value = HoldValue::new(OwnerId::new("late").expect("owner"), vec!["c:1".to_string()]);

        for blocking in [true, false] {
            let key =
                keys::request_key(&dir, HoldKind::Exclusive, session.id(), shared.seq.fetch_add(1, Ordering::Relaxed));
            let txn = acquire_txn(&dir, &key, session.id(), &value, HoldKind::Exclusive, blocking);
            // The caller gave up before the put arrived.
            shared
                .leave_queue(QueuePlace {
                    session: session.clone(),
                    holds_on: None,
                    dir: dir.clone(),
                    key: key.clone(),
                    kind: HoldKind::Exclusive,
                    rev: None,
                    ahead: None,
                    watch: None,
                })
                .await;
            let late = shared.cluster.txn("late put", limit, txn).await.expect("the late put is answered");
            assert!(!late.succeeded(), "a put given back applied (blocking: {blocking})");
            let read = Txn::new().and_then([TxnOp::get(dir.clone(), Some(GetOptions::new().with_prefix()))]);
            let resp = shared.cluster.read("read", limit, read).await.expect("read the lock");
            assert!(first_kv(&resp, 0).is_none(), "a key given back is in the lock's range (blocking: {blocking})");
        }
    }
}
