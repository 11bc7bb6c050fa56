//! Leader election: one leader per term, terms strictly increasing, observers seeing the
//! leaders in order, and a vanished leader replaced after it learns it lost.

use std::time::{Duration, Instant};

use dlock_core::{campaign, observe, Leader, LockError, LockOptions, Locker, LostReason};

use super::{assert_unsupported, unique_name, watchdog};
use crate::fixture::{Faults, Fixture};

/// Whether the backend can hold an election; if not, checks that it says so.
async fn elects(locker: &dyn Locker, name: &dlock_core::LockName) -> bool {
    if locker.capabilities().results {
        return true;
    }
    assert_unsupported("campaign", campaign(locker, name, b"x", &LockOptions::new()).await);
    assert_unsupported("observe", observe(locker, name).current().await);
    false
}

/// Three candidates on three clients: one leads at a time, each resignation elects the
/// next with a higher term, and an observer on a fourth client sees every leader, in
/// order, with its value, and nobody once the last one resigns.
pub async fn election_one_leader_per_term_seen_in_order(f: &dyn Fixture) {
    let name = unique_name("elect");
    let watcher = f.client().await;
    if !elects(&*watcher, &name).await {
        return;
    }
    let margin = f.timing().margin;
    let mut observer = observe(&*watcher, &name).every(Duration::from_millis(10));
    let first = f.client().await;
    let leading = campaign(&*first, &name, b"candidate-0", &watchdog(f, margin)).await.expect("campaign");
    let seen = tokio::time::timeout(margin, observer.changed()).await.expect("observed in time").expect("observe");
    assert_eq!(seen, Some(Leader { value: b"candidate-0".to_vec(), term: leading.term() }));

    let mut waiting = Vec::new();
    for i in 1..3 {
        let (client, name, opts) = (f.client().await, name.clone(), watchdog(f, margin * 10));
        waiting.push(tokio::spawn(async move {
            let value = format!("candidate-{i}").into_bytes();
            let leadership = campaign(&*client, &name, &value, &opts).await;
            (value, leadership)
        }));
    }
    // The campaigns wait while the first leads.
    tokio::task::yield_now().await;
    assert!(waiting.iter().all(|w| !w.is_finished()), "a second candidate was elected beside the leader");
    let mut term = leading.term();
    leading.resign().await.expect("resign");
    for _ in 1..3 {
        let next =
            tokio::time::timeout(margin * 2, observer.changed()).await.expect("observed in time").expect("observe");
        // Between two leaders there may be a look that finds nobody.
        let next = match next {
            None => tokio::time::timeout(margin * 2, observer.changed()).await.expect("in time").expect("observe"),
            some => some,
        }
        .expect("a leader is elected after a resignation");
        assert!(next.term > term, "term {} after term {term}", next.term);
        term = next.term;
        // The observer may see the new leader before its campaign task has run to its end.
        let deadline = Instant::now() + margin;
        let at = loop {
            if let Some(at) = waiting.iter().position(|w| w.is_finished()) {
                break at;
            }
            assert!(Instant::now() < deadline, "the observed leader's campaign did not return");
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let (value, leadership) = waiting.remove(at).await.expect("join");
        let leadership = leadership.expect("campaign");
        assert_eq!(next, Leader { value, term: leadership.term() }, "the observer saw another leader than elected");
        assert!(waiting.iter().all(|w| !w.is_finished()), "two candidates lead at once");
        leadership.resign().await.expect("resign");
    }
    let last = tokio::time::timeout(margin, observer.changed()).await.expect("in time").expect("observe");
    assert_eq!(last, None, "the observer still saw a leader after the last one resigned");
}

/// A leader cut off from the backend learns it lost before another candidate is
/// elected, and the next term is higher.
pub async fn election_vanished_leader_is_replaced_after_it_knows(f: &dyn Faults) {
    let timing = f.timing();
    let name = unique_name("elect-vanish");
    let other = f.client().await;
    if !elects(&*other, &name).await {
        return;
    }
    let faulty = f.faulty_client().await;
    let opts = LockOptions::watchdog(timing.ttl).wait(timing.margin);
    let leading = campaign(&*faulty.locker, &name, b"old", &opts).await.expect("campaign");
    let cut_at = Instant::now();
    faulty.link.cut();
    let next = campaign(&*other, &name, b"new", &opts.clone().wait(timing.ttl + timing.margin * 2))
        .await
        .expect("a candidate is elected once the leader vanished");
    assert!(leading.lease().remaining().is_zero(), "elected while the old leader still counted itself leader");
    assert!(cut_at.elapsed() < timing.ttl + timing.margin, "the next leader came {:?} after the cut", cut_at.elapsed());
    assert!(next.term() > leading.term());
    let reason = tokio::time::timeout(timing.margin, leading.lost()).await.expect("the old leader's lost signal");
    assert_ne!(reason, LostReason::Stolen, "a cut-off leader cannot have seen its successor");
    let leader = observe(&*other, &name).current().await.expect("observe").expect("a leader");
    assert_eq!(leader.value, b"new");
    next.resign().await.expect("resign");
    assert!(matches!(leading.resign().await, Err(LockError::NotHeld)), "a deposed leader's resignation");
}
