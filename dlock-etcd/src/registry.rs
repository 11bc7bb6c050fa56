//! What a client knows about the lock keys it holds: for re-entrant acquires, for the
//! guarded-transaction helper, and to tell holds their lease is gone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use dlock_core::backend::{lock_unpoisoned, LostSignal};
use dlock_core::{HoldKind, OwnerId};

use crate::keys::HoldValue;
use crate::session::Session;

/// One lock key this client holds, shared by every re-entrant hold of it.
#[derive(Debug)]
pub(crate) struct KeyState {
    pub(crate) dir: Vec<u8>,
    pub(crate) key: Vec<u8>,
    /// The key's create revision: the fencing token.
    pub(crate) token: i64,
    pub(crate) owner: OwnerId,
    /// The kind of hold the key was granted: an owner re-enters only that kind.
    pub(crate) kind: HoldKind,
    /// The lease the key is on now (a re-entry or renewal asking for a longer ttl moves it).
    session: Mutex<Arc<Session>>,
    /// Leases the key may have moved to by a request whose answer was lost: kept (never
    /// revoked) while the key lives, and adopted when a read finds the key on one.
    spares: Mutex<Vec<Arc<Session>>>,
    /// The key's value as this client last saw it on the server.
    value: Mutex<HoldValue>,
    /// The key is known to be deleted.
    gone: AtomicBool,
}

impl KeyState {
    pub(crate) fn new(
        dir: Vec<u8>,
        key: Vec<u8>,
        kind: HoldKind,
        token: i64,
        value: HoldValue,
        session: Arc<Session>,
    ) -> Arc<Self> {
        Arc::new(KeyState {
            dir,
            key,
            token,
            owner: value.owner.clone(),
            kind,
            session: Mutex::new(session),
            spares: Mutex::new(Vec::new()),
            value: Mutex::new(value),
            gone: AtomicBool::new(false),
        })
    }

    pub(crate) fn session(&self) -> Arc<Session> {
        lock_unpoisoned(&self.session).clone()
    }

    /// The key is on this lease now (confirmed by the server).
    pub(crate) fn set_session(&self, session: Arc<Session>) {
        let old = std::mem::replace(&mut *lock_unpoisoned(&self.session), session.clone());
        let mut spares = lock_unpoisoned(&self.spares);
        spares.retain(|s| s.id() != session.id());
        // The lease it left may still be where a lost request put it back: keep it
        // while unsure (it is dropped with the key).
        if old.id() != session.id() && !spares.iter().any(|s| s.id() == old.id()) {
            spares.push(old);
        }
    }

    /// The key may have moved to `session` (a request whose answer was lost).
    pub(crate) fn add_spare(&self, session: Arc<Session>) {
        let mut spares = lock_unpoisoned(&self.spares);
        if self.session().id() != session.id() && !spares.iter().any(|s| s.id() == session.id()) {
            spares.push(session);
        }
    }

    /// The lease of this id the key may be on.
    pub(crate) fn known_lease(&self, lease: i64) -> Option<Arc<Session>> {
        let current = self.session();
        if current.id() == lease {
            return Some(current);
        }
        lock_unpoisoned(&self.spares).iter().find(|s| s.id() == lease).cloned()
    }

    pub(crate) fn value(&self) -> HoldValue {
        lock_unpoisoned(&self.value).clone()
    }

    pub(crate) fn set_value(&self, value: HoldValue) {
        *lock_unpoisoned(&self.value) = value;
    }

    pub(crate) fn is_gone(&self) -> bool {
        self.gone.load(Ordering::SeqCst)
    }

    pub(crate) fn set_gone(&self) {
        self.gone.store(true, Ordering::SeqCst);
    }
}

/// A granted hold of the etcd backend: one acquire of a lock key (re-entrant acquires
/// share the key, each with its own hold).
#[derive(Debug, Clone)]
pub struct EtcdHold {
    pub(crate) inner: Arc<HoldInner>,
}

#[derive(Debug)]
pub(crate) struct HoldInner {
    pub(crate) key: Arc<KeyState>,
    /// The request that made this hold, as named in the key's value.
    pub(crate) id: String,
    /// Set by whoever gives this hold back first (a release, a drop, the sweep of a lost
    /// hold), so that it is given back once.
    released: AtomicBool,
}

impl EtcdHold {
    pub(crate) fn new(key: Arc<KeyState>, id: String) -> Self {
        EtcdHold { inner: Arc::new(HoldInner { key, id, released: AtomicBool::new(false) }) }
    }

    pub(crate) fn key(&self) -> &Arc<KeyState> {
        &self.inner.key
    }

    /// The request that made this hold.
    pub(crate) fn id(&self) -> &str {
        &self.inner.id
    }

    /// Marks the hold given back; false if it already was.
    pub(crate) fn take_release(&self) -> bool {
        !self.inner.released.swap(true, Ordering::SeqCst)
    }

    pub(crate) fn is_released(&self) -> bool {
        self.inner.released.load(Ordering::SeqCst)
    }

    /// The lock key in etcd.
    pub fn lock_key(&self) -> &[u8] {
        &self.inner.key.key
    }

    /// The fencing token (the key's create revision).
    pub fn token(&self) -> i64 {
        self.inner.key.token
    }
}

/// The keys and holds of one client.
#[derive(Default)]
pub(crate) struct Registry {
    keys: Mutex<Tracked<Vec<u8>, Weak<KeyState>>>,
    holds: Mutex<Vec<(Weak<HoldInner>, LostSignal)>>,
    holds_at_last_prune: Mutex<usize>,
}

/// A map of weak entries that prunes the dead ones on the way, amortised over inserts.
struct Tracked<K, V> {
    map: HashMap<K, Vec<V>>,
    inserts: usize,
}

impl<K, V> Default for Tracked<K, V> {
    fn default() -> Self {
        Tracked { map: HashMap::new(), inserts: 0 }
    }
}

impl Registry {
    fn keys(&self) -> MutexGuard<'_, Tracked<Vec<u8>, Weak<KeyState>>> {
        lock_unpoisoned(&self.keys)
    }

    fn holds(&self) -> MutexGuard<'_, Vec<(Weak<HoldInner>, LostSignal)>> {
        lock_unpoisoned(&self.holds)
    }

    pub(crate) fn insert_key(&self, key: &Arc<KeyState>) {
        let mut keys = self.keys();
        keys.inserts += 1;
        if keys.inserts >= keys.map.len().max(64) {
            keys.inserts = 0;
            keys.map.retain(|_, entries| {
                entries.retain(|w| w.strong_count() > 0);
                !entries.is_empty()
            });
        }
        let entries = keys.map.entry(key.dir.clone()).or_default();
        entries.retain(|w| w.strong_count() > 0);
        entries.push(Arc::downgrade(key));
    }

    fn find(&self, dir: &[u8], with_gone: bool, matches: impl Fn(&KeyState) -> bool) -> Option<Arc<KeyState>> {
        // Upgraded entries are returned or dropped after the guard: a last reference
        // dropped under it must not run code that takes it again.
        let candidates: Vec<Arc<KeyState>> = {
            let keys = self.keys();
            keys.map.get(dir).map(|entries| entries.iter().filter_map(Weak::upgrade).collect()).unwrap_or_default()
        };
        candidates.into_iter().find(|k| (with_gone || !k.is_gone()) && matches(k))
    }

    /// A key of this lock that this client holds for `owner`, granted as `kind`.
    pub(crate) fn find_owned(&self, dir: &[u8], owner: &OwnerId, kind: HoldKind) -> Option<Arc<KeyState>> {
        self.find(dir, false, |k| &k.owner == owner && k.kind == kind)
    }

    /// The key of this lock that this client was granted with `token`, even if it is
    /// gone since.
    pub(crate) fn find_token_any(&self, dir: &[u8], token: i64) -> Option<Arc<KeyState>> {
        self.find(dir, true, |k| k.token == token)
    }

    /// Remembers a granted hold and its lost signal.
    pub(crate) fn watch(&self, hold: &EtcdHold, signal: LostSignal) {
        let mut holds = self.holds();
        let mut last = lock_unpoisoned(&self.holds_at_last_prune);
        if holds.len() >= (*last * 2).max(64) {
            holds.retain(|(h, s)| h.strong_count() > 0 && !s.is_closed());
            *last = holds.len();
        }
        holds.push((Arc::downgrade(&hold.inner), signal));
    }

    /// The lost signals of the holds whose key is on this lease.
    pub(crate) fn signals_on_lease(&self, lease: i64) -> Vec<LostSignal> {
        let entries: Vec<(Arc<HoldInner>, LostSignal)> =
            self.holds().iter().filter_map(|(h, s)| h.upgrade().map(|h| (h, s.clone()))).collect();
        entries.into_iter().filter(|(h, _)| h.key.session().id() == lease).map(|(_, s)| s).collect()
    }

    /// Holds whose lease the client counts as lost while they were not given back (a
    /// lease kept past `max_hold`, a renewal that failed until validity ended): their keys
    /// must go, or other holds renewing the same session would keep them alive. Forgets
    /// holds that are gone.
    pub(crate) fn lost_unreleased(&self) -> Vec<EtcdHold> {
        let mut found = Vec::new();
        let mut drop_later = Vec::new();
        {
            let mut holds = self.holds();
            holds.retain(|(h, s)| match h.upgrade() {
                None => false,
                Some(inner) => {
                    let hold = EtcdHold { inner };
                    if hold.is_released() {
                        drop_later.push(hold);
                        false
                    } else if s.is_closed() {
                        found.push(hold);
                        false
                    } else {
                        drop_later.push(hold);
                        true
                    }
                }
            });
        }
        drop(drop_later);
        found
    }
}
