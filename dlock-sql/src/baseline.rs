//! The raw baseline for `dlock bench`: the lease table's acquire and release statements
//! (and the renewal), sent straight through sqlx on the same kind of pool.

use async_trait::async_trait;
use dlock_core::{LockError, LockName, RawBaseline, DEFAULT_TTL};

use crate::config::SqlConfig;
use crate::db::{Args, Pool, Warm};
use crate::dialect::LeaseSql;

/// The lease table's statements sent raw (see [`RawBaseline`]).
#[derive(Debug)]
pub struct SqlBaseline {
    pool: Pool,
    sql: LeaseSql,
}

/// Opens the pool (and the table) for the raw baseline.
pub async fn raw_baseline(config: SqlConfig) -> Result<SqlBaseline, LockError> {
    let pool = Pool::connect(&config, &Warm::default()).await?;
    let sql = LeaseSql::of(&config);
    if config.create_table {
        crate::schema::ensure(&pool, &sql, config.common.connect_timeout).await?;
    }
    Ok(SqlBaseline { pool, sql })
}

const OWNER: &str = "raw-baseline";

fn args(name: &LockName) -> Args<'_> {
    Args { owner: OWNER, ttl_us: DEFAULT_TTL.as_micros() as i64, grant: OWNER, ..Args::name(name.as_str()) }
}

#[async_trait]
impl RawBaseline for SqlBaseline {
    async fn acquire_release(&self, name: &LockName) -> Result<(), LockError> {
        let granted = self.pool.run(&self.sql.acquire, args(name)).await?;
        let fence =
            granted.rows.first().and_then(|r| r.first()).and_then(|v| v.int()).unwrap_or(granted.last_id as i64);
        self.pool.run(&self.sql.release, Args { fence, ..args(name) }).await.map(drop)
    }

    async fn renew(&self, name: &LockName) -> Result<(), LockError> {
        self.pool.run(&self.sql.renew, Args { fence: 1, ..args(name) }).await.map(drop)
    }
}
