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
//! - keeps one heartbeat at a time in flight, with no timeout of its own: a late answer
//!   still tells when the server last heard from the client (the client library drops a
//!   connection that stays silent, which fails the request);
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

use dlock_core::backend::lock_unpoisoned;
use dlock_core::ConnectConfig;
use dlock_core::{HoldKind, LockError, LockName, LostReason, OwnerId};
use futures::future::join_all;
use tokio::sync::Notify;
use zookeeper_client as zk;

use crate::error::{is_transient, lock_error, timed_out};
use crate::node::Node;
use crate::settings::Settings;
use crate::znode::{self, Unwanted};

mod tls;

pub(crate) use self::tls::Tls;
use self::tls::Verdict;

/// Node checks per multi-read request, so that a request stays far below the server's
/// packet limit (`jute.maxbuffer`, 1 MiB by default).
const READ_CHUNK: usize = 256;

/// Heartbeats in flight at once per session (they stall together on a stalled connection,
/// which the library then drops).
const MAX_HEARTBEATS: usize = 8;

/// The pause between attempts to open a session.
const CONNECT_RETRY: Duration = Duration::from_millis(50);

#[derive(Default)]
struct Registry {
    /// Granted nodes by uuid.
    held: HashMap<String, Arc<Node>>,
    /// The uuid of the node an owner holds on a lock as each kind, for re-entrant
    /// acquires.
    owners: HashMap<(LockName, OwnerId, HoldKind), String>,
    unwanted: Vec<Unwanted>,
    /// Heartbeats in flight.
    heartbeats: usize,
    /// When the last heartbeat was sent.
    last_heartbeat: Option<Instant>,
    /// When the last heartbeat that reads the held nodes was sent.
    last_node_read: Option<Instant>,
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
    /// Nanoseconds from `origin` to the send time of this crate's latest request.
    last_sent: AtomicU64,
    /// The longest the client library lets an idle connection go without a ping.
    ping_gap: Duration,
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
    /// milliseconds; the server may clamp it) and starts its monitor. A TLS configuration's
    /// files are read now.
    pub(crate) async fn open(settings: Arc<Settings>, ttl: Duration) -> Result<Arc<Session>, LockError> {
        let requested = session_timeout_for(ttl);
        // The library drops a connection that stays silent for its connection timeout (a
        // third of the session timeout by default), however close an answer is: allow
        // 3/5, so that answers that come late but in time still count.
        let mut connector = zk::Client::connector()
            .with_session_timeout(requested)
            .with_connection_timeout(connection_timeout_for(requested))
            .with_fail_eagerly();
        connector = settings.config.authenticate(connector);
        let tls = Tls::load(&settings.config)?;
        if let Some(tls) = &tls {
            connector = connector.with_tls(tls.options());
        }
        let connect_timeout = settings.config.connect_timeout();
        let connect_string = settings.config.connect_string();
        let deadline = Instant::now() + connect_timeout;
        // Until a probe got an answer from a member that showed no refusal.
        let mut diagnosed = false;
        // What that answer suggests, for the error if no session opens.
        let mut hint: Option<String> = None;
        let with_hint = |mut err: LockError, hint: &Option<String>| {
            if let (LockError::Unavailable { what, .. }, Some(hint)) = (&mut err, hint) {
                what.push_str("; ");
                what.push_str(hint);
            }
            err
        };
        let (client, origin) = loop {
            let origin = Instant::now();
            let connect = connector.clone();
            let attempt = async {
                match tls {
                    Some(_) => connect.secure_connect(&connect_string).await,
                    None => connect.connect(&connect_string).await,
                }
            };
            match tokio::time::timeout_at(deadline.into(), attempt).await {
                Ok(Ok(client)) => break (client, origin),
                // No member answered in time (the client gives each a fraction of the
                // session timeout, little for a short ttl on a loaded server): try again
                // while the connect timeout allows. Unless a handshake shows that the
                // members refuse this client (or it them) for how it connects: the library
                // reports that as a lost connection too, and retrying cannot help.
                Ok(Err(err)) if is_transient(&err) => {
                    if !diagnosed {
                        match tls::diagnose(&settings.config, tls.as_ref(), deadline).await {
                            Verdict::Refused(refused) => return Err(refused),
                            Verdict::Answered(guess) => (diagnosed, hint) = (true, guess),
                            Verdict::Unreached => {}
                        }
                    }
                    if Instant::now() + CONNECT_RETRY >= deadline {
                        return Err(with_hint(lock_error("connect", err), &hint));
                    }
                    tracing::debug!(%err, "no ZooKeeper session yet; trying again");
                    tokio::time::sleep(CONNECT_RETRY).await;
                }
                Ok(Err(err)) => return Err(lock_error("connect", err)),
                Err(_) => return Err(with_hint(timed_out("connect", connect_timeout), &hint)),
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
            last_sent: AtomicU64::new(0),
            // The library pings after 3 of its ticks of silence: 3/40 of the connection
            // timeout set below (or 3/20 of the session timeout when that is shorter), and
            // at most every 10 s.
            ping_gap: (connection_timeout_for(requested) * 3 / 8).max(negotiated * 3 / 20).min(Duration::from_secs(10)),
            registry: Mutex::new(Registry { last_heartbeat: Some(origin), ..Registry::default() }),
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
        lock_unpoisoned(&self.registry)
    }

    /// Whether the session holds nothing and has nothing left to do: no held node, no
    /// node to delete, no heartbeat or sweep in flight.
    pub(crate) fn is_idle(&self) -> bool {
        let registry = self.registry();
        registry.held.is_empty() && registry.unwanted.is_empty() && !registry.sweep_running && registry.heartbeats == 0
    }

    /// Whether the session has ended (expired, closed, authentication failed): nothing
    /// sent on it can succeed any more.
    pub(crate) fn is_ended(&self) -> bool {
        self.client.state().is_terminated() || self.registry().ended.is_some()
    }

    fn is_connected(&self) -> bool {
        matches!(self.client.state(), zk::SessionState::SyncConnected)
    }

    /// Notes that a request goes out now, and returns the time an answer through the
    /// leader confirms: now when this crate sent something shortly before (the guard
    /// covers that gap), else earlier by the gap the library's pings may have left.
    pub(crate) fn sending(&self) -> Instant {
        let now = Instant::now();
        let nanos = now.saturating_duration_since(self.origin).as_nanos().min(u64::MAX as u128) as u64;
        let prev = self.origin + Duration::from_nanos(self.last_sent.swap(nanos, Ordering::AcqRel));
        if now.saturating_duration_since(prev) <= self.heartbeat_every() {
            now
        } else {
            now.checked_sub(self.ping_gap.saturating_sub(self.heartbeat_every())).unwrap_or(self.origin)
        }
    }

    /// How often the monitor sends a `sync` while the session holds nodes.
    fn heartbeat_every(&self) -> Duration {
        self.negotiated / 10
    }

    /// A request sent at `sent` was answered through the leader: the leader has heard
    /// from us since (within the guard).
    pub(crate) fn confirm(&self, sent: Instant) {
        let nanos = sent.saturating_duration_since(self.origin).as_nanos().min(u64::MAX as u128) as u64;
        self.confirmed.fetch_max(nanos, Ordering::AcqRel);
    }

    fn confirmed_at(&self) -> Instant {
        self.origin + Duration::from_nanos(self.confirmed.load(Ordering::Acquire))
    }

    /// How long before the earliest possible server-side expiry the holds are given up.
    ///
    /// Only the leader expires sessions, and it learns that a client was heard from when
    /// the client's member reports its touched sessions, in its answer to the leader's
    /// next ping (every half tick). An answer that went through the leader (a `sync`, a
    /// write) shows the member's link to the leader worked when the request was sent, so
    /// the leader has heard of the client's packets up to the member's previous report
    /// (at most half a tick before; a tick is at most half the negotiated timeout, the
    /// shortest session the server grants being two ticks). The packet before that one
    /// went at most a heartbeat earlier ([`sending`](Session::sending) counts a longer
    /// silence against the confirmation). So a quarter plus a tenth of the timeout, and
    /// the drift allowance.
    pub(crate) fn guard(&self) -> Duration {
        guard_for(self.negotiated)
    }

    /// The waiter's node became a hold. Refused (`false`) when the session has ended: the
    /// node went with it, and no lost signal could fire for it any more.
    pub(crate) fn grant(&self, node: Arc<Node>) -> bool {
        {
            let mut registry = self.registry();
            if registry.ended.is_some() || self.client.state().is_terminated() {
                return false;
            }
            registry.owners.insert(owner_key(&node), node.uuid.clone());
            let expires_at = node.expires_at();
            registry.next_expiry = Some(registry.next_expiry.map_or(expires_at, |next| next.min(expires_at)));
            registry.held.insert(node.uuid.clone(), node);
        }
        self.kick.notify_one();
        true
    }

    /// The node `owner` holds on `name` as `kind` through this session, if any is live.
    pub(crate) fn held_by(&self, name: &LockName, owner: &OwnerId, kind: HoldKind) -> Option<Arc<Node>> {
        let registry = self.registry();
        let uuid = registry.owners.get(&(name.clone(), owner.clone(), kind))?;
        registry.held.get(uuid).filter(|node| node.is_live()).cloned()
    }

    /// The node is no longer held (released, or lost): forget it.
    pub(crate) fn forget(&self, node: &Node) {
        let mut registry = self.registry();
        if registry.held.get(&node.uuid).is_some_and(|held| std::ptr::eq(&**held, node)) {
            registry.held.remove(&node.uuid);
        }
        let key = owner_key(node);
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

    /// Whether each node at `paths` still exists, as the leader sees it: a `sync` (which
    /// the member forwards to the leader) pipelined in front of multi-reads of the nodes,
    /// so that a member cut off from the leader, still answering reads from its stale
    /// tree, cannot vouch for the holds. An answer confirms the session from the time the
    /// requests were sent. No timeout of its own: a late answer is still an answer, and the
    /// caller bounds the wait. `Unavailable` while disconnected.
    pub(crate) async fn confirm_nodes(&self, paths: &[&str]) -> Result<Vec<bool>, LockError> {
        if !self.is_connected() {
            return Err(LockError::unavailable(format!(
                "ZooKeeper session {} is disconnected",
                self.client.session_id()
            )));
        }
        if let Some(state) = self.registry().ended {
            return Err(LockError::unavailable(format!("the ZooKeeper session ended ({state})")));
        }
        let sent = self.sending();
        // Requests are sent when made, in this order, and a member answers a session's
        // requests in order: the reads are answered after the sync.
        let synced = self.client.sync("/");
        let reads: Vec<_> = paths
            .chunks(READ_CHUNK)
            .map(|chunk| {
                let mut reader = self.client.new_multi_reader();
                let added: Result<(), zk::Error> = chunk.iter().try_for_each(|path| reader.add_get_data(path));
                let commit = added.map(|()| reader.commit());
                async move { commit?.await }
            })
            .collect();
        let (synced, read) = futures::join!(synced, join_all(reads));
        match synced {
            Ok(()) | Err(zk::Error::NoNode) => {}
            Err(err) => return Err(lock_error("sync with the leader", err)),
        }
        let mut exists = Vec::with_capacity(paths.len());
        for results in read {
            for result in results.map_err(|err| lock_error("renewal check", err))? {
                exists.push(match result {
                    zk::MultiReadResult::Data { .. } => true,
                    zk::MultiReadResult::Error { err: zk::Error::NoNode } => false,
                    zk::MultiReadResult::Error { err } => return Err(lock_error("renewal check", err)),
                    // Only data reads were sent.
                    _ => false,
                });
            }
        }
        if exists.len() != paths.len() {
            let why = format!("ZooKeeper answered {} of {} node checks", exists.len(), paths.len());
            return Err(LockError::Backend(why.into()));
        }
        self.confirm(sent);
        Ok(exists)
    }

    /// The nodes at `paths` that this session holds and that are gone: deleted
    /// underneath their holder (an operator), or with the session.
    pub(crate) fn lose_missing(&self, paths: &[&str], exists: &[bool]) {
        let gone: Vec<Arc<Node>> = {
            let registry = self.registry();
            paths
                .iter()
                .zip(exists)
                .filter(|(_, exists)| !**exists)
                .filter_map(|(path, _)| {
                    let uuid = znode::uuid_of(path.rsplit('/').next()?)?;
                    registry.held.get(uuid).filter(|node| node.path == *path).cloned()
                })
                .collect()
        };
        for node in gone {
            self.lose(&node, self.gone_reason());
        }
    }

    /// Why a held node that vanished is gone: with its session, or deleted by someone.
    pub(crate) fn gone_reason(&self) -> LostReason {
        if self.is_ended() {
            LostReason::SessionExpired
        } else {
            LostReason::Expired
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
                    registry.owners.remove(&owner_key(&node));
                    registry.unwanted.push(node.unwanted());
                    lost.push((node, reason));
                }
            }
            registry.next_expiry = registry.held.values().map(|node| node.expires_at()).min();
        }
        if let Some(next) = registry.next_expiry {
            at(next);
        }

        // While disconnected, requests would only queue until the connection is back (the
        // state change wakes the monitor then).
        // While it holds nodes, the session sends a `sync` every tenth of its timeout, and
        // reads the held nodes every third (noticing nodes deleted underneath). Renewals
        // do both, and postpone them. None has a timeout of its own: a late answer still
        // confirms, and the library drops a connection that stays silent too long.
        if self.is_connected() && registry.heartbeats < MAX_HEARTBEATS && !registry.held.is_empty() {
            let confirmed = self.confirmed_at();
            let last = registry.last_heartbeat.map_or(confirmed, |last| last.max(confirmed));
            let due = last + self.heartbeat_every();
            if now >= due {
                let read_due =
                    registry.last_node_read.map_or(confirmed, |last| last.max(confirmed)) + self.negotiated / 3;
                let paths: Vec<String> = if now >= read_due {
                    registry.last_node_read = Some(now);
                    registry.held.values().map(|node| node.path.clone()).collect()
                } else {
                    Vec::new()
                };
                registry.heartbeats += 1;
                registry.last_heartbeat = Some(now);
                tokio::spawn(run_heartbeat(self.clone(), paths));
                at(now + self.heartbeat_every());
            } else {
                at(due);
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

/// One heartbeat: confirms the session through the leader and notices held nodes that
/// were deleted underneath their holders.
async fn run_heartbeat(session: Arc<Session>, paths: Vec<String>) {
    let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
    match session.confirm_nodes(&paths).await {
        Ok(exists) => session.lose_missing(&paths, &exists),
        Err(err) => tracing::debug!(%err, "heartbeat failed"),
    }
    session.registry().heartbeats -= 1;
    session.kick.notify_one();
}

/// The guard of a session of this negotiated timeout; see [`Session::guard`].
pub(crate) fn guard_for(negotiated: Duration) -> Duration {
    negotiated / 4 + negotiated / 10 + dlock_core::drift(negotiated)
}

fn owner_key(node: &Node) -> (LockName, OwnerId, HoldKind) {
    (node.name.clone(), node.owner.clone(), node.kind)
}

/// The library's connection timeout for a session of this requested timeout.
fn connection_timeout_for(requested: Duration) -> Duration {
    requested * 3 / 5
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
