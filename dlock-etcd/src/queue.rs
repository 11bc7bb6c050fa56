//! The queue of one lock: every request is a key under the lock's range, the lowest
//! create revision holds, each waiter watches the key just ahead of its own.
//!
//! An acquire puts its key in one transaction: when the range is empty the put alone
//! (the lock is ours); otherwise the put and a read of the two newest keys, which are
//! ours and the one ahead of us. A `try_acquire` puts nothing on a busy lock. Along with
//! the transaction goes a keepalive of the lease (unless the last one already covers the
//! new hold's ttl), so that the lease outlasts the validity the client counts from the
//! attempt's start.
//!
//! A waiter watches the delete of the key ahead from the revision at which it read it, so
//! no delete is missed; then it checks again, in one read-only transaction plus a
//! keepalive, that its own key still exists, that its lease is alive, and that no key is
//! ahead of it. A waiter whose key or lease went away while it waited (etcd#11456) never
//! takes the lock for that: it queues again, at the back.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::backend::{Attempt, Request};
use dlock_core::LockError;
use etcd_client::{
    Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, WatchFilterType,
    WatchOptions, WatchStream,
};

use crate::backend::{first_kv, token_of, Shared, Step};
use crate::error::{is_lease_gone, EtcdError};
use crate::keys::{self, HoldValue};
use crate::registry::{EtcdHold, KeyState};
use crate::session::Session;

/// A waiter's place in a lock's queue.
pub struct EtcdTicket {
    session: Arc<Session>,
    dir: Vec<u8>,
    key: Vec<u8>,
    /// Our key's create revision, once the put is confirmed; `None` while it is uncertain.
    rev: Option<i64>,
    /// The key just ahead of ours, and the revision at which it was read.
    ahead: Option<(Vec<u8>, i64)>,
    watch: Option<AheadWatch>,
}

impl std::fmt::Debug for EtcdTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTicket")
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("rev", &self.rev)
            .field("ahead", &self.ahead.as_ref().map(|(k, _)| String::from_utf8_lossy(k)))
            .finish()
    }
}

impl EtcdTicket {
    /// Whether our key is confirmed in the queue.
    pub(crate) fn is_queued(&self) -> bool {
        self.rev.is_some()
    }

    /// Drops the ticket whose key is known to be gone.
    pub(crate) fn forget(self) {}
}

struct AheadWatch {
    key: Vec<u8>,
    stream: WatchStream,
}

/// The first attempt of a request: puts its key (see the module docs).
pub(crate) async fn enqueue(
    shared: &Shared,
    req: &Request,
    dir: &[u8],
    slot: &mut Option<EtcdTicket>,
    since: Instant,
) -> Result<Step, LockError> {
    let session = shared.session_for(req.mode).await?;
    let key = keys::request_key(dir, session.id(), shared.next_seq());
    let put =
        TxnOp::put(key.clone(), HoldValue::encode(1, &req.owner), Some(PutOptions::new().with_lease(session.id())));
    let empty = Compare::create_revision(dir.to_vec(), CompareOp::Equal, 0).with_prefix();
    let txn = if req.blocking {
        let newest = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(2)
            .with_keys_only();
        Txn::new().when([empty]).and_then([put.clone()]).or_else([put, TxnOp::get(dir.to_vec(), Some(newest))])
    } else {
        Txn::new().when([empty]).and_then([put])
    };
    // Before the put is sent, so that whatever happens to the reply, the key is deleted
    // if the attempt fails.
    *slot = Some(EtcdTicket {
        session: session.clone(),
        dir: dir.to_vec(),
        key: key.clone(),
        rev: None,
        ahead: None,
        watch: None,
    });
    let (alive, resp) = futures::join!(session.ensure(since, req.ttl()), shared.txn("acquire", txn));
    let resp = match resp {
        Err(err) if is_lease_gone(&err) => {
            session.mark_gone();
            return Ok(Step::Requeue);
        }
        other => other?,
    };
    let put_done = resp.succeeded() || req.blocking;
    if !put_done {
        *slot = None;
        return Ok(Step::Done(Attempt::Busy { retry_after: None }));
    }
    if !alive? {
        // The lease died around the put: the key went with it.
        return Ok(Step::Requeue);
    }
    let rev = resp.header().map(|h| h.revision()).ok_or(EtcdError::Protocol("a transaction without a header"))?;
    if resp.succeeded() {
        let ticket = slot.take().ok_or(EtcdError::Protocol("the ticket vanished"))?;
        return Ok(Step::Done(granted(shared, req, ticket, rev)));
    }
    let ticket = slot.as_mut().ok_or(EtcdError::Protocol("the ticket vanished"))?;
    ticket.rev = Some(rev);
    let newest = match resp.op_responses().into_iter().nth(1) {
        Some(TxnOpResponse::Get(mut get)) => get.take_kvs(),
        _ => return Err(EtcdError::Protocol("the queue read is missing").into()),
    };
    // Newest first: ours, then the one ahead of us (there is one: the range was not empty).
    ticket.ahead = match newest.as_slice() {
        [ours, ahead] if ours.key() == key.as_slice() => Some((ahead.key().to_vec(), rev)),
        _ => None,
    };
    tracing::debug!(rev, "queued");
    Ok(Step::Done(Attempt::Busy { retry_after: if ticket.ahead.is_some() { None } else { Some(Duration::ZERO) } }))
}

/// A later attempt of a queued request (see the module docs).
pub(crate) async fn recheck(
    shared: &Shared,
    req: &Request,
    slot: &mut Option<EtcdTicket>,
    since: Instant,
) -> Result<Step, LockError> {
    let Some(ticket) = slot.as_mut() else { return Ok(Step::Requeue) };
    let Some(rev) = ticket.rev else { return Ok(Step::Requeue) };
    let ahead = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_max_create_revision(rev - 1)
        .with_limit(1)
        .with_keys_only();
    let txn = Txn::new().and_then([
        TxnOp::get(ticket.key.clone(), Some(GetOptions::new().with_keys_only())),
        TxnOp::get(ticket.dir.clone(), Some(ahead)),
    ]);
    let (alive, resp) = futures::join!(ticket.session.ensure(since, req.ttl()), shared.read("acquire", txn));
    let resp = resp?;
    if !alive? {
        tracing::debug!(rev, "the waiter's lease is gone; queueing again");
        return Ok(Step::Requeue);
    }
    let ours = first_kv(&resp, 0);
    if ours.is_none_or(|kv| kv.create_revision() != rev) {
        tracing::debug!(rev, "the waiter's key is gone; queueing again");
        return Ok(Step::Requeue);
    }
    let seen = resp.header().map(|h| h.revision()).ok_or(EtcdError::Protocol("a transaction without a header"))?;
    match first_kv(&resp, 1) {
        None => {
            let ticket = slot.take().ok_or(EtcdError::Protocol("the ticket vanished"))?;
            Ok(Step::Done(granted(shared, req, ticket, rev)))
        }
        Some(ahead) => {
            ticket.ahead = Some((ahead.key().to_vec(), seen));
            Ok(Step::Done(Attempt::Busy { retry_after: None }))
        }
    }
}

fn granted(shared: &Shared, req: &Request, ticket: EtcdTicket, rev: i64) -> Attempt<EtcdHold> {
    let key = KeyState::new(ticket.dir, ticket.key, rev, req.owner.clone(), ticket.session);
    shared.registry.insert_key(&key);
    tracing::debug!(token = rev, "granted");
    Attempt::Granted { hold: EtcdHold::new(key), token: token_of(rev) }
}

/// Waits for the key ahead to be deleted, keeping our lease alive meanwhile.
///
/// A broken watch is opened again from the same revision (nothing is missed), so a waiter
/// rides out an election or a member going down. It gives up waiting (and lets the next
/// check decide) only once its lease may have expired while etcd could not be reached.
pub(crate) async fn wait(
    shared: &Shared,
    req: &Request,
    slot: &mut Option<EtcdTicket>,
    until: tokio::time::Instant,
) -> Result<(), LockError> {
    let _ = req;
    let until = until.into_std();
    let Some(ticket) = slot.as_mut() else {
        tokio::time::sleep_until(until.into()).await;
        return Ok(());
    };
    let Some((ahead, seen)) = ticket.ahead.clone() else {
        pause(until).await;
        return Ok(());
    };
    let session = ticket.session.clone();
    let mut watch = ticket.watch.take().filter(|w| w.key == ahead);
    let mut next_keepalive = session.keepalive_due();
    let mut next_watch = Instant::now();
    loop {
        let now = Instant::now();
        if now >= until {
            ticket.watch = watch;
            return Ok(());
        }
        if watch.is_none() && now >= next_watch {
            let options = WatchOptions::new().with_start_revision(seen + 1).with_filters([WatchFilterType::NoPut]);
            match shared.cluster.watch(shared.op_timeout, ahead.clone(), options).await {
                Ok(stream) => watch = Some(AheadWatch { key: ahead.clone(), stream }),
                Err(err) => {
                    if Instant::now() >= session.alive_until() {
                        return Ok(());
                    }
                    tracing::debug!(%err, "watching the key ahead failed; trying again");
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
            // The key ahead was deleted.
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
                match tokio::time::timeout(shared.op_timeout, session.ensure(now, session.ttl())).await {
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

/// How soon a waiter tries again to watch, or to keep its lease alive, after a failure.
const REWATCH: Duration = Duration::from_millis(200);

async fn next_message(
    watch: &mut Option<AheadWatch>,
) -> Result<Option<etcd_client::WatchResponse>, etcd_client::Error> {
    match watch {
        Some(watch) => watch.stream.message().await,
        None => std::future::pending().await,
    }
}

/// A short pause before checking again when there is nothing to watch.
async fn pause(until: Instant) {
    tokio::time::sleep_until(until.min(Instant::now() + Duration::from_millis(100)).into()).await;
}

/// Gives up a place in the queue: deletes the key (or revokes a private lease, which takes
/// the key with it).
pub(crate) async fn abandon(shared: &Shared, ticket: EtcdTicket) {
    let EtcdTicket { session, key, rev, watch, .. } = ticket;
    drop(watch);
    if session.is_private() {
        if shared.cluster.revoke(shared.op_timeout, session.id()).await.is_ok() {
            session.mark_gone();
        }
        return;
    }
    if rev.is_none() {
        // The put's reply never came: the put may yet land after the delete.
        session.retire();
    }
    if let Err(err) = shared.cluster.delete(shared.op_timeout, key.clone()).await {
        tracing::debug!(%err, "deleting a waiter's key failed; retrying in the background");
        session.retire();
        let cluster = shared.cluster.clone();
        let limit = shared.op_timeout;
        retry_in_background(session, move || {
            let (cluster, key) = (cluster.clone(), key.clone());
            async move { cluster.delete(limit, key).await }
        });
    }
}

/// Retries `op`, with a pause doubling from 100 ms to a third of the session's ttl, until
/// it succeeds or the session's lease may be gone (nobody keeps it alive any more: it
/// expires and takes its keys along).
pub(crate) fn retry_in_background<F, Fut>(session: Arc<Session>, op: F)
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

/// The first pause of a background clean-up.
const CLEANUP_FIRST: Duration = Duration::from_millis(100);
