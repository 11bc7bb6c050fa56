//! The Redis [`Backend`]: each operation is one script call on the command connection;
//! waiters sleep on the shared pub/sub connection until a release or the holder's ttl.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{Attempt, Backend, Release, Renewal, Request};
use dlock_core::{
    Capabilities, FencingToken, HoldKind, LockError, LockInfo, LockName, StoredResult, DEFAULT_KEEP_IDLE,
};
use redis::Value;

use crate::config::ReplicaAck;
use crate::connection::RedisConnection;
use crate::error::to_lock_error;
use crate::handoff::{Entry, LocalWaiters};
use crate::hold::{holder, RedisHold};
use crate::keys::{grant_field, hold_id, owner_field, KeyLayout, LockKeys};
use crate::pubsub::{Registration, Subscriptions};
use crate::results;
use crate::scripts::{
    parse_given_back, parse_inspect_queue, ttl_millis, wait_replicas, AcquireReply, Invocation, ReleaseReply,
    RenewReply, Scripts,
};

/// What this backend can do: everything, FIFO grants (`fair(true)`), queue lengths,
/// readers' shares and semaphore permits included. RedLock has its own, without them
/// ([`REDLOCK_CAPABILITIES`](crate::REDLOCK_CAPABILITIES)).
pub const CAPABILITIES: Capabilities = Capabilities {
    reentrant: true,
    fifo: true,
    notify: true,
    ttl: true,
    fixed: true,
    extend: true,
    queue_length: true,
    results: true,
    shared: true,
    permits: true,
};

/// When a busy acquire takes a place in the lock's queue (see the acquire script).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PlaceMode {
    /// Never: a try, which does not wait.
    Never,
    /// Only behind a queue that exists already: a blocking non-fair acquire, which must
    /// not overtake queued waiters but has no order of its own to keep otherwise. A
    /// writer (an exclusive acquire) that finds readers or permits holding queues too,
    /// so that readers coming after it wait behind it (writer preference), and so does a
    /// permit request that is refused, so that later permit requests (for more permits,
    /// say) do not overtake it.
    BehindQueue,
    /// Always: a blocking fair acquire.
    Always,
}

impl PlaceMode {
    fn of(req: &Request) -> Self {
        match (req.blocking, req.fair) {
            (false, _) => PlaceMode::Never,
            (true, false) => PlaceMode::BehindQueue,
            (true, true) => PlaceMode::Always,
        }
    }

    fn arg(self) -> &'static str {
        match self {
            PlaceMode::Never => "0",
            PlaceMode::BehindQueue => "1",
            PlaceMode::Always => "2",
        }
    }
}

/// A waiter's state between attempts: its subscription, and its place in the queue.
///
/// A waiter with a place listens on its client's wake-up channel of the lock for messages
/// naming its place, which a release (or a give-back, or the head giving up) publishes
/// only when it is first in the queue of a free lock; one without listens on the lock's
/// channel, as every release publishes there while nobody queues.
pub struct RedisTicket {
    /// The place id (the request id) once the waiter was given a place: the place is
    /// given up with it when the waiter gives up.
    place: Option<String>,
    /// The channel `registration` listens on.
    channel: String,
    registration: Registration,
    /// Its registration as a waiter this client's releases may hand the lock to, once it
    /// has a place (an exclusive request, without replica acknowledgement).
    local: Option<Entry>,
}

impl std::fmt::Debug for RedisTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTicket").field("place", &self.place).field("channel", &self.channel).finish()
    }
}

impl RedisTicket {
    /// The waiter's place id, if it has (or had) a place in the queue.
    pub fn place(&self) -> Option<&str> {
        self.place.as_deref()
    }
}

/// How often a queued waiter comes back at the latest, as a fraction of its place lapse:
/// its place lapses that long after its last attempt, so it refreshes the place at least
/// three times within it, with a quarter to spare for the round trips.
const PLACE_REFRESHES_PER_LAPSE: u32 = 4;

/// The Redis backend of one client: a command connection, the key layout, and the
/// shared pub/sub connection of its waiters.
pub struct RedisBackend {
    conn: RedisConnection,
    layout: KeyLayout,
    subscriptions: Subscriptions,
    /// The scripts that publish as the waiters listen (sharded on a Cluster of Redis 7).
    scripts: &'static Scripts,
    replica_ack: Option<Acked>,
    local: LocalWaiters,
    /// How long a name's fence counter outlives its last grant, renewal or release, in ms.
    keep_ms: u64,
    /// Where the locks live, as [`Backend::target`] tells it; `None` for a backend built
    /// without being told.
    target: Option<String>,
}

/// Replica acknowledgement: how many replicas, and the connections of its own that
/// grants and renewals take (`WAIT` blocks the connection it is sent on).
struct Acked {
    ack: ReplicaAck,
    conns: Vec<RedisConnection>,
    next: AtomicUsize,
}

impl Acked {
    /// The next connection, in turn, so that one slow `WAIT` holds up few others.
    fn conn(&self) -> RedisConnection {
        let index = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        self.conns[index].clone()
    }
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend").finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// A backend over an open connection. With a replica acknowledgement, `acked` are
    /// the connections grants and renewals take, apart from `conn` (at least one). The
    /// scripts publish their wake-ups as `subscriptions` listen for them.
    pub fn new(
        conn: RedisConnection,
        layout: KeyLayout,
        subscriptions: Subscriptions,
        replica_ack: Option<(ReplicaAck, Vec<RedisConnection>)>,
    ) -> Self {
        let replica_ack = replica_ack.map(|(ack, mut conns)| {
            if conns.is_empty() {
                conns.push(conn.clone());
            }
            Acked { ack, conns, next: AtomicUsize::new(0) }
        });
        RedisBackend {
            conn,
            layout,
            scripts: subscriptions.publish().scripts(),
            subscriptions,
            replica_ack,
            local: LocalWaiters::default(),
            keep_ms: ttl_millis(DEFAULT_KEEP_IDLE),
            target: None,
        }
    }

    /// Keeps a name's fence counter for `keep` after its last grant, renewal or release
    /// (the default is [`DEFAULT_KEEP_IDLE`]); a grant that finds it gone starts it again
    /// from the server's clock in microseconds.
    pub fn with_keep_idle(mut self, keep: std::time::Duration) -> Self {
        self.keep_ms = ttl_millis(keep).max(1);
        self
    }

    /// Names where this backend's locks live (see [`RedisConfig::target`](crate::RedisConfig::target)),
    /// for [`Backend::target`].
    pub fn with_target(mut self, target: impl Into<String>) -> Self {
        self.target = Some(target.into());
        self
    }

    /// How long a name's fence counter outlives its last use.
    pub fn keep_idle(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.keep_ms)
    }

    /// The key layout.
    pub fn layout(&self) -> &KeyLayout {
        &self.layout
    }

    /// The keys and channel of `name`.
    pub fn keys(&self, name: &LockName) -> LockKeys {
        self.layout.lock(name)
    }

    /// The command connection, for commands of your own.
    pub fn connection(&self) -> RedisConnection {
        self.conn.clone()
    }

    /// How many lock channels this client's waiters are subscribed to now.
    pub fn subscribed_channels(&self) -> usize {
        self.subscriptions.channels()
    }

    /// One acquire script call, with the replica acknowledgement if configured: a grant
    /// too few replicas acknowledged is given back and fails.
    async fn acquire_once(&self, req: &Request, keys: &LockKeys, ttl_ms: u64) -> Result<AcquireReply, LockError> {
        let place = Place { id: req.id.as_str(), mode: PlaceMode::of(req), lapse_ms: ttl_millis(req.place_lapse()) };
        let call = match req.kind {
            HoldKind::Exclusive => acquire_call(
                self.scripts,
                keys,
                (&owner_field(&req.owner), &grant_field(&req.id)),
                &keys.void(&req.id),
                (ttl_ms, self.keep_ms),
                place,
            ),
            kind => acquire_shared_call(
                self.scripts,
                keys,
                (&hold_id(&req.owner, kind), req.id.as_str()),
                &keys.void(&req.id),
                (ttl_ms, self.keep_ms),
                place,
                kind,
            ),
        };
        let Some(acked) = &self.replica_ack else {
            let reply = call.run(&mut self.conn.clone()).await.map_err(to_lock_error)?;
            return AcquireReply::parse(reply).map_err(to_lock_error);
        };
        let (ack, mut conn) = (acked.ack, acked.conn());
        let reply = AcquireReply::parse(call.run(&mut conn).await.map_err(to_lock_error)?).map_err(to_lock_error)?;
        if let AcquireReply::Granted(_) = reply {
            let acked = wait_replicas(&mut conn, &keys.hold, ack).await.map_err(to_lock_error)?;
            if acked < ack.replicas {
                if let Err(err) = self.give_back_grant(req, keys).await {
                    tracing::debug!(%err, "giving back a grant the replicas did not acknowledge failed; its ttl frees it");
                }
                self.suspect_failover();
                return Err(not_acknowledged(acked, ack));
            }
        }
        Ok(reply)
    }
}

impl RedisBackend {
    /// A write was not acknowledged by the replicas it should have been: through
    /// Sentinel, every connection of the client looks the master up again.
    fn suspect_failover(&self) {
        self.conn.suspect_failover();
        for conn in self.replica_ack.iter().flat_map(|acked| &acked.conns) {
            conn.suspect_failover();
        }
    }

    /// Gives back the grant `req` may have made (and only it), and refuses a late delivery
    /// of it. Whether there was a grant to give back.
    async fn give_back_grant(&self, req: &Request, keys: &LockKeys) -> Result<bool, LockError> {
        let reply = give_back_call(self.scripts, keys, req).run(&mut self.conn.clone()).await.map_err(to_lock_error)?;
        parse_given_back(reply).map_err(to_lock_error)
    }
}

fn not_acknowledged(acked: u32, ack: ReplicaAck) -> LockError {
    LockError::QuorumNotReached { got: acked as usize, needed: ack.replicas as usize }
}

/// A request's place in the queue: its id (the request id), when it takes one, and how
/// long it lasts after the request's last look, in ms.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Place<'a> {
    pub(crate) id: &'a str,
    pub(crate) mode: PlaceMode,
    pub(crate) lapse_ms: u64,
}

/// The acquire script call of one request: its owner and grant fields, its marker key,
/// its ttl and the name's keep time (both in ms), and its place in the queue.
pub(crate) fn acquire_call(
    scripts: &'static Scripts,
    keys: &LockKeys,
    (owner_field, grant_field): (&str, &str),
    void: &str,
    (ttl_ms, keep_ms): (u64, u64),
    place: Place<'_>,
) -> Invocation {
    Invocation::new(&scripts.acquire, &[&keys.hold, &keys.fence, void, &keys.queue, &keys.places])
        .arg(owner_field)
        .arg(ttl_ms)
        .arg(grant_field)
        .arg(place.id)
        .arg(place.mode.arg())
        .arg(&keys.wake_prefix)
        .arg(place.lapse_ms)
        .arg(keep_ms)
}

/// The acquire script call of a reader's share or a permit (`kind`) for one request: its
/// hold and request ids, its marker key, its ttl and the name's keep time, and its place.
pub(crate) fn acquire_shared_call(
    scripts: &'static Scripts,
    keys: &LockKeys,
    (hold, request): (&str, &str),
    void: &str,
    (ttl_ms, keep_ms): (u64, u64),
    place: Place<'_>,
    kind: HoldKind,
) -> Invocation {
    let permits = match kind {
        HoldKind::Permit { permits } => permits,
        HoldKind::Exclusive | HoldKind::Shared => 0,
    };
    Invocation::new(&scripts.acquire_shared, &[&keys.hold, &keys.fence, void, &keys.queue, &keys.places, &keys.leases])
        .arg(hold)
        .arg(ttl_ms)
        .arg(request)
        .arg(place.id)
        .arg(place.mode.arg())
        .arg(&keys.wake_prefix)
        .arg(kind.as_str())
        .arg(permits)
        .arg(place.lapse_ms)
        .arg(keep_ms)
}

/// The renew script call of `hold`, whatever its kind, keeping the name's fence counter
/// for `keep_ms`.
fn renew_hold_call(scripts: &'static Scripts, hold: &RedisHold, ttl_ms: u64, keep_ms: u64) -> Invocation {
    match hold.kind {
        HoldKind::Exclusive => {
            renew_call(scripts, &hold.keys, (&hold.owner_field, &hold.grant_field), hold.token, (ttl_ms, keep_ms))
        }
        kind => Invocation::new(&scripts.renew_shared, &[&hold.keys.hold, &hold.keys.leases, &hold.keys.fence])
            .arg(hold.hold_id())
            .arg(hold.token.to_string())
            .arg(ttl_ms)
            .arg(hold.request_id())
            .arg(kind.as_str())
            .arg(keep_ms),
    }
}

/// The release script call of `hold`, whatever its kind.
fn release_hold_call(scripts: &'static Scripts, hold: &RedisHold, keep_ms: u64) -> Invocation {
    match hold.kind {
        HoldKind::Exclusive => {
            release_call(scripts, &hold.keys, (&hold.owner_field, &hold.grant_field), hold.token, keep_ms)
        }
        HoldKind::Shared | HoldKind::Permit { .. } => {
            release_shared_call(scripts, &hold.keys, (&hold.hold_id(), hold.request_id()), hold.token, keep_ms)
        }
    }
}

/// The release script call for one grant (by hold id and request id) of a reader's share
/// or a permit.
pub(crate) fn release_shared_call(
    scripts: &'static Scripts,
    keys: &LockKeys,
    (hold, request): (&str, &str),
    token: u64,
    keep_ms: u64,
) -> Invocation {
    Invocation::new(&scripts.release_shared, &[&keys.hold, &keys.queue, &keys.places, &keys.leases, &keys.fence])
        .arg(hold)
        .arg(token.to_string())
        .arg(&keys.channel)
        .arg(request)
        .arg(&keys.wake_prefix)
        .arg(keep_ms)
}

/// The renew script call for one grant (by owner and grant field) of the lock alone,
/// keeping the name's fence counter for `keep_ms`.
pub(crate) fn renew_call(
    scripts: &'static Scripts,
    keys: &LockKeys,
    (owner_field, grant_field): (&str, &str),
    token: u64,
    (ttl_ms, keep_ms): (u64, u64),
) -> Invocation {
    Invocation::new(&scripts.renew, &[&keys.hold, &keys.fence])
        .arg(owner_field)
        .arg(token.to_string())
        .arg(ttl_ms)
        .arg(grant_field)
        .arg(keep_ms)
}

/// The attempt granting `req` the hold of `keys` with `token`; `handed_at` is when the
/// release that handed it over was sent, for a grant a release made.
fn granted(req: &Request, keys: LockKeys, token: u64, handed_at: Option<tokio::time::Instant>) -> Attempt<RedisHold> {
    let hold = RedisHold {
        keys,
        owner_field: owner_field(&req.owner),
        grant_field: grant_field(&req.id),
        token,
        kind: req.kind,
        handed_at,
    };
    Attempt::Granted { hold, token: FencingToken::new(token) }
}

/// The release script call for one grant (by owner and grant field) of the lock alone,
/// keeping the name's fence counter for `keep_ms`. The waiters it may hand the lock to
/// follow as further arguments (see the `handoff` module).
pub(crate) fn release_call(
    scripts: &'static Scripts,
    keys: &LockKeys,
    (owner_field, grant_field): (&str, &str),
    token: u64,
    keep_ms: u64,
) -> Invocation {
    Invocation::new(&scripts.release, &[&keys.hold, &keys.queue, &keys.places, &keys.fence])
        .arg(owner_field)
        .arg(token.to_string())
        .arg(&keys.channel)
        .arg(grant_field)
        .arg(&keys.wake_prefix)
        .arg(keep_ms)
}

/// The give-back script call for whatever grant request `req` may have made on `keys`.
pub(crate) fn give_back_call(scripts: &'static Scripts, keys: &LockKeys, req: &Request) -> Invocation {
    let void = keys.void(&req.id);
    let call = match req.kind {
        HoldKind::Exclusive => Invocation::new(&scripts.give_back, &[&keys.hold, &void, &keys.queue, &keys.places])
            .arg(owner_field(&req.owner))
            .arg(grant_field(&req.id)),
        kind @ (HoldKind::Shared | HoldKind::Permit { .. }) => {
            Invocation::new(&scripts.give_back_shared, &[&keys.hold, &void, &keys.queue, &keys.places, &keys.leases])
                .arg(hold_id(&req.owner, kind))
                .arg(req.id.as_str())
        }
    };
    call.arg(&keys.channel).arg(ttl_millis(req.ttl()).max(1)).arg(req.id.as_str()).arg(&keys.wake_prefix)
}

/// The abandon script call that gives up the place `place` in the queue of `keys`.
pub(crate) fn abandon_call(scripts: &'static Scripts, keys: &LockKeys, place: &str) -> Invocation {
    Invocation::new(&scripts.abandon, &[&keys.hold, &keys.queue, &keys.places]).arg(place).arg(&keys.wake_prefix)
}

#[async_trait]
impl Backend for RedisBackend {
    type Hold = RedisHold;
    type Ticket = RedisTicket;

    fn name(&self) -> &'static str {
        "redis"
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    /// A fair acquire always takes a place in the lock's queue; the others race.
    fn grants_in_request_order(&self, req: &Request) -> bool {
        PlaceMode::of(req) == PlaceMode::Always
    }

    fn target(&self) -> String {
        self.target.clone().unwrap_or_else(|| format!("{}@{:p}", self.name(), self))
    }

    async fn attempt(&self, req: &Request, ticket: &mut Option<RedisTicket>) -> Result<Attempt<RedisHold>, LockError> {
        let keys = self.layout.lock(&req.name);
        let ttl_ms = ttl_millis(req.ttl());
        let place = req.id.as_str();
        if let Some((token, sent)) = ticket.as_ref().and_then(|t| t.local.as_ref()).and_then(Entry::take_handed) {
            return Ok(granted(req, keys, token, Some(sent)));
        }
        if ticket.is_none() && PlaceMode::of(req) == PlaceMode::Always {
            // Another waiter of this client queues for the lock already: listening beside
            // it costs nothing, and listening before the first look means that look
            // needs no second one.
            let channel = keys.wake(place);
            if let Some(registration) = self.subscriptions.subscribed_for(&channel, place) {
                *ticket = Some(RedisTicket { place: Some(place.to_string()), channel, registration, local: None });
            }
        }
        let mut reply = self.acquire_once(req, &keys, ttl_ms).await?;
        // A waiter listens where its wake-up will come: its client's channel once it has
        // a place, else the lock's. Subscribe there, then look again: a wake-up between
        // the look and the subscription would otherwise go unnoticed until the next timed
        // look. Whether it has a place can change once more with that look (a queue
        // formed, or its lapsed place was dropped); the next attempt catches up then.
        for _ in 0..2 {
            let AcquireReply::Busy { queued, .. } = reply else { break };
            if !req.blocking {
                break;
            }
            let channel = if queued { keys.wake(place) } else { keys.channel.clone() };
            if let Some(ticket) = ticket.as_mut() {
                if queued {
                    ticket.place = Some(place.to_string());
                }
                if ticket.channel == channel {
                    break;
                }
            }
            let had_place = ticket.as_mut().and_then(|t| t.place.take());
            let registration = if queued {
                self.subscriptions.subscribe_for(&channel, place).await
            } else {
                self.subscriptions.subscribe(&channel).await
            };
            let place = if queued { Some(place.to_string()) } else { had_place };
            let local = ticket.take().and_then(|t| t.local);
            *ticket = Some(RedisTicket { place, channel, registration, local });
            reply = self.acquire_once(req, &keys, ttl_ms).await?;
        }
        Ok(match reply {
            AcquireReply::Granted(token) => granted(req, keys, token, None),
            AcquireReply::Busy { left, queued } => {
                // A millisecond more, so that the hold has surely expired when we look again.
                let left = left.map(|d| d + Duration::from_millis(1));
                let retry_after = if queued {
                    if let Some(ticket) = ticket.as_mut() {
                        ticket.place = Some(req.id.to_string());
                        if ticket.local.is_none() && req.kind == HoldKind::Exclusive && self.replica_ack.is_none() {
                            ticket.local = Some(self.local.enter(&keys, req, ttl_ms));
                        }
                    }
                    let refresh = req.place_lapse() / PLACE_REFRESHES_PER_LAPSE;
                    Some(left.map_or(refresh, |left| left.min(refresh)))
                } else {
                    left
                };
                Attempt::Busy { retry_after }
            }
        })
    }

    async fn wait(
        &self,
        _req: &Request,
        ticket: &mut Option<RedisTicket>,
        until: tokio::time::Instant,
    ) -> Result<(), LockError> {
        match ticket {
            Some(RedisTicket { registration, local: Some(local), .. }) => {
                let woken = async {
                    tokio::select! {
                        _ = registration.notified() => {}
                        _ = local.handed() => {}
                    }
                };
                let _ = tokio::time::timeout_at(until, woken).await;
            }
            Some(ticket) => {
                let _ = tokio::time::timeout_at(until, ticket.registration.notified()).await;
            }
            None => tokio::time::sleep_until(until).await,
        }
        Ok(())
    }

    async fn abandon(&self, req: &Request, ticket: RedisTicket) {
        if ticket.local.is_some() {
            // A release of this client may have handed the lock to this request already:
            // give back whatever grant it has, with its place.
            return self.give_back(req, Some(ticket)).await;
        }
        let Some(place) = ticket.place.as_deref() else { return };
        let keys = self.layout.lock(&req.name);
        if let Err(err) = abandon_call(self.scripts, &keys, place).run(&mut self.conn.clone()).await {
            tracing::debug!(%err, lock = %keys.hold, "giving up a place in the queue failed; it lapses on its own soon");
        }
    }

    async fn renew(&self, hold: &RedisHold, ttl: Duration) -> Result<Renewal, LockError> {
        let call = renew_hold_call(self.scripts, hold, ttl_millis(ttl), self.keep_ms);
        let mut conn = match &self.replica_ack {
            None => self.conn.clone(),
            Some(acked) => acked.conn(),
        };
        let reply = call.run(&mut conn).await.map_err(to_lock_error)?;
        Ok(match RenewReply::parse(reply).map_err(to_lock_error)? {
            RenewReply::Renewed => {
                // A renewal the replicas may not have could be lost in a failover: not
                // a renewal the lease may count on. The scheduler retries it.
                if let Some(ack) = self.replica_ack.as_ref().map(|acked| acked.ack) {
                    let acked = wait_replicas(&mut conn, &hold.keys.hold, ack).await.map_err(to_lock_error)?;
                    if acked < ack.replicas {
                        self.suspect_failover();
                        return Err(not_acknowledged(acked, ack));
                    }
                }
                Renewal::Renewed
            }
            RenewReply::Gone => Renewal::Lost(dlock_core::LostReason::Expired),
            RenewReply::Stolen => Renewal::Lost(dlock_core::LostReason::Stolen),
        })
    }

    /// Names this client's waiters of the lock, so that the release can hand it to the
    /// head of the queue if that is one of them (see the `handoff` module).
    async fn release(&self, hold: &RedisHold) -> Result<Release, LockError> {
        let mut call = release_hold_call(self.scripts, hold, self.keep_ms);
        let mut unsettled = None;
        if hold.kind == HoldKind::Exclusive && self.replica_ack.is_none() {
            call = self.local.name_waiters(&hold.keys.hold, call);
            unsettled = Some(self.local.unsettled(&hold.keys.hold));
        }
        let sent = tokio::time::Instant::now();
        let (reply, sent_twice) = call.run_again_if_broken(&mut self.conn.clone()).await.map_err(to_lock_error)?;
        let reply = ReleaseReply::parse(reply).map_err(to_lock_error)?;
        if let ReleaseReply::HandedOn { place, token } = &reply {
            self.local.hand(&hold.keys.hold, place, *token, sent);
        }
        // A reply to a second sending cannot tell what the first one did.
        if !sent_twice || matches!(reply, ReleaseReply::HandedOn { .. }) {
            if let Some(unsettled) = unsettled {
                unsettled.settle();
            }
        }
        Ok(if reply.released(sent_twice) { Release::Released } else { Release::NotHeld })
    }

    fn granted_since(&self, hold: &RedisHold) -> Option<tokio::time::Instant> {
        hold.handed_at
    }

    async fn give_back(&self, req: &Request, ticket: Option<RedisTicket>) {
        // The give-back script gives up the request's place too: its id is the request's.
        drop(ticket);
        let keys = self.layout.lock(&req.name);
        match self.give_back_grant(req, &keys).await {
            Ok(true) => {
                tracing::debug!(lock = %keys.hold, request = %req.id, "gave back the grant of an attempt whose reply was lost")
            }
            Ok(false) => {}
            Err(err) => {
                tracing::debug!(%err, lock = %keys.hold, "giving back an attempt whose reply was lost failed; its ttl frees it")
            }
        }
    }

    async fn store_result(
        &self,
        hold: &RedisHold,
        token: FencingToken,
        value: &[u8],
        retention: Duration,
    ) -> Result<(), LockError> {
        let Some(acked) = &self.replica_ack else {
            return results::store(&mut self.conn.clone(), hold, token, value, retention).await;
        };
        // Acknowledged as a grant is: a result only the master has could be lost in a
        // failover, and a later run would then do the work again. The record stays (it
        // was stored under a live hold), so the caller learns its store is in doubt.
        let (ack, mut conn) = (acked.ack, acked.conn());
        results::store(&mut conn, hold, token, value, retention).await?;
        let acked = wait_replicas(&mut conn, &hold.keys.result(), ack).await.map_err(to_lock_error)?;
        if acked < ack.replicas {
            self.suspect_failover();
            return Err(not_acknowledged(acked, ack));
        }
        Ok(())
    }

    async fn load_result(&self, name: &LockName) -> Result<Option<StoredResult>, LockError> {
        results::load(&mut self.conn.clone(), &self.layout.lock(name)).await
    }

    async fn inspect(&self, name: &LockName) -> Result<LockInfo, LockError> {
        let keys = self.layout.lock(name);
        let reply: Value = Invocation::new(&self.scripts.inspect_queue, &[&keys.hold, &keys.places, &keys.leases])
            .run(&mut self.conn.clone())
            .await
            .map_err(to_lock_error)?;
        let (waiters, view) = parse_inspect_queue(reply).map_err(to_lock_error)?;
        Ok(LockInfo { holder: holder(view, &keys.hold)?, waiters: Some(waiters) })
    }
}
