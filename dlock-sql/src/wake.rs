//! PostgreSQL wake-up: one `LISTEN` connection per client, shared by all its waiters.
//!
//! A release that frees a lock sends `pg_notify(<table>, <name>)` at commit. Each waiter
//! subscribes to its lock's name *before* its attempt, so a release that commits after the
//! attempt always leaves a permit behind (`Notify::notify_one` stores one when nobody waits
//! yet). When the listening connection is lost, notifications may have been missed: every
//! waiter is woken to look again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::backend::lock_unpoisoned;
use dlock_core::LockError;
use sqlx::postgres::PgListener;
use tokio::sync::{Notify, OnceCell};
use tokio::task::JoinHandle;

use crate::db::Pool;
use crate::error::lock_error;

type Subscribers = Arc<Mutex<HashMap<String, Vec<(u64, Arc<Notify>)>>>>;

/// The listener of one client.
#[derive(Debug)]
pub(crate) struct Waker {
    channel: String,
    subscribers: Subscribers,
    next_id: AtomicU64,
    started: OnceCell<JoinHandle<()>>,
}

/// A waiter's subscription to one lock name; dropping it unsubscribes.
#[derive(Debug)]
pub(crate) struct Subscription {
    id: u64,
    name: String,
    notify: Arc<Notify>,
    subscribers: Subscribers,
}

impl Subscription {
    /// Completes when the lock may have been freed.
    pub(crate) async fn notified(&self) {
        self.notify.notified().await;
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut subs = lock_unpoisoned(&self.subscribers);
        if let Some(list) = subs.get_mut(&self.name) {
            list.retain(|(id, _)| *id != self.id);
            if list.is_empty() {
                subs.remove(&self.name);
            }
        }
    }
}

impl Waker {
    pub(crate) fn new(channel: String) -> Self {
        Waker { channel, subscribers: Arc::default(), next_id: AtomicU64::new(1), started: OnceCell::new() }
    }

    /// Subscribes to `name`, starting the listener (and waiting for its `LISTEN`) first.
    pub(crate) async fn subscribe(&self, pool: &Pool, name: &str) -> Result<Subscription, LockError> {
        self.started.get_or_try_init(|| self.start(pool)).await?;
        let notify = Arc::new(Notify::new());
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        lock_unpoisoned(&self.subscribers).entry(name.to_string()).or_default().push((id, notify.clone()));
        Ok(Subscription { id, name: name.to_string(), notify, subscribers: self.subscribers.clone() })
    }

    async fn start(&self, pool: &Pool) -> Result<JoinHandle<()>, LockError> {
        let pg = match pool {
            Pool::Postgres(pg) => pg,
            #[allow(unreachable_patterns)]
            _ => return Err(LockError::backend("LISTEN/NOTIFY needs PostgreSQL")),
        };
        // A pool of its own, so the listening connection never takes a lock-statement slot.
        let own = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(pg.options().get_acquire_timeout())
            .connect_lazy_with((*pg.connect_options()).clone());
        let mut listener = PgListener::connect_with(&own).await.map_err(lock_error)?;
        listener.listen(&self.channel).await.map_err(lock_error)?;
        let subscribers = self.subscribers.clone();
        Ok(tokio::spawn(async move {
            loop {
                match listener.try_recv().await {
                    Ok(Some(note)) => wake(&subscribers, Some(note.payload())),
                    // The connection was lost (and is being re-established): notifications
                    // may have been missed, so everyone looks again.
                    Ok(None) => wake(&subscribers, None),
                    Err(err) => {
                        tracing::debug!(%err, "the LISTEN connection failed; retrying");
                        wake(&subscribers, None);
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        }))
    }
}

fn wake(subscribers: &Subscribers, name: Option<&str>) {
    let subs = lock_unpoisoned(subscribers);
    match name {
        Some(name) => subs.get(name).into_iter().flatten().for_each(|(_, n)| n.notify_one()),
        None => subs.values().flatten().for_each(|(_, n)| n.notify_one()),
    }
}

impl Drop for Waker {
    fn drop(&mut self) {
        if let Some(task) = self.started.get() {
            task.abort();
        }
    }
}
