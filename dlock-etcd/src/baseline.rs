//! The raw baseline for `dlock bench`: the requests of an uncontended acquire and release,
//! of a campaign and resignation, and of a renewal, sent straight through `etcd-client`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::{ConnectConfig, HoldKind, LockError, LockName, OwnerId, RawBaseline, DEFAULT_TTL, MAX_DURATION};
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp};

use crate::cluster::Cluster;
use crate::config::EtcdConfig;
use crate::connect;
use crate::error::EtcdError;
use crate::keys::{self, first_kv, HoldValue};
use crate::lock::CAS_ROUNDS;

/// The grant id every baseline hold records in its key's value.
const GRANT: &str = "raw-baseline";

/// The etcd backend's raw baseline (see [`RawBaseline`]): one lease granted up front, as
/// a client session is; each acquire sends a keepalive of it alongside the put-if-free
/// transaction, and the release is one guarded delete.
pub struct EtcdBaseline {
    // Shared with the background revokes of result leases a store leaves unused.
    cluster: Arc<Cluster>,
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
    let cluster = Arc::new(connect::open(&config).await?);
    let granted = cluster.grant(config.op_timeout(), keys::ttl_secs(DEFAULT_TTL)).await?;
    Ok(EtcdBaseline {
        cluster,
        prefix: config.prefix().to_string(),
        lease: granted.id,
        op_timeout: config.op_timeout(),
        owner: OwnerId::new("raw-baseline")?,
        seq: AtomicU64::new(1),
    })
}

/// The key of a granted request, as its release guards on it.
struct Held {
    key: Vec<u8>,
    value: Vec<u8>,
    /// The key's create revision: the hold's token.
    rev: i64,
}

impl EtcdBaseline {
    /// The acquire transaction of an uncontended request of `kind`, with a keepalive of the
    /// lease alongside as a session sends it.
    async fn acquire(&self, name: &LockName, kind: HoldKind) -> Result<Held, LockError> {
        let dir = keys::lock_dir(&self.prefix, name);
        let key = keys::request_key(&dir, kind, self.lease, self.seq.fetch_add(1, Ordering::Relaxed));
        let value = HoldValue::new(self.owner.clone(), vec![GRANT.to_string()]).encode();
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
            return Err(LockError::timeout());
        }
        let rev = resp.header().map(|h| h.revision()).ok_or(EtcdError::Protocol("a transaction without a header"))?;
        Ok(Held { key, value, rev })
    }

    /// The release: one delete guarded by the key's create revision and value.
    async fn release(&self, held: Held) -> Result<(), LockError> {
        let Held { key, value, rev } = held;
        let release = Txn::new()
            .when([
                Compare::create_revision(key.clone(), CompareOp::Equal, rev),
                Compare::value(key.clone(), CompareOp::Equal, value),
            ])
            .and_then([TxnOp::delete(key.clone(), None)])
            .or_else([TxnOp::get(key, None)]);
        self.cluster.txn("release", self.op_timeout, release).await.map(drop)
    }

    /// The compare-and-swap rounds of a store of `record` at `target` on the result lease
    /// `lease`, each guarded by the hold and by the result key's mod revision as last seen.
    async fn store(&self, held: &Held, target: &[u8], record: Vec<u8>, lease: i64) -> Result<(), LockError> {
        let mut seen_result = 0;
        for _ in 0..CAS_ROUNDS {
            let txn = Txn::new()
                .when([
                    Compare::create_revision(held.key.clone(), CompareOp::Equal, held.rev),
                    Compare::value(held.key.clone(), CompareOp::Equal, held.value.clone()),
                    Compare::lease(held.key.clone(), CompareOp::Equal, self.lease),
                    Compare::mod_revision(target.to_vec(), CompareOp::Equal, seen_result),
                ])
                .and_then([
                    TxnOp::get(target.to_vec(), Some(GetOptions::new().with_keys_only())),
                    TxnOp::put(target.to_vec(), record.clone(), Some(PutOptions::new().with_lease(lease))),
                ])
                .or_else([TxnOp::get(held.key.clone(), None), TxnOp::get(target.to_vec(), None)]);
            let resp = self.cluster.read("store a result", self.op_timeout, txn).await?;
            if resp.succeeded() {
                if let Some(old) = first_kv(&resp, 0).filter(|old| old.lease() != 0 && old.lease() != lease) {
                    // The library gives back the replaced record's lease too, or every
                    // round of the benchmark would leave a year-long lease behind.
                    self.revoke_later(old.lease());
                }
                return Ok(());
            }
            if first_kv(&resp, 0).is_none_or(|kv| kv.create_revision() != held.rev) {
                return Err(LockError::not_held());
            }
            // Uncontended, the kept result is of an earlier token: only its revision matters.
            seen_result = first_kv(&resp, 1).map_or(0, |kv| kv.mod_revision());
        }
        Err(EtcdError::Protocol("the result kept changing under a raw store").into())
    }

    /// Revokes a lease that holds no key, in the background, as the library does: the
    /// store's answer does not wait for it.
    fn revoke_later(&self, lease: i64) {
        self.cluster.revoke_later(self.op_timeout, lease, self.op_timeout);
    }

    async fn keep_alive(&self) -> Result<(), LockError> {
        match self.cluster.keep_alive(self.op_timeout, self.lease).await? {
            true => Ok(()),
            false => Err(LockError::lost(dlock_core::LostReason::SessionExpired)),
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
        let held = self.acquire(name, kind).await?;
        self.release(held).await
    }

    /// The acquire, the store's lease grant (the retention's) and compare-and-swap rounds
    /// as `Shared::store_result` sends them, and the release. The first round assumes no
    /// result, as the library's does, so a name with a result kept takes a second round.
    async fn campaign_resign(&self, name: &LockName, value: &[u8]) -> Result<(), LockError> {
        let held = self.acquire(name, HoldKind::Exclusive).await?;
        let target = keys::result_key_in(&keys::lock_dir(&self.prefix, name));
        let record = keys::encode_result(keys::token_of(held.rev), value);
        let lease = self.cluster.grant(self.op_timeout, keys::ttl_secs(MAX_DURATION)).await?.id;
        let stored = self.store(&held, &target, record, lease).await;
        if stored.is_err() {
            // Whatever became of the record, a year-long lease must not outlive the
            // benchmark that failed on it.
            self.revoke_later(lease);
        }
        self.release(held).await?;
        stored
    }

    async fn renew(&self, name: &LockName) -> Result<(), LockError> {
        let key = keys::request_key(&keys::lock_dir(&self.prefix, name), HoldKind::Exclusive, self.lease, 0);
        let check = Txn::new().and_then([TxnOp::get(key, Some(GetOptions::new().with_keys_only()))]);
        let (alive, checked) = futures::join!(self.keep_alive(), self.cluster.read("renew", self.op_timeout, check));
        alive?;
        checked.map(drop)
    }
}
