//! What users build on a lock: idempotent execution and multi-locks.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::{
    campaign, idempotent, HoldKind, IdempotentError, IdempotentOptions, LockError, LockName, LockOptions, Locker,
    MultiLock, OwnerId, RunOutcome,
};

use super::{assert_unsupported, eventually, unique_name, watchdog};
use crate::fixture::{Evict, Faults, Fixture};

type Answer = Result<RunOutcome<String>, IdempotentError<String>>;

fn in_progress() -> String {
    "in progress".to_string()
}

fn opts(f: &dyn Fixture) -> IdempotentOptions {
    IdempotentOptions::new().with_lock(watchdog(f, Duration::ZERO)).with_retention(Duration::from_secs(600))
}

/// Runs `value` as the work of `key`, counting the runs in `runs`.
async fn run(locker: &dyn Locker, key: &LockName, opts: &IdempotentOptions, runs: &AtomicUsize, value: &str) -> Answer {
    idempotent(
        locker,
        key,
        opts,
        |_lease| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(value.to_string())
        },
        in_progress,
    )
    .await
}

/// Whether the backend stores results; if it does not, checks that it says so.
async fn stores_results(locker: &dyn Locker, key: &LockName) -> bool {
    if locker.capabilities().results {
        return true;
    }
    assert_unsupported("load_result", locker.load_result(key).await);
    let outcome = run(locker, key, &IdempotentOptions::new(), &AtomicUsize::new(0), "x").await;
    assert!(
        matches!(outcome, Err(IdempotentError::Lock(LockError::Unsupported(_)))),
        "idempotent without the results capability: {outcome:?}"
    );
    false
}

/// The first call for a key runs the work and stores its result with the run's token;
/// a later duplicate, from another client, gets that result without running the work.
pub async fn idempotent_runs_once_and_replays_the_result(f: &dyn Fixture) {
    let (first, second) = (f.client().await, f.client().await);
    let key = unique_name("idem-once");
    if !stores_results(&*first, &key).await {
        return;
    }
    let runs = AtomicUsize::new(0);
    let opts = opts(f);
    let ran = run(&*first, &key, &opts, &runs, "shipped #1").await.expect("first run");
    assert_eq!(ran, RunOutcome::Ran("shipped #1".to_string()));
    let stored = first.load_result(&key).await.expect("load").expect("a result is stored");
    let info = second.inspect(&key).await.expect("inspect");
    assert!(info.holder.is_none(), "the key is free once the run ended: {info:?}");
    let replay = run(&*second, &key, &opts, &runs, "shipped #2").await.expect("duplicate");
    assert_eq!(replay, RunOutcome::Stored("shipped #1".to_string()));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the duplicate ran the work");
    assert_eq!(second.load_result(&key).await.expect("load"), Some(stored), "the duplicate changed the record");

    // The record's token is the run's own.
    let key = unique_name("idem-token");
    let token = idempotent(&*first, &key, &opts, |lease| async move { Ok::<_, String>(lease.token().get()) }, || 0)
        .await
        .expect("run")
        .into_value();
    let stored = second.load_result(&key).await.expect("load").expect("stored");
    assert_eq!(stored.token.get(), token, "the record carries the token of the run that wrote it");
}

/// A duplicate while a run is under way gets the fallback at once, without waiting for
/// the run and without running the work; after the run it gets the stored result.
pub async fn idempotent_duplicate_gets_fallback_while_running(f: &dyn Fixture) {
    let timing = f.timing();
    let (first, second) = (f.client().await, f.client().await);
    let key = unique_name("idem-busy");
    if !stores_results(&*first, &key).await {
        return;
    }
    let opts = opts(f);
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let (finish, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let running = {
        let (first, key, opts) = (first.clone(), key.clone(), opts.clone());
        tokio::spawn(async move {
            let work = |_lease| async move {
                let _ = started_tx.send(());
                let _ = finish_rx.await;
                Ok::<_, String>("done".to_string())
            };
            idempotent(&*first, &key, &opts, work, in_progress).await
        })
    };
    started.await.expect("the first run starts");
    let runs = AtomicUsize::new(0);
    let asked = Instant::now();
    let busy = run(&*second, &key, &opts, &runs, "duplicate").await.expect("duplicate");
    assert_eq!(busy, RunOutcome::InProgress(in_progress()));
    assert!(asked.elapsed() < timing.op_timeout + timing.margin, "the duplicate waited {:?}", asked.elapsed());
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the duplicate ran the work");

    finish.send(()).expect("the run is waiting");
    let ran = running.await.expect("task").expect("the first run");
    assert_eq!(ran, RunOutcome::Ran("done".to_string()));
    let later = run(&*second, &key, &opts, &runs, "duplicate").await.expect("later duplicate");
    assert_eq!(later, RunOutcome::Stored("done".to_string()));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// Work that fails stores nothing and frees the key at once, as does a result over the
/// size bound (a clear error): the next call runs the work again.
pub async fn idempotent_failure_frees_the_key(f: &dyn Fixture) {
    let (first, second) = (f.client().await, f.client().await);
    let key = unique_name("idem-fail");
    if !stores_results(&*first, &key).await {
        return;
    }
    let opts = opts(f);
    let failed = idempotent(&*first, &key, &opts, |_| async { Err::<String, _>("card declined") }, in_progress).await;
    assert!(matches!(failed, Err(IdempotentError::Work("card declined"))), "failed work: {failed:?}");
    assert_eq!(first.load_result(&key).await.expect("load"), None, "a failed run stored a result");
    let runs = AtomicUsize::new(0);
    let retry = run(&*second, &key, &opts, &runs, "charged").await.expect("retry");
    assert_eq!(retry, RunOutcome::Ran("charged".to_string()), "the retry after a failure must run");

    let key = unique_name("idem-large");
    let small = opts.clone().with_max_bytes(16);
    let large = run(&*first, &key, &small, &runs, "a result well over sixteen bytes").await;
    assert!(
        matches!(large, Err(IdempotentError::TooLarge { limit: 16, size }) if size > 16),
        "an oversized result: {large:?}"
    );
    assert_eq!(first.load_result(&key).await.expect("load"), None, "an oversized result was stored");
    let retry = run(&*second, &key, &small, &runs, "ok").await.expect("retry");
    assert_eq!(retry, RunOutcome::Ran("ok".to_string()));
}

/// Duplicates racing the end of a run: asking from the moment the run began until they
/// get its result, every duplicate gets the fallback or the stored result, never a second
/// run, however close to the store and the release it asks.
pub async fn idempotent_duplicates_race_the_end_of_a_run(f: &dyn Fixture) {
    let (first, second, third) = (f.client().await, f.client().await, f.client().await);
    let probe = unique_name("idem-race");
    if !stores_results(&*first, &probe).await {
        return;
    }
    let opts = opts(f);
    for round in 0..10 {
        let key = unique_name("idem-race");
        let runs = Arc::new(AtomicUsize::new(0));
        let value = format!("round {round}");
        let (began_tx, began) = tokio::sync::watch::channel(false);
        let duplicates = [second.clone(), third.clone()].map(|locker| {
            let (key, opts, runs, value, mut began) =
                (key.clone(), opts.clone(), runs.clone(), value.clone(), began.clone());
            tokio::spawn(async move {
                let _ = began.wait_for(|began| *began).await;
                loop {
                    match run(&*locker, &key, &opts, &runs, "a second run").await {
                        Ok(RunOutcome::InProgress(_)) => {}
                        Ok(RunOutcome::Stored(stored)) => {
                            assert_eq!(stored, value, "a duplicate got another run's result");
                            return;
                        }
                        Ok(RunOutcome::Ran(_)) => panic!("a duplicate ran the work while or after the first run"),
                        Err(err) => panic!("a duplicate failed: {err}"),
                    }
                }
            })
        });
        let work = |_lease| {
            let (runs, value) = (runs.clone(), value.clone());
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                began_tx.send_replace(true);
                Ok::<_, String>(value)
            }
        };
        let outcome = idempotent(&*first, &key, &opts, work, in_progress).await.expect("the run");
        assert_eq!(outcome, RunOutcome::Ran(value.clone()));
        for duplicate in duplicates {
            duplicate.await.expect("a duplicate panicked");
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1, "round {round}: the work ran more than once");
        drop(began);
    }
}

/// A caller that vanishes while running frees the key when its lease runs out; the next
/// call then runs the work.
pub async fn idempotent_dead_runner_frees_the_key_within_ttl(f: &dyn Faults) {
    let timing = f.timing();
    let faulty = f.faulty_client().await;
    let other = f.client().await;
    let key = unique_name("idem-dead");
    if !stores_results(&*other, &key).await {
        return;
    }
    let opts = opts(f);
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let runner = {
        let (locker, key, opts) = (faulty.locker.clone(), key.clone(), opts.clone());
        tokio::spawn(async move {
            let work = |_lease| async move {
                let _ = started_tx.send(());
                std::future::pending::<Result<String, String>>().await
            };
            idempotent(&*locker, &key, &opts, work, in_progress).await
        })
    };
    started.await.expect("the run starts");
    faulty.link.cut();
    let runs = AtomicUsize::new(0);
    let bound = timing.ttl + timing.margin * 2 + timing.op_timeout;
    eventually("the key of a vanished runner frees", bound, || async {
        run(&*other, &key, &opts, &runs, "second run").await.expect("duplicate").ran()
    })
    .await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let vanished = tokio::time::timeout(timing.margin + timing.op_timeout, runner)
        .await
        .expect("the vanished run ends when its lease is lost")
        .expect("task");
    assert!(matches!(vanished, Err(IdempotentError::Lock(_))), "the vanished run: {vanished:?}");
    faulty.link.restore();
}

/// A run whose lease ended (here: removed underneath it, as an expiry while it was
/// paused would) cannot store its late result: the backend refuses it, and a later
/// run's result stays.
pub async fn idempotent_late_result_is_refused(f: &dyn Evict) {
    let (first, second) = (f.client().await, f.client().await);
    let key = unique_name("idem-late");
    if !stores_results(&*first, &key).await {
        return;
    }
    let retention = Duration::from_secs(600);
    let stale = first.acquire(&key, &watchdog(f, f.timing().margin)).await.expect("acquire");
    f.evict(&key).await;
    let refused = stale.store_result(b"\"late\"", retention).await;
    assert!(matches!(refused, Err(LockError::NotHeld { .. })), "a store after the hold ended: {refused:?}");
    assert_eq!(second.load_result(&key).await.expect("load"), None);

    let runs = AtomicUsize::new(0);
    let newer = run(&*second, &key, &opts(f), &runs, "newer").await.expect("the next run");
    assert_eq!(newer, RunOutcome::Ran("newer".to_string()));
    let kept = second.load_result(&key).await.expect("load").expect("stored");
    assert!(kept.token > stale.token());
    let refused = stale.store_result(b"\"late\"", retention).await;
    assert!(matches!(refused, Err(LockError::NotHeld { .. })), "a late store over a newer result: {refused:?}");
    assert_eq!(second.load_result(&key).await.expect("load"), Some(kept), "the late run overwrote a newer result");
    drop(stale);
}

/// Two multi-locks over the same names given in opposite orders never deadlock: 200
/// rounds each, both make progress, never inside together.
pub async fn multilock_overlapping_sets_do_not_deadlock(f: &dyn Fixture) {
    let timing = f.timing();
    let (a, b) = (unique_name("multi-a"), unique_name("multi-b"));
    let inside = Arc::new(AtomicBool::new(false));
    let opts = watchdog(f, timing.ttl * 20 + timing.margin * 4);
    let mut tasks = Vec::new();
    for names in [[a.clone(), b.clone()], [b.clone(), a.clone()]] {
        let multi = MultiLock::on(f.client().await, names).expect("two names");
        let (inside, opts) = (inside.clone(), opts.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..200 {
                let lease = match multi.acquire(&opts).await {
                    Ok(lease) => lease,
                    Err(err) => panic!("round {round}: {err} (a deadlock between the two orders?)"),
                };
                assert!(!inside.swap(true, Ordering::SeqCst), "two multi-locks over {{a, b}} inside at once");
                tokio::task::yield_now().await;
                inside.store(false, Ordering::SeqCst);
                lease.release().await.expect("release");
            }
        }));
    }
    for task in tasks {
        task.await.expect("a multi-lock task panicked");
    }
}

/// A multi-lock that cannot take its last part (held by another: timeout; its client cut
/// off: an error) gives back every part it took: none is left held.
pub async fn multilock_failure_leaves_no_partial_holds(f: &dyn Faults) {
    let timing = f.timing();
    let (client, checker) = (f.client().await, f.client().await);
    let base = unique_name("multi-partial");
    let part = |n: u32| LockName::new(format!("{base}/{n}")).expect("name");
    let all = [part(1), part(2), part(3)];
    let free = |names: &[LockName]| {
        let (checker, names, opts) = (checker.clone(), names.to_vec(), watchdog(f, Duration::ZERO));
        async move {
            for name in names {
                let lease = checker.try_acquire(&name, &opts).await.expect("try_acquire");
                let lease = lease.unwrap_or_else(|| panic!("{name} was left held"));
                lease.release().await.expect("release");
            }
        }
    };

    let blocker = checker.acquire(&all[2], &watchdog(f, timing.margin)).await.expect("hold the last part");
    let multi = MultiLock::on(client.clone(), all.clone()).expect("names");
    let timed_out = multi.acquire(&watchdog(f, Duration::from_millis(200))).await;
    assert!(matches!(timed_out, Err(LockError::Timeout { .. })), "last part busy: {timed_out:?}");
    assert!(multi.try_acquire(&watchdog(f, Duration::ZERO)).await.expect("try").is_none());
    free(&all[..2]).await;
    blocker.release().await.expect("release");

    let faulty = f.faulty_client().await;
    faulty.link.cut();
    let multi = MultiLock::new()
        .with(client.clone(), all[0].clone())
        .and_then(|m| m.with(client.clone(), all[1].clone()))
        .and_then(|m| m.with(faulty.locker.clone(), all[2].clone()))
        .expect("parts");
    assert_eq!(multi.names().last(), Some(&all[2]), "the cut-off part is taken last");
    let failed = multi.acquire(&watchdog(f, timing.margin)).await;
    assert!(failed.is_err(), "a multi-lock whose last part is unreachable: {failed:?}");
    free(&all).await;
    faulty.link.restore();
}

/// A multi-lease carries every part's token, fires its lost signal when any one part is
/// lost, and its release frees every part still held.
pub async fn multilease_combines_its_parts(f: &dyn Evict) {
    let timing = f.timing();
    let (client, checker) = (f.client().await, f.client().await);
    let base = unique_name("multi-lease");
    let names: Vec<LockName> = (1..=3).map(|n| LockName::new(format!("{base}/{n}")).expect("name")).collect();
    let multi = MultiLock::on(client, names.clone()).expect("names");
    let lease = multi.acquire(&watchdog(f, timing.margin)).await.expect("acquire");
    let tokens = lease.tokens();
    assert_eq!(tokens.iter().map(|(name, _)| name).collect::<Vec<_>>(), names.iter().collect::<Vec<_>>());
    for (name, token) in &tokens {
        let holder = checker.inspect(name).await.expect("inspect").holder.expect("held");
        assert_eq!(holder.token, *token, "{name}: the multi-lease's token is not the holder's");
    }
    assert!(!lease.is_lost());

    f.evict(&names[1]).await;
    tokio::time::timeout(timing.ttl + timing.margin, lease.lost()).await.expect("losing one part fires the signal");
    assert!(lease.is_lost() && lease.lost_reason().is_some());
    let released = lease.release().await;
    assert!(matches!(released, Err(LockError::NotHeld { .. })), "releasing with a lost part: {released:?}");
    for name in [&names[0], &names[2]] {
        let again = checker.try_acquire(name, &watchdog(f, Duration::ZERO)).await.expect("try_acquire");
        assert!(again.is_some(), "{name} stayed held after the multi-lease's release");
    }
}

/// A multi-lock returns only when every part is live: a `Fixed` part whose ttl ran out
/// while a later part was awaited is taken again (or the acquire fails), never handed
/// back lapsed, and another client cannot take any part of what it returned.
pub async fn multilock_parts_are_live_when_granted(f: &dyn Fixture) {
    let timing = f.timing();
    let (client, other, checker) = (f.client().await, f.client().await, f.client().await);
    let base = unique_name("multi-live");
    let (first, last) =
        (LockName::new(format!("{base}/a")).expect("name"), LockName::new(format!("{base}/b")).expect("name"));
    let fixed = LockOptions::fixed(timing.ttl).wait(timing.ttl * 4 + timing.margin * 2);
    if !client.capabilities().fixed {
        let multi = MultiLock::on(client, [first, last]).expect("names");
        assert_unsupported("a multi-lock of fixed leases", multi.acquire(&fixed).await);
        return;
    }
    // The last part is busy for two ttls: the first part's fixed lease runs out meanwhile.
    let blocker = other.acquire(&last, &watchdog(f, Duration::ZERO)).await.expect("hold the last part");
    let hold_for = timing.ttl * 2;
    let unblock = tokio::spawn(async move {
        tokio::time::sleep(hold_for).await;
        blocker.release().await
    });
    let multi = MultiLock::on(client, [first.clone(), last.clone()]).expect("names");
    assert_eq!(multi.names().next(), Some(&first), "the first part is taken first");
    let lease = multi.acquire(&fixed).await.expect("the multi-lock is granted once the last part is free");
    for part in lease.leases() {
        assert!(
            !part.is_lost() && !part.remaining().is_zero(),
            "{} was handed back lapsed ({:?}, {:?} left)",
            part.name(),
            part.lost_reason(),
            part.remaining()
        );
    }
    for name in [&first, &last] {
        let intruder = checker.try_acquire(name, &watchdog(f, Duration::ZERO)).await.expect("try_acquire");
        assert!(intruder.is_none(), "{name}, a part of a granted multi-lease, was free for another client");
    }
    unblock.await.expect("join").expect("release the blocker");
    lease.release().await.expect("release");
}

/// Leader election and idempotent work refuse options that would let two candidates
/// lead, or a duplicate run, at once: a reader's or a permit's lease, and (for
/// idempotent work) an explicit owner, which a duplicate could re-enter. Nothing is left
/// held.
pub async fn recipes_refuse_options_that_share_them(f: &dyn Fixture) {
    let client = f.client().await;
    let name = unique_name("recipe-options");
    let runs = AtomicUsize::new(0);
    for kind in [HoldKind::Shared, HoldKind::Permit { permits: 2 }] {
        let opts = watchdog(f, Duration::ZERO).kind(kind);
        let elected = campaign(&*client, &name, b"leader", &opts).await;
        assert!(matches!(elected, Err(LockError::InvalidInput(_))), "a campaign with a {kind:?} lease: {elected:?}");
        let ran = run(&*client, &name, &IdempotentOptions::new().with_lock(opts), &runs, "x").await;
        assert!(
            matches!(ran, Err(IdempotentError::Lock(LockError::InvalidInput(_)))),
            "idempotent work with a {kind:?} lease: {ran:?}"
        );
    }
    let owner = OwnerId::new(format!("recipe-owner-{:016x}", fastrand::u64(..))).expect("owner");
    let with_owner = IdempotentOptions::new().with_lock(watchdog(f, Duration::ZERO).owner(owner));
    let ran = run(&*client, &name, &with_owner, &runs, "x").await;
    assert!(
        matches!(ran, Err(IdempotentError::Lock(LockError::InvalidInput(_)))),
        "idempotent work with an explicit owner: {ran:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "refused work ran");
    assert!(client.inspect(&name).await.expect("inspect").holder.is_none(), "a refused recipe left a hold");
}
