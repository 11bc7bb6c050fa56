//! What a backend keeps per name: nothing, once a name has been idle for its keep time
//! and its results have expired, and never at the cost of a token going back.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{idempotent, FencingToken, IdempotentOptions, LockName, LockOptions, Locker, RunOutcome};
use futures::stream::{self, StreamExt};

use super::unique_name;
use crate::fixture::Storage;

/// How many names the property leaves behind, as a service keying idempotent work per
/// request would.
pub const IDLE_NAMES: usize = 10_000;

/// How many of them are run at once.
const AT_ONCE: usize = 32;

/// Runs `key` once, as idempotent work where the backend stores results (else a plain
/// acquire and release), and returns the token it ran under.
async fn use_once(locker: &dyn Locker, key: &LockName, retention: Duration) -> FencingToken {
    let lock = LockOptions::watchdog(Duration::from_secs(30));
    if !locker.capabilities().results {
        let lease = locker.try_acquire(key, &lock).await.expect("try_acquire").expect("a fresh name is free");
        let token = lease.token();
        lease.release().await.expect("release");
        return token;
    }
    let opts = IdempotentOptions::new().with_lock(lock).with_retention(retention);
    let ran = idempotent(locker, key, &opts, |lease| async move { Ok::<_, String>(lease.token().get()) }, || 0)
        .await
        .expect("idempotent work on a fresh key");
    match ran {
        RunOutcome::Ran(token) => FencingToken::new(token),
        other => panic!("{key}: a fresh key did not run its work: {other:?}"),
    }
}

/// [`IDLE_NAMES`] idempotent keys (plain locks where the backend stores no results),
/// each used once: once their results have expired and the names have been idle for the
/// backend's keep time, a sweep leaves nothing of them on the server, and a name used
/// again still gets a token above every one it had.
pub async fn idle_names_leave_nothing_behind(f: &dyn Storage) {
    let timing = f.timing();
    let client: Arc<dyn Locker> = f.client().await;
    let base = unique_name("idle");
    let prefix = format!("{base}/");
    let retention = Duration::from_secs(1);
    let names: Vec<LockName> = (0..IDLE_NAMES).map(|n| LockName::new(format!("{prefix}{n}")).expect("name")).collect();
    // The first name alone, counted at once, shows that the count sees what is kept: its
    // stored result at least.
    let first = use_once(&*client, &names[0], retention).await;
    if client.capabilities().results {
        let kept = f.records(names[0].as_str()).await;
        assert!(kept > 0, "no record counted for a name whose result was just stored");
    }
    let rest: Vec<FencingToken> = stream::iter(names[1..].to_vec())
        .map(|name| {
            let client = client.clone();
            async move { use_once(&*client, &name, retention).await }
        })
        .buffered(AT_ONCE)
        .collect()
        .await;
    let tokens: Vec<FencingToken> = std::iter::once(first).chain(rest).collect();

    tokio::time::sleep(retention.max(timing.idle) + timing.margin).await;
    client.sweep().await.expect("sweep");
    until_none_left(f, &prefix, timing.margin * 2).await;

    // Names that come back start above every token they had.
    let highest = tokens.iter().copied().max().expect("tokens");
    for name in [&names[0], &names[IDLE_NAMES - 1]] {
        let lease = client.try_acquire(name, &LockOptions::new()).await.expect("try_acquire").expect("free");
        assert!(lease.token() > highest, "{name} came back with token {} below {highest}", lease.token());
        lease.release().await.expect("release");
    }
}

/// Waits until the server keeps no record under `prefix`. Removing ten thousand names'
/// records takes a loaded server a while, so the wait lasts as long as the count keeps
/// falling, and fails once it has not fallen for `stall`.
async fn until_none_left(f: &dyn Storage, prefix: &str, stall: Duration) {
    let mut last = usize::MAX;
    let mut fell = tokio::time::Instant::now();
    loop {
        let left = f.records(prefix).await;
        if left == 0 {
            return;
        }
        if left < last {
            (last, fell) = (left, tokio::time::Instant::now());
        }
        assert!(fell.elapsed() < stall, "{left} records of idle names stay on the server: none went for {stall:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
