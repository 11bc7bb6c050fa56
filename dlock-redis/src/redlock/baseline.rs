//! The raw baseline of RedLock for `dlock bench`: the grant and release script calls of
//! an uncontended lock (and a renewal), sent to every node at once with the client
//! library and awaited with a plain `join_all`, without a client, quorum early exits,
//! leases, renewal scheduling or pub/sub.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use dlock_core::{LockError, LockName, RawBaseline, DEFAULT_KEEP_IDLE, DEFAULT_TTL};
use futures::future::join_all;

use super::backend::{grant_call, read_fence_call};
use super::config::TokenSource;
use super::nodes::Nodes;
use crate::backend::{release_call, renew_call};
use crate::error::to_lock_error;
use crate::keys::{KeyLayout, LockKeys};
use crate::scripts::{scripts, ttl_millis, GrantReply};

/// The owner field every baseline call uses.
const OWNER_FIELD: &str = "owner:raw-baseline";

/// The grant field every baseline call uses.
const GRANT_FIELD: &str = "grant:raw-baseline";

/// The ttl and the keep time of every baseline call, in ms: a client's defaults.
fn times() -> (u64, u64) {
    (ttl_millis(DEFAULT_TTL), ttl_millis(DEFAULT_KEEP_IDLE))
}

/// The RedLock raw baseline (see [`raw_baseline`](super::raw_baseline)).
pub struct RedLockBaseline {
    nodes: Nodes,
    layout: KeyLayout,
    quorum: usize,
    source: TokenSource,
    /// How far ahead of the clock proposals are, in µs (as a client's).
    lead: u64,
    /// The last token proposed, so that proposals keep rising within a microsecond.
    last: AtomicU64,
}

impl std::fmt::Debug for RedLockBaseline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedLockBaseline").finish_non_exhaustive()
    }
}

impl RedLockBaseline {
    pub(crate) fn new(nodes: Nodes, layout: KeyLayout, quorum: usize, source: TokenSource, lead: u64) -> Self {
        RedLockBaseline { nodes, layout, quorum, source, lead, last: AtomicU64::new(0) }
    }

    /// A token above `above`: from the clock, or with `tokens=read` simply the next one.
    fn propose(&self, above: u64) -> u64 {
        if self.source == TokenSource::ReadFirst {
            return above.saturating_add(1);
        }
        let clock = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0) + self.lead;
        let floor = above.saturating_add(1).max(clock);
        let previous = self.last.fetch_max(floor, Ordering::Relaxed);
        floor.max(previous.saturating_add(1))
    }

    /// The highest fence counter of every node (the read script), for `tokens=read`.
    async fn read_counters(&self, keys: &LockKeys) -> Result<u64, LockError> {
        let mut max = 0;
        let call = read_fence_call(keys, self.lead);
        for reply in join_all(self.nodes.iter().map(|link| {
            let (call, mut conn) = (&call, link.conn.clone());
            async move { Ok(redis::from_redis_value::<u64>(call.run(&mut conn).await?)?) }
        }))
        .await
        {
            max = max.max(reply.map_err(to_lock_error)?);
        }
        Ok(max)
    }

    /// The grant on every node; returns the nodes that granted and the highest counter.
    async fn grant(&self, keys: &LockKeys, token: u64) -> Result<(Vec<usize>, u64), LockError> {
        let void = format!("{}:void:raw-baseline", keys.hold);
        let call = grant_call(keys, (OWNER_FIELD, GRANT_FIELD, &void), token, times(), self.lead);
        let replies = join_all(self.nodes.iter().map(|link| {
            let (call, mut conn) = (&call, link.conn.clone());
            async move { call.run(&mut conn).await }
        }))
        .await;
        let (mut granted, mut fence) = (Vec::new(), 0);
        for (index, reply) in replies.into_iter().enumerate() {
            let (reply, node_fence) = GrantReply::parse(reply.map_err(to_lock_error)?).map_err(to_lock_error)?;
            fence = fence.max(node_fence);
            if reply == GrantReply::Granted(token) {
                granted.push(index);
            }
        }
        Ok((granted, fence))
    }

    async fn release(&self, keys: &LockKeys, token: u64, on: &[usize]) -> Result<(), LockError> {
        let call = release_call(scripts(), keys, (OWNER_FIELD, GRANT_FIELD), token, times().1);
        for reply in join_all(on.iter().map(|&index| {
            let (call, mut conn) = (&call, self.nodes[index].conn.clone());
            async move { call.run(&mut conn).await }
        }))
        .await
        {
            reply.map_err(to_lock_error)?;
        }
        Ok(())
    }
}

#[async_trait]
impl RawBaseline for RedLockBaseline {
    async fn acquire_release(&self, name: &LockName) -> Result<(), LockError> {
        let keys = self.layout.lock(name);
        let above = match self.source {
            TokenSource::ReadFirst => self.read_counters(&keys).await?,
            TokenSource::Clock => 0,
        };
        let mut token = self.propose(above);
        for _ in 0..2 {
            let (granted, fence) = self.grant(&keys, token).await?;
            let all: Vec<usize> = (0..self.nodes.len()).collect();
            if granted.len() >= self.quorum {
                return self.release(&keys, token, &all).await;
            }
            self.release(&keys, token, &granted).await?;
            token = self.propose(fence);
        }
        Err(LockError::timeout())
    }

    async fn renew(&self, name: &LockName) -> Result<(), LockError> {
        let keys = self.layout.lock(name);
        let call = renew_call(scripts(), &keys, (OWNER_FIELD, GRANT_FIELD), 0, times());
        for reply in join_all(self.nodes.iter().map(|link| {
            let (call, mut conn) = (&call, link.conn.clone());
            async move { call.run(&mut conn).await }
        }))
        .await
        {
            reply.map_err(to_lock_error)?;
        }
        Ok(())
    }
}
