//! A granted hold: its node, its owner, kind and hold count, its client-side expiry, and
//! the lost signals of the leases riding on it.

use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use dlock_core::backend::{lock_unpoisoned, LostSignal, Request};
use dlock_core::{FencingToken, HoldKind, LockName, LostReason, OwnerId};

use crate::znode::Unwanted;

/// A granted hold: the node, who holds it, and the leases riding on it.
pub(crate) struct Node {
    pub(crate) name: LockName,
    pub(crate) owner: OwnerId,
    /// The kind of hold the node was granted as: the owner re-enters only this kind.
    pub(crate) kind: HoldKind,
    pub(crate) lock_path: String,
    pub(crate) path: String,
    pub(crate) uuid: String,
    pub(crate) token: FencingToken,
    state: Mutex<NodeState>,
}

struct NodeState {
    /// How many leases of the owner hold the node (re-entrancy).
    count: u32,
    lost: Option<LostReason>,
    /// The last lease let go and the node is being (or was) deleted.
    released: bool,
    /// When the node is deleted unless renewed: the ttl, kept on the client.
    expires_at: Instant,
    signals: Vec<(u64, LostSignal)>,
    /// The grants (hold ids) that ride on the node and have not been released.
    grants: Vec<u64>,
}

/// What to do after a lease let go of a node, decided under the node's lock.
pub(crate) enum CountChange {
    /// The node is lost (or already released): nothing to send.
    Gone,
    /// Store the new count in the node's data.
    Store(u32),
    /// The count reached zero: delete the node.
    Delete,
}

impl Node {
    /// The node at `path` granted to `req`.
    pub(crate) fn new(
        req: &Request,
        lock_path: String,
        path: String,
        uuid: String,
        token: FencingToken,
        expires_at: Instant,
    ) -> Self {
        Node {
            name: req.name.clone(),
            owner: req.owner.clone(),
            kind: req.kind,
            lock_path,
            path,
            uuid,
            token,
            state: Mutex::new(NodeState {
                count: 1,
                lost: None,
                released: false,
                expires_at,
                signals: Vec::new(),
                grants: Vec::new(),
            }),
        }
    }

    /// The node as something to delete.
    pub(crate) fn unwanted(&self) -> Unwanted {
        Unwanted { lock_path: self.lock_path.clone(), uuid: self.uuid.clone(), path: Some(self.path.clone()) }
    }

    fn state(&self) -> MutexGuard<'_, NodeState> {
        lock_unpoisoned(&self.state)
    }

    /// Why the node is lost, if it is.
    pub(crate) fn lost(&self) -> Option<LostReason> {
        self.state().lost
    }

    /// Whether the node is still held: neither lost nor released.
    pub(crate) fn is_live(&self) -> bool {
        let state = self.state();
        state.lost.is_none() && !state.released
    }

    /// When the client deletes the node unless a renewal comes first.
    pub(crate) fn expires_at(&self) -> Instant {
        self.state().expires_at
    }

    /// Keeps the node at least until `until` (never shortening it).
    pub(crate) fn extend(&self, until: Instant) {
        let mut state = self.state();
        state.expires_at = state.expires_at.max(until);
    }

    /// Marks the node lost and fires the lost signal of every lease on it (once).
    pub(crate) fn fire(&self, reason: LostReason) {
        let signals = {
            let mut state = self.state();
            if state.lost.is_some() || state.released {
                return;
            }
            state.lost = Some(reason);
            std::mem::take(&mut state.signals)
        };
        tracing::debug!(lock = %self.name, token = %self.token, %reason, "hold lost");
        for (_, signal) in signals {
            signal.fire(reason);
        }
    }

    /// Adds the lost signal of lease `id`; fires it at once when the node is lost already.
    pub(crate) fn watch(&self, id: u64, signal: LostSignal) {
        let lost = {
            let mut state = self.state();
            state.signals.retain(|(_, s)| !s.is_closed());
            if state.lost.is_none() {
                state.signals.push((id, signal.clone()));
            }
            state.lost
        };
        if let Some(reason) = lost {
            signal.fire(reason);
        }
    }

    /// Records grant `id` as riding on the node.
    pub(crate) fn admit(&self, id: u64) {
        self.state().grants.push(id);
    }

    /// Whether grant `id` still rides on the node: the node is held and the grant was
    /// not released (the owner's other grants do not count).
    pub(crate) fn rides(&self, id: u64) -> bool {
        let state = self.state();
        state.lost.is_none() && !state.released && state.grants.contains(&id)
    }

    /// Forgets grant `id` and its lost signal (it is being released).
    pub(crate) fn unwatch(&self, id: u64) {
        let mut state = self.state();
        state.signals.retain(|(sid, _)| *sid != id);
        state.grants.retain(|grant| *grant != id);
    }

    /// Takes one hold off the count (a lease's release) and, still under the node's lock,
    /// lets `send` issue the request that stores the change, so that concurrent changes
    /// reach the server in the order they were made.
    pub(crate) fn leave<T>(&self, send: impl FnOnce(CountChange) -> T) -> T {
        let mut state = self.state();
        if state.lost.is_some() || state.released {
            drop(state);
            return send(CountChange::Gone);
        }
        state.count = state.count.saturating_sub(1);
        if state.count == 0 {
            state.released = true;
            state.signals.clear();
            send(CountChange::Delete)
        } else {
            send(CountChange::Store(state.count))
        }
    }

    /// Adds one hold to the count (a re-entrant acquire whose store succeeded), unless the
    /// node was lost or released meanwhile. Returns the new count.
    pub(crate) fn enter(&self) -> Option<u32> {
        let mut state = self.state();
        if state.lost.is_some() || state.released {
            return None;
        }
        state.count = state.count.saturating_add(1);
        Some(state.count)
    }

    /// Lets `send` store the current hold count, under the node's lock, unless the node is
    /// lost or released.
    pub(crate) fn with_count<T>(&self, send: impl FnOnce(u32) -> T) -> Option<T> {
        let state = self.state();
        (state.lost.is_none() && !state.released).then(|| send(state.count))
    }
}
