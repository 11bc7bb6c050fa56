//! The Redis [`Backend`]: each operation is one script call on the command connection;
//! waiters sleep on the shared pub/sub connection until a release or the holder's ttl.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{Attempt, Backend, Release, Renewal, Request};
use dlock_core::{Capabilities, FencingToken, LockError, LockInfo, LockName, StoredResult};
use redis::Value;

use crate::config::ReplicaAck;
use crate::connection::RedisConnection;
use crate::error::to_lock_error;
use crate::hold::{holder, RedisHold};
use crate::keys::{grant_field, owner_field, KeyLayout, LockKeys};
use crate::pubsub::{Registration, Subscriptions};
use crate::results;
use crate::scripts::{
    parse_given_back, scripts, ttl_millis, wait_replicas, AcquireReply, HoldView, Invocation, ReleaseReply, RenewReply,
};

/// What this backend can do: everything but FIFO grants and queue lengths (waiters are
/// not queued in Redis; each retries when woken). RedLock can do the same.
pub const CAPABILITIES: Capabilities = Capabilities {
    reentrant: true,
    fifo: false,
    notify: true,
    ttl: true,
    fixed: true,
    extend: true,
    queue_length: false,
    results: true,
};

/// The Redis backend of one client: a command connection, the key layout, and the
/// shared pub/sub connection of its waiters.
pub struct RedisBackend {
    conn: RedisConnection,
    layout: KeyLayout,
    subscriptions: Subscriptions,
    replica_ack: Option<Acked>,
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
    /// the connections grants and renewals take, apart from `conn` (at least one).
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
        RedisBackend { conn, layout, subscriptions, replica_ack }
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
        let call = acquire_call(keys, &owner_field(&req.owner), &grant_field(&req.id), &keys.void(&req.id), ttl_ms);
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
        let reply = give_back_call(keys, req).run(&mut self.conn.clone()).await.map_err(to_lock_error)?;
        parse_given_back(reply).map_err(to_lock_error)
    }
}

fn not_acknowledged(acked: u32, ack: ReplicaAck) -> LockError {
    LockError::QuorumNotReached { got: acked as usize, needed: ack.replicas as usize }
}

/// The acquire script call of one request: its owner, its grant field and its marker key.
pub(crate) fn acquire_call(
    keys: &LockKeys,
    owner_field: &str,
    grant_field: &str,
    void: &str,
    ttl_ms: u64,
) -> Invocation {
    Invocation::new(&scripts().acquire, &[&keys.hold, &keys.fence, void]).arg(owner_field).arg(ttl_ms).arg(grant_field)
}

/// The renew script call for one grant.
pub(crate) fn renew_call(keys: &LockKeys, owner_field: &str, grant_field: &str, token: u64, ttl_ms: u64) -> Invocation {
    Invocation::new(&scripts().renew, &[&keys.hold])
        .arg(owner_field)
        .arg(token.to_string())
        .arg(ttl_ms)
        .arg(grant_field)
}

/// The release script call for one grant.
pub(crate) fn release_call(keys: &LockKeys, owner_field: &str, grant_field: &str, token: u64) -> Invocation {
    Invocation::new(&scripts().release, &[&keys.hold])
        .arg(owner_field)
        .arg(token.to_string())
        .arg(&keys.channel)
        .arg(grant_field)
}

/// The give-back script call for whatever grant request `req` may have made on `keys`.
pub(crate) fn give_back_call(keys: &LockKeys, req: &Request) -> Invocation {
    Invocation::new(&scripts().give_back, &[&keys.hold, &keys.void(&req.id)])
        .arg(owner_field(&req.owner))
        .arg(grant_field(&req.id))
        .arg(&keys.channel)
        .arg(ttl_millis(req.ttl()).max(1))
}

#[async_trait]
impl Backend for RedisBackend {
    type Hold = RedisHold;
    type Ticket = Registration;

    fn name(&self) -> &'static str {
        "redis"
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    async fn attempt(&self, req: &Request, ticket: &mut Option<Registration>) -> Result<Attempt<RedisHold>, LockError> {
        let keys = self.layout.lock(&req.name);
        let ttl_ms = ttl_millis(req.ttl());
        let mut reply = self.acquire_once(req, &keys, ttl_ms).await?;
        if matches!(reply, AcquireReply::Busy(_)) && req.blocking && ticket.is_none() {
            // Subscribe, then look again: a release between the first look and the
            // subscription would otherwise go unnoticed until the holder's ttl.
            *ticket = Some(self.subscriptions.subscribe(&keys.channel).await);
            reply = self.acquire_once(req, &keys, ttl_ms).await?;
        }
        Ok(match reply {
            AcquireReply::Granted(token) => Attempt::Granted {
                hold: RedisHold {
                    keys,
                    owner_field: owner_field(&req.owner),
                    grant_field: grant_field(&req.id),
                    token,
                },
                token: FencingToken::new(token),
            },
            // A millisecond more, so that the hold has surely expired when we look again.
            AcquireReply::Busy(left) => Attempt::Busy { retry_after: left.map(|d| d + Duration::from_millis(1)) },
        })
    }

    async fn wait(
        &self,
        _req: &Request,
        ticket: &mut Option<Registration>,
        until: tokio::time::Instant,
    ) -> Result<(), LockError> {
        match ticket {
            Some(registration) => {
                let _ = tokio::time::timeout_at(until, registration.notified()).await;
            }
            None => tokio::time::sleep_until(until).await,
        }
        Ok(())
    }

    async fn renew(&self, hold: &RedisHold, ttl: Duration) -> Result<Renewal, LockError> {
        let call = renew_call(&hold.keys, &hold.owner_field, &hold.grant_field, hold.token, ttl_millis(ttl));
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

    async fn release(&self, hold: &RedisHold) -> Result<Release, LockError> {
        let call = release_call(&hold.keys, &hold.owner_field, &hold.grant_field, hold.token);
        let (reply, sent_twice) = call.run_again_if_broken(&mut self.conn.clone()).await.map_err(to_lock_error)?;
        let released = ReleaseReply::parse(reply).map_err(to_lock_error)?.released(sent_twice);
        Ok(if released { Release::Released } else { Release::NotHeld })
    }

    async fn give_back(&self, req: &Request, ticket: Option<Registration>) {
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
        let reply: Value = Invocation::new(&scripts().inspect, &[&keys.hold])
            .run(&mut self.conn.clone())
            .await
            .map_err(to_lock_error)?;
        let holder = holder(HoldView::parse(reply).map_err(to_lock_error)?, &keys.hold)?;
        Ok(LockInfo { holder, waiters: None })
    }
}
