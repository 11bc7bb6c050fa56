//! The lease-table backend: one row per lock name, written once for every dialect.
//!
//! A row holds the owner, its hold count (re-entrancy), the fence counter and the expiry
//! in microseconds of the database's clock. Acquire, renew and release are one statement
//! each (see [`crate::dialect`]); the fence counter is raised on every grant and never
//! reset, because the row stays when the lock is released.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{Attempt, Backend, Release, Renewal, Request};
use dlock_core::{Capabilities, FencingToken, Holder, LockError, LockInfo, LockName, LostReason, OwnerId};

use crate::batch::{Batcher, Pending};
use crate::config::{Dialect, SqlConfig};
use crate::db::{Args, Pool, Value};
use crate::dialect::{LeaseSql, Reply};
use crate::link::{Conn, SqlLink};
#[cfg(feature = "postgres")]
use crate::wake::Waker;

/// The lease-table backend of one client (see the crate docs). Build a client with
/// [`crate::connect`].
#[derive(Debug, Clone)]
pub struct SqlBackend {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    conn: Arc<Conn>,
    sql: Arc<LeaseSql>,
    batcher: Arc<Batcher>,
    dialect: Dialect,
    #[cfg(feature = "postgres")]
    waker: Option<Waker>,
}

/// A granted hold: the row's name, our owner identity and the token we were granted.
#[derive(Debug, Clone)]
pub struct SqlHold {
    name: LockName,
    owner: OwnerId,
    fence: i64,
}

/// A waiter's wake-up subscription (PostgreSQL); empty on the polling dialects.
#[derive(Debug)]
pub struct SqlTicket {
    #[cfg(feature = "postgres")]
    subscription: Option<crate::wake::Subscription>,
}

/// A holder as the `inspect` statement reports it.
struct Row {
    owner: Option<String>,
    fence: i64,
    holds: i64,
    remaining_us: i64,
}

impl Row {
    fn parse(values: &[Value]) -> Result<Row, LockError> {
        let bad = || LockError::backend(format!("unexpected row from the lease table: {values:?}"));
        Ok(Row {
            owner: values.first().ok_or_else(bad)?.text().map(str::to_string),
            fence: values.get(1).and_then(Value::int).ok_or_else(bad)?,
            holds: values.get(2).and_then(Value::int).ok_or_else(bad)?,
            remaining_us: values.get(3).and_then(Value::int).ok_or_else(bad)?,
        })
    }

    /// The live holder, if any.
    fn holder(&self) -> Option<(&str, i64)> {
        match &self.owner {
            Some(owner) if self.remaining_us > 0 && self.holds > 0 => Some((owner, self.fence)),
            _ => None,
        }
    }
}

/// A ttl in microseconds, rounded up, so the database never frees the hold early.
fn ttl_us(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_nanos().div_ceil(1000)).unwrap_or(i64::MAX / 4)
}

fn token(fence: i64) -> Result<FencingToken, LockError> {
    u64::try_from(fence)
        .ok()
        .filter(|f| *f > 0)
        .map(FencingToken::new)
        .ok_or_else(|| LockError::backend(format!("the lease table returned an invalid fence {fence}")))
}

impl SqlBackend {
    /// Connects (within the connect timeout) and creates the lease table when it is
    /// missing and the config allows it.
    pub async fn connect(config: SqlConfig) -> Result<Self, LockError> {
        let pool = Pool::connect(&config).await?;
        let sql = LeaseSql::new(config.dialect, &config.table());
        if config.create_table {
            crate::schema::ensure(&pool, &sql.create, &sql.inspect, config.connect_timeout).await?;
        }
        let dialect = config.dialect;
        #[cfg(feature = "postgres")]
        let waker = sql.channel.clone().map(Waker::new);
        Ok(SqlBackend {
            shared: Arc::new(Shared {
                conn: Conn::new(config, pool),
                sql: Arc::new(sql),
                batcher: Arc::default(),
                dialect,
                #[cfg(feature = "postgres")]
                waker,
            }),
        })
    }

    /// The database kind.
    pub fn dialect(&self) -> Dialect {
        self.shared.dialect
    }

    /// The configuration the backend was built from.
    pub fn config(&self) -> &SqlConfig {
        self.shared.conn.config()
    }

    /// The fault switch of this client, for fault-injection tests (see [`SqlLink`]).
    pub fn link(&self) -> SqlLink {
        SqlLink::new(self.shared.conn.clone())
    }

    /// Clears the holder of `name` as an operator would (a forced unlock): the holder's
    /// next renewal finds the hold gone and its lost signal fires. The fence counter stays,
    /// so the next holder's token is still higher.
    pub async fn evict(&self, name: &LockName) -> Result<(), LockError> {
        let pool = self.shared.conn.pool().await?;
        pool.run(&self.shared.sql.evict, Args::name(name.as_str())).await.map(drop)
    }

    async fn row(&self, pool: &Pool, name: &LockName) -> Result<Option<Row>, LockError> {
        let answer = pool.run(&self.shared.sql.inspect, Args::name(name.as_str())).await?;
        answer.rows.first().map(|r| Row::parse(r)).transpose()
    }

    fn hold_args<'a>(hold: &'a SqlHold, ttl: Duration) -> Args<'a> {
        Args { name: hold.name.as_str(), owner: hold.owner.as_str(), fence: hold.fence, ttl_us: ttl_us(ttl), batch: "" }
    }

    fn granted_fence(&self, answer: &crate::db::Answer) -> Option<i64> {
        match self.shared.sql.acquire.reply {
            Reply::Rows => answer.rows.first().and_then(|r| r.first()).and_then(Value::int),
            // MySQL: LAST_INSERT_ID carries the token, 0 when busy.
            Reply::Done => i64::try_from(answer.last_id).ok().filter(|f| *f > 0),
        }
    }
}

#[async_trait]
impl Backend for SqlBackend {
    type Hold = SqlHold;
    type Ticket = SqlTicket;

    fn name(&self) -> &'static str {
        self.shared.dialect.name()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            reentrant: true,
            fifo: false,
            notify: self.shared.sql.channel.is_some(),
            ttl: true,
            fixed: true,
            extend: true,
            queue_length: false,
        }
    }

    async fn attempt(&self, req: &Request, ticket: &mut Option<SqlTicket>) -> Result<Attempt<SqlHold>, LockError> {
        let pool = self.shared.conn.pool().await?;
        #[cfg(not(feature = "postgres"))]
        let _ = ticket;
        #[cfg(feature = "postgres")]
        if let (Some(waker), true, None) = (&self.shared.waker, req.blocking, ticket.as_ref()) {
            // Subscribe before the attempt, so a release committed after it always wakes us.
            let subscription = waker.subscribe(&pool, req.name.as_str()).await?;
            *ticket = Some(SqlTicket { subscription: Some(subscription) });
        }
        let args =
            Args { name: req.name.as_str(), owner: req.owner.as_str(), fence: 0, ttl_us: ttl_us(req.ttl()), batch: "" };
        let answer = pool.run(&self.shared.sql.acquire, args).await?;
        if let Some(fence) = self.granted_fence(&answer) {
            let hold = SqlHold { name: req.name.clone(), owner: req.owner.clone(), fence };
            return Ok(Attempt::Granted { hold, token: token(fence)? });
        }
        if !req.blocking {
            return Ok(Attempt::Busy { retry_after: None });
        }
        // Busy: look again when the holder's hold runs out, at the latest.
        let row = self.row(&pool, &req.name).await?;
        let remaining = row
            .as_ref()
            .and_then(|r| r.holder().map(|_| r.remaining_us))
            .map_or(Duration::ZERO, |us| Duration::from_micros(us.unsigned_abs()) + Duration::from_millis(1));
        Ok(Attempt::Busy { retry_after: Some(remaining) })
    }

    async fn wait(
        &self,
        req: &Request,
        ticket: &mut Option<SqlTicket>,
        until: tokio::time::Instant,
    ) -> Result<(), LockError> {
        let _ = req;
        #[cfg(feature = "postgres")]
        if let Some(subscription) = ticket.as_ref().and_then(|t| t.subscription.as_ref()) {
            let _ = tokio::time::timeout_at(until, subscription.notified()).await;
            return Ok(());
        }
        let _ = ticket;
        tokio::time::sleep_until(until).await;
        Ok(())
    }

    async fn renew(&self, hold: &SqlHold, ttl: Duration) -> Result<Renewal, LockError> {
        let pool = self.shared.conn.pool().await?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        let pending = Pending {
            name: hold.name.as_str().to_string(),
            owner: hold.owner.as_str().to_string(),
            fence: hold.fence,
            ttl_us: ttl_us(ttl),
            reply,
        };
        let timeout = self.shared.conn.config().op_timeout;
        self.shared.batcher.submit(pool.clone(), self.shared.sql.clone(), timeout, pending);
        match answer.await {
            Ok(Ok(true)) => return Ok(Renewal::Renewed),
            Ok(Ok(false)) => {}
            Ok(Err(err)) => return Err(err),
            Err(_) => return Err(LockError::backend("the renewal batch ended without an answer")),
        }
        let row = self.row(&pool, &hold.name).await?;
        Ok(match row.as_ref().and_then(Row::holder) {
            Some((owner, fence)) if owner != hold.owner.as_str() || fence != hold.fence => {
                Renewal::Lost(LostReason::Stolen)
            }
            _ => Renewal::Lost(LostReason::Expired),
        })
    }

    async fn release(&self, hold: &SqlHold) -> Result<Release, LockError> {
        let pool = self.shared.conn.pool().await?;
        let stmt = &self.shared.sql.release;
        let answer = pool.run(stmt, Self::hold_args(hold, Duration::ZERO)).await?;
        Ok(if answer.matched(stmt.reply) > 0 { Release::Released } else { Release::NotHeld })
    }

    async fn inspect(&self, name: &LockName) -> Result<LockInfo, LockError> {
        let pool = self.shared.conn.pool().await?;
        let row = self.row(&pool, name).await?;
        let holder = match row.as_ref().and_then(|r| r.holder().map(|h| (h, r))) {
            Some(((owner, fence), row)) => Some(Holder {
                owner: OwnerId::new(owner)?,
                token: token(fence)?,
                count: u32::try_from(row.holds).unwrap_or(u32::MAX),
                remaining: Some(Duration::from_micros(row.remaining_us.unsigned_abs())),
            }),
            None => None,
        };
        Ok(LockInfo { holder, waiters: None })
    }
}
