//! Results stored under a lock's name for idempotent execution: one key per lock beside
//! its range ([`result_key`](crate::result_key)), on an etcd lease of its own that lasts
//! the retention.
//!
//! A store is one transaction guarded by the hold and by the result key as last seen:
//! the hold's key still exists with the create revision it was granted with, on the lease
//! this client keeps it on, still naming this hold; and the result key's mod revision is
//! the one whose token was read as lower (0: absent). When the result key moved meanwhile,
//! its new token is read in the same answer and the store tries again; a token at or
//! above ours refuses it. The first round assumes no result yet, so a run's store is one
//! lease grant and one transaction.

use std::time::Duration;

use dlock_core::{FencingToken, LockError, LockName, StoredResult};
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};

use crate::error::EtcdError;
use crate::keys::{self, first_kv};
use crate::lock::{Shared, CAS_ROUNDS};
use crate::registry::EtcdHold;

/// How the rounds of a store ended.
enum Outcome {
    Stored,
    /// Nothing was written.
    Refused(LockError),
    /// The last put's answer was lost: it may have applied.
    InDoubt(LockError),
}

impl Shared {
    pub(crate) async fn store_result(
        &self,
        hold: &EtcdHold,
        token: FencingToken,
        value: &[u8],
        retention: Duration,
    ) -> Result<(), LockError> {
        let key = hold.key();
        if hold.is_released() || key.is_gone() {
            return Err(LockError::not_held());
        }
        let target = keys::result_key_in(&key.dir);
        let record = keys::encode_result(token, value);
        let lease = self.grant_retention(retention).await?;
        match self.put_result(hold, token, &target, record, lease).await {
            Outcome::Stored => {
                tracing::debug!(%token, bytes = value.len(), "result stored");
                Ok(())
            }
            Outcome::Refused(err) => {
                // Nothing was written: the lease granted for the result holds no key.
                self.revoke_later(lease);
                Err(err)
            }
            // The put may have applied, and then the lease keeps the result.
            Outcome::InDoubt(err) => Err(err),
        }
    }

    /// The compare-and-swap rounds of a store, on the result lease `lease`.
    async fn put_result(
        &self,
        hold: &EtcdHold,
        token: FencingToken,
        target: &[u8],
        record: Vec<u8>,
        lease: i64,
    ) -> Outcome {
        let key = hold.key();
        // The result key's mod revision as last seen; 0 while we believe it absent.
        let mut seen_result = 0;
        let mut fresh = false;
        for _ in 0..CAS_ROUNDS {
            if key.is_gone() {
                return Outcome::Refused(LockError::not_held());
            }
            let seen = key.value();
            if !seen.holds.iter().any(|h| h == hold.id()) {
                if fresh {
                    return Outcome::Refused(LockError::not_held());
                }
                // What we saw may be stale (an answer was lost): read the key.
                let txn = Txn::new().and_then([TxnOp::get(key.key.clone(), None)]);
                let resp = match self.read("read a held key", txn).await {
                    Ok(resp) => resp,
                    Err(err) => return Outcome::Refused(err),
                };
                match first_kv(&resp, 0).filter(|kv| kv.create_revision() == key.token) {
                    Some(kv) => {
                        if let Err(err) = self.adopt(key, &kv) {
                            return Outcome::Refused(err);
                        }
                    }
                    None => key.set_gone(),
                }
                fresh = true;
                continue;
            }
            let session = key.session();
            let txn = Txn::new()
                .when([
                    Compare::create_revision(key.key.clone(), CompareOp::Equal, key.token),
                    Compare::value(key.key.clone(), CompareOp::Equal, seen.encode()),
                    Compare::lease(key.key.clone(), CompareOp::Equal, session.id()),
                    Compare::mod_revision(target.to_vec(), CompareOp::Equal, seen_result),
                ])
                .and_then([
                    // The record it replaces, for the lease that kept it.
                    TxnOp::get(target.to_vec(), Some(GetOptions::new().with_keys_only())),
                    TxnOp::put(target.to_vec(), record.clone(), Some(PutOptions::new().with_lease(lease))),
                ])
                .or_else([TxnOp::get(key.key.clone(), None), TxnOp::get(target.to_vec(), None)]);
            // Sent again after a broken connection: a repeat finds the result key moved
            // (by the first send, recognised below by its lease) and changes nothing.
            let resp = match self.read("store a result", txn).await {
                Ok(resp) => resp,
                Err(err) => return Outcome::InDoubt(err),
            };
            if resp.succeeded() {
                if let Some(old) = first_kv(&resp, 0).filter(|old| old.lease() != 0 && old.lease() != lease) {
                    // No key is on it any more: it would only linger until the old retention.
                    self.revoke_later(old.lease());
                }
                return Outcome::Stored;
            }
            fresh = true;
            let stored = first_kv(&resp, 1);
            if stored.as_ref().is_some_and(|kv| kv.lease() == lease) {
                // An earlier send of this very store applied; its answer was lost.
                return Outcome::Stored;
            }
            let Some(held) = first_kv(&resp, 0).filter(|kv| kv.create_revision() == key.token) else {
                key.set_gone();
                return Outcome::Refused(LockError::not_held());
            };
            if let Err(err) = self.adopt(key, &held) {
                return Outcome::Refused(err);
            }
            if held.lease() != key.session().id() {
                // On a lease this client does not keep alive: the hold is not ours to use.
                return Outcome::Refused(LockError::not_held());
            }
            seen_result = match stored {
                None => 0,
                Some(kv) => match keys::decode_result(kv.key(), kv.value()) {
                    Ok(newer) if newer.token >= token => {
                        tracing::debug!(%token, stored = %newer.token, "a result of a later holder is stored");
                        return Outcome::Refused(LockError::not_held());
                    }
                    Ok(_) => kv.mod_revision(),
                    Err(err) => return Outcome::Refused(err.into()),
                },
            };
        }
        Outcome::Refused(LockError::backend(EtcdError::Protocol("the hold or the result kept changing under a store")))
    }

    pub(crate) async fn load_result(&self, name: &LockName) -> Result<Option<StoredResult>, LockError> {
        let target = keys::result_key_in(&self.dir(name));
        let resp = self.cluster.get("load a result", self.op_timeout, target, GetOptions::new()).await?;
        match resp.kvs().first() {
            None => Ok(None),
            Some(kv) => Ok(Some(keys::decode_result(kv.key(), kv.value())?)),
        }
    }

    /// A fresh lease for one result: the retention in whole seconds, rounded up (etcd may
    /// raise it to its minimum ttl, never lower it).
    async fn grant_retention(&self, retention: Duration) -> Result<i64, LockError> {
        let secs = keys::ttl_secs(retention);
        let resp = self.cluster.grant(self.op_timeout, secs).await?;
        if resp.ttl < secs {
            self.revoke_later(resp.id);
            return Err(EtcdError::ShortLease { asked: secs, granted: resp.ttl }.into());
        }
        Ok(resp.id)
    }

    /// Revokes a lease that holds no key of ours, in the background.
    fn revoke_later(&self, lease: i64) {
        self.cluster.revoke_later(self.op_timeout, lease, self.op_timeout);
    }
}
