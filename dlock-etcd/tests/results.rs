//! Results stored under a lock's name: where they live in etcd, the lease that expires
//! them, and what a record dlock did not write does.

mod common;

use std::time::Duration;

use common::EtcdFixture;
use dlock_conformance::properties::{eventually, unique_name};
use dlock_conformance::Evict;
use dlock_core::{LockError, LockOptions, Locker};
use etcd_client::PutOptions;

const RETENTION: Duration = Duration::from_secs(600);
const MARGIN: Duration = Duration::from_secs(8);

fn opts() -> LockOptions {
    LockOptions::watchdog(Duration::from_secs(5)).wait(MARGIN)
}

/// The result key is not one of the lock's queue, outlives the hold's release and
/// eviction, and is replaced only by a later holder's result, whose store lets the
/// replaced record's lease go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn result_key_lives_beside_the_queue_on_a_lease_of_its_own() {
    dlock_conformance::init_tracing();
    let fixture = EtcdFixture::start().await;
    let (client, other) = (fixture.locker().await, fixture.locker().await);
    let name = unique_name("result-key");
    let key = dlock_etcd::result_key(client.backend().prefix(), &name);
    let mut etcd = fixture.etcd().await;

    let first = client.acquire(&name, &opts()).await.expect("acquire");
    first.store_result(b"first", RETENTION).await.expect("store");
    let info = other.inspect(&name).await.expect("inspect");
    assert_eq!(info.waiters, Some(0), "the result key counted as a waiter: {info:?}");
    assert_eq!(info.holder.expect("held").token, first.token());
    let stored = etcd.get(key.clone(), None).await.expect("read the result key");
    let kv = stored.kvs().first().expect("the result key exists");
    assert_eq!(kv.value(), format!("{}\nfirst", first.token().get()).as_bytes());
    let first_lease = kv.lease();
    let ttl = etcd.lease_time_to_live(first_lease, None).await.expect("lease ttl").ttl();
    assert!(ttl > 590 && ttl <= 600, "the result lease lasts the retention: {ttl} s");

    let again = first.store_result(b"again", RETENTION).await;
    assert!(matches!(again, Err(LockError::NotHeld { .. })), "a second store of the same token: {again:?}");

    fixture.evict(&name).await;
    let kept = other.load_result(&name).await.expect("load").expect("the eviction left the result");
    assert_eq!((kept.token, kept.value.as_slice()), (first.token(), &b"first"[..]));
    drop(first);

    let second = other.acquire(&name, &opts()).await.expect("the evicted lock is free");
    assert!(second.token() > kept.token);
    second.store_result(b"second", RETENTION).await.expect("a later holder replaces the result");
    let second_token = second.token();
    second.release().await.expect("release");
    let replaced = client.load_result(&name).await.expect("load").expect("stored");
    assert_eq!((replaced.token, replaced.value.as_slice()), (second_token, &b"second"[..]));
    eventually("the replaced record's lease is revoked", MARGIN, || {
        let mut etcd = etcd.clone();
        async move { etcd.lease_time_to_live(first_lease, None).await.is_ok_and(|r| r.ttl() < 0) }
    })
    .await;
}

/// The result is gone once its retention (rounded up to etcd's whole seconds) has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn result_expires_with_its_retention() {
    dlock_conformance::init_tracing();
    let fixture = EtcdFixture::start().await;
    let client = fixture.locker().await;
    let name = unique_name("result-expiry");
    let lease = client.acquire(&name, &opts()).await.expect("acquire");
    lease.store_result(b"short-lived", Duration::from_millis(1500)).await.expect("store");
    lease.release().await.expect("release");
    assert!(client.load_result(&name).await.expect("load").is_some(), "the result is kept at first");
    eventually("the result expires", MARGIN, || async { client.load_result(&name).await.expect("load").is_none() })
        .await;
}

/// A result key holding a value dlock did not write is a backend error for a load and a
/// store alike, and the store leaves it as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_result_record_is_a_backend_error() {
    dlock_conformance::init_tracing();
    let fixture = EtcdFixture::start().await;
    let client = fixture.locker().await;
    let name = unique_name("result-foreign");
    let key = dlock_etcd::result_key(client.backend().prefix(), &name);
    let mut etcd = fixture.etcd().await;
    etcd.put(key.clone(), "not a record", None::<PutOptions>).await.expect("put a foreign value");

    let loaded = client.load_result(&name).await;
    assert!(matches!(loaded, Err(LockError::Backend(_))), "loading a foreign record: {loaded:?}");
    let lease = client.acquire(&name, &opts()).await.expect("acquire");
    let stored = lease.store_result(b"mine", RETENTION).await;
    assert!(matches!(stored, Err(LockError::Backend(_))), "storing over a foreign record: {stored:?}");
    lease.release().await.expect("release");
    let resp = etcd.get(key, None).await.expect("read the result key");
    assert_eq!(resp.kvs().first().map(|kv| kv.value()), Some(&b"not a record"[..]));
}

/// A re-entrant hold stores under the key it shares with the outer hold; the outer hold,
/// of the same token, then finds a result of its token stored and is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentrant_holds_store_under_the_key_they_share() {
    dlock_conformance::init_tracing();
    let fixture = EtcdFixture::start().await;
    let client = fixture.locker().await;
    let name = unique_name("result-reentrant");
    let opts = opts().owner(dlock_core::OwnerId::new("job 7").expect("owner"));
    let outer = client.acquire(&name, &opts).await.expect("acquire");
    let inner = client.acquire(&name, &opts).await.expect("re-enter");
    assert_eq!(outer.token(), inner.token());
    inner.store_result(b"inner", RETENTION).await.expect("the inner hold stores");
    inner.release().await.expect("release the inner hold");
    let refused = outer.store_result(b"outer", RETENTION).await;
    assert!(matches!(refused, Err(LockError::NotHeld { .. })), "a store of a token already stored: {refused:?}");
    let stored = client.load_result(&name).await.expect("load").expect("stored");
    assert_eq!((stored.token, stored.value.as_slice()), (outer.token(), &b"inner"[..]));
    outer.release().await.expect("release");
}
