//! The raw baseline for `dlock bench`: the lease table's acquire and release statements
//! (with a result's store between them for a campaign, and the renewal), sent straight
//! through sqlx on the same kind of pool. A reader's share or a permit is the same
//! transactions the library runs (lock the lease row, read the holds, write one), without
//! a client, leases or renewal scheduling.

use std::sync::Arc;

use async_trait::async_trait;
use dlock_core::{HoldKind, LockError, LockName, RawBaseline, DEFAULT_TTL, MAX_DURATION};

use crate::config::SqlConfig;
use crate::db::{in_tx, Args, Pool, Warm};
use crate::dialect::LeaseSql;

/// The lease table's statements sent raw (see [`RawBaseline`]).
#[derive(Debug)]
pub struct SqlBaseline {
    pool: Pool,
    sql: Arc<LeaseSql>,
}

/// Opens the pool (and the table) for the raw baseline.
pub async fn raw_baseline(config: SqlConfig) -> Result<SqlBaseline, LockError> {
    let pool = Pool::connect(&config, &Warm::default()).await?;
    let sql = LeaseSql::of(&config);
    if config.create_table {
        crate::schema::ensure(&pool, &sql, config.common.connect_timeout).await?;
    }
    Ok(SqlBaseline { pool, sql: Arc::new(sql) })
}

const OWNER: &str = "raw-baseline";

fn args(name: &LockName) -> Args<'_> {
    Args { owner: OWNER, ttl_us: DEFAULT_TTL.as_micros() as i64, grant: OWNER, ..Args::name(name.as_str()) }
}

impl SqlBaseline {
    /// The acquire statement of an uncontended exclusive hold: its fence (the token).
    async fn acquire(&self, name: &LockName) -> Result<i64, LockError> {
        let granted = self.pool.run(&self.sql.acquire, args(name)).await?;
        crate::lease::granted_fence(&self.sql, &granted).ok_or(LockError::timeout())
    }

    /// The release statement of the exclusive hold of `fence`.
    async fn release(&self, name: &LockName, fence: i64) -> Result<(), LockError> {
        self.pool.run(&self.sql.release, Args { fence, ..args(name) }).await.map(drop)
    }
}

#[async_trait]
impl RawBaseline for SqlBaseline {
    async fn acquire_release(&self, name: &LockName) -> Result<(), LockError> {
        let fence = self.acquire(name).await?;
        self.release(name, fence).await
    }

    /// The acquire, the one `store_result` statement a hold's store is, and the release.
    /// The library's occasional sweep of expired results (at most once a minute, in the
    /// background) is left out: it is no part of one campaign.
    async fn campaign_resign(&self, name: &LockName, value: &[u8]) -> Result<(), LockError> {
        let fence = self.acquire(name).await?;
        let retention_us = crate::results::retention_us(MAX_DURATION);
        let stmt = &self.sql.store_result;
        let stored = self.pool.run(stmt, Args { value, retention_us, fence, ..args(name) }).await?;
        if stored.matched(stmt.reply) == 0 {
            return Err(LockError::not_held());
        }
        self.release(name, fence).await
    }

    async fn acquire_release_kind(&self, name: &LockName, kind: HoldKind) -> Result<(), LockError> {
        if kind == HoldKind::Exclusive {
            return self.acquire_release(name).await;
        }
        let kind_text = crate::holds::kind_text(kind);
        let args = Args { kind: &kind_text, ..args(name) };
        let attempted = self
            .pool
            .transact(&in_tx(&self.sql, args, move |tx, sql, args| {
                Box::pin(crate::holds::attempt(tx, sql, args.args(), kind, false))
            }))
            .await?;
        let crate::holds::Attempted::Granted(fence) = attempted else { return Err(LockError::timeout()) };
        let released = self
            .pool
            .transact(&in_tx(&self.sql, Args { fence, ..args }, |tx, sql, args| {
                Box::pin(crate::holds::take_back(tx, sql, &sql.holds.release, args.args()))
            }))
            .await?;
        if released {
            Ok(())
        } else {
            Err(LockError::not_held())
        }
    }

    async fn renew(&self, name: &LockName) -> Result<(), LockError> {
        self.pool.run(&self.sql.renew, Args { fence: 1, ..args(name) }).await.map(drop)
    }
}
