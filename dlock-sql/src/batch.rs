//! Renewals coalesced into batches: while renewal statements are in flight (up to
//! [`MAX_IN_FLIGHT`] at once), the renewals asked for meanwhile wait and then go together in
//! one statement. A lone renewal goes at once as a single-row statement, so batching adds
//! no latency; a client renewing thousands of leases at once sends a few statements instead
//! of thousands, and one slow statement does not hold up all the others.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::LockError;
use tokio::sync::oneshot;

use crate::db::{Args, Pool, Value};
use crate::dialect::{LeaseSql, Reply};

/// The most holds one statement renews.
const MAX_BATCH: usize = 500;

/// Renewal statements in flight at once per client.
pub(crate) const MAX_IN_FLIGHT: usize = 4;

/// One hold to renew, and where its answer goes (`true`: renewed).
pub(crate) struct Pending {
    pub(crate) name: String,
    pub(crate) owner: String,
    pub(crate) fence: i64,
    pub(crate) ttl_us: i64,
    pub(crate) reply: oneshot::Sender<Result<bool, LockError>>,
}

#[derive(Default)]
struct Queue {
    pending: Vec<Pending>,
    running: usize,
}

/// The renewal batcher of one client.
#[derive(Default)]
pub(crate) struct Batcher {
    queue: Mutex<Queue>,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher").finish_non_exhaustive()
    }
}

impl Batcher {
    /// Queues a renewal; starts a drain task unless [`MAX_IN_FLIGHT`] are running.
    /// Each statement is bounded by `timeout`, so one that hangs (a connection that went
    /// silent) fails its renewals instead of holding up every later one.
    pub(crate) fn submit(self: &Arc<Self>, pool: Pool, sql: Arc<LeaseSql>, timeout: Duration, pending: Pending) {
        let start = {
            let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            queue.pending.push(pending);
            let start = queue.running < MAX_IN_FLIGHT;
            if start {
                queue.running += 1;
            }
            start
        };
        if start {
            let this = self.clone();
            tokio::spawn(async move { this.drain(pool, sql, timeout).await });
        }
    }

    async fn drain(&self, pool: Pool, sql: Arc<LeaseSql>, timeout: Duration) {
        loop {
            let batch: Vec<Pending> = {
                let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                if queue.pending.is_empty() {
                    queue.running -= 1;
                    return;
                }
                let n = queue.pending.len().min(MAX_BATCH);
                queue.pending.drain(..n).collect()
            };
            let started = std::time::Instant::now();
            let outcome = tokio::time::timeout(timeout, run(&pool, &sql, &batch))
                .await
                .unwrap_or_else(|_| Err(LockError::unavailable(format!("a renewal took over {timeout:?}"))));
            tracing::debug!(size = batch.len(), took = ?started.elapsed(), ok = outcome.is_ok(), "renewal batch");
            for p in batch {
                let answer = match &outcome {
                    Ok(renewed) => Ok(renewed.contains(&(p.name.clone(), p.fence))),
                    Err(err) if err.is_transient() => Err(LockError::unavailable(err.to_string())),
                    Err(err) => Err(LockError::backend(err.to_string())),
                };
                let _ = p.reply.send(answer);
            }
        }
    }
}

/// Renews `batch`, answering the `(name, fence)` pairs it renewed.
async fn run(pool: &Pool, sql: &LeaseSql, batch: &[Pending]) -> Result<HashSet<(String, i64)>, LockError> {
    if let [one] = batch {
        let args = Args { name: &one.name, owner: &one.owner, fence: one.fence, ttl_us: one.ttl_us, batch: "" };
        let answer = pool.run(&sql.renew, args).await?;
        let mut renewed = HashSet::new();
        if answer.matched(sql.renew.reply) > 0 {
            renewed.insert((one.name.clone(), one.fence));
        }
        return Ok(renewed);
    }
    // One entry per hold (re-entrant leases share one), with the longest ttl asked.
    let mut unique: HashMap<(&str, &str, i64), i64> = HashMap::new();
    for p in batch {
        let ttl = unique.entry((&p.name, &p.owner, p.fence)).or_insert(p.ttl_us);
        *ttl = (*ttl).max(p.ttl_us);
    }
    let mut json = String::from("[");
    for (i, ((name, owner, fence), ttl)) in unique.iter().enumerate() {
        if i > 0 {
            json.push(',');
        }
        json.push_str("{\"n\":");
        json_string(&mut json, name);
        json.push_str(",\"o\":");
        json_string(&mut json, owner);
        json.push_str(&format!(",\"f\":{fence},\"t\":{ttl}}}"));
    }
    json.push(']');
    let answer = pool.run(&sql.renew_batch, Args::batch(&json)).await?;
    let rows = match (sql.renew_batch.reply, &sql.renewed) {
        (Reply::Rows, _) => answer.rows,
        (Reply::Done, Some(check)) => {
            if answer.affected == unique.len() as u64 {
                return Ok(unique.keys().map(|(n, _, f)| (n.to_string(), *f)).collect());
            }
            pool.run(check, Args::batch(&json)).await?.rows
        }
        (Reply::Done, None) => return Err(LockError::backend("a batch renewal without a way to read its result")),
    };
    Ok(rows
        .iter()
        .filter_map(|r| match (r.first(), r.get(1)) {
            (Some(Value::Text(name)), Some(Value::Int(fence))) => Some((name.clone(), *fence)),
            _ => None,
        })
        .collect())
}

/// Appends `text` as a JSON string literal.
fn json_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::json_string;

    #[test]
    fn escapes_json() {
        let mut out = String::new();
        json_string(&mut out, "a\"b\\c\n\u{1}🔒");
        assert_eq!(out, "\"a\\\"b\\\\c\\u000a\\u0001🔒\"");
    }
}
