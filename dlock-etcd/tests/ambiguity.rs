//! Requests whose answer was lost, in the ways only etcd's leases allow: a re-entry that
//! moves the held key to a longer lease.

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
