//! Guarded transactions: fencing for data kept in etcd itself.
//!
//! A holder that keeps its protected data in etcd does not need a resource that checks
//! tokens: it guards each write with `create_revision(lock key) == token` (etcd's
//! `IsOwner`). The write then applies only while the lock key that granted the token
//! still exists; a holder whose lease expired, or whose key was deleted, finds its
//! transaction refused, however late it wakes up. A reader's or a permit's key is guarded
//! the same way: the guard proves that hold still exists, not that it is alone (other
//! readers, or other permits, may write beside it).

use dlock_core::{FencingToken, LockError, LockName};
use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnResponse};

use crate::backend::EtcdBackend;

/// The guard of a write made under a lock: the lock key still exists with the token as
/// its create revision.
///
/// ```
/// use dlock_core::FencingToken;
/// use etcd_client::{Txn, TxnOp};
///
/// let txn = Txn::new()
///     .when([dlock_etcd::guard(b"dlock/orders%2F42/7587-1".to_vec(), FencingToken::new(42))])
///     .and_then([TxnOp::put("orders/42/state", "paid", None)]);
/// # let _ = txn;
/// ```
pub fn guard(lock_key: impl Into<Vec<u8>>, token: FencingToken) -> Compare {
    Compare::create_revision(lock_key, CompareOp::Equal, i64::try_from(token.get()).unwrap_or(i64::MAX))
}

impl EtcdBackend {
    /// The etcd key of a hold this client granted (while its lease, or a handle of it,
    /// is alive), found by the lock's name and the hold's token.
    pub fn lock_key(&self, name: &LockName, token: FencingToken) -> Option<Vec<u8>> {
        let dir = self.shared.dir(name);
        let token = i64::try_from(token.get()).ok()?;
        self.shared.registry.find_token_any(&dir, token).map(|k| k.key.clone())
    }

    /// A transaction that applies `ops` only while the hold (`name`, `token`) is still the
    /// lock's: `Compare(create_revision(lock key) == token)` then `ops`. `NotHeld` when this
    /// client does not know the hold (it was released, or granted by another client).
    ///
    /// ```no_run
    /// use dlock_core::{LockName, LockOptions, Locker};
    /// use etcd_client::TxnOp;
    ///
    /// # async fn run(locker: dlock_etcd::EtcdLocker) -> Result<(), dlock_core::LockError> {
    /// let name = LockName::new("orders/42")?;
    /// let lease = locker.acquire(&name, &LockOptions::new()).await?;
    /// let write = TxnOp::put("orders/42/state", "paid", None);
    /// let done = locker.backend().guarded(&name, lease.token(), [write]).await?;
    /// assert!(done.succeeded(), "the lock was lost before the write");
    /// lease.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn guarded_txn(
        &self,
        name: &LockName,
        token: FencingToken,
        ops: impl Into<Vec<TxnOp>>,
    ) -> Result<Txn, LockError> {
        let key = self.lock_key(name, token).ok_or(LockError::not_held())?;
        Ok(Txn::new().when([guard(key, token)]).and_then(ops))
    }

    /// Builds [`guarded_txn`](Self::guarded_txn) and runs it; `succeeded()` on the answer
    /// says whether the writes were applied.
    pub async fn guarded(
        &self,
        name: &LockName,
        token: FencingToken,
        ops: impl Into<Vec<TxnOp>>,
    ) -> Result<TxnResponse, LockError> {
        let txn = self.guarded_txn(name, token, ops)?;
        self.shared.cluster.txn("guarded transaction", self.shared.op_timeout, txn).await
    }
}
