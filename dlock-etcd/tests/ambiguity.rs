//! Requests whose answer was lost, in the ways only etcd's leases allow: a re-entry that
//! moves the held key to a longer lease, and the grant of a lease.

mod common;

use std::time::Duration;

use common::EtcdFixture;
use dlock_conformance::properties::{eventually, unique_name};
use dlock_conformance::{Fault, Link};
use dlock_core::{LockError, LockOptions, Locker, OwnerId};

const MARGIN: Duration = Duration::from_secs(8);

/// An owner holds a lock on a short lease and re-enters it asking for a longer ttl; the
/// re-entry moves the key to the client's longer lease, and its answer is lost. Giving
/// the re-entry back must not revoke the lease the key now lives on: the owner's first
/// hold keeps the lock, nobody else gets it, and it frees when that hold is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_reentry_onto_a_longer_lease_keeps_the_key() {
    dlock_conformance::init_tracing();
    let fixture = EtcdFixture::start().await;
    let (client, link) = fixture.proxied().await;
    let other = fixture.locker().await;
    let (short, long) = (Duration::from_secs(2), Duration::from_secs(30));

    // The client's 30 s lease exists, with no key on it.
    let warm = client.acquire(&unique_name("warm-long-lease"), &LockOptions::watchdog(long)).await.expect("acquire");
    warm.release().await.expect("release");

    let name = unique_name("reentry-moves");
    let owned = |ttl| LockOptions::watchdog(ttl).owner(OwnerId::new("mover").expect("owner")).wait(MARGIN);
    let held = client.acquire(&name, &owned(short)).await.expect("the owner acquires");

    link.set(Fault::DropReplies);
    let reentered = client.acquire(&name, &owned(long)).await;
    link.restore();
    assert!(
        matches!(reentered, Err(LockError::Unavailable { .. })),
        "a re-entry whose reply was dropped: {reentered:?}"
    );
    let settled = client.clone();
    eventually("the ambiguous re-entry is given back", MARGIN, move || {
        let client = settled.clone();
        async move { client.stats().in_flight == 0 }
    })
    .await;

    // Several renewals of the short hold later, the key is still the owner's.
    tokio::time::sleep(short * 2).await;
    assert!(!held.is_lost(), "the owner's hold was lost: {:?}", held.lost_reason());
    let intruder = other.try_acquire(&name, &LockOptions::new()).await.expect("try_acquire");
    assert!(intruder.is_none(), "another client got the lock while the owner's hold lives");
    let holder = other.inspect(&name).await.expect("inspect").holder.expect("the owner holds the lock");
    assert_eq!((holder.token, holder.count), (held.token(), 1), "the re-entry was given back, and only it");

    held.release().await.expect("the owner releases");
    let next = other.acquire(&name, &LockOptions::watchdog(short).wait(MARGIN)).await.expect("the lock is free");
    next.release().await.expect("release");
}

/// The leases of the fixture's server granted for `ttl_secs`.
async fn leases_of(etcd: &mut etcd_client::Client, ttl_secs: i64) -> Vec<i64> {
    let mut found = Vec::new();
    for lease in etcd.lease_client().leases().await.expect("list leases").leases() {
        match etcd.lease_client().time_to_live(lease.id(), None).await {
            Ok(ttl) if ttl.granted_ttl() == ttl_secs => found.push(lease.id()),
            _ => {}
        }
    }
    found
}

/// A lease grant whose answer is lost fails the acquire that needed it; the lease the
/// server made for it holds nothing and nobody knows its id but the client, which
/// revokes it once the server answers again, long before its own ttl would end it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grant_whose_reply_was_lost_leaves_no_lease() {
    dlock_conformance::init_tracing();
    let fixture = EtcdFixture::start().await;
    let (client, link) = fixture.proxied().await;
    let mut etcd = fixture.etcd().await;
    // A ttl no other test asks for, long beside the bound below.
    let ttl = Duration::from_secs(97);
    let warm = client.acquire(&unique_name("warm"), &LockOptions::new()).await.expect("the proxied client works");
    warm.release().await.expect("release");
    assert!(leases_of(&mut etcd, 97).await.is_empty(), "a lease of this ttl before the test");

    // The grant reaches the server and its answer is lost; then the link goes down, so
    // the client can neither hear of the lease nor revoke it until it comes back.
    link.set(Fault::DropReplies);
    let acquiring = tokio::spawn(async move {
        client.acquire(&unique_name("grant-lost"), &LockOptions::watchdog(ttl).wait(MARGIN)).await.map(drop)
    });
    let granted = etcd.clone();
    eventually("the server grants the lease whose answer is lost", MARGIN, move || {
        let mut etcd = granted.clone();
        async move { leases_of(&mut etcd, 97).await.len() == 1 }
    })
    .await;
    link.set(Fault::Cut);
    let acquired = acquiring.await.expect("the acquire's task");
    assert!(
        matches!(acquired, Err(LockError::Unavailable { .. })),
        "an acquire whose grant got no answer: {acquired:?}"
    );
    assert_eq!(leases_of(&mut etcd, 97).await.len(), 1, "the lease outlived the link");
    link.restore();

    eventually("the lease whose grant got no answer is revoked", MARGIN * 2, || {
        let mut etcd = etcd.clone();
        async move { leases_of(&mut etcd, 97).await.is_empty() }
    })
    .await;
}
