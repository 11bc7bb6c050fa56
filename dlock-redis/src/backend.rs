//! The Redis [`Backend`]: each operation is one script call on the command connection;
//! waiters sleep on the shared pub/sub connection until a release or the holder's ttl.

use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{Attempt, Backend, Release, Renewal, Request};
use dlock_core::{Capabilities, FencingToken, Holder, LockError, LockInfo, LockName, OwnerId};
use redis::Value;

use crate::config::ReplicaAck;
use crate::connection::RedisConnection;
use crate::error::to_lock_error;
use crate::keys::{owner_field, KeyLayout, LockKeys};
use crate::pubsub::{Registration, Subscriptions};
use crate::scripts::{parse_release, scripts, ttl_millis, AcquireReply, HoldView, Invocation, RenewReply};

/// What this backend can do: everything but FIFO grants and queue lengths (waiters are
/// not queued in Redis; each retries when woken).
pub const CAPABILITIES: Capabilities = Capabilities {
    reentrant: true,
    fifo: false,
    notify: true,
    ttl: true,
    fixed: true,
    extend: true,
    queue_length: false,
};

/// The Redis backend of one client: a command connection, the key layout, and the
/// shared pub/sub connection of its waiters.
pub struct RedisBackend {
    conn: RedisConnection,
    layout: KeyLayout,
    subscriptions: Subscriptions,
    replica_ack: Option<ReplicaAck>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend").finish_non_exhaustive()
    }
}

/// A granted hold: the lock's keys, the owner and the token, which renewals and the
/// release check on the server.
#[derive(Debug, Clone)]
pub struct RedisHold {
    keys: LockKeys,
    owner_field: String,
    token: u64,
}

impl RedisHold {
    /// The lock's keys.
    pub fn keys(&self) -> &LockKeys {
        &self.keys
    }

    /// The fencing token.
    pub fn token(&self) -> FencingToken {
        FencingToken::new(self.token)
    }
}

impl RedisBackend {
    /// A backend over an open connection.
    pub fn new(
        conn: RedisConnection,
        layout: KeyLayout,
        subscriptions: Subscriptions,
        replica_ack: Option<ReplicaAck>,
    ) -> Self {
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
    async fn acquire_once(&self, keys: &LockKeys, owner_field: &str, ttl_ms: u64) -> Result<AcquireReply, LockError> {
        let call = acquire_call(keys, owner_field, ttl_ms);
        let mut conn = self.conn.clone();
        let Some(ack) = self.replica_ack else {
            return AcquireReply::parse(call.run(&mut conn).await.map_err(to_lock_error)?).map_err(to_lock_error);
        };
        let (reply, acked) = call.run_acked(&mut conn, ack).await.map_err(to_lock_error)?;
        let reply = AcquireReply::parse(reply).map_err(to_lock_error)?;
        if let AcquireReply::Granted(token) = reply {
            if acked < ack.replicas {
                let hold = RedisHold { keys: keys.clone(), owner_field: owner_field.to_string(), token };
                if let Err(err) = self.release(&hold).await {
                    tracing::debug!(%err, "giving back a grant the replicas did not acknowledge failed; its ttl frees it");
                }
                self.conn.suspect_failover();
                return Err(not_acknowledged(acked, ack));
            }
        }
        Ok(reply)
    }
}

fn not_acknowledged(acked: u32, ack: ReplicaAck) -> LockError {
    LockError::QuorumNotReached { got: acked as usize, needed: ack.replicas as usize }
}

/// The acquire script call for one owner.
pub(crate) fn acquire_call(keys: &LockKeys, owner_field: &str, ttl_ms: u64) -> Invocation {
    Invocation::new(&scripts().acquire, &[&keys.hold, &keys.fence]).arg(owner_field).arg(ttl_ms)
}

/// The renew script call for one hold.
pub(crate) fn renew_call(keys: &LockKeys, owner_field: &str, token: u64, ttl_ms: u64) -> Invocation {
    Invocation::new(&scripts().renew, &[&keys.hold]).arg(owner_field).arg(token).arg(ttl_ms)
}

/// The release script call for one hold.
pub(crate) fn release_call(keys: &LockKeys, owner_field: &str, token: u64) -> Invocation {
    Invocation::new(&scripts().release, &[&keys.hold]).arg(owner_field).arg(token).arg(&keys.channel)
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
        let owner = owner_field(&req.owner);
        let ttl_ms = ttl_millis(req.ttl());
        let mut reply = self.acquire_once(&keys, &owner, ttl_ms).await?;
        if matches!(reply, AcquireReply::Busy(_)) && req.blocking && ticket.is_none() {
            // Subscribe, then look again: a release between the first look and the
            // subscription would otherwise go unnoticed until the holder's ttl.
            *ticket = Some(self.subscriptions.subscribe(&keys.channel).await);
            reply = self.acquire_once(&keys, &owner, ttl_ms).await?;
        }
        Ok(match reply {
            AcquireReply::Granted(token) => Attempt::Granted {
                hold: RedisHold { keys, owner_field: owner, token },
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
        let call = renew_call(&hold.keys, &hold.owner_field, hold.token, ttl_millis(ttl));
        let mut conn = self.conn.clone();
        let (reply, acked) = match self.replica_ack {
            None => (call.run(&mut conn).await.map_err(to_lock_error)?, None),
            Some(ack) => {
                let (reply, acked) = call.run_acked(&mut conn, ack).await.map_err(to_lock_error)?;
                (reply, Some((acked, ack)))
            }
        };
        Ok(match RenewReply::parse(reply).map_err(to_lock_error)? {
            RenewReply::Renewed => {
                // A renewal the replicas may not have could be lost in a failover: not
                // a renewal the lease may count on. The scheduler retries it.
                if let Some((acked, ack)) = acked.filter(|(acked, ack)| acked < &ack.replicas) {
                    self.conn.suspect_failover();
                    return Err(not_acknowledged(acked, ack));
                }
                Renewal::Renewed
            }
            RenewReply::Gone => Renewal::Lost(dlock_core::LostReason::Expired),
            RenewReply::Stolen => Renewal::Lost(dlock_core::LostReason::Stolen),
        })
    }

    async fn release(&self, hold: &RedisHold) -> Result<Release, LockError> {
        let call = release_call(&hold.keys, &hold.owner_field, hold.token);
        let reply = call.run(&mut self.conn.clone()).await.map_err(to_lock_error)?;
        Ok(if parse_release(reply).map_err(to_lock_error)? { Release::Released } else { Release::NotHeld })
    }

    async fn inspect(&self, name: &LockName) -> Result<LockInfo, LockError> {
        let keys = self.layout.lock(name);
        let reply: Value = Invocation::new(&scripts().inspect, &[&keys.hold])
            .run(&mut self.conn.clone())
            .await
            .map_err(to_lock_error)?;
        let holder = match HoldView::parse(reply).map_err(to_lock_error)? {
            None => None,
            Some(view) => Some(Holder {
                owner: OwnerId::new(&view.owner)
                    .map_err(|e| LockError::backend(format!("owner field of {}: {e}", keys.hold)))?,
                token: FencingToken::new(view.token),
                count: view.count,
                remaining: view.remaining,
            }),
        };
        Ok(LockInfo { holder, waiters: None })
    }
}
