//! A row lock cancelled while its work runs leaves no session setting behind on the pool's
//! connections: the next user of the pool gets the pool's own busy timeout.

#![cfg(feature = "sqlite")]

use std::time::Duration;

use dlock_sql::{RowLock, SqlError};

#[tokio::test]
async fn a_cancelled_row_lock_leaves_the_pool_settings_alone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let opts = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.path().join("rows.db"))
        .create_if_missing(true)
        .busy_timeout(Duration::from_millis(7000));
    let pool =
        sqlx::pool::PoolOptions::<sqlx::Sqlite>::new().max_connections(1).connect_with(opts).await.expect("pool");
    sqlx::query("CREATE TABLE stock (id INTEGER PRIMARY KEY, qty INTEGER)").execute(&pool).await.expect("create");
    sqlx::query("INSERT INTO stock VALUES (1, 5)").execute(&pool).await.expect("insert");

    let (entered, inside) = tokio::sync::oneshot::channel::<()>();
    let lock = RowLock::new("stock", "id").expect("row lock").nowait();
    {
        let run = lock.run(&pool, 1_i64, move |_conn| {
            Box::pin(async move {
                let _ = entered.send(());
                std::future::pending::<Result<(), SqlError>>().await
            })
        });
        tokio::pin!(run);
        tokio::select! {
            outcome = &mut run => panic!("the work never ends, yet run returned {outcome:?}"),
            _ = inside => {}
        }
        // Dropping `run` here cancels it inside the work, with NOWAIT's busy timeout set.
    }

    let busy: i64 = sqlx::query_scalar("PRAGMA busy_timeout").fetch_one(&pool).await.expect("busy timeout");
    assert_eq!(busy, 7000, "the pool's connection kept the cancelled row lock's busy timeout");
}
