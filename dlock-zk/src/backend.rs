//! [`ZkBackend`]: the lock recipe over ZooKeeper's primitives.
//!
//! `zookeeper-client` ships a cancellation-safe, Curator-compatible lock recipe
//! (`Client::lock` with `LockPrefix::new_curator`). It is not used as is because it
//! blocks until the lock is granted inside one call: the dlock contract needs a single
//! non-blocking attempt (`try_acquire`, and the client's wait loop with its wait bound and
//! cancellation), the created node's `czxid` as the fencing token (the recipe drops the
//! create's `Stat`), the owner and hold count in the node's data (re-entrancy, `inspect`),
//! and lost reasons. This recipe keeps its node layout (`_c_<uuid>-lock-<sequence>`, so
//! Curator clients queue in the same order) and its recovery of a create whose reply was
//! lost (the uuid finds the node), and adds what the contract needs.
//!
//! Readers and permits queue in the same sequence as the mutex, in the shape of Curator's
//! read-write lock: the kind is in the node's name, a node is granted when its kind is
//! compatible with every node ahead of it, and a waiter watches only a node whose
//! deletion it needs (see `znode::turn`). Every kind takes its node's czxid as its token.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dlock_core::backend::{Attempt, Backend, LostSignal, Release, Renewal, Request};
use dlock_core::{
    Capabilities, FencingToken, Holder, LeaseMode, LockError, LockInfo, LockName, LostReason, StoredResult, Swept,
    DEFAULT_TTL,
};
use zookeeper_client as zk;

use crate::config::ZkConfig;
use crate::error::{is_connection_loss, lock_error, retrying};
use crate::node::{CountChange, Node};
use crate::pool::SessionPool;
use crate::results::{self, Outcome};
use crate::session::Session;
use crate::settings::Settings;
use crate::znode::{self, Unwanted};

/// How many result znodes one sweep call reads (and deletes, where expired) at most:
/// few enough to take well under the operation timeout on a loaded server.
pub(crate) const SWEEP_BATCH: usize = 500;

/// The ttl of the session a request's node lives in. A watchdog lease's node lives as
/// long as a session of its ttl, which is what the ttl means here. A `Fixed` lease is
/// ended at its ttl by the client anyway, so its node lives in a session of at most
/// [`MAX_PLACE_LAPSE`](dlock_core::MAX_PLACE_LAPSE): a waiter (or holder) that dies
/// frees its place within seconds, however long the lease it asked for.
fn session_ttl(req: &Request) -> Duration {
    if req.mode.is_watchdog() {
        req.ttl()
    } else {
        req.place_lapse()
    }
}

/// The ZooKeeper backend: builds a [`Client`](dlock_core::Client) with
/// [`connect`](crate::connect), or by hand with [`ZkBackend::connect`].
///
/// Holds live on ZooKeeper sessions pooled by ttl bucket (a few sessions whatever the
/// ttls; one opened on first use of its bucket and closed when idle), whose requested
/// timeout is the bucket.
pub struct ZkBackend {
    settings: Arc<Settings>,
    pool: SessionPool,
    watch_events: AtomicU64,
    next_hold: AtomicU64,
    /// Where the last sweep call stopped (see `results::sweep`).
    sweep_cursor: std::sync::Mutex<String>,
}

impl std::fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkBackend").finish_non_exhaustive()
    }
}

impl ZkBackend {
    /// Connects to the ensemble: opens the session used for inspection and for leases of
    /// the default ttl, so that an unreachable ensemble fails here, with `Unavailable`
    /// within the connect timeout.
    pub async fn connect(config: ZkConfig) -> Result<Self, LockError> {
        config.validate()?;
        let settings = Arc::new(Settings::new(config));
        let backend = ZkBackend {
            pool: SessionPool::new(settings.clone()),
            settings,
            watch_events: AtomicU64::new(0),
            next_hold: AtomicU64::new(1),
            sweep_cursor: std::sync::Mutex::default(),
        };
        backend.session(DEFAULT_TTL).await?;
        Ok(backend)
    }

    /// The configuration.
    pub fn config(&self) -> &ZkConfig {
        &self.settings.config
    }

    /// How many watch notifications this client's waiters received: with the
    /// predecessor watch, one per hand-off of a mutex to one of them, whatever the
    /// queue's length (readers behind a writer each get one when it leaves; a permit
    /// waiter of `n` gets one per release among the `n` nodes just ahead of it).
    pub fn watch_events(&self) -> u64 {
        self.watch_events.load(Ordering::Relaxed)
    }

    /// The live sessions: `(ttl bucket, negotiated session timeout)` each, by bucket.
    pub fn sessions(&self) -> Vec<(Duration, Duration)> {
        self.pool.describe()
    }

    /// The session for leases of `ttl` (its bucket's), opened when there is none.
    async fn session(&self, ttl: Duration) -> Result<Arc<Session>, LockError> {
        self.pool.get(ttl).await
    }

    fn live_sessions(&self) -> Vec<Arc<Session>> {
        self.pool.live()
    }

    /// Any live session (for reads), opening the default one when none is live.
    async fn any_session(&self) -> Result<Arc<Session>, LockError> {
        match self.live_sessions().into_iter().next() {
            Some(session) => Ok(session),
            None => self.session(DEFAULT_TTL).await,
        }
    }

    fn hold(&self, req: &Request, session: Arc<Session>, node: Arc<Node>) -> ZkHold {
        let watchdog = matches!(req.mode, LeaseMode::Watchdog { .. });
        let id = self.next_hold.fetch_add(1, Ordering::Relaxed);
        node.admit(id);
        ZkHold { session, node, id, watchdog }
    }

    /// A re-entrant acquire: the owner already holds the lock through this client. The
    /// count goes up only once its store succeeded, so an attempt cut short (a timeout, a
    /// cancellation) changes nothing the lock depends on.
    async fn reenter(&self, req: &Request, started: Instant) -> Result<Option<Attempt<ZkHold>>, LockError> {
        for session in self.live_sessions() {
            let Some(node) = session.held_by(&req.name, &req.owner, req.kind) else { continue };
            let store =
                |count: u32| session.client().set_data(&node.path, &znode::encode_data(&node.owner, count), None);
            let propose = || node.with_count(|count| (count + 1, store(count + 1)));
            let Some((mut proposed, stored)) = propose() else { continue };
            let mut outcome = stored.await;
            while outcome.as_ref().is_err_and(is_connection_loss) {
                tokio::time::sleep(Duration::from_millis(10)).await;
                outcome = match propose() {
                    Some((count, stored)) => {
                        proposed = count;
                        stored.await
                    }
                    None => Err(zk::Error::NoNode),
                };
            }
            match outcome {
                Ok(_) => {
                    let Some(count) = node.enter() else { continue };
                    if count != proposed {
                        // A release stored its count meanwhile: store the current one (the
                        // request is sent at once; its answer is not needed).
                        drop(node.with_count(store));
                    }
                    node.extend(started + req.ttl());
                    let token = node.token;
                    return Ok(Some(Attempt::Granted { hold: self.hold(req, session, node), token }));
                }
                Err(zk::Error::NoNode) => session.lose(&node, LostReason::Expired),
                // The hold went with its session: acquire afresh.
                Err(_) if session.is_ended() => continue,
                Err(err) => return Err(lock_error("re-entrant acquire", err)),
            }
        }
        Ok(None)
    }

    /// Creates the lock's znode (a container where the server has them), and the root
    /// above it when missing.
    async fn ensure_lock_node(&self, session: &Session, lock_path: &str) -> Result<(), LockError> {
        let client = session.client();
        let settings = &self.settings;
        for _ in 0..4 {
            let containers = settings.containers.load(Ordering::Relaxed);
            let mode = if containers { zk::CreateMode::Container } else { zk::CreateMode::Persistent };
            let options = mode.with_acls(settings.acls());
            match retrying(|| client.create(lock_path, &[], &options)).await {
                Ok(_) | Err(zk::Error::NodeExists) => return Ok(()),
                Err(zk::Error::NoNode) => {
                    let root = &settings.config.root();
                    let options = zk::CreateMode::Persistent.with_acls(settings.acls());
                    match retrying(|| client.mkdir(root, &options)).await {
                        Ok(()) | Err(zk::Error::NodeExists) => {}
                        Err(err) => return Err(lock_error("create the root znode", err)),
                    }
                }
                Err(zk::Error::Unimplemented) if containers => {
                    tracing::debug!("the server has no container nodes; lock znodes are persistent");
                    settings.containers.store(false, Ordering::Relaxed);
                }
                Err(err) => return Err(lock_error("create the lock znode", err)),
            }
        }
        Err(LockError::unavailable(format!("the lock znode {lock_path} keeps disappearing")))
    }

    /// Creates the ticket's node and lists the queue in one round trip (the list is
    /// pipelined behind the create, so it sees the new node). A create whose reply was
    /// lost is found again by the ticket's uuid.
    async fn create_node(&self, req: &Request, ticket: &mut ZkTicket) -> Result<(Vec<String>, Instant), LockError> {
        let session = ticket.session.clone();
        let client = session.client();
        let settings = &self.settings;
        let prefix = znode::node_prefix(&ticket.lock_path, &ticket.uuid, req.kind);
        let data = znode::encode_data(&req.owner, 1);
        let options = zk::CreateMode::EphemeralSequential.with_acls(settings.acls());
        loop {
            let sent = session.sending();
            let create = client.create(&prefix, &data, &options);
            let list = client.list_children(&ticket.lock_path);
            let (created, listed) = futures::join!(create, list);
            match created {
                Ok((stat, sequence)) => {
                    ticket.node = Some((format!("{prefix}{sequence}"), token_of(&stat)));
                    let children = match listed {
                        Ok(children) => children,
                        Err(_) => retrying(|| client.list_children(&ticket.lock_path))
                            .await
                            .map_err(|e| lock_error("list", e))?,
                    };
                    return Ok((children, sent));
                }
                Err(zk::Error::NoNode) => self.ensure_lock_node(&session, &ticket.lock_path).await?,
                Err(err) if is_connection_loss(&err) => {
                    // The create may have been applied: look for the uuid before retrying
                    // (after a sync, so that a create applied elsewhere in the ensemble
                    // is seen).
                    let sent = session.sending();
                    match retrying(|| client.sync(&ticket.lock_path)).await {
                        Ok(()) | Err(zk::Error::NoNode) => {}
                        Err(err) => return Err(lock_error("sync", err)),
                    }
                    let children = match retrying(|| client.list_children(&ticket.lock_path)).await {
                        Ok(children) => children,
                        Err(zk::Error::NoNode) => continue,
                        Err(err) => return Err(lock_error("list", err)),
                    };
                    let Some(name) = children.iter().find(|n| znode::uuid_of(n) == Some(&ticket.uuid)) else {
                        continue;
                    };
                    let path = format!("{}/{name}", ticket.lock_path);
                    match retrying(|| client.get_data(&path)).await {
                        Ok((_, stat)) => {
                            ticket.node = Some((path, token_of(&stat)));
                            return Ok((children, sent));
                        }
                        Err(zk::Error::NoNode) => continue,
                        Err(err) => return Err(lock_error("read the lock node", err)),
                    }
                }
                Err(err) => return Err(lock_error("create the lock node", err)),
            }
        }
    }

    /// One attempt on the ticket's session (or the session of the request's ttl).
    async fn attempt_once(
        &self,
        req: &Request,
        ticket: &mut Option<ZkTicket>,
        started: Instant,
    ) -> Result<Attempt<ZkHold>, LockError> {
        if let Some(granted) = self.reenter(req, started).await? {
            if let Some(ticket) = ticket.take() {
                self.abandon(req, ticket).await;
            }
            return Ok(granted);
        }
        if ticket.as_ref().is_some_and(|t| t.session.is_ended()) {
            // The session and its node are gone; the place in the queue with them.
            if let Some(mut stale) = ticket.take() {
                stale.settled = true;
            }
        }
        if ticket.is_none() {
            let session = self.session(session_ttl(req)).await?;
            *ticket = Some(ZkTicket::new(session, self.settings.config.lock_path(&req.name)));
        }
        let Some(t) = ticket.as_mut() else { unreachable!("the ticket was just made") };
        let session = t.session.clone();
        let client = session.client();
        loop {
            let (children, sent) = if t.node.is_none() {
                self.create_node(req, t).await?
            } else {
                // The sync goes through the leader, so an answer confirms the session (a
                // member cut off from the leader cannot), and the list that follows it
                // sees every delete the leader committed before.
                let sent = session.sending();
                let synced_list = || async {
                    let (synced, listed) =
                        futures::join!(client.sync(&t.lock_path), client.list_children(&t.lock_path));
                    match synced {
                        Ok(()) | Err(zk::Error::NoNode) => listed,
                        Err(err) => Err(err),
                    }
                };
                match retrying(synced_list).await {
                    Ok(children) => (children, sent),
                    Err(zk::Error::NoNode) => (Vec::new(), sent),
                    Err(err) => return Err(lock_error("list", err)),
                }
            };
            let Some((own_path, token)) = t.node.clone() else { continue };
            let own_name = own_path.rsplit('/').next().unwrap_or_default();
            let mut queue = znode::queue(children);
            // Nodes of this attempt other than its own come from a create whose reply was
            // lost and that was sent again: delete them, or they would block the queue.
            // The monitor deletes them, retrying until it can.
            for twin in queue.iter().filter(|c| c.has_uuid(&t.uuid) && c.name != own_name) {
                let path = format!("{}/{}", t.lock_path, twin.name);
                tracing::debug!(%path, "deleting a duplicate node of this attempt");
                session.discard(Unwanted { lock_path: t.lock_path.clone(), uuid: t.uuid.clone(), path: Some(path) });
            }
            queue.retain(|c| !c.has_uuid(&t.uuid) || c.name == own_name);
            let Some(position) = queue.iter().position(|c| c.name == own_name) else {
                // Our node vanished (deleted underneath a waiter): queue again.
                tracing::debug!(path = %own_path, "the waiter's node is gone; queueing again");
                // Should it still exist unseen, it must not block the queue.
                session.discard(t.unwanted());
                t.node = None;
                t.watcher = None;
                continue;
            };
            let watch = match znode::turn(&queue, position) {
                znode::Turn::Granted => None,
                znode::Turn::Wait(ahead) => Some(ahead),
            };
            let Some(ahead) = watch else {
                session.confirm(sent);
                let node =
                    Arc::new(Node::new(req, t.lock_path.clone(), own_path, t.uuid.clone(), token, started + req.ttl()));
                if !session.grant(node.clone()) {
                    return Err(LockError::unavailable("the ZooKeeper session ended"));
                }
                if let Some(mut granted) = ticket.take() {
                    granted.settled = true;
                }
                return Ok(Attempt::Granted { hold: self.hold(req, session, node), token });
            };
            if !req.blocking {
                return Ok(Attempt::Busy { retry_after: None });
            }
            // Watch only the nodes the grant rule names: no grant of ours can come before
            // one of them is deleted, and nobody else is woken by it (no herd). For a
            // mutex it is the one node just ahead.
            let paths: Vec<String> =
                ahead.iter().filter_map(|&i| queue.get(i)).map(|c| format!("{}/{}", t.lock_path, c.name)).collect();
            let watches = paths.iter().map(|path| retrying(move || client.get_and_watch_data(path)));
            let mut watchers = Vec::with_capacity(paths.len());
            let mut gone = false;
            for watched in futures::future::join_all(watches).await {
                match watched {
                    Ok((_, _, watcher)) => watchers.push(watcher),
                    Err(zk::Error::NoNode) => gone = true,
                    Err(err) => return Err(lock_error("watch the node ahead", err)),
                }
            }
            // A node went between the list and the watch: look again.
            if gone {
                continue;
            }
            // Without a watch (the rule named no node, which it never does for a node in
            // the queue) the wait polls instead.
            t.watcher = match watchers.len() {
                0 => None,
                1 => Some(Box::pin(watchers.swap_remove(0).changed())),
                _ => Some(Box::pin(async move {
                    let changes = watchers.into_iter().map(|w| Box::pin(w.changed()));
                    futures::future::select_all(changes).await.0
                })),
            };
            return Ok(Attempt::Busy { retry_after: None });
        }
    }
}

/// Awaits the store of a node's hold count and, while the connection drops, stores the
/// count the node has by then (it may have changed meanwhile).
async fn store_count(
    session: &Session,
    node: &Node,
    first: impl Future<Output = Result<zk::Stat, zk::Error>>,
) -> Result<(), zk::Error> {
    let mut outcome = first.await.map(drop);
    while outcome.as_ref().is_err_and(is_connection_loss) {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let again = node
            .with_count(|count| session.client().set_data(&node.path, &znode::encode_data(&node.owner, count), None));
        outcome = match again {
            Some(stored) => stored.await.map(drop),
            // Lost or released meanwhile: nothing left to store.
            None => Ok(()),
        };
    }
    outcome
}

/// The newest holder and the number of waiters of the lock at `lock_path`.
async fn read_queue(session: &Session, lock_path: &str) -> Result<LockInfo, LockError> {
    let client = session.client();
    loop {
        let children = match retrying(|| client.list_children(lock_path)).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => return Ok(LockInfo { holder: None, waiters: Some(0) }),
            Err(err) => return Err(lock_error("list", err)),
        };
        let queue = znode::queue(children);
        let granted: Vec<&znode::Contender> =
            queue.iter().zip(znode::granted(&queue)).filter(|(_, granted)| *granted).map(|(c, _)| c).collect();
        // Readers and permits hold together: report the newest, as the memory backend does.
        let Some(newest) = granted.last() else { return Ok(LockInfo { holder: None, waiters: Some(0) }) };
        let waiters = queue.len() - granted.len();
        let newest_path = format!("{lock_path}/{}", newest.name);
        match retrying(|| client.get_data(&newest_path)).await {
            Ok((data, stat)) => {
                let (owner, count) = znode::decode_data(&data);
                // The hold lasts as long as its holder's session: no ttl to report.
                let holder = Holder { owner, token: token_of(&stat), count, remaining: None };
                return Ok(LockInfo { holder: Some(holder), waiters: Some(waiters) });
            }
            // The holder left between the two reads: look again.
            Err(zk::Error::NoNode) => continue,
            Err(err) => return Err(lock_error("read the lock node", err)),
        }
    }
}

/// A hold's fencing token: the czxid of its node.
pub(crate) fn token_of(stat: &zk::Stat) -> FencingToken {
    // A zxid is positive and grows with every write of the ensemble, across leader
    // elections (the epoch is its high half) and restarts (it is persisted).
    FencingToken::new(stat.czxid.max(0) as u64)
}

/// A granted hold: the node on its session, and this lease's id among the leases of a
/// re-entrant owner.
pub struct ZkHold {
    session: Arc<Session>,
    node: Arc<Node>,
    id: u64,
    /// Whether the lease is renewed by the watchdog (rather than `Fixed`).
    watchdog: bool,
}

impl std::fmt::Debug for ZkHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkHold").field("path", &self.node.path).field("token", &self.node.token).finish()
    }
}

type EventFuture = Pin<Box<dyn Future<Output = zk::WatchedEvent> + Send>>;

/// A waiter's place: its node in the lock's queue (once created) and the watch on the
/// nodes ahead of it whose deletion it waits for.
pub struct ZkTicket {
    session: Arc<Session>,
    lock_path: String,
    uuid: String,
    node: Option<(String, FencingToken)>,
    watcher: Option<EventFuture>,
    settled: bool,
}

impl ZkTicket {
    fn new(session: Arc<Session>, lock_path: String) -> Self {
        let uuid = uuid::Uuid::new_v4().to_string();
        ZkTicket { session, lock_path, uuid, node: None, watcher: None, settled: false }
    }

    fn unwanted(&self) -> Unwanted {
        Unwanted {
            lock_path: self.lock_path.clone(),
            uuid: self.uuid.clone(),
            path: self.node.as_ref().map(|(path, _)| path.clone()),
        }
    }
}

/// Hands a node to the session's monitor for deletion unless disarmed: the release of a
/// node whose delete was not confirmed.
struct Fallback<'a> {
    session: &'a Session,
    node: Option<Unwanted>,
}

impl<'a> Fallback<'a> {
    fn new(session: &'a Session, node: Unwanted) -> Self {
        Fallback { session, node: Some(node) }
    }

    fn disarm(&mut self) {
        self.node = None;
    }
}

impl Drop for Fallback<'_> {
    fn drop(&mut self) {
        if let Some(node) = self.node.take() {
            self.session.discard(node);
        }
    }
}

impl Drop for ZkTicket {
    fn drop(&mut self) {
        // A ticket dropped without being granted or given back: its node must not stay.
        if !self.settled {
            self.session.discard(self.unwanted());
        }
    }
}

impl std::fmt::Debug for ZkTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkTicket").field("lock", &self.lock_path).field("node", &self.node).finish()
    }
}

#[async_trait]
impl Backend for ZkBackend {
    type Hold = ZkHold;
    type Ticket = ZkTicket;

    fn name(&self) -> &'static str {
        "zookeeper"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }

    /// Every waiter has a sequential node in the name's queue, whichever client it came from.
    fn grants_in_request_order(&self, _req: &Request) -> bool {
        true
    }

    async fn attempt(&self, req: &Request, ticket: &mut Option<ZkTicket>) -> Result<Attempt<ZkHold>, LockError> {
        let started = Instant::now();
        match self.attempt_once(req, ticket, started).await {
            // The session ended under the attempt (it expired while disconnected): the
            // node went with it; queue again on a fresh session.
            Err(err) if ticket.as_ref().is_some_and(|t| t.session.is_ended()) => {
                tracing::debug!(%err, "the session ended during the attempt; trying on a new one");
                if let Some(mut stale) = ticket.take() {
                    stale.settled = true;
                }
                self.attempt_once(req, ticket, started).await
            }
            outcome => outcome,
        }
    }

    async fn wait(
        &self,
        _req: &Request,
        ticket: &mut Option<ZkTicket>,
        until: tokio::time::Instant,
    ) -> Result<(), LockError> {
        let watcher = ticket.as_mut().and_then(|t| t.watcher.as_mut());
        match watcher {
            Some(watcher) => {
                let woken = tokio::time::timeout_at(until, watcher).await;
                if let Ok(event) = woken {
                    if let Some(t) = ticket.as_mut() {
                        t.watcher = None;
                    }
                    if event.event_type != zk::EventType::Session {
                        self.watch_events.fetch_add(1, Ordering::Relaxed);
                    }
                    tracing::debug!(event = ?event.event_type, path = %event.path, "woken by the node ahead");
                }
            }
            // Nothing to wait for: look again soon rather than spin.
            None => tokio::time::sleep_until(until.min(tokio::time::Instant::now() + Duration::from_millis(100))).await,
        }
        Ok(())
    }

    async fn abandon(&self, _req: &Request, mut ticket: ZkTicket) {
        ticket.watcher = None;
        if ticket.session.is_ended() {
            // The node went with the session.
            ticket.settled = true;
            return;
        }
        // Without a path the create's outcome is unknown: dropping the unsettled ticket
        // hands the search for its node to the monitor. So does a delete that fails, or
        // that is cut short by the operation timeout.
        let Some((path, _)) = ticket.node.clone() else { return };
        let client = ticket.session.client();
        match retrying(|| client.delete(&path, None)).await {
            Ok(()) | Err(zk::Error::NoNode) => ticket.settled = true,
            Err(err) => tracing::debug!(%path, %err, "giving up the place in the queue is left to the monitor"),
        }
    }

    async fn renew(&self, hold: &ZkHold, ttl: Duration) -> Result<Renewal, LockError> {
        self.renew_many(&[hold], ttl).await.pop().unwrap_or_else(|| Err(LockError::unavailable("no renewal answer")))
    }

    /// One `sync` and multi-read per session for all the holds: a hold is renewed when the
    /// leader-confirmed read finds its node.
    async fn renew_many(&self, holds: &[&ZkHold], ttl: Duration) -> Vec<Result<Renewal, LockError>> {
        let called = Instant::now();
        let mut answers: Vec<Option<Result<Renewal, LockError>>> =
            holds.iter().map(|hold| hold.node.lost().map(|reason| Ok(Renewal::Lost(reason)))).collect();
        // Holds of one ttl share a session, but a re-entered hold may live on another.
        let mut groups: Vec<(&Arc<Session>, Vec<usize>)> = Vec::new();
        for (i, hold) in holds.iter().enumerate().filter(|(i, _)| answers[*i].is_none()) {
            match groups.iter_mut().find(|(session, _)| Arc::ptr_eq(session, &hold.session)) {
                Some((_, members)) => members.push(i),
                None => groups.push((&hold.session, vec![i])),
            }
        }
        let checks = groups.iter().map(|(session, members)| async move {
            let paths: Vec<&str> = members.iter().map(|&i| holds[i].node.path.as_str()).collect();
            let outcome = session.confirm_nodes(&paths).await;
            if let Ok(exists) = &outcome {
                session.lose_missing(&paths, exists);
            }
            outcome
        });
        let outcomes = futures::future::join_all(checks).await;
        for ((session, members), outcome) in groups.iter().zip(outcomes) {
            match outcome {
                Ok(exists) => {
                    for (&i, exists) in members.iter().zip(exists) {
                        let node = &holds[i].node;
                        answers[i] = Some(Ok(match node.lost() {
                            Some(reason) => Renewal::Lost(reason),
                            None if !exists => {
                                session.lose(node, session.gone_reason());
                                Renewal::Lost(node.lost().unwrap_or(LostReason::Expired))
                            }
                            None => {
                                node.extend(called + ttl);
                                Renewal::Renewed
                            }
                        }));
                    }
                }
                Err(err) => {
                    // The last hold of the group gets the error itself, with its source.
                    if let Some((&last, others)) = members.split_last() {
                        for &i in others {
                            answers[i] = Some(Err(LockError::unavailable(err.to_string())));
                        }
                        answers[last] = Some(Err(err));
                    }
                }
            }
        }
        answers
            .into_iter()
            .map(|answer| answer.unwrap_or_else(|| Err(LockError::unavailable("no renewal answer"))))
            .collect()
    }

    async fn release(&self, hold: &ZkHold) -> Result<Release, LockError> {
        let (node, session) = (&hold.node, &hold.session);
        node.unwatch(hold.id);
        enum Sent<S, D> {
            Gone,
            Store(S),
            Delete(D),
        }
        let sent = node.leave(|change| match change {
            CountChange::Gone => Sent::Gone,
            CountChange::Store(count) => {
                Sent::Store(session.client().set_data(&node.path, &znode::encode_data(&node.owner, count), None))
            }
            CountChange::Delete => Sent::Delete(session.client().delete(&node.path, None)),
        });
        match sent {
            Sent::Gone => Ok(Release::NotHeld),
            Sent::Store(stored) => match store_count(session, node, stored).await {
                Ok(()) => Ok(Release::Released),
                Err(zk::Error::NoNode) => {
                    session.lose(node, LostReason::Expired);
                    Ok(Release::NotHeld)
                }
                Err(err) => Err(lock_error("release", err)),
            },
            Sent::Delete(deleted) => {
                session.forget(node);
                // Should this future be dropped before the delete is confirmed (the
                // operation timeout), the monitor deletes the node instead.
                let mut fallback = Fallback::new(session, node.unwanted());
                let outcome = match deleted.await {
                    Err(err) if is_connection_loss(&err) => {
                        match retrying(|| session.client().delete(&node.path, None)).await {
                            // The first delete, whose reply was lost, took the node.
                            Err(zk::Error::NoNode) => Ok(()),
                            other => other,
                        }
                    }
                    other => other,
                };
                match outcome {
                    Ok(()) => {
                        fallback.disarm();
                        Ok(Release::Released)
                    }
                    Err(zk::Error::NoNode) => {
                        fallback.disarm();
                        Ok(Release::NotHeld)
                    }
                    Err(err) => Err(lock_error("release", err)),
                }
            }
        }
    }

    async fn inspect(&self, name: &LockName) -> Result<LockInfo, LockError> {
        let session = self.any_session().await?;
        match read_queue(&session, &self.settings.config.lock_path(name)).await {
            // The session ended under the read: read again on a live one.
            Err(_) if session.is_ended() => {
                let session = self.any_session().await?;
                read_queue(&session, &self.settings.config.lock_path(name)).await
            }
            outcome => outcome,
        }
    }

    /// Checks the hold on the client first (a hold given up or past its ttl is not the
    /// live one even while its node is still there), then on the server, in the
    /// transaction that writes the record (see `results::store`).
    async fn store_result(
        &self,
        hold: &ZkHold,
        token: FencingToken,
        value: &[u8],
        retention: Duration,
    ) -> Result<(), LockError> {
        let node = &hold.node;
        // The node is shared by the owner's re-entrant leases: this lease itself must still
        // ride on it, not only the node be held.
        if !node.rides(hold.id) || node.expires_at() <= Instant::now() {
            return Err(LockError::not_held());
        }
        let path = self.settings.config.result_path(&node.name);
        let record = results::encode(token, results::expiry_ms(retention), value);
        match results::store(&self.settings, &hold.session, node, &path, token, &record).await? {
            Outcome::Written => Ok(()),
            Outcome::NotHeld => Err(LockError::not_held()),
            Outcome::Unknown => {
                let session = self.any_session().await?;
                match results::read(session.client(), &path).await {
                    Ok(Some((data, _))) if data == record => Ok(()),
                    Ok(_) => Err(LockError::not_held()),
                    Err(err) => Err(lock_error("read the result back", err)),
                }
            }
        }
    }

    /// Reads through the leader (a `sync` in front of the read): a result stored through
    /// another member is seen once its store has returned.
    async fn load_result(&self, name: &LockName) -> Result<Option<StoredResult>, LockError> {
        let path = self.settings.config.result_path(name);
        let session = self.any_session().await?;
        let read = match results::read(session.client(), &path).await {
            // The session ended under the read: read again on a live one.
            Err(_) if session.is_ended() => {
                let session = self.any_session().await?;
                results::read(session.client(), &path).await
            }
            outcome => outcome,
        };
        let Some((data, _)) = read.map_err(|err| lock_error("read the result", err))? else {
            return Ok(None);
        };
        let record = results::decode(&data, &path)?;
        Ok((!record.is_expired(results::now_ms())).then(|| record.to_stored()))
    }

    /// Deletes result znodes whose record has expired, at most 1,000 a call.
    /// Lock znodes need no sweep: they are containers, which the server deletes once
    /// empty; tokens are zxids, so no counter stays either.
    async fn sweep(&self) -> Result<Swept, LockError> {
        let session = self.any_session().await?;
        results::sweep(&self.settings, &session, SWEEP_BATCH, &self.sweep_cursor).await
    }

    fn target(&self) -> String {
        target(&self.settings.config)
    }

    /// A watchdog lease's renewals are what confirm its session: each keeps the hold for
    /// the session timeout the server negotiated (perhaps below the ttl), less the guard
    /// by which confirmations lag (see `Session::guard`). A `Fixed` lease (or an
    /// extension of one) is kept for its ttl by the client, on a session whose own
    /// heartbeats keep it alive and whose lost signal fires before the server could end
    /// it.
    fn effective_ttl(&self, hold: &ZkHold, requested: Duration) -> Duration {
        if hold.watchdog {
            requested.min(hold.session.negotiated().saturating_sub(hold.session.guard()))
        } else {
            requested
        }
    }

    fn watch_hold(&self, hold: &ZkHold, signal: LostSignal) {
        hold.node.watch(hold.id, signal);
    }
}

/// Where a client of `config` keeps its locks (see [`Backend::target`]): the servers and
/// the root znode.
pub(crate) fn target(config: &ZkConfig) -> String {
    let scheme = if config.is_tls() { "zks" } else { "zk" };
    format!("{scheme}://{}{}", config.connect_string(), config.root())
}
