//! Fenced updates: the resource refuses a holder whose lease ran out.
//!
//! A lock alone cannot stop a holder that stalls (a GC pause, a slow disk) past its lease
//! and then writes, after the next holder has written. The fencing token can: the row
//! remembers the highest token that wrote it and takes writes only from that token or a
//! higher one (`UPDATE … SET fence = $token WHERE id = $id AND fence <= $token`). Here the
//! lock and the row are in one PostgreSQL database.
//!
//! ```sh
//! cargo run -p dlock-examples --bin fenced -- postgres://app:secret@127.0.0.1:5432/app
//! ```

use std::time::Duration;

use dlock::sql::fenced::{self, FencedTable};
use dlock::sql::{Dialect, SqlConfig, SqlError};
use dlock::{LockName, LockOptions, Locker};
use sqlx::postgres::{PgPool, PgPoolOptions};

/// The PostgreSQL service of docker-compose.yml.
const DEFAULT_URL: &str = "postgres://dlock:dlock@127.0.0.1:15432/dlock";

/// The account both holders write.
const ACCOUNT: i64 = 7;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args().nth(1).or_else(|| std::env::var("DLOCK_URL").ok()).unwrap_or(DEFAULT_URL.into());
    let pool = PgPoolOptions::new().max_connections(2).connect(&url).await?;
    // Resource rows start with fence 0, below every token.
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS dlock_example_accounts \
         (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL, fence BIGINT NOT NULL DEFAULT 0)",
    )
    .execute(&pool)
    .await?;
    sqlx::query("INSERT INTO dlock_example_accounts (id, balance) VALUES ($1, 0) ON CONFLICT (id) DO NOTHING")
        .bind(ACCOUNT)
        .execute(&pool)
        .await?;
    let accounts = FencedTable::new("dlock_example_accounts", "id", "fence")?;

    // Two replicas of a service, each with its own lock client.
    let config = SqlConfig::from_url(&url)?;
    let first_replica = dlock::sql::connect(config.clone()).await?;
    let second_replica = dlock::sql::connect(config).await?;
    let name = LockName::new(format!("accounts/{ACCOUNT}"))?;

    // The first replica takes a short fixed lease, then stalls past it...
    let stalled = first_replica.acquire(&name, &LockOptions::fixed(Duration::from_millis(500))).await?;
    let stale_token = stalled.token();
    // ...so the second gets the lock once that lease has run out, and writes.
    let next = second_replica.acquire(&name, &LockOptions::new().wait(Duration::from_secs(10))).await?;
    let next_token = next.token();
    write(&pool, &accounts, 200, i64::try_from(next_token.get())?).await?;
    // The first wakes up and writes as if it still held the lock: refused.
    let late = write(&pool, &accounts, 100, i64::try_from(stale_token.get())?).await;
    next.release().await?;
    // NotHeld: the stalled lease was no longer ours, and the release frees nothing.
    let _ = stalled.release().await;
    match late {
        Err(SqlError::Fenced) => {}
        other => return Err(format!("the stalled holder's write should be Fenced, not {other:?}").into()),
    }
    let balance: i64 = sqlx::query_scalar("SELECT balance FROM dlock_example_accounts WHERE id = $1")
        .bind(ACCOUNT)
        .fetch_one(&pool)
        .await?;
    println!(
        "fenced: a holder that stalled past its lease wrote with token {stale_token} and was refused; the next holder's write with token {next_token} stands (balance {balance})"
    );
    Ok(())
}

/// Sets the balance, if no higher token than `token` has written the row.
async fn write(pool: &PgPool, accounts: &FencedTable, balance: i64, token: i64) -> Result<(), SqlError> {
    let sql = accounts.update_sql(Dialect::Postgres, &["balance"]);
    let done = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(balance) // balance
        .bind(token) // fence = token
        .bind(ACCOUNT) // WHERE id = ...
        .bind(token) // AND fence <= token
        .execute(pool)
        .await?;
    fenced::expect_accepted(done.rows_affected())
}
