//! One ZooKeeper session and the holds that live on it.
//!
//! A hold is an ephemeral node, so it lasts exactly as long as its session: the client's
//! pings (the crate's heartbeat) keep the session alive, and the server deletes the node
//! when the session expires. The server cannot expire the session sooner than its
//! negotiated timeout after it last heard from the client, and it heard from the client
//! no sooner than the send time of the last request that was answered. So each session
//! keeps `confirmed`, the send time of its latest answered request, and a monitor task
//! fires the lost signal of every hold on the session when
//! `confirmed + negotiated timeout - guard` passes without a fresher answer (a
//! disconnection lasting past the holds' validity), as Curator treats a suspended
//! connection. The monitor also
//!
//! - sends a heartbeat read of the held nodes when nothing else was answered for a third
//!   of the timeout (so an idle session keeps its holds, and a node deleted underneath its
//!   holder is noticed);
//! - batches renewals: each renewal asks whether its node still exists, and the renewals
//!   arriving within a few milliseconds share one multi-read request (one round trip per
//!   batch, not per lease); a check slower than half the session timeout counts as failed;
//! - deletes a hold's node when its ttl passes without renewal (`Fixed` leases, `max_hold`),
//!   so that holds expire by ttl while the client lives, and by session expiry when it dies;
//! - deletes unwanted nodes: those of abandoned waits whose delete failed, of holds whose
//!   release failed, and of creates whose reply was lost, so that no orphan node of a live
//!   session blocks the queue behind it;
//! - fires `SessionExpired` for every hold when the session ends.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use dlock_core::{LockError, LockName, LostReason, OwnerId};
use futures::future::join_all;
use tokio::sync::{oneshot, Notify};
use zookeeper_client as zk;

use crate::error::{is_transient, lock_error, timed_out};
use crate::node::Node;
use crate::settings::Settings;
use crate::znode;

/// Renewal checks per multi-read request, so that a request stays far below the server's
/// packet limit (`jute.maxbuffer`, 1 MiB by default).
const BATCH_CHUNK: usize = 256;

/// The pause between attempts to open a session.
const CONNECT_RETRY: Duration = Duration::from_millis(50);

/// The longest a renewal check waits for others to share its request.
const BATCH_WINDOW: Duration = Duration::from_millis(20);

/// Batches of renewal checks in flight at once per session: a second batch goes out
/// while the first is answered, so a check waits for at most about one round trip.
const MAX_BATCHES: usize = 2;

/// A node to delete once the session can: its lock znode, the uuid of the attempt that
/// created it, and its path when known.
#[derive(Debug, Clone)]
pub(crate) struct Unwanted {
    pub lock_path: String,
    pub uuid: String,
    pub path: Option<String>,
}

type Verdict = oneshot::Sender<Result<bool, LockError>>;

#[derive(Default)]
struct Registry {
    /// Granted nodes by uuid.
    held: HashMap<String, Arc<Node>>,
    /// The uuid of the node an owner holds on a lock, for re-entrant acquires.
    owners: HashMap<(LockName, OwnerId), String>,
    unwanted: Vec<Unwanted>,
    /// Renewal checks waiting for the next batch.
    checks: Vec<(String, Verdict)>,
    /// When the oldest waiting check arrived.
    checks_since: Option<Instant>,
    /// Batches of checks in flight.
    batches: usize,
    last_batch: Option<Instant>,
    /// No held node expires before this (expiry only moves later, so the nodes need
    /// scanning only once it passes).
    next_expiry: Option<Instant>,
    sweep_running: bool,
    sweep_after: Option<Instant>,
    ended: Option<zk::SessionState>,
}

/// One ZooKeeper session, shared by every lock of one ttl on one client.
pub(crate) struct Session {
    client: zk::Client,
    settings: Arc<Settings>,
    negotiated: Duration,
    origin: Instant,
    /// Nanoseconds from `origin` to the send time of the latest answered request.
    confirmed: AtomicU64,
    registry: Mutex<Registry>,
    kick: Arc<Notify>,
}

impl Drop for Session {
    fn drop(&mut self) {
        // Wake the monitor so that it sees the session gone and ends.
        self.kick.notify_one();
    }
}

impl Session {
    /// Opens a session whose requested timeout is `ttl` (rounded up to whole
    /// milliseconds; the server may clamp it) and starts its monitor.
    pub(crate) async fn open(settings: Arc<Settings>, ttl: Duration) -> Result<Arc<Session>, LockError> {
        let requested = session_timeout_for(ttl);
        let mut connector = zk::Client::connector().with_session_timeout(requested).with_fail_eagerly();
        if let Some(auth) = settings.config.digest_auth() {
            connector = connector.with_auth("digest", &auth);
        }
        let connect_timeout = settings.config.connect_timeout();
        let connect_string = settings.config.connect_string();
        let deadline = Instant::now() + connect_timeout;
        let (client, origin) = loop {
            let origin = Instant::now();
            match tokio::time::timeout_at(deadline.into(), connector.clone().connect(&connect_string)).await {
                Ok(Ok(client)) => break (client, origin),
                // No member answered in time (the client gives each a fraction of the
                // session timeout, little for a short ttl on a loaded server): try again
                // while the connect timeout allows.
                Ok(Err(err)) if is_transient(&err) && Instant::now() + CONNECT_RETRY < deadline => {
                    tracing::debug!(%err, "no ZooKeeper session yet; trying again");
                    tokio::time::sleep(CONNECT_RETRY).await;
                }
                Ok(Err(err)) => return Err(lock_error("connect", err)),
                Err(_) => return Err(timed_out("connect", connect_timeout)),
            }
        };
        let negotiated = client.session_timeout();
        tracing::debug!(session = %client.session_id(), ?requested, ?negotiated, "ZooKeeper session opened");
        let kick = Arc::new(Notify::new());
        let states = client.state_watcher();
        let session = Arc::new(Session {
            client,
            settings,
            negotiated,
            origin,
            // The server started the session's clock after the connect request was sent.
            confirmed: AtomicU64::new(0),
            registry: Mutex::new(Registry { last_batch: Some(origin), ..Registry::default() }),
            kick: kick.clone(),
        });
        tokio::spawn(monitor(Arc::downgrade(&session), kick, states));
        Ok(session)
    }

    pub(crate) fn client(&self) -> &zk::Client {
        &self.client
    }

    /// The session timeout the server granted.
    pub(crate) fn negotiated(&self) -> Duration {
        self.negotiated
    }

    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the session has ended (expired, closed, authentication failed): nothing
    /// sent on it can succeed any more.
    pub(crate) fn is_ended(&self) -> bool {
        self.client.state().is_terminated() || self.registry().ended.is_some()
    }

    fn is_connected(&self) -> bool {
        matches!(self.client.state(), zk::SessionState::SyncConnected)
    }

    /// A request sent at `sent` was answered: the server has heard from us since.
    pub(crate) fn confirm(&self, sent: Instant) {
        let nanos = sent.saturating_duration_since(self.origin).as_nanos().min(u64::MAX as u128) as u64;
        self.confirmed.fetch_max(nanos, Ordering::AcqRel);
    }

    fn confirmed_at(&self) -> Instant {
        self.origin + Duration::from_nanos(self.confirmed.load(Ordering::Acquire))
    }

    /// How long before the earliest possible server-side expiry the holds are given up:
    /// the drift allowance and room for a late timer.
    fn guard(&self) -> Duration {
        self.negotiated / 10 + Duration::from_millis(2)
    }

    /// How long renewal checks wait for others to join their batch.
    fn batch_window(&self) -> Duration {
        (self.negotiated / 50).min(BATCH_WINDOW)
    }

    /// The waiter's node became a hold. Refused (`false`) when the session has ended: the
    /// node went with it, and no lost signal could fire for it any more.
    pub(crate) fn grant(&self, node: Arc<Node>) -> bool {
        {
            let mut registry = self.registry();
            if registry.ended.is_some() || self.client.state().is_terminated() {
                return false;
            }
            registry.owners.insert((node.name.clone(), node.owner.clone()), node.uuid.clone());
            let expires_at = node.expires_at();
            registry.next_expiry = Some(registry.next_expiry.map_or(expires_at, |next| next.min(expires_at)));
            registry.held.insert(node.uuid.clone(), node);
        }
        self.kick.notify_one();
        true
    }

    /// The node `owner` holds on `name` through this session, if any is live.
    pub(crate) fn held_by(&self, name: &LockName, owner: &OwnerId) -> Option<Arc<Node>> {
        let registry = self.registry();
        let uuid = registry.owners.get(&(name.clone(), owner.clone()))?;
        registry.held.get(uuid).filter(|node| node.is_live()).cloned()
    }

    /// The node is no longer held (released, or lost): forget it.
    pub(crate) fn forget(&self, node: &Node) {
        let mut registry = self.registry();
        if registry.held.get(&node.uuid).is_some_and(|held| std::ptr::eq(&**held, node)) {
            registry.held.remove(&node.uuid);
        }
        let key = (node.name.clone(), node.owner.clone());
        if registry.owners.get(&key) == Some(&node.uuid) {
            registry.owners.remove(&key);
        }
    }

    /// The node is gone or given up: forget it and fire its leases' lost signals.
    pub(crate) fn lose(&self, node: &Node, reason: LostReason) {
        self.forget(node);
        node.fire(reason);
    }

    /// Hands a node to the monitor to delete (retrying while the session lives).
    pub(crate) fn discard(&self, unwanted: Unwanted) {
        {
            let mut registry = self.registry();
            if registry.ended.is_none() {
                registry.unwanted.push(unwanted);
            }
        }
        self.kick.notify_one();
    }

    /// Whether the node at `path` still exists: one check in the next batch of renewal
    /// checks, which shares a single round trip. `Unavailable` while disconnected.
    pub(crate) async fn check(&self, path: &str) -> Result<bool, LockError> {
        if !self.is_connected() {
            return Err(LockError::unavailable(format!(
                "ZooKeeper session {} is disconnected",
                self.client.session_id()
            )));
        }
        let (tx, rx) = oneshot::channel();
        {
            let mut registry = self.registry();
            if let Some(state) = registry.ended {
                return Err(LockError::unavailable(format!("the ZooKeeper session ended ({state})")));
            }
            registry.checks_since.get_or_insert_with(Instant::now);
            registry.checks.push((path.to_string(), tx));
        }
        self.kick.notify_one();
        // A check slower than half the session timeout counts as failed, so that a lease
        // whose renewals hang is lost as unreachable (and retried meanwhile), not expired.
        let bound = self.settings.op_timeout().min(self.negotiated / 2);
        match tokio::time::timeout(bound, rx).await {
            Ok(answer) => answer.unwrap_or_else(|_| Err(LockError::unavailable("the ZooKeeper session ended"))),
            Err(_) => Err(timed_out("renewal check", bound)),
        }
    }

    /// Runs the monitor's periodic duties; returns when it next needs to run.
    fn tick(self: &Arc<Self>, now: Instant) -> Option<Instant> {
        let mut lost: Vec<(Arc<Node>, LostReason)> = Vec::new();
        let mut wake: Option<Instant> = None;
        let mut at = |t: Instant| wake = Some(wake.map_or(t, |w: Instant| w.min(t)));
        let mut registry = self.registry();
        if registry.ended.is_some() {
            return None;
        }

        if !registry.held.is_empty() {
            let deadline = self.confirmed_at() + self.negotiated.saturating_sub(self.guard());
            if now >= deadline {
                // The server may expire the session soon: give every hold up before it can.
                tracing::debug!(session = %self.client.session_id(), holds = registry.held.len(),
                    "no answer from ZooKeeper within the session timeout; holds given up");
                let held: Vec<Arc<Node>> = registry.held.drain().map(|(_, node)| node).collect();
                registry.owners.clear();
                for node in held {
                    registry.unwanted.push(node.unwanted());
                    lost.push((node, LostReason::BackendUnavailable));
                }
            } else {
                at(deadline);
            }
        }

        // Holds whose ttl ran out without renewal are deleted (Fixed leases, max_hold).
        if registry.next_expiry.is_some_and(|next| next <= now) {
            let expired: Vec<String> = registry
                .held
                .iter()
                .filter(|(_, node)| node.expires_at() <= now)
                .map(|(uuid, _)| uuid.clone())
                .collect();
            // Renewals that could not get through are why a watchdog lease ran out.
            let reason = if self.is_connected() { LostReason::Expired } else { LostReason::BackendUnavailable };
            for uuid in expired {
                if let Some(node) = registry.held.remove(&uuid) {
                    registry.owners.remove(&(node.name.clone(), node.owner.clone()));
                    registry.unwanted.push(node.unwanted());
                    lost.push((node, reason));
                }
            }
            registry.next_expiry = registry.held.values().map(|node| node.expires_at()).min();
        }
        if let Some(next) = registry.next_expiry {
            at(next);
        }

        let heartbeat = self.negotiated / 3;
        if !self.is_connected() {
            // Requests would only queue until the connection is back (the state change
            // wakes the monitor then); renewals fail now and are retried by the client.
            registry.checks_since = None;
            for (_, tx) in registry.checks.drain(..) {
                let _ = tx.send(Err(LockError::unavailable("the ZooKeeper session is disconnected")));
            }
        } else if registry.batches < MAX_BATCHES {
            let due = !registry.held.is_empty() && registry.last_batch.is_none_or(|last| now >= last + heartbeat);
            // Checks wait a moment for others to share their request.
            let gathered = registry.checks_since.map(|since| since + self.batch_window());
            if let Some(gathered) = gathered.filter(|gathered| *gathered > now && !due) {
                at(gathered);
            } else if !registry.checks.is_empty() || due {
                registry.checks_since = None;
                let mut checks: Vec<(String, Option<Verdict>)> =
                    std::mem::take(&mut registry.checks).into_iter().map(|(path, tx)| (path, Some(tx))).collect();
                if due {
                    checks.extend(registry.held.values().map(|node| (node.path.clone(), None)));
                }
                registry.batches += 1;
                registry.last_batch = Some(now);
                tokio::spawn(run_batch(self.clone(), checks));
            } else if let Some(last) = registry.last_batch.filter(|_| !registry.held.is_empty()) {
                at(last + heartbeat);
            }
        }

        if !registry.unwanted.is_empty() && !registry.sweep_running && self.is_connected() {
            match registry.sweep_after {
                Some(after) if now < after => at(after),
                _ => {
                    let items = std::mem::take(&mut registry.unwanted);
                    registry.sweep_running = true;
                    tokio::spawn(run_sweep(self.clone(), items));
                }
            }
        }
        drop(registry);

        for (node, reason) in lost {
            node.fire(reason);
        }
        wake
    }

    /// The session ended: every hold on it is gone with it.
    fn end(&self, state: zk::SessionState) {
        let held: Vec<Arc<Node>> = {
            let mut registry = self.registry();
            if registry.ended.is_some() {
                return;
            }
            registry.ended = Some(state);
            registry.owners.clear();
            registry.unwanted.clear();
            registry.checks_since = None;
            for (_, tx) in registry.checks.drain(..) {
                let _ = tx.send(Err(LockError::unavailable(format!("the ZooKeeper session ended ({state})"))));
            }
            registry.held.drain().map(|(_, node)| node).collect()
        };
        tracing::debug!(session = %self.client.session_id(), %state, holds = held.len(), "ZooKeeper session ended");
        for node in held {
            node.fire(LostReason::SessionExpired);
        }
    }
}

/// The requested session timeout for a ttl: whole milliseconds, rounded up, within what
/// the protocol can carry.
fn session_timeout_for(ttl: Duration) -> Duration {
    let millis = ttl.as_nanos().div_ceil(1_000_000).clamp(1, i32::MAX as u128) as u64;
    Duration::from_millis(millis)
}

async fn monitor(session: Weak<Session>, kick: Arc<Notify>, mut states: zk::StateWatcher) {
    loop {
        let wake = {
            let Some(session) = session.upgrade() else { return };
            let state = session.client.state();
            if state.is_terminated() {
                session.end(state);
                return;
            }
            session.tick(Instant::now())
        };
        tokio::select! {
            _ = kick.notified() => {}
            _ = states.changed() => {}
            _ = sleep_until(wake) => {}
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// One batch of renewal checks (and heartbeat reads): multi-reads of the nodes' data,
/// sent together.
async fn run_batch(session: Arc<Session>, checks: Vec<(String, Option<Verdict>)>) {
    let mut paths: Vec<String> = checks.iter().map(|(path, _)| path.clone()).collect();
    paths.sort_unstable();
    paths.dedup();
    let sent = Instant::now();
    let timeout = session.settings.op_timeout();
    let requests: Vec<_> = paths
        .chunks(BATCH_CHUNK)
        .map(|chunk| {
            let mut reader = session.client.new_multi_reader();
            let added: Result<(), zk::Error> = chunk.iter().try_for_each(|path| reader.add_get_data(path));
            let commit = added.map(|()| reader.commit());
            async move { commit?.await }
        })
        .collect();
    let outcome = match tokio::time::timeout(timeout, join_all(requests)).await {
        Ok(results) => results.into_iter().collect::<Result<Vec<_>, _>>().map_err(|e| lock_error("renewal check", e)),
        Err(_) => Err(timed_out("renewal check", timeout)),
    };
    let verdicts: Result<HashMap<String, bool>, LockError> = outcome.map(|results| {
        paths
            .into_iter()
            .zip(results.into_iter().flatten())
            .map(|(path, result)| (path, matches!(result, zk::MultiReadResult::Data { .. })))
            .collect()
    });
    match &verdicts {
        Ok(exists) => {
            session.confirm(sent);
            let gone: Vec<Arc<Node>> = {
                let registry = session.registry();
                exists
                    .iter()
                    .filter(|(_, exists)| !**exists)
                    .filter_map(|(path, _)| {
                        let uuid = znode::uuid_of(path.rsplit('/').next()?)?;
                        registry.held.get(uuid).filter(|node| node.path == *path).cloned()
                    })
                    .collect()
            };
            for node in gone {
                // Deleted underneath us (an operator, or the session ended meanwhile).
                session.lose(&node, LostReason::Expired);
            }
        }
        Err(err) => tracing::debug!(%err, "renewal checks failed"),
    }
    for (path, verdict) in checks {
        if let Some(tx) = verdict {
            let answer = match &verdicts {
                Ok(exists) => Ok(exists.get(&path).copied().unwrap_or(false)),
                Err(err) => Err(LockError::unavailable(err.to_string())),
            };
            let _ = tx.send(answer);
        }
    }
    session.registry().batches -= 1;
    session.kick.notify_one();
}

/// Deletes unwanted nodes; what cannot be deleted now is retried later.
async fn run_sweep(session: Arc<Session>, items: Vec<Unwanted>) {
    let timeout = session.settings.op_timeout();
    let results = join_all(items.into_iter().map(|item| {
        let session = &session;
        async move {
            match tokio::time::timeout(timeout, delete_unwanted(session.client(), &item)).await {
                Ok(Ok(())) => None,
                Ok(Err(err)) => {
                    tracing::debug!(lock = %item.lock_path, %err, "deleting an unwanted node failed; will retry");
                    Some(item)
                }
                Err(_) => Some(item),
            }
        }
    }))
    .await;
    let retry: Vec<Unwanted> = results.into_iter().flatten().collect();
    let mut registry = session.registry();
    registry.sweep_running = false;
    if registry.ended.is_none() {
        registry.sweep_after = (!retry.is_empty()).then(|| Instant::now() + Duration::from_millis(200));
        registry.unwanted.extend(retry);
    }
    drop(registry);
    session.kick.notify_one();
}

/// Deletes the node of an abandoned attempt or hold. Without a known path, the lock's
/// children are searched for the attempt's uuid, after a `sync` so that a create whose
/// reply was lost is seen if it was applied.
async fn delete_unwanted(client: &zk::Client, item: &Unwanted) -> Result<(), zk::Error> {
    let paths = match &item.path {
        Some(path) => vec![path.clone()],
        None => {
            match client.sync(&item.lock_path).await {
                Ok(()) | Err(zk::Error::NoNode) => {}
                Err(err) => return Err(err),
            }
            let children = match client.list_children(&item.lock_path).await {
                Ok(children) => children,
                Err(zk::Error::NoNode) => return Ok(()),
                Err(err) => return Err(err),
            };
            children
                .into_iter()
                .filter(|name| znode::uuid_of(name) == Some(item.uuid.as_str()))
                .map(|name| format!("{}/{name}", item.lock_path))
                .collect()
        }
    };
    for path in paths {
        match client.delete(&path, None).await {
            Ok(()) | Err(zk::Error::NoNode) => tracing::debug!(%path, "deleted an unwanted node"),
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_timeouts_round_up_and_fit_the_protocol() {
        assert_eq!(session_timeout_for(Duration::from_micros(1500)), Duration::from_millis(2));
        assert_eq!(session_timeout_for(Duration::from_secs(2)), Duration::from_secs(2));
        assert_eq!(session_timeout_for(Duration::from_secs(365 * 24 * 3600)), Duration::from_millis(i32::MAX as u64));
    }
}
