//! The raw baseline for `dlock bench`: the acquire and release script calls of an
//! uncontended lock, reader's share or permit (and a renewal), sent straight over the
//! same kind of connection, without a client, leases, renewal scheduling or pub/sub.

use async_trait::async_trait;
use dlock_core::{
    place_lapse, HoldKind, LockError, LockName, RawBaseline, DEFAULT_KEEP_IDLE, DEFAULT_TTL, MAX_DURATION,
};

use crate::backend::{
    acquire_call, acquire_shared_call, release_call, release_shared_call, renew_call, Place, PlaceMode,
};
use crate::config::ReplicaAck;
use crate::connection::RedisConnection;
use crate::error::to_lock_error;
use crate::keys::{hold_id_of, KeyLayout, LockKeys};
use crate::results::{self, StoreReply};
use crate::scripts::{ttl_millis, wait_replicas, AcquireReply, Invocation, Scripts};

/// The owner field every baseline call uses.
const OWNER_FIELD: &str = "owner:raw-baseline";

/// The grant field every baseline call uses.
const GRANT_FIELD: &str = "grant:raw-baseline";

/// The owner and request id every baseline call of a reader's share or a permit uses (as
/// the grant field above names the request).
const ID: &str = "raw-baseline";

/// The ttl and the keep time of every baseline call, in ms: a client's defaults.
fn times() -> (u64, u64) {
    (ttl_millis(DEFAULT_TTL), ttl_millis(DEFAULT_KEEP_IDLE))
}

/// The place every baseline call has: none (an uncontended call never waits).
fn no_place() -> Place<'static> {
    Place { id: ID, mode: PlaceMode::Never, lapse_ms: ttl_millis(place_lapse(DEFAULT_TTL)) }
}

/// The Redis raw baseline (see [`raw_baseline`](crate::raw_baseline)).
pub struct RedisBaseline {
    conn: RedisConnection,
    layout: KeyLayout,
    /// The scripts the library's client sends over this connection.
    scripts: &'static Scripts,
    replica_ack: Option<ReplicaAck>,
}

impl std::fmt::Debug for RedisBaseline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBaseline").finish_non_exhaustive()
    }
}

impl RedisBaseline {
    pub(crate) fn new(
        conn: RedisConnection,
        layout: KeyLayout,
        scripts: &'static Scripts,
        replica_ack: Option<ReplicaAck>,
    ) -> Self {
        RedisBaseline { conn, layout, scripts, replica_ack }
    }

    /// The acquire script call of an uncontended lock: its token.
    async fn acquire(&self, keys: &LockKeys) -> Result<u64, LockError> {
        let void = format!("{}:void:raw-baseline", keys.hold);
        let acquire = acquire_call(self.scripts, keys, (OWNER_FIELD, GRANT_FIELD), &void, times(), no_place());
        match AcquireReply::parse(self.send(&acquire, &keys.hold).await?).map_err(to_lock_error)? {
            AcquireReply::Granted(token) => Ok(token),
            AcquireReply::Busy { .. } => Err(LockError::timeout()),
        }
    }

    /// Sends `call`; with a replica acknowledgement, `WAIT`s for it (on the same one
    /// connection: the baseline measures the calls, not a pool).
    async fn send(&self, call: &Invocation, hold: &str) -> Result<redis::Value, LockError> {
        let mut conn = self.conn.clone();
        let reply = call.run(&mut conn).await.map_err(to_lock_error)?;
        if let Some(ack) = self.replica_ack {
            wait_replicas(&mut conn, hold, ack).await.map_err(to_lock_error)?;
        }
        Ok(reply)
    }
}

#[async_trait]
impl RawBaseline for RedisBaseline {
    async fn acquire_release(&self, name: &LockName) -> Result<(), LockError> {
        let keys = self.layout.lock(name);
        let token = self.acquire(&keys).await?;
        self.send(&release_call(self.scripts, &keys, (OWNER_FIELD, GRANT_FIELD), token, times().1), &keys.hold)
            .await
            .map(drop)
    }

    /// The acquire, the store script call a campaign makes, and the release.
    async fn campaign_resign(&self, name: &LockName, value: &[u8]) -> Result<(), LockError> {
        let keys = self.layout.lock(name);
        let token = self.acquire(&keys).await?;
        let store = Invocation::new(&results::scripts().store, &[&keys.hold, &keys.result()])
            .arg(OWNER_FIELD)
            .arg(token.to_string())
            .arg(GRANT_FIELD)
            .arg(format!("{GRANT_FIELD}/{:016x}", fastrand::u64(..)))
            .arg(value)
            .arg(ttl_millis(MAX_DURATION));
        let stored = StoreReply::parse(self.send(&store, &keys.result()).await?).map_err(to_lock_error)?;
        if !stored.stored() {
            return Err(LockError::not_held());
        }
        self.send(&release_call(self.scripts, &keys, (OWNER_FIELD, GRANT_FIELD), token, times().1), &keys.hold)
            .await
            .map(drop)
    }

    async fn acquire_release_kind(&self, name: &LockName, kind: HoldKind) -> Result<(), LockError> {
        if kind == HoldKind::Exclusive {
            return self.acquire_release(name).await;
        }
        let keys = self.layout.lock(name);
        let void = format!("{}:void:{ID}", keys.hold);
        let hold = hold_id_of(ID, kind);
        let acquire = acquire_shared_call(self.scripts, &keys, (&hold, ID), &void, times(), no_place(), kind);
        match AcquireReply::parse(self.send(&acquire, &keys.hold).await?).map_err(to_lock_error)? {
            AcquireReply::Granted(token) => self
                .send(&release_shared_call(self.scripts, &keys, (&hold, ID), token, times().1), &keys.hold)
                .await
                .map(drop),
            AcquireReply::Busy { .. } => Err(LockError::timeout()),
        }
    }

    async fn renew(&self, name: &LockName) -> Result<(), LockError> {
        let keys = self.layout.lock(name);
        self.send(&renew_call(self.scripts, &keys, (OWNER_FIELD, GRANT_FIELD), 0, times()), &keys.hold).await.map(drop)
    }
}
