//! The queue each client keeps per name: its blocking acquires of one name take turns in
//! the client, and only the first of them contends at the backend.
//!
//! Without it, the tasks of one client race each other at the server: on a backend that
//! grants in any order, the task that just released is the one most likely to win again
//! (its next attempt is already on the wire when the others wake up), so its neighbours
//! can wait for seconds, and every release wakes every waiter of the client. With it, a
//! client sends one waiter's requests for a name instead of W, and its own waiters are
//! granted in the order they asked. Waiters of different clients still meet at the
//! backend, in whatever order the backend grants.
//!
//! A first waiter whose acquire fails (the backend is unreachable, say) lets every waiter
//! queued behind it go to the backend at once: each then learns of the failure within
//! its own operation timeout, instead of one timeout after another down the queue.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{Notify, Semaphore};

use crate::name::LockName;

/// One turnstile per name with a waiter or a contender, and nothing for other names.
#[derive(Debug, Default)]
pub(crate) struct LocalQueues {
    names: Mutex<HashMap<LockName, Arc<Turnstile>>>,
}

/// The queue of one name.
#[derive(Debug)]
struct Turnstile {
    /// One permit: the turn. Tokio's semaphore hands permits out in request order.
    turn: Semaphore,
    /// Fired when the one whose turn it was failed: everyone waiting then goes on.
    failed: Notify,
    /// Fired when a lease of this client on the name is released, so that the first
    /// waiter attempts at once instead of after its poll or the backend's wake-up.
    released: Notify,
}

/// How a wait for the turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Every waiter ahead has left; this place holds the turn.
    Mine,
    /// The waiter whose turn it was failed; this one goes to the backend without the turn.
    Open,
}

impl LocalQueues {
    /// A place in `name`'s queue. Await [`Place::turn`] for the turn; dropping the place,
    /// before or after its turn came, lets the next waiter go on.
    pub(crate) fn join(self: &Arc<Self>, name: &LockName) -> Place {
        let turnstile = self
            .names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(name.clone())
            .or_insert_with(|| {
                Arc::new(Turnstile { turn: Semaphore::new(1), failed: Notify::new(), released: Notify::new() })
            })
            .clone();
        Place { queues: self.clone(), name: name.clone(), turnstile: Some(turnstile), turn: false, waited: false }
    }

    /// A lease of this client on `name` was released: wakes the waiter whose turn it is.
    pub(crate) fn released(&self, name: &LockName) {
        if let Some(turnstile) = self.names.lock().unwrap_or_else(PoisonError::into_inner).get(name) {
            turnstile.released.notify_waiters();
        }
    }

    /// How many names have a turnstile now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.names.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// A waiter's place in the queue of one name.
#[derive(Debug)]
pub(crate) struct Place {
    queues: Arc<LocalQueues>,
    name: LockName,
    turnstile: Option<Arc<Turnstile>>,
    /// Whether this place holds the turn (the turnstile's one permit, forgotten so that
    /// the place alone gives it back).
    turn: bool,
    /// Whether the turn had to be waited for.
    waited: bool,
}

impl Place {
    /// Takes the turn if nobody is ahead of this place.
    pub(crate) fn try_turn(&mut self) -> bool {
        if !self.turn {
            if let Some(Ok(permit)) = self.turnstile.as_ref().map(|turnstile| turnstile.turn.try_acquire()) {
                permit.forget();
                self.turn = true;
            }
        }
        self.turn
    }

    /// Whether this place waited for a neighbour before its turn came.
    pub(crate) fn waited(&self) -> bool {
        self.waited
    }

    /// Waits until every waiter that joined before this one has left, or until the one
    /// whose turn it was fails. Cancel safe: a place dropped while it waits leaves the
    /// queue at once.
    pub(crate) async fn turn(&mut self) -> Turn {
        if self.turn {
            return Turn::Mine;
        }
        self.waited = true;
        let Some(turnstile) = self.turnstile.as_ref() else { return Turn::Open };
        tokio::select! {
            // The semaphore is never closed, so acquiring only ever waits.
            Ok(permit) = turnstile.turn.acquire() => {
                permit.forget();
                self.turn = true;
                Turn::Mine
            }
            _ = turnstile.failed.notified() => Turn::Open,
        }
    }

    /// Completes when a lease of this client on the name is released after this call (it
    /// counts from the call, not from the first poll, so that no release between an
    /// attempt and the wait after it is missed).
    pub(crate) fn released(&self) -> Option<tokio::sync::futures::Notified<'_>> {
        self.turnstile.as_ref().map(|turnstile| turnstile.released.notified())
    }

    /// This place's acquire failed while it held the turn: every waiter queued now goes
    /// to the backend at once. Waiters that come later queue again.
    pub(crate) fn failed(&self) {
        if let (true, Some(turnstile)) = (self.turn, self.turnstile.as_ref()) {
            turnstile.failed.notify_waiters();
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let Some(turnstile) = self.turnstile.take() else { return };
        if self.turn {
            turnstile.turn.add_permits(1);
        }
        // Every place holds a clone of its turnstile, and only places do besides the map:
        // when the map's is the last one, no waiter is left and the name's entry goes.
        let mut names = self.queues.names.lock().unwrap_or_else(PoisonError::into_inner);
        drop(turnstile);
        if names.get(&self.name).is_some_and(|entry| Arc::strong_count(entry) == 1) {
            names.remove(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::sync::mpsc;

    use super::{LocalQueues, Turn};
    use crate::name::LockName;

    fn name(n: &str) -> LockName {
        LockName::new(n).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn turns_come_in_the_order_places_were_taken() {
        let queues = Arc::new(LocalQueues::default());
        let mut first = queues.join(&name("a"));
        first.turn().await;
        let (done, mut order) = mpsc::unbounded_channel();
        let mut waiters = Vec::new();
        for i in 0..5 {
            let mut place = queues.join(&name("a"));
            let done = done.clone();
            waiters.push(tokio::spawn(async move {
                place.turn().await;
                done.send(i).unwrap();
                tokio::time::sleep(Duration::from_millis(1)).await;
            }));
            // Each task is parked on its turn before the next one joins.
            tokio::task::yield_now().await;
        }
        drop(first);
        for waiter in waiters {
            waiter.await.unwrap();
        }
        let seen: Vec<i32> = std::iter::from_fn(|| order.try_recv().ok()).collect();
        assert_eq!(seen, vec![0, 1, 2, 3, 4]);
        assert_eq!(queues.len(), 0, "the name's entry outlived its last waiter");
    }

    #[tokio::test(start_paused = true)]
    async fn a_place_dropped_while_waiting_does_not_hold_up_the_next() {
        let queues = Arc::new(LocalQueues::default());
        let mut first = queues.join(&name("a"));
        first.turn().await;
        let mut gone = queues.join(&name("a"));
        let abandoned = tokio::spawn(async move { gone.turn().await });
        tokio::task::yield_now().await;
        let mut next = queues.join(&name("a"));
        abandoned.abort();
        assert!(abandoned.await.unwrap_err().is_cancelled());
        drop(first);
        tokio::time::timeout(Duration::from_secs(1), next.turn()).await.expect("the next waiter's turn came");
        drop(next);
        assert_eq!(queues.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_turn_lets_everyone_waiting_go_at_once() {
        let queues = Arc::new(LocalQueues::default());
        let mut first = queues.join(&name("a"));
        first.turn().await;
        let mut waiting = Vec::new();
        for _ in 0..3 {
            let mut place = queues.join(&name("a"));
            waiting.push(tokio::spawn(async move { place.turn().await }));
            tokio::task::yield_now().await;
        }
        // The one holding the turn fails, and keeps its place for a while yet.
        first.failed();
        for waiter in waiting {
            let turn = tokio::time::timeout(Duration::from_secs(1), waiter).await.expect("released at once");
            assert_eq!(turn.unwrap(), Turn::Open);
        }
        // Who comes later queues again behind the turn still held.
        let mut later = queues.join(&name("a"));
        assert!(!later.try_turn());
        drop(first);
        assert!(later.try_turn());
    }

    #[tokio::test]
    async fn names_do_not_wait_for_each_other() {
        let queues = Arc::new(LocalQueues::default());
        let mut a = queues.join(&name("a"));
        a.turn().await;
        let mut b = queues.join(&name("b"));
        tokio::time::timeout(Duration::from_secs(5), b.turn()).await.expect("another name's turn is free");
        assert_eq!(queues.len(), 2);
        drop((a, b));
        assert_eq!(queues.len(), 0);
    }
}
