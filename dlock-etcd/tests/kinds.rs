//! Read-write locks and semaphores on etcd, beyond the shared suite: permit requests
//! keep their queue order whatever number of permits each asked with, a waiter behind
//! permits is woken by whichever of them goes first, `inspect` shows the newest of
//! several holds, and an owner re-enters only the kind it holds.

mod common;

use std::time::{Duration, Instant};

use common::EtcdFixture;
use dlock_conformance::properties::{eventually, unique_name};
use dlock_core::{LockOptions, Locker, OwnerId};

const MARGIN: Duration = Duration::from_secs(8);

fn opts() -> LockOptions {
    LockOptions::watchdog(Duration::from_secs(5)).wait(MARGIN)
}

/// A request for more permits does not overtake one for fewer that waits ahead of it,
/// nor joins it once it holds (it asked for one permit, so for no company): grants
/// follow the queue, so every grant's token is above the earlier ones'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_requests_keep_their_order() {
    dlock_conformance::init_tracing();
    let fixture = EtcdFixture::start().await;
    let (admin, a, b, c) =
        (fixture.locker().await, fixture.locker().await, fixture.locker().await, fixture.locker().await);
    let name = unique_name("permit-order");

    let first = a.acquire(&name, &opts().permits(1)).await.expect("a permit");
    let second = tokio::spawn({
        let (b, name) = (b.clone(), name.clone());
        async move { b.acquire(&name, &opts().permits(1)).await }
    });
    eventually("the second request waits", MARGIN, || {
        let (admin, name) = (admin.clone(), name.clone());
        async move { admin.inspect(&name).await.is_ok_and(|info| info.waiters == Some(1)) }
    })
    .await;
    // Five permits would admit it beside the holder, but a request waits ahead of it.
    let wait = LockOptions::watchdog(Duration::from_secs(5)).wait(Duration::ZERO).permits(5);
    assert!(c.try_acquire(&name, &wait).await.expect("try").is_none(), "a later request overtook a waiting one");
    let third = tokio::spawn({
        let (c, name) = (c.clone(), name.clone());
        async move { c.acquire(&name, &opts().permits(5)).await }
    });
    eventually("the third request waits", MARGIN, || {
        let (admin, name) = (admin.clone(), name.clone());
        async move { admin.inspect(&name).await.is_ok_and(|info| info.waiters == Some(2)) }
    })
    .await;

    let first_token = first.token();
    first.release().await.expect("release");
    let second = second.await.expect("join").expect("the second request is granted");
    let info = admin.inspect(&name).await.expect("inspect");
    assert_eq!(info.waiters, Some(1), "the request for five joined a holder that asked for one permit");
    let second_token = second.token();
    second.release().await.expect("release");
    let third = third.await.expect("join").expect("the third request is granted once the second is out");
    assert!(first_token < second_token && second_token < third.token(), "grants out of queue order");

    let info = admin.inspect(&name).await.expect("inspect");
    let holder = info.holder.expect("a holder");
    assert_eq!(holder.token, third.token(), "inspect shows the newest hold");
    assert_eq!(info.waiters, Some(0));
    third.release().await.expect("release");
}

/// Permits come back in any order: the waiters behind them are woken by whichever goes,
/// not only by the oldest or the newest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_waiters_wake_on_any_permit_coming_back() {
    dlock_conformance::init_tracing();
    let fixture = EtcdFixture::start().await;
    let name = unique_name("permit-wake");
    let three = || opts().permits(3);
    let mut held = Vec::new();
    for _ in 0..3 {
        let client = fixture.locker().await;
        held.push(client.acquire(&name, &three()).await.expect("a permit"));
    }
    let admin = fixture.locker().await;
    let mut waiting = Vec::new();
    for n in 1..=2 {
        let client = fixture.locker().await;
        waiting.push(tokio::spawn({
            let name = name.clone();
            async move { client.acquire(&name, &three()).await }
        }));
        eventually("the request waits", MARGIN, || {
            let (admin, name) = (admin.clone(), name.clone());
            async move { admin.inspect(&name).await.is_ok_and(|info| info.waiters == Some(n)) }
        })
        .await;
    }

    // The middle permit, then the newest: neither is the one just ahead of a waiter.
    let middle = held.remove(1);
    let since = Instant::now();
    middle.release().await.expect("release");
    let fourth = waiting.remove(0).await.expect("join").expect("the first waiter is granted");
    let newest = held.remove(1);
    newest.release().await.expect("release");
    let fifth = waiting.remove(0).await.expect("join").expect("the second waiter is granted");
    // Without a notification they would wait for the whole wait bound.
    assert!(since.elapsed() < Duration::from_secs(3), "the waiters took {:?}", since.elapsed());
    for lease in [fourth, fifth, held.remove(0)] {
        lease.release().await.expect("release");
    }
}

/// Readers hold together: `inspect` shows the newest of them, and counts the writer
/// waiting behind them, not the readers, as waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_the_newest_reader() {
    dlock_conformance::init_tracing();
    let fixture = EtcdFixture::start().await;
    let (admin, a, b, w) =
        (fixture.locker().await, fixture.locker().await, fixture.locker().await, fixture.locker().await);
    let name = unique_name("inspect-readers");
    let first = a.acquire(&name, &opts().read()).await.expect("read");
    let second = b.acquire(&name, &opts().read()).await.expect("read");
    let writing = tokio::spawn({
        let (w, name) = (w.clone(), name.clone());
        async move { w.acquire(&name, &opts().write()).await }
    });
    eventually("the writer waits", MARGIN, || {
        let (admin, name) = (admin.clone(), name.clone());
        async move { admin.inspect(&name).await.is_ok_and(|info| info.waiters == Some(1)) }
    })
    .await;
    let holder = admin.inspect(&name).await.expect("inspect").holder.expect("a holder");
    assert_eq!((&holder.owner, holder.token), (second.owner(), second.token()));
    first.release().await.expect("release");
    second.release().await.expect("release");
    let writer = writing.await.expect("join").expect("the writer is granted");
    let holder = admin.inspect(&name).await.expect("inspect").holder.expect("a holder");
    assert_eq!(holder.token, writer.token());
    writer.release().await.expect("release");
}

/// An owner re-enters the kind it holds, and only that: a reader that asks to write
/// waits like anyone else (no upgrade), while its second read shares its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_re_enters_only_the_kind_it_holds() {
    dlock_conformance::init_tracing();
    let fixture = EtcdFixture::start().await;
    let client = fixture.locker().await;
    let name = unique_name("reenter-kind");
    let owner = OwnerId::new("reader-7").expect("owner");
    let as_owner = |opts: LockOptions| opts.owner(owner.clone());
    let first = client.acquire(&name, &as_owner(opts().read())).await.expect("read");
    let again = client.acquire(&name, &as_owner(opts().read())).await.expect("read again");
    assert_eq!(first.token(), again.token(), "a re-entered read takes the hold's token");
    assert_eq!(client.inspect(&name).await.expect("inspect").holder.expect("a holder").count, 2);
    let write = as_owner(LockOptions::watchdog(Duration::from_secs(5)).wait(Duration::ZERO).write());
    assert!(client.try_acquire(&name, &write).await.expect("try").is_none(), "a reader was upgraded to a writer");
    let three = as_owner(LockOptions::watchdog(Duration::from_secs(5)).wait(Duration::ZERO).permits(3));
    assert!(client.try_acquire(&name, &three).await.expect("try").is_none(), "a reader was granted a permit");
    again.release().await.expect("release");
    first.release().await.expect("release");
    let writer =
        client.acquire(&name, &as_owner(opts().write())).await.expect("the owner writes once it stopped reading");
    writer.release().await.expect("release");
}
