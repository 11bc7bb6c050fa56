//! Release notifications: one pub/sub connection per client, shared by all its waiters.
//!
//! A waiter registers for a lock's channel ([`Subscriptions::subscribe`]) before it
//! tries the lock again, so a release after that try cannot go unnoticed: either the
//! `SUBSCRIBE` was confirmed before the try (and the release message arrives), or the
//! pub/sub connection is down, and then every waiter is woken as soon as it is back
//! (messages may have been missed meanwhile). Waiters also wake at the holder's
//! remaining ttl, so an expired or deleted hold, which sends no message, is noticed too.
//!
//! A task owns the connection: it connects on the first subscription, subscribes and
//! unsubscribes in the order waiters come and go, checks the connection with a `PING`
//! now and then, and reconnects (resubscribing everything) when it breaks, or, through
//! Sentinel, when the client moves to a new master: releases are published there.
//!
//! On a Cluster of Redis 7 or later the task listens by sharded pub/sub instead, on the
//! primary that serves each channel's slot ([`crate::shards`]): a channel whose
//! subscription is lost there (its slot migrated, its primary failed over or stopped
//! answering) is subscribed again where the slot is served then, with a growing delay
//! while that fails, and its waiters are woken once it is (a release may have been
//! published meanwhile). Channels of other slots keep their subscriptions.
//!
//! A waiter waits for its subscription a quarter of the operation timeout at most: past
//! that (the pub/sub connection cannot be opened, or its server is frozen while the
//! command connection works) it looks at the lock without it and falls back to looking
//! again at the holder's remaining ttl; the registration stays, and is woken when the
//! subscription is in place after all.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::Instant;

use crate::connection::NodeSource;
use crate::scripts::Publish;
use crate::sentinel::MasterChanges;
use crate::shards::{ShardEvent, Shards};

/// How often an idle pub/sub connection is checked with a `PING`.
const HEALTH_CHECK_EVERY: Duration = Duration::from_secs(5);

/// Delay between reconnection attempts, doubling up to the maximum.
const RECONNECT_MIN: Duration = Duration::from_millis(50);
const RECONNECT_MAX: Duration = Duration::from_secs(2);

/// The share of the operation timeout a waiter waits for its subscription.
const CONFIRM_SHARE: u32 = 4;

/// The delay before the next attempt after `failures` failed ones.
fn backoff(failures: usize) -> Duration {
    RECONNECT_MIN.saturating_mul(1 << failures.min(6)).min(RECONNECT_MAX)
}

/// The shared pub/sub connection of one client.
#[derive(Clone)]
pub struct Subscriptions {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Subscriptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscriptions").finish_non_exhaustive()
    }
}

struct Shared {
    state: Mutex<State>,
    requests: mpsc::UnboundedSender<Request>,
    /// How long a waiter waits for its subscription before it looks without it.
    confirm_within: Duration,
    /// How the waiters listen, so how releases must be published.
    publish: Publish,
}

#[derive(Default)]
struct State {
    channels: HashMap<String, Channel>,
    next_id: u64,
}

#[derive(Default)]
struct Channel {
    waiters: HashMap<u64, Waiter>,
    /// The server confirmed the subscription on the current connection.
    confirmed: bool,
}

struct Waiter {
    notify: Arc<Notify>,
    /// The only message that wakes it (besides reconnections), if it is particular.
    payload: Option<String>,
}

enum Request {
    Subscribe { channel: String, done: oneshot::Sender<()> },
    Unsubscribe { channel: String },
}

/// Completes when the subscription of a [`Registration`] is in place (see
/// [`Subscriptions::register`]).
#[derive(Debug)]
pub struct Confirmation {
    pending: Option<oneshot::Receiver<()>>,
}

impl Confirmation {
    /// Waits for the server's confirmation, or for the news that the connection is down.
    pub async fn confirmed(self) {
        if let Some(pending) = self.pending {
            let _ = pending.await;
        }
    }
}

/// A waiter's registration for one channel: woken on each message, and whenever the
/// connection was re-established. Dropping it unregisters (and unsubscribes the last).
pub struct Registration {
    shared: Arc<Shared>,
    channel: String,
    id: u64,
    notify: Arc<Notify>,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration").field("channel", &self.channel).field("id", &self.id).finish()
    }
}

impl Registration {
    /// Completes at the next message or reconnection since the last call (a wake-up that
    /// came before this call is not lost).
    pub async fn notified(&self) {
        self.notify.notified().await;
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut state = self.shared.state();
        let Some(channel) = state.channels.get_mut(&self.channel) else { return };
        channel.waiters.remove(&self.id);
        if channel.waiters.is_empty() {
            state.channels.remove(&self.channel);
            // Sent under the lock, so the task sees unsubscribes and subscribes of one
            // channel in the order they happened.
            let _ = self.shared.requests.send(Request::Unsubscribe { channel: std::mem::take(&mut self.channel) });
        }
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        dlock_core::backend::lock_unpoisoned(&self.state)
    }

    /// Wakes the waiters of one channel, or of all; with a message, only those that wait
    /// for any message or for that one.
    fn wake(&self, channel: Option<&str>, message: Option<&[u8]>) {
        let state = self.state();
        let wanted = |w: &&Waiter| match (&w.payload, message) {
            (Some(payload), Some(message)) => payload.as_bytes() == message,
            _ => true,
        };
        match channel {
            Some(name) => {
                if let Some(channel) = state.channels.get(name) {
                    channel.waiters.values().filter(wanted).for_each(|w| w.notify.notify_one());
                }
            }
            None => state.channels.values().flat_map(|c| c.waiters.values()).for_each(|w| w.notify.notify_one()),
        }
    }
}

impl Subscriptions {
    /// Starts the task that will own the pub/sub connection (it connects when the first
    /// waiter subscribes). Must be called inside a Tokio runtime.
    pub fn start(nodes: NodeSource, connect_timeout: Duration, op_timeout: Duration) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            requests: tx,
            confirm_within: op_timeout / CONFIRM_SHARE,
            publish: nodes.publish(),
        });
        let task = Task { shared: Arc::downgrade(&shared), nodes, connect_timeout, op_timeout };
        tokio::spawn(task.run(rx));
        Subscriptions { shared }
    }

    /// How releases must be published for these subscriptions to hear them.
    pub fn publish(&self) -> Publish {
        self.shared.publish
    }

    /// Registers for `channel`, returning once a message published from now on will wake
    /// the registration: the server confirmed the subscription, or the connection is down
    /// (and the registration will be woken when it is back), or a quarter of the
    /// operation timeout passed (and the registration will be woken when the subscription
    /// is confirmed after all; the waiter looks again at the holder's ttl meanwhile).
    pub async fn subscribe(&self, channel: &str) -> Registration {
        let (registration, confirmation) = self.register(channel, Arc::new(Notify::new()));
        self.confirmed_in_time(channel, confirmation).await;
        registration
    }

    /// Waits for a confirmation, a quarter of the operation timeout at most.
    async fn confirmed_in_time(&self, channel: &str, confirmation: Confirmation) {
        let within = self.shared.confirm_within;
        if tokio::time::timeout(within, confirmation.confirmed()).await.is_err() {
            tracing::debug!(channel, ?within, "no pub/sub subscription in time; looking at the holder's ttl meanwhile");
        }
    }

    /// Registers for `channel` at once, waking `notify` on each message (several
    /// registrations may share one `Notify`, so that a waiter subscribed on several servers
    /// wakes once). The [`Confirmation`] completes when a message published from then on
    /// will wake it, as for [`subscribe`](Self::subscribe); a waiter that stops waiting
    /// for it earlier is woken when the confirmation comes after all, since a message may
    /// have gone unseen until then.
    pub fn register(&self, channel: &str, notify: Arc<Notify>) -> (Registration, Confirmation) {
        self.register_for(channel, None, notify)
    }

    /// Registers for the messages on `channel` that are exactly `payload`, as
    /// [`subscribe`](Self::subscribe) does for all of them: many waiters of one client
    /// can share a channel and yet be woken one at a time.
    pub async fn subscribe_for(&self, channel: &str, payload: &str) -> Registration {
        let (registration, confirmation) =
            self.register_for(channel, Some(payload.to_string()), Arc::new(Notify::new()));
        self.confirmed_in_time(channel, confirmation).await;
        registration
    }

    /// As [`subscribe_for`](Self::subscribe_for), but only when the channel is subscribed
    /// and confirmed already (another waiter of this client listens on it): then the
    /// registration is in place at once, with no round trip.
    pub fn subscribed_for(&self, channel: &str, payload: &str) -> Option<Registration> {
        let notify = Arc::new(Notify::new());
        let mut state = self.shared.state();
        let id = state.next_id;
        let entry = state.channels.get_mut(channel).filter(|c| c.confirmed)?;
        entry.waiters.insert(id, Waiter { notify: notify.clone(), payload: Some(payload.to_string()) });
        state.next_id += 1;
        Some(Registration { shared: self.shared.clone(), channel: channel.to_string(), id, notify })
    }

    fn register_for(
        &self,
        channel: &str,
        payload: Option<String>,
        notify: Arc<Notify>,
    ) -> (Registration, Confirmation) {
        let (id, confirmed) = {
            let mut state = self.shared.state();
            let id = state.next_id;
            state.next_id += 1;
            let entry = state.channels.entry(channel.to_string()).or_default();
            entry.waiters.insert(id, Waiter { notify: notify.clone(), payload });
            (id, entry.confirmed)
        };
        let registration = Registration { shared: self.shared.clone(), channel: channel.to_string(), id, notify };
        let mut pending = None;
        if !confirmed {
            let (done, confirmation) = oneshot::channel();
            if self.shared.requests.send(Request::Subscribe { channel: channel.to_string(), done }).is_ok() {
                pending = Some(confirmation);
            }
        }
        (registration, Confirmation { pending })
    }

    /// How many channels have waiters now (for tests and metrics).
    pub fn channels(&self) -> usize {
        self.shared.state().channels.len()
    }
}

struct Task {
    shared: std::sync::Weak<Shared>,
    nodes: NodeSource,
    connect_timeout: Duration,
    op_timeout: Duration,
}

/// How a connected session ended.
enum Ended {
    /// The client is gone.
    Closed,
    /// The connection broke.
    Broken,
    /// The master moved (through Sentinel): releases are published on the new one now.
    Moved,
}

/// What the task listens through.
enum Link {
    /// One connection, `SUBSCRIBE`: broken as a whole.
    Classic { sink: PubSubSink, stream: PubSubStream },
    /// A connection per primary of a Cluster, `SSUBSCRIBE`: channels are lost and placed
    /// again one by one, and the link as a whole never breaks.
    Sharded(Box<Shards>),
}

/// What a link heard.
enum Event {
    Message {
        channel: String,
        payload: Vec<u8>,
    },
    /// These channels are subscribed nowhere any more.
    Lost(Vec<String>),
    /// The connection broke.
    Broken,
}

impl Link {
    async fn next(&mut self) -> Event {
        match self {
            Link::Classic { stream, .. } => match stream.next().await {
                Some(message) => Event::Message {
                    channel: message.get_channel_name().to_string(),
                    payload: message.get_payload_bytes().to_vec(),
                },
                None => Event::Broken,
            },
            Link::Sharded(shards) => match shards.next().await {
                ShardEvent::Message { channel, payload } => Event::Message { channel, payload },
                ShardEvent::Lost(channels) => Event::Lost(channels),
            },
        }
    }

    /// Subscribes `channels`: those subscribed now, or `None` when the link broke.
    async fn subscribe(&mut self, channels: &[String], timeout: Duration) -> Option<Vec<String>> {
        match self {
            Link::Classic { sink, .. } => match tokio::time::timeout(timeout, sink.subscribe(channels)).await {
                Ok(Ok(())) => Some(channels.to_vec()),
                _ => None,
            },
            Link::Sharded(shards) => Some(shards.subscribe(channels).await),
        }
    }

    /// Unsubscribes `channel`; false when the link broke.
    async fn unsubscribe(&mut self, channel: &str, timeout: Duration) -> bool {
        match self {
            Link::Classic { sink, .. } => {
                matches!(tokio::time::timeout(timeout, sink.unsubscribe(channel)).await, Ok(Ok(())))
            }
            Link::Sharded(shards) => {
                shards.unsubscribe(channel).await;
                true
            }
        }
    }

    /// Checks the connections with a `PING`; false when the link broke (a sharded link
    /// closes the connections that fail, and their channels come as lost).
    async fn check(&mut self, timeout: Duration) -> bool {
        match self {
            Link::Classic { sink, .. } => {
                matches!(tokio::time::timeout(timeout, sink.ping::<redis::Value>()).await, Ok(Ok(_)))
            }
            Link::Sharded(shards) => {
                shards.check().await;
                true
            }
        }
    }
}

/// The channels a sharded link could not subscribe (their primary unreachable, or not
/// known yet), tried again with a delay that grows while they keep failing.
#[derive(Default)]
struct Unplaced {
    channels: BTreeSet<String>,
    failures: usize,
    at: Option<Instant>,
}

impl Unplaced {
    fn add(&mut self, channel: String) {
        self.channels.insert(channel);
        if self.at.is_none() {
            self.at = Some(Instant::now() + backoff(self.failures));
        }
    }

    fn contains(&self, channel: &str) -> bool {
        self.channels.contains(channel)
    }

    fn remove(&mut self, channel: &str) {
        self.channels.remove(channel);
        if self.channels.is_empty() {
            *self = Unplaced::default();
        }
    }

    /// Completes when the channels are due for another try; never while there are none.
    async fn due(&self) {
        match self.at {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    }

    /// After a round of tries: again later, if some are left.
    fn tried(&mut self) {
        if self.channels.is_empty() {
            *self = Unplaced::default();
        } else {
            self.failures += 1;
            self.at = Some(Instant::now() + backoff(self.failures));
        }
    }
}

impl Task {
    async fn run(self, mut requests: mpsc::UnboundedReceiver<Request>) {
        // Idle until someone subscribes.
        let mut pending = match requests.recv().await {
            Some(request) => Some(request),
            None => return,
        };
        let mut failures = 0usize;
        let mut reconnecting = false;
        let mut moves = self.nodes.changes();
        loop {
            // A waiter answered while no connection was up may have missed a release;
            // on the very first connection every waiter is still waiting for its answer.
            let wake_all = reconnecting || failures > 0;
            // Seen before the node is chosen: a move after this one reconnects again.
            moves.seen();
            let link = match self.connect(failures, wake_all).await {
                Some(link) => link,
                None => {
                    // Answer waiters at once: the wake-up after reconnecting covers them.
                    if !self.drain(&mut requests, &mut pending) {
                        return;
                    }
                    let delay = backoff(failures);
                    failures += 1;
                    tokio::time::sleep(delay).await;
                    continue;
                }
            };
            failures = 0;
            reconnecting = true;
            match self.serve(link, &mut requests, &mut pending, &mut moves).await {
                Ended::Closed => return,
                Ended::Broken => tracing::debug!("the Redis pub/sub connection broke; reconnecting"),
                Ended::Moved => tracing::debug!("the Redis master changed; moving the pub/sub connection to it"),
            }
        }
    }

    /// Answers queued requests while disconnected. Returns false when the client is gone.
    fn drain(&self, requests: &mut mpsc::UnboundedReceiver<Request>, pending: &mut Option<Request>) -> bool {
        pending.take();
        loop {
            match requests.try_recv() {
                Ok(_) => {}
                Err(mpsc::error::TryRecvError::Empty) => return self.shared.strong_count() > 0,
                Err(mpsc::error::TryRecvError::Disconnected) => return false,
            }
        }
    }

    /// Connects and subscribes to every channel that has waiters, then wakes them all if
    /// `wake_all`. A sharded link connects to each primary when it first subscribes a
    /// channel there; it never breaks, so it is made once, before any channel.
    async fn connect(&self, attempt: usize, wake_all: bool) -> Option<Link> {
        if let NodeSource::Shards(nodes) = &self.nodes {
            return Some(Link::Sharded(Box::new(Shards::new(
                (**nodes).clone(),
                self.connect_timeout,
                self.op_timeout,
            ))));
        }
        let open = async {
            let client = self.nodes.client(attempt).await?;
            let (mut sink, stream) = client.get_async_pubsub().await?.split();
            let channels: Vec<String> = match self.shared.upgrade() {
                Some(shared) => shared.state().channels.keys().cloned().collect(),
                None => Vec::new(),
            };
            if !channels.is_empty() {
                sink.subscribe(&channels).await?;
            }
            Ok::<_, redis::RedisError>((sink, stream, channels))
        };
        let (sink, stream, channels) = match tokio::time::timeout(self.connect_timeout, open).await {
            Ok(Ok(connection)) => connection,
            Ok(Err(err)) => {
                tracing::debug!(%err, "cannot open the Redis pub/sub connection");
                return None;
            }
            Err(_) => {
                tracing::debug!("opening the Redis pub/sub connection timed out");
                return None;
            }
        };
        let shared = self.shared.upgrade()?;
        {
            let mut state = shared.state();
            for channel in &channels {
                if let Some(entry) = state.channels.get_mut(channel) {
                    entry.confirmed = true;
                }
            }
        }
        if wake_all {
            shared.wake(None, None);
        }
        Some(Link::Classic { sink, stream })
    }

    async fn serve(
        &self,
        mut link: Link,
        requests: &mut mpsc::UnboundedReceiver<Request>,
        pending: &mut Option<Request>,
        moves: &mut MasterChanges,
    ) -> Ended {
        let mut health = tokio::time::interval(HEALTH_CHECK_EVERY);
        health.reset();
        let mut unplaced = Unplaced::default();
        loop {
            let request = match pending.take() {
                Some(request) => Some(request),
                None => tokio::select! {
                    request = requests.recv() => match request {
                        Some(request) => Some(request),
                        None => return Ended::Closed,
                    },
                    event = link.next() => {
                        let Some(shared) = self.shared.upgrade() else { return Ended::Closed };
                        match event {
                            Event::Message { channel, payload } => shared.wake(Some(&channel), Some(&payload)),
                            Event::Lost(channels) => {
                                let mut state = shared.state();
                                for channel in channels {
                                    if let Some(entry) = state.channels.get_mut(&channel) {
                                        entry.confirmed = false;
                                        unplaced.add(channel);
                                    }
                                }
                            }
                            Event::Broken => return self.broken(),
                        }
                        None
                    },
                    _ = health.tick() => {
                        if !link.check(self.op_timeout).await {
                            return self.broken();
                        }
                        None
                    }
                    () = unplaced.due() => {
                        match self.place(&mut link, &mut unplaced).await {
                            Some(()) => None,
                            None => return self.broken(),
                        }
                    }
                    () = moves.changed() => {
                        return match self.broken() {
                            Ended::Broken => Ended::Moved,
                            closed => closed,
                        };
                    }
                },
            };
            let Some(request) = request else { continue };
            let Some(shared) = self.shared.upgrade() else { return Ended::Closed };
            match request {
                Request::Subscribe { channel, done } => {
                    if shared.state().channels.get(&channel).is_none_or(|c| c.confirmed) {
                        confirm(&shared, &channel, done);
                        continue;
                    }
                    if unplaced.contains(&channel) {
                        // Its primary could not be reached just now: answered at once, and
                        // woken when the next try places it.
                        let _ = done.send(());
                        continue;
                    }
                    drop(shared);
                    match link.subscribe(std::slice::from_ref(&channel), self.op_timeout).await {
                        Some(subscribed) if !subscribed.is_empty() => {
                            if let Some(shared) = self.shared.upgrade() {
                                if let Some(entry) = shared.state().channels.get_mut(&channel) {
                                    entry.confirmed = true;
                                }
                                confirm(&shared, &channel, done);
                            }
                        }
                        Some(_) => {
                            let _ = done.send(());
                            unplaced.add(channel);
                        }
                        None => {
                            let _ = done.send(());
                            return self.broken();
                        }
                    }
                }
                Request::Unsubscribe { channel } => {
                    // Someone registered for it again since: keep the subscription.
                    if shared.state().channels.contains_key(&channel) {
                        continue;
                    }
                    drop(shared);
                    if unplaced.contains(&channel) {
                        unplaced.remove(&channel);
                        continue;
                    }
                    if !link.unsubscribe(&channel, self.op_timeout).await {
                        return self.broken();
                    }
                }
            }
        }
    }

    /// Tries to subscribe the unplaced channels that still have waiters, and wakes the
    /// waiters of each one subscribed: a release may have gone unheard meanwhile. `None`
    /// when the link broke.
    async fn place(&self, link: &mut Link, unplaced: &mut Unplaced) -> Option<()> {
        let wanted: Vec<String> = {
            let shared = self.shared.upgrade()?;
            let state = shared.state();
            unplaced.channels.iter().filter(|c| state.channels.contains_key(*c)).cloned().collect()
        };
        unplaced.channels.retain(|c| wanted.contains(c));
        let subscribed = link.subscribe(&wanted, self.op_timeout).await?;
        let shared = self.shared.upgrade()?;
        for channel in &subscribed {
            unplaced.channels.remove(channel);
            if let Some(entry) = shared.state().channels.get_mut(channel) {
                entry.confirmed = true;
            }
            shared.wake(Some(channel), None);
        }
        unplaced.tried();
        Some(())
    }

    /// The connection broke: forget confirmations (they were for the old connection).
    fn broken(&self) -> Ended {
        match self.shared.upgrade() {
            Some(shared) => {
                shared.state().channels.values_mut().for_each(|c| c.confirmed = false);
                Ended::Broken
            }
            None => Ended::Closed,
        }
    }
}

/// Tells a subscriber that its subscription is in place. One that stopped waiting for
/// the confirmation has looked at the lock without it, so a release in between may have
/// gone unseen: wake the channel's waiters to look again.
fn confirm(shared: &Shared, channel: &str, done: oneshot::Sender<()>) {
    if done.send(()).is_err() {
        shared.wake(Some(channel), None);
    }
}
