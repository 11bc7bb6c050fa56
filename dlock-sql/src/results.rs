//! Stored results, for both lockers: reading a record back, and sweeping expired records
//! now and then so that the results table does not keep every name ever stored.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::backend::lock_unpoisoned;
use dlock_core::{FencingToken, LockError, StoredResult};
use tokio::time::Instant;

use crate::db::{Answer, Args, Value};
use crate::dialect::Stmt;
use crate::link::Conn;

/// How often one client sweeps expired results at most: after a store, once this long
/// has passed since its last sweep (its first store sweeps at once).
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// A retention in whole microseconds, rounded up.
pub(crate) fn retention_us(retention: Duration) -> i64 {
    i64::try_from(retention.as_nanos().div_ceil(1000)).unwrap_or(i64::MAX / 4)
}

/// The record a `load` statement answered with, if any: `Backend` for a row this crate
/// did not write (a token that is not positive, a missing value).
pub(crate) fn record(answer: &Answer) -> Result<Option<StoredResult>, LockError> {
    let Some(row) = answer.rows.first() else { return Ok(None) };
    // The value is not shown: it may be large and may hold user data.
    let bad = || LockError::backend(format!("a corrupt row in the results table: token {:?}", row.first()));
    let token =
        row.first().and_then(Value::int).and_then(|t| u64::try_from(t).ok()).filter(|t| *t > 0).ok_or_else(bad)?;
    let value = row.get(1).and_then(Value::bytes).ok_or_else(bad)?;
    Ok(Some(StoredResult { token: FencingToken::new(token), value: value.to_vec() }))
}

/// When a client sweeps expired results next.
#[derive(Debug, Default)]
pub(crate) struct Sweeper {
    next: Mutex<Option<Instant>>,
}

impl Sweeper {
    /// Called after a store: runs `sweep` in the background when it is due, bounded by the
    /// operation timeout. Its failure only leaves the expired rows for a later sweep (or the
    /// next store of their names, which replaces them).
    pub(crate) fn after_store(&self, conn: &Arc<Conn>, sweep: &Stmt) {
        let now = Instant::now();
        {
            let mut next = lock_unpoisoned(&self.next);
            if next.is_some_and(|at| now < at) {
                return;
            }
            *next = Some(now + SWEEP_EVERY);
        }
        let (conn, sweep) = (conn.clone(), sweep.clone());
        let op_timeout = conn.config().common.op_timeout;
        tokio::spawn(async move {
            match tokio::time::timeout(op_timeout, conn.run(&sweep, Args::name(""))).await {
                Ok(Ok(answer)) => tracing::debug!(deleted = answer.affected, "swept expired results"),
                Ok(Err(err)) => tracing::debug!(%err, "sweeping expired results failed"),
                Err(_) => tracing::debug!("sweeping expired results took over {op_timeout:?}"),
            }
        });
    }
}
