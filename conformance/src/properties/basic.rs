//! The plain contract: acquire and release, try, wait bounds, input validation, names.

use std::time::{Duration, Instant};

use dlock_core::{LockError, LockName, LockOptions, MAX_DURATION, MAX_NAME_LEN};

use super::{eventually, unique_name, watchdog};
use crate::fixture::Fixture;

/// Acquire returns a lease with a token, `inspect` (from the holder's client and from
/// another) shows the holder, release frees the lock, and the next grant's token is higher.
pub async fn acquire_release(f: &dyn Fixture) {
    let margin = f.timing().margin;
    let (a, b) = (f.client().await, f.client().await);
    let name = unique_name("acquire-release");

    let lease = a.acquire(&name, &watchdog(f, margin)).await.expect("acquire a free lock");
    assert_eq!(lease.name(), &name);
    assert!(lease.token().get() > 0, "tokens start above zero");
    assert!(!lease.is_lost());
    assert!(lease.remaining() > Duration::ZERO);

    for (who, client) in [("holder", &a), ("other client", &b)] {
        let info = client.inspect(&name).await.expect("inspect");
        let holder = info.holder.unwrap_or_else(|| panic!("inspect from the {who} shows no holder"));
        assert_eq!(&holder.owner, lease.owner(), "inspect from the {who}: owner");
        assert_eq!(holder.token, lease.token(), "inspect from the {who}: token");
    }

    let first = lease.token();
    lease.release().await.expect("release our own lease");
    let info = b.inspect(&name).await.expect("inspect");
    assert!(info.holder.is_none(), "the lock is free after release, inspect shows {info:?}");

    let again = b.try_acquire(&name, &watchdog(f, margin)).await.expect("try_acquire").expect("free after release");
    assert!(again.token() > first, "the next grant's token {} must exceed {first}", again.token());
    again.release().await.expect("release");
}

/// A third client inspecting while the lock is handed from one client to another never
/// sees a holder whose release has returned, and sees the new holder once its acquire
/// has returned. A grant made in two steps (the lock, then the record of its token) must
/// not show the old record beside the new lock.
pub async fn inspect_follows_hand_offs(f: &dyn Fixture) {
    let margin = f.timing().margin;
    let clients = [f.client().await, f.client().await];
    let probe = f.client().await;
    let name = unique_name("inspect-hand-off");
    let mut holder = clients[0].acquire(&name, &watchdog(f, margin)).await.expect("acquire");
    for round in 0..20 {
        let next = clients[(round + 1) % 2].clone();
        let waiting = tokio::spawn({
            let (next, name, opts) = (next.clone(), name.clone(), watchdog(f, margin * 2));
            async move { next.acquire(&name, &opts).await }
        });
        eventually("the next holder waits", margin, || {
            let next = next.clone();
            async move { next.stats().waiting > 0 }
        })
        .await;
        let released = holder.token();
        holder.release().await.expect("release");
        while !waiting.is_finished() {
            if let Some(seen) = probe.inspect(&name).await.expect("inspect").holder {
                assert_ne!(seen.token, released, "round {round}: inspect shows a holder whose release has returned");
            }
        }
        holder = waiting.await.expect("join").expect("the waiter is granted");
        let seen = probe.inspect(&name).await.expect("inspect").holder;
        assert_eq!(seen.map(|h| h.token), Some(holder.token()), "round {round}: inspect after the grant returned");
    }
    holder.release().await.expect("release");
}

/// `try_acquire` on a held lock returns `None` at once, whatever the wait bound says.
pub async fn try_acquire_returns_at_once(f: &dyn Fixture) {
    let margin = f.timing().margin;
    let (a, b) = (f.client().await, f.client().await);
    let name = unique_name("try-acquire");
    let held = a.acquire(&name, &watchdog(f, margin)).await.expect("acquire");

    let opts = watchdog(f, Duration::from_secs(120));
    let started = Instant::now();
    let attempt = b.try_acquire(&name, &opts).await.expect("try_acquire on a held lock is not an error");
    let took = started.elapsed();
    assert!(attempt.is_none(), "try_acquire must not get a held lock");
    assert!(took < margin, "try_acquire waited {took:?} for a holder (the wait bound was 120 s)");
    assert_eq!(b.stats().active_leases, 0);

    held.release().await.expect("release");
    let got = b.try_acquire(&name, &opts).await.expect("try_acquire").expect("free now");
    got.release().await.expect("release");
}

/// `acquire` with a wait bound on a held lock fails with `Timeout`, not before the bound
/// and not long after it, and leaves no waiter behind.
pub async fn wait_bound_times_out(f: &dyn Fixture) {
    let timing = f.timing();
    let (a, b) = (f.client().await, f.client().await);
    let name = unique_name("wait-bound");
    let held = a.acquire(&name, &watchdog(f, timing.margin)).await.expect("acquire");

    let bound = timing.ttl.max(Duration::from_millis(300));
    let started = Instant::now();
    let result = b.acquire(&name, &watchdog(f, bound)).await;
    let took = started.elapsed();
    assert!(matches!(result, Err(LockError::Timeout { .. })), "expected Timeout, got {result:?}");
    if let Err(err @ LockError::Timeout { waited, .. }) = &result {
        // The error says which lock and how long it waited.
        assert_eq!(err.lock_name(), Some(name.as_str()), "{err}");
        assert_eq!(*waited, Some(bound), "{err}");
        assert!(err.to_string().contains(name.as_str()), "{err}");
    }
    assert!(took >= bound, "Timeout after {took:?}, before the bound of {bound:?}");
    assert!(took < bound + timing.margin, "Timeout after {took:?}, far past the bound of {bound:?}");

    if b.capabilities().queue_length {
        eventually("the timed-out waiter leaves the queue", timing.margin, || async {
            a.inspect(&name).await.map(|i| i.waiters == Some(0)).unwrap_or(false)
        })
        .await;
    }
    assert_eq!(b.stats().waiting, 0);
    held.release().await.expect("release");
}

/// Bad input is `InvalidInput`, never a panic or an overflow: empty, oversized and NUL
/// names, zero and absurd durations. A name of exactly the maximum length works.
pub async fn bad_input_rejected(f: &dyn Fixture) {
    let margin = f.timing().margin;
    let client = f.client().await;

    for (what, result) in [
        ("empty name", LockName::new("")),
        ("1 MiB name", LockName::new("n".repeat(1 << 20))),
        ("name with NUL", LockName::new("a\0b")),
        ("name one byte too long", LockName::new("n".repeat(MAX_NAME_LEN + 1))),
    ] {
        assert!(matches!(result, Err(LockError::InvalidInput(_))), "{what}: {result:?}");
    }

    let name = unique_name("bad-input");
    let ttl = f.timing().ttl;
    let bad_options = [
        ("zero ttl", LockOptions::watchdog(Duration::ZERO)),
        ("zero fixed ttl", LockOptions::fixed(Duration::ZERO)),
        ("ttl of u64::MAX ms", LockOptions::watchdog(Duration::from_millis(u64::MAX))),
        ("ttl just over the maximum", LockOptions::watchdog(MAX_DURATION + Duration::from_secs(1))),
        ("overflowing wait", LockOptions::watchdog(ttl).wait(Duration::MAX)),
        ("zero max_hold", LockOptions::watchdog(ttl).max_hold(Duration::ZERO)),
    ];
    for (what, opts) in &bad_options {
        let acquired = client.acquire(&name, opts).await;
        assert!(matches!(acquired, Err(LockError::InvalidInput(_))), "acquire with {what}: {acquired:?}");
        let tried = client.try_acquire(&name, opts).await;
        assert!(matches!(tried, Err(LockError::InvalidInput(_))), "try_acquire with {what}: {tried:?}");
    }
    let info = client.inspect(&name).await.expect("inspect");
    assert!(info.holder.is_none(), "rejected acquires must not take the lock");

    // The longest legal names, in ASCII and in 4-byte characters.
    let prefix = name.as_str().to_string();
    let ascii = format!("{prefix}{}", "x".repeat(MAX_NAME_LEN - prefix.len()));
    let emoji = format!("{}{}", "🔒".repeat((MAX_NAME_LEN - 8) / 4), &format!("{:08x}", fastrand::u32(..)));
    for long in [ascii, emoji] {
        assert_eq!(long.len(), MAX_NAME_LEN);
        let long = LockName::new(long).expect("a name of the maximum length is legal");
        let lease = client.acquire(&long, &watchdog(f, margin)).await.expect("acquire a maximum-length name");
        let info = client.inspect(&long).await.expect("inspect");
        assert_eq!(info.holder.map(|h| h.token), Some(lease.token()));
        if client.capabilities().extend {
            let extended = lease.extend(Duration::ZERO).await;
            assert!(matches!(extended, Err(LockError::InvalidInput(_))), "extend(0): {extended:?}");
        }
        lease.release().await.expect("release");
    }
}

/// Names with `/`, spaces, `:`, braces, dots, escapes and emoji all work, and no two
/// of them share a lock: each is held at once by a different owner.
pub async fn awkward_names_do_not_collide(f: &dyn Fixture) {
    let margin = f.timing().margin;
    let (a, b) = (f.client().await, f.client().await);
    let run = format!("{:08x}", fastrand::u32(..));
    let suffixes = [
        "a/b",
        "a%2Fb",
        "a%2fb",
        "a b",
        "a+b",
        "a:b",
        "a::b",
        "a",
        "A",
        "a/",
        "/a",
        "a//b",
        ".",
        "..",
        "a\\b",
        "a\nb",
        "a\tb",
        "a'b\"c;--",
        "%",
        "%25",
        "{a}",
        "{a",
        "a}",
        "{}",
        "*",
        "?",
        "[a]",
        "é",
        "e\u{301}",
        "🔒",
        "ключ",
        "名前",
        "a.b",
        "a_b",
        "a-b",
    ];
    let mut leases = Vec::new();
    for suffix in suffixes {
        let name = LockName::new(format!("dlock-test/names-{run}/{suffix}")).expect("legal name");
        let lease = a
            .try_acquire(&name, &watchdog(f, margin))
            .await
            .unwrap_or_else(|e| panic!("try_acquire {name:?}: {e}"))
            .unwrap_or_else(|| panic!("{name:?} is held already: it collides with another name"));
        leases.push(lease);
    }
    for lease in &leases {
        let info = b.inspect(lease.name()).await.expect("inspect");
        let holder = info.holder.unwrap_or_else(|| panic!("{:?} shows no holder", lease.name()));
        assert_eq!(holder.token, lease.token(), "{:?}: inspect shows another hold's token", lease.name());
        assert_eq!(&holder.owner, lease.owner(), "{:?}: inspect shows another hold's owner", lease.name());
        let other = b.try_acquire(lease.name(), &watchdog(f, margin)).await.expect("try_acquire");
        assert!(other.is_none(), "{:?} was granted twice", lease.name());
    }
    for lease in leases {
        let name = lease.name().clone();
        lease.release().await.unwrap_or_else(|e| panic!("release {name:?}: {e}"));
        assert!(b.inspect(&name).await.expect("inspect").holder.is_none(), "{name:?} still held after release");
    }
}
