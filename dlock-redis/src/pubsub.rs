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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::{mpsc, oneshot, Notify};

use crate::connection::NodeSource;
use crate::sentinel::MasterChanges;

/// How often an idle pub/sub connection is checked with a `PING`.
const HEALTH_CHECK_EVERY: Duration = Duration::from_secs(5);

/// Delay between reconnection attempts, doubling up to the maximum.
const RECONNECT_MIN: Duration = Duration::from_millis(50);
const RECONNECT_MAX: Duration = Duration::from_secs(2);

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
        let shared = Arc::new(Shared { state: Mutex::new(State::default()), requests: tx });
        let task = Task { shared: Arc::downgrade(&shared), nodes, connect_timeout, op_timeout };
        tokio::spawn(task.run(rx));
        Subscriptions { shared }
    }

    /// Registers for `channel`, returning once a message published from now on will wake
    /// the registration: the server confirmed the subscription, or the connection is down
    /// (and the registration will be woken when it is back).
    pub async fn subscribe(&self, channel: &str) -> Registration {
        let (registration, confirmation) = self.register(channel, Arc::new(Notify::new()));
        confirmation.confirmed().await;
        registration
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
        confirmation.confirmed().await;
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
            let (sink, stream) = match self.connect(failures, wake_all).await {
                Some(connection) => connection,
                None => {
                    // Answer waiters at once: the wake-up after reconnecting covers them.
                    if !self.drain(&mut requests, &mut pending) {
                        return;
                    }
                    let delay = RECONNECT_MIN.saturating_mul(1 << failures.min(6)).min(RECONNECT_MAX);
                    failures += 1;
                    tokio::time::sleep(delay).await;
                    continue;
                }
            };
            failures = 0;
            reconnecting = true;
            match self.serve(sink, stream, &mut requests, &mut pending, &mut moves).await {
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
    /// `wake_all`.
    async fn connect(&self, attempt: usize, wake_all: bool) -> Option<(PubSubSink, PubSubStream)> {
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
        Some((sink, stream))
    }

    async fn serve(
        &self,
        mut sink: PubSubSink,
        mut stream: PubSubStream,
        requests: &mut mpsc::UnboundedReceiver<Request>,
        pending: &mut Option<Request>,
        moves: &mut MasterChanges,
    ) -> Ended {
        let mut health = tokio::time::interval(HEALTH_CHECK_EVERY);
        health.reset();
        loop {
            let request = match pending.take() {
                Some(request) => Some(request),
                None => tokio::select! {
                    request = requests.recv() => match request {
                        Some(request) => Some(request),
                        None => return Ended::Closed,
                    },
                    message = stream.next() => match message {
                        Some(message) => {
                            let Some(shared) = self.shared.upgrade() else { return Ended::Closed };
                            shared.wake(Some(message.get_channel_name()), Some(message.get_payload_bytes()));
                            None
                        }
                        None => return self.broken(),
                    },
                    _ = health.tick() => {
                        match tokio::time::timeout(self.op_timeout, sink.ping::<redis::Value>()).await {
                            Ok(Ok(_)) => None,
                            _ => return self.broken(),
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
                    drop(shared);
                    match tokio::time::timeout(self.op_timeout, sink.subscribe(&channel)).await {
                        Ok(Ok(())) => {
                            if let Some(shared) = self.shared.upgrade() {
                                if let Some(entry) = shared.state().channels.get_mut(&channel) {
                                    entry.confirmed = true;
                                }
                                confirm(&shared, &channel, done);
                            }
                        }
                        _ => {
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
                    let unsubscribed = tokio::time::timeout(self.op_timeout, sink.unsubscribe(&channel)).await;
                    if !matches!(unsubscribed, Ok(Ok(()))) {
                        return self.broken();
                    }
                }
            }
        }
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
