//! The raw baseline for `dlock bench`: the requests of an uncontended acquire and release,
//! and of a renewal, sent straight through `etcd-client`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::{ConnectConfig, HoldKind, LockError, LockName, OwnerId, RawBaseline, DEFAULT_TTL};
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp};

use crate::cluster::Cluster;
use crate::config::EtcdConfig;
use crate::connect;
use crate::error::EtcdError;
use crate::keys::{self, HoldValue};

/// The etcd backend's raw baseline (see [`RawBaseline`]): one lease granted up front, as
/// a client session is; each acquire sends a keepalive of it alongside the put-if-free
/// transaction, and the release is one guarded delete.
pub struct EtcdBaseline {
    cluster: Cluster,
    prefix: String,
    lease: i64,
    op_timeout: Duration,
    owner: OwnerId,
    seq: AtomicU64,
}

impl std::fmt::Debug for EtcdBaseline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBaseline").finish_non_exhaustive()
    }
}

/// Connects as [`connect`](crate::connect) does and grants the baseline's lease (30 s,
/// the default ttl).
pub async fn raw_baseline(config: EtcdConfig) -> Result<EtcdBaseline, LockError> {
    let cluster = connect::open(&config).await?;
    let granted = cluster.grant(config.op_timeout(), keys::ttl_secs(DEFAULT_TTL)).await?;
    Ok(EtcdBaseline {
        cluster,
        prefix: config.prefix().to_string(),
        lease: granted.id(),
        op_timeout: config.op_timeout(),
        owner: OwnerId::new("raw-baseline")?,
        seq: AtomicU64::new(1),
    })
}

impl EtcdBaseline {
    async fn keep_alive(&self) -> Result<(), LockError> {
        match self.cluster.keep_alive(self.op_timeout, self.lease).await? {
            true => Ok(()),
            false => Err(LockError::Lost(dlock_core::LostReason::SessionExpired)),
        }
    }
}

#[async_trait]
impl RawBaseline for EtcdBaseline {
    async fn acquire_release(&self, name: &LockName) -> Result<(), LockError> {
        self.acquire_release_kind(name, HoldKind::Exclusive).await
    }

    /// The acquire transaction of an uncontended request of `kind` (a put guarded by the
    /// ranges that would hold it back; for a permit request, with the read of the permit
    /// requests ahead), then the release.
    async fn acquire_release_kind(&self, name: &LockName, kind: HoldKind) -> Result<(), LockError> {
        let dir = keys::lock_dir(&self.prefix, name);
        let key = keys::request_key(&dir, kind, self.lease, self.seq.fetch_add(1, Ordering::Relaxed));
        let value = HoldValue::new(self.owner.clone(), vec!["raw-baseline".to_string()]).encode();
        let put = TxnOp::put(key.clone(), value.clone(), Some(PutOptions::new().with_lease(self.lease)));
        let guards: Vec<Compare> = match kind {
            HoldKind::Exclusive => vec![Compare::create_revision(dir.clone(), CompareOp::Equal, 0).with_prefix()],
            _ => keys::blocker_ranges(&dir, kind)
                .into_iter()
                .map(|(start, end)| Compare::create_revision(start, CompareOp::Equal, 0).with_range(end))
                .collect(),
        };
        let ops = match kind {
            HoldKind::Permit { permits } => {
                let (start, end) = keys::permit_range(&dir);
                let newest = GetOptions::new()
                    .with_range(end)
                    .with_sort(SortTarget::Create, SortOrder::Descend)
                    .with_limit(i64::from(permits) + 1)
                    .with_keys_only();
                vec![put, TxnOp::get(start, Some(newest))]
            }
            _ => vec![put],
        };
        let acquire = Txn::new().when(guards).and_then(ops);
        let (alive, resp) = futures::join!(self.keep_alive(), self.cluster.txn("acquire", self.op_timeout, acquire));
        alive?;
        let resp = resp?;
        if !resp.succeeded() {
            return Err(LockError::Timeout);
        }
        let rev = resp.header().map(|h| h.revision()).ok_or(EtcdError::Protocol("a transaction without a header"))?;
        let release = Txn::new()
            .when([
                Compare::create_revision(key.clone(), CompareOp::Equal, rev),
                Compare::value(key.clone(), CompareOp::Equal, value),
            ])
            .and_then([TxnOp::delete(key.clone(), None)])
            .or_else([TxnOp::get(key, None)]);
        self.cluster.txn("release", self.op_timeout, release).await.map(drop)
    }

    async fn renew(&self, name: &LockName) -> Result<(), LockError> {
        let key = keys::request_key(&keys::lock_dir(&self.prefix, name), HoldKind::Exclusive, self.lease, 0);
        let check = Txn::new().and_then([TxnOp::get(key, Some(GetOptions::new().with_keys_only()))]);
        let (alive, checked) = futures::join!(self.keep_alive(), self.cluster.read("renew", self.op_timeout, check));
        alive?;
        checked.map(drop)
    }
}
