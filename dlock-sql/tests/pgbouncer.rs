//! PostgreSQL behind PgBouncer in transaction pooling mode (`pooler=transaction`): the
//! lease table passes the suite's core properties with each client's connections sharing
//! two server sessions, waiters poll, and advisory locks refuse to connect.

#![cfg(feature = "postgres")]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_conformance::properties;
use dlock_conformance::{Fixture, Timing};
use dlock_core::{ConnectConfig, LockError, Locker};
use dlock_sql::{LockKind, SqlConfig};
use dlock_testkit::supervisor::pgbouncer::{PgBouncerServer, PoolMode};
use dlock_testkit::supervisor::postgres::PostgresServer;

/// Server sessions PgBouncer shares among all the clients' connections.
const SERVER_SESSIONS: u32 = 2;

struct Bounced {
    bouncer: PgBouncerServer,
    _postgres: PostgresServer,
}

impl Bounced {
    async fn start() -> Self {
        tokio::task::spawn_blocking(|| {
            let postgres = PostgresServer::start(100).expect("postgres");
            let bouncer =
                PgBouncerServer::start(postgres.addr(), PoolMode::Transaction, SERVER_SESSIONS).expect("pgbouncer");
            Bounced { bouncer, _postgres: postgres }
        })
        .await
        .expect("spawn_blocking")
    }

    fn config(&self) -> SqlConfig {
        SqlConfig::from_url(&format!("{}?pooler=transaction", self.bouncer.url()))
            .expect("url")
            .with_op_timeout(Duration::from_secs(2))
            .with_connect_timeout(Duration::from_secs(10))
    }
}

#[async_trait]
impl Fixture for Bounced {
    fn timing(&self) -> Timing {
        Timing::SHORT
    }

    async fn client(&self) -> Arc<dyn Locker> {
        Arc::new(dlock_sql::connect(self.config()).await.expect("connect through PgBouncer"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_table_works_behind_a_transaction_pooler() {
    let bounced = Bounced::start().await;
    properties::core(&bounced).await;
    properties::semaphore_admits_at_most_n(&bounced).await;

    // Waiters poll: a LISTEN through the pooler would listen on nobody's session.
    let client = bounced.client().await;
    assert!(!client.capabilities().notify);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_locks_refuse_a_transaction_pooler() {
    let bounced = Bounced::start().await;
    match dlock_sql::connect_any(bounced.config().with_lock_kind(LockKind::Advisory)).await {
        Err(LockError::InvalidInput(why)) => assert!(why.contains("transaction pooler"), "{why}"),
        other => panic!("advisory behind a transaction pooler: {:?}", other.map(|_| "connected")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_option_prepared_statements_collide() {
    // What the option is for: sqlx's named statements outlive the transaction that made
    // them on a server session the pooler then hands to another client.
    let bounced = Bounced::start().await;
    let config =
        SqlConfig::from_url(&bounced.bouncer.url()).expect("url").with_connect_timeout(Duration::from_secs(10));
    let clients: Vec<_> = futures::future::join_all((0..4).map(|_| dlock_sql::connect(config.clone()))).await;
    let mut failed = clients.iter().any(Result::is_err);
    for locker in clients.into_iter().flatten() {
        for _ in 0..20 {
            let name = dlock_conformance::properties::unique_name("collide");
            match locker.try_acquire(&name, &dlock_core::LockOptions::new()).await {
                Ok(Some(lease)) => failed |= lease.release().await.is_err(),
                _ => failed = true,
            }
        }
    }
    assert!(failed, "named statements went through a transaction pooler unharmed");
}
