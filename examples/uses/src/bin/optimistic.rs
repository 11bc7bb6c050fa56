//! Optimistic updates on PostgreSQL: no lock at all, a version column instead.
//!
//! Each writer reads the row with its version, computes, and writes only if the version is
//! still the one it read (`… SET qty = $1, version = version + 1 WHERE id = $2 AND
//! version = $3`). A writer that lost the race updates no row (`SqlError::Conflict`) and
//! tries again from a fresh read. Cheaper than a lock when conflicts are rare.
//!
//! ```sh
//! cargo run -p dlock-examples --bin optimistic -- postgres://app:secret@127.0.0.1:5432/app
//! ```

use std::sync::atomic::{AtomicU32, Ordering};

use dlock::sql::optimistic::{self, RetryPolicy, VersionedTable};
use dlock::sql::Dialect;
use sqlx::postgres::PgPoolOptions;

/// The PostgreSQL service of docker-compose.yml.
const DEFAULT_URL: &str = "postgres://dlock:dlock@127.0.0.1:15432/dlock";

/// The item every buyer wants, and how many buyers come at once.
const ITEM: i64 = 1;
const BUYERS: i64 = 8;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args().nth(1).or_else(|| std::env::var("DLOCK_URL").ok()).unwrap_or(DEFAULT_URL.into());
    let pool = PgPoolOptions::new().max_connections(8).connect(&url).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS dlock_example_inventory \
         (id BIGINT PRIMARY KEY, qty BIGINT NOT NULL, version BIGINT NOT NULL DEFAULT 0)",
    )
    .execute(&pool)
    .await?;
    sqlx::query(
        "INSERT INTO dlock_example_inventory (id, qty) VALUES ($1, 100) ON CONFLICT (id) DO UPDATE SET qty = 100",
    )
    .bind(ITEM)
    .execute(&pool)
    .await?;
    let inventory = VersionedTable::new("dlock_example_inventory", "id", "version")?;
    let update = inventory.update_sql(Dialect::Postgres, &["qty"]);

    // Each conflict means another buyer's write went in, so no buyer conflicts more than
    // BUYERS - 1 times: the default 10 attempts are enough.
    let policy = RetryPolicy::default();
    let conflicts = AtomicU32::new(0);
    let (pool, update, conflicts, policy) = (&pool, &update, &conflicts, &policy);
    let buyers = (0..BUYERS).map(|_| {
        optimistic::retry(policy, move || async move {
            let (qty, version): (i64, i64) =
                sqlx::query_as("SELECT qty, version FROM dlock_example_inventory WHERE id = $1")
                    .bind(ITEM)
                    .fetch_one(pool)
                    .await?;
            let done = sqlx::query(sqlx::AssertSqlSafe(update.clone()))
                .bind(qty - 1) // qty
                .bind(ITEM) // WHERE id = ...
                .bind(version) // AND version = the one read
                .execute(pool)
                .await?;
            let outcome = optimistic::expect_updated(done.rows_affected());
            if outcome.is_err() {
                conflicts.fetch_add(1, Ordering::Relaxed);
            }
            outcome
        })
    });
    for sale in futures::future::join_all(buyers).await {
        sale?;
    }
    let left: i64 =
        sqlx::query_scalar("SELECT qty FROM dlock_example_inventory WHERE id = $1").bind(ITEM).fetch_one(pool).await?;
    if left != 100 - BUYERS {
        return Err(format!("{BUYERS} sales left {left} of 100: a sale was lost").into());
    }
    println!(
        "optimistic: {BUYERS} buyers at once took one item each, stock 100 -> {left}, after {} version conflicts retried",
        conflicts.load(Ordering::Relaxed)
    );
    Ok(())
}
