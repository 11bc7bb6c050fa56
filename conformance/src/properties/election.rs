//! Leader election: one leader per term, terms strictly increasing, observers seeing the
//! leaders in order, and a vanished leader replaced after it learns it lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dlock_core::{
    campaign, observe, Capabilities, ClientStats, Leader, Lease, LockError, LockInfo, LockName, LockOptions, Locker,
    LostReason, StoredResult, Swept,
};

use super::{assert_unsupported, unique_name, watchdog};
use crate::fixture::{Fault, Faults, Fixture, Link};

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
    assert!(matches!(leading.resign().await, Err(LockError::NotHeld { .. })), "a deposed leader's resignation");
}

/// A candidate's client whose link drops every reply from the grant of its lease on, so
/// that the store of its value is applied but its answer lost, until the candidate next
/// reads a stored value.
struct LosesTheStoreReply<'a> {
    locker: Arc<dyn Locker>,
    link: &'a dyn Link,
    dropping: AtomicBool,
}

#[async_trait]
impl Locker for LosesTheStoreReply<'_> {
    async fn acquire(&self, name: &LockName, opts: &LockOptions) -> Result<Lease, LockError> {
        let lease = self.locker.acquire(name, opts).await?;
        self.link.set(Fault::DropReplies);
        self.dropping.store(true, Ordering::SeqCst);
        Ok(lease)
    }

    async fn try_acquire(&self, name: &LockName, opts: &LockOptions) -> Result<Option<Lease>, LockError> {
        self.locker.try_acquire(name, opts).await
    }

    async fn inspect(&self, name: &LockName) -> Result<LockInfo, LockError> {
        self.locker.inspect(name).await
    }

    async fn load_result(&self, name: &LockName) -> Result<Option<StoredResult>, LockError> {
        if self.dropping.swap(false, Ordering::SeqCst) {
            self.link.restore();
        }
        self.locker.load_result(name).await
    }

    async fn sweep(&self) -> Result<Swept, LockError> {
        self.locker.sweep().await
    }

    fn target(&self) -> String {
        self.locker.target()
    }

    fn capabilities(&self) -> Capabilities {
        self.locker.capabilities()
    }

    fn backend_name(&self) -> &'static str {
        self.locker.backend_name()
    }

    fn stats(&self) -> ClientStats {
        self.locker.stats()
    }
}

/// A campaign whose store was applied but whose reply was lost either confirms the store
/// and leads, or fails without ever having been reported: an observer never reports a
/// leader whose campaign failed.
pub async fn election_store_whose_reply_was_lost_is_confirmed(f: &dyn Faults) {
    let timing = f.timing();
    let name = unique_name("elect-lost-store");
    let watcher = f.client().await;
    if !elects(&*watcher, &name).await {
        return;
    }
    let faulty = f.faulty_client().await;
    let candidate = LosesTheStoreReply { locker: faulty.locker.clone(), link: &*faulty.link, dropping: false.into() };
    let seen: Arc<Mutex<Vec<Leader>>> = Arc::default();
    let watching = tokio::spawn({
        let (watcher, name, seen) = (watcher.clone(), name.clone(), seen.clone());
        async move {
            let mut observer = observe(&*watcher, &name).every(Duration::from_millis(10));
            while let Ok(now) = observer.changed().await {
                seen.lock().expect("seen").extend(now);
            }
        }
    });
    let opts = LockOptions::watchdog(timing.ttl.max(timing.op_timeout * 4)).wait(timing.margin);
    let elected = campaign(&candidate, &name, b"candidate", &opts).await;
    faulty.link.restore();
    // Let the observer look a few more times: a value left stored would show now.
    tokio::time::sleep(Duration::from_millis(200)).await;
    watching.abort();
    let seen = seen.lock().expect("seen").clone();
    match elected {
        Ok(leading) => {
            assert!(
                seen.iter().any(|leader| leader.term == leading.term()),
                "the confirmed leader was never observed: {seen:?}"
            );
            leading.resign().await.expect("resign");
        }
        Err(err) => {
            assert!(seen.is_empty(), "observers reported a leader whose campaign failed ({err}): {seen:?}");
        }
    }
}
