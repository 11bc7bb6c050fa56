//! A pessimistic row lock on PostgreSQL: `SELECT … FOR UPDATE` on one of your own rows, for
//! the length of a transaction that runs the work.
//!
//! The row itself is the lock, and the work commits (or rolls back) with it: no lease to
//! renew, nothing to clean up. Two buyers of the last items cannot both read the same
//! stock and both write it minus one; a buyer that would rather fail than wait uses
//! `NOWAIT` and gets `SqlError::Contended`.
//!
//! ```sh
//! cargo run -p dlock-examples --bin row_lock -- postgres://app:secret@127.0.0.1:5432/app
//! ```

use std::time::Duration;

use dlock::sql::{RowLock, SqlError};
use sqlx::postgres::{PgConnection, PgPoolOptions};
use tokio::sync::oneshot;

/// The PostgreSQL service of docker-compose.yml.
const DEFAULT_URL: &str = "postgres://dlock:dlock@127.0.0.1:15432/dlock";

/// The item both buyers want.
const ITEM: i64 = 1;

/// A slow sale: it says when it has read the stock, and waits before it writes.
type Slow = (oneshot::Sender<()>, oneshot::Receiver<()>);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args().nth(1).or_else(|| std::env::var("DLOCK_URL").ok()).unwrap_or(DEFAULT_URL.into());
    let pool = PgPoolOptions::new().max_connections(4).connect(&url).await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS dlock_example_stock (id BIGINT PRIMARY KEY, qty BIGINT NOT NULL)")
        .execute(&pool)
        .await?;
    sqlx::query("INSERT INTO dlock_example_stock VALUES ($1, 10) ON CONFLICT (id) DO UPDATE SET qty = 10")
        .bind(ITEM)
        .execute(&pool)
        .await?;

    // Waits up to 2 s for a row another transaction holds.
    let lock = RowLock::new("dlock_example_stock", "id")?.wait(Duration::from_secs(2));
    // The first buyer is slow between its read and its write (a payment, say): here it
    // writes only once the impatient buyer has tried, so that the run shows the contention
    // whatever the machine's speed.
    let (taken, row_taken) = oneshot::channel();
    let (tried, impatient_tried) = oneshot::channel();
    let first = lock.run(&pool, ITEM, |conn| Box::pin(sell(conn, Some((taken, impatient_tried)))));
    let others = async {
        // Whatever the first buyer's outcome, the others go on once it has read.
        let _ = row_taken.await;
        let impatient = lock.clone().nowait().run(&pool, ITEM, |conn| Box::pin(sell(conn, None))).await;
        let _ = tried.send(());
        // This one waits until the first buyer commits, then sells from what it left.
        let patient = lock.run(&pool, ITEM, |conn| Box::pin(sell(conn, None))).await;
        (impatient, patient)
    };
    let (first, (impatient, patient)) = tokio::join!(first, others);
    let (after_first, left) = (first?, patient?);
    let impatient = match impatient {
        Err(err @ SqlError::Contended) => err.to_string(),
        other => return Err(format!("a NOWAIT buyer should find the row locked, not {other:?}").into()),
    };
    if (after_first, left) != (9, 8) {
        return Err(format!("stock went 10 -> {after_first} -> {left}: a sale was lost").into());
    }
    println!(
        "row_lock: two buyers of item {ITEM} in turn under SELECT … FOR UPDATE took the stock from 10 to {left}; a NOWAIT buyer meanwhile got \"{impatient}\""
    );
    Ok(())
}

/// Sells one item inside the transaction that holds the row; returns the stock left.
/// With `slow`, tells its first half once the stock is read, then takes its time: until
/// the second half is told (or dropped).
async fn sell(conn: &mut PgConnection, slow: Option<Slow>) -> Result<i64, SqlError> {
    let qty: i64 = sqlx::query_scalar("SELECT qty FROM dlock_example_stock WHERE id = $1")
        .bind(ITEM)
        .fetch_one(&mut *conn)
        .await?;
    if let Some((taken, go_on)) = slow {
        let _ = taken.send(());
        let _ = go_on.await;
    }
    let left = (qty - 1).max(0);
    sqlx::query("UPDATE dlock_example_stock SET qty = $1 WHERE id = $2")
        .bind(left)
        .bind(ITEM)
        .execute(&mut *conn)
        .await?;
    Ok(left)
}
