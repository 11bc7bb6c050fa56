//! The lease-table backend: one row per lock name, written once for every dialect.
//!
//! A row holds the owner, its hold count (re-entrancy), the fence counter and the expiry
//! in microseconds of the database's clock. Acquire, renew and release are one statement
//! each (see [`crate::dialect`]); the fence counter is raised on every grant. The row stays
//! when the lock is released, until a sweep finds the name idle for the keep time; a row
//! made again starts its counter at the database's clock in microseconds, above the
//! tokens of the row it replaces.
//!
//! Shared holds and semaphore permits are rows of the holds table beside it
//! (`<prefix>_holds`, see [`crate::holds`]); the lease row keeps their fence counter and the
//! latest expiry among them (`shared_us`), which is all the exclusive statements read, so
//! an exclusive acquire, renew and release stay one statement each. A blocking exclusive
//! request that finds shared holds or permits in its way records its place as a waiting
//! writer there, and a blocking permit request that is refused its place with its number
//! of permits (each refreshed by the waiter's attempts, and lapsing a place's lapse after
//! the last if its client dies): while a writer's is live, no new shared hold or permit
//! is granted (writer preference); while a permit request's is, no later request for more
//! permits is.
//!
//! Stored results are rows of the results table beside it (`<prefix>_results`: name,
//! token, value, expires_us), keyed by the same name. A store is one statement that writes
//! only while the lease row is still this hold's, as release checks it, and the stored
//! result is of a lower token or expired.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{Attempt, Backend, Release, Renewal, Request};
use dlock_core::{
    Capabilities, FencingToken, HoldKind, Holder, LockError, LockInfo, LockName, LostReason, OwnerId, StoredResult,
    Swept,
};
use futures::future::BoxFuture;
use tokio::time::Instant;

use crate::config::{Dialect, SqlConfig};
use crate::db::{in_tx, Answer, Args, OwnedArgs, Pool, Tx, Value, Warm};
use crate::dialect::{LeaseSql, Reply, Stmt, SWEEP_BATCH};
use crate::holds::{self, Attempted, Live};
use crate::link::{Conn, SqlLink};
use crate::results::Sweeper;
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
    dialect: Dialect,
    /// Whether the database runs `renew_batch` (MariaDB before 10.6 has no `JSON_TABLE`:
    /// it renews each hold with its own statement).
    batch_renewals: bool,
    sweeper: Sweeper,
    /// Where the locks live (see [`Backend::target`]).
    target: String,
    #[cfg(feature = "postgres")]
    waker: Option<Waker>,
}

/// A granted hold: the row's name, our owner identity, the token we were granted, the
/// request id recorded with the grant, and the kind of hold (an exclusive hold lives in the
/// lease row, the others in the holds table).
#[derive(Debug)]
pub struct SqlHold {
    name: LockName,
    owner: OwnerId,
    fence: i64,
    grant: String,
    kind: HoldKind,
    /// The ttl of the last grant or renewal, in microseconds: a release whose outcome is
    /// unknown is retried for at most this long, after which the database has freed it.
    ttl_us: AtomicI64,
}

/// A waiter's wake-up subscription (PostgreSQL), and whether it holds a place in the holds
/// table (a waiting writer's, or a waiting permit request's).
#[derive(Debug, Default)]
pub struct SqlTicket {
    #[cfg(feature = "postgres")]
    subscription: Option<crate::wake::Subscription>,
    waiting: bool,
}

/// A holder as the `inspect` statement reports it.
struct Row {
    owner: Option<String>,
    fence: i64,
    holds: i64,
    remaining_us: i64,
    /// How long the latest shared hold or permit has left (not positive: none is live).
    shared_remaining_us: i64,
}

impl Row {
    fn parse(values: &[Value]) -> Result<Row, LockError> {
        let bad = || LockError::backend(format!("unexpected row from the lease table: {values:?}"));
        Ok(Row {
            owner: values.first().ok_or_else(bad)?.text().map(str::to_string),
            fence: values.get(1).and_then(Value::int).ok_or_else(bad)?,
            holds: values.get(2).and_then(Value::int).ok_or_else(bad)?,
            remaining_us: values.get(3).and_then(Value::int).ok_or_else(bad)?,
            shared_remaining_us: values.get(4).and_then(Value::int).ok_or_else(bad)?,
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

/// A ttl (or any span the database adds to its clock) in microseconds, rounded up, so the
/// database never ends anything early.
pub(crate) fn ttl_us(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_nanos().div_ceil(1000)).unwrap_or(i64::MAX / 4)
}

fn token(fence: i64) -> Result<FencingToken, LockError> {
    u64::try_from(fence)
        .ok()
        .filter(|f| *f > 0)
        .map(FencingToken::new)
        .ok_or_else(|| LockError::backend(format!("the lease table returned an invalid fence {fence}")))
}

/// Pauses between the sends of a release or give-back whose outcome stays unknown.
const SETTLE_BACKOFF: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(1));

impl SqlBackend {
    /// Connects (within the connect timeout) and creates the lease table when it is
    /// missing and the config allows it.
    pub async fn connect(config: SqlConfig) -> Result<Self, LockError> {
        let sql = LeaseSql::of(&config);
        let warm: Warm = [&sql.renew, &sql.renew_batch, &sql.inspect, &sql.release, &sql.give_back]
            .iter()
            .map(|stmt| stmt.sql.clone())
            .collect();
        let pool = Pool::connect(&config, &warm).await?;
        if config.create_table {
            crate::schema::ensure(&pool, &sql, config.common.connect_timeout).await?;
        }
        let batch_renewals = match config.dialect {
            Dialect::MySql => {
                let version = tokio::time::timeout(config.common.connect_timeout, pool.version())
                    .await
                    .map_err(|_| LockError::unavailable("reading the server version timed out"))??;
                json_table(&version)
            }
            _ => true,
        };
        let dialect = config.dialect;
        let target = config.describe(&config.table());
        #[cfg(feature = "postgres")]
        // Behind a transaction pooler a LISTEN would hold on to nobody's session: poll.
        let waker = sql.channel.clone().filter(|_| !config.transaction_pooler).map(Waker::new);
        Ok(SqlBackend {
            shared: Arc::new(Shared {
                conn: Conn::new(config, pool, warm),
                sql: Arc::new(sql),
                dialect,
                batch_renewals,
                sweeper: Sweeper::default(),
                target,
                #[cfg(feature = "postgres")]
                waker,
            }),
        })
    }

    /// The database kind.
    pub fn dialect(&self) -> Dialect {
        self.shared.dialect
    }

    /// Whether a release wakes this client's waiters (PostgreSQL's `LISTEN`), rather
    /// than their polls finding the lock free.
    fn wakes_waiters(&self) -> bool {
        #[cfg(feature = "postgres")]
        return self.shared.waker.is_some();
        #[cfg(not(feature = "postgres"))]
        return false;
    }

    /// The configuration the backend was built from.
    pub fn config(&self) -> &SqlConfig {
        self.shared.conn.config()
    }

    /// The fault switch of this client, for fault-injection tests (see [`SqlLink`]).
    pub fn link(&self) -> SqlLink {
        self.shared.conn.link()
    }

    /// Clears the holder of `name` as an operator would (a forced unlock): the holder's
    /// next renewal finds the hold gone and its lost signal fires. The fence counter stays,
    /// so the next holder's token is still higher; a stored result stays too.
    pub async fn evict(&self, name: &LockName) -> Result<(), LockError> {
        // Shared holds and permits go too, and waiting writers' places (their writers
        // record them again on their next attempt).
        self.transact(|tx, sql, args| Box::pin(holds::evict(tx, sql, args.args())), Args::name(name.as_str())).await
    }

    async fn run(&self, stmt: &Stmt, args: Args<'_>) -> Result<Answer, LockError> {
        self.shared.conn.run(stmt, args).await
    }

    /// Runs `body` with these arguments in one transaction (see [`crate::holds`]).
    async fn transact<T, F>(&self, body: F, args: Args<'_>) -> Result<T, LockError>
    where
        T: Send + 'static,
        F: for<'t> Fn(&'t mut Tx, &'t LeaseSql, &'t OwnedArgs) -> BoxFuture<'t, Result<T, LockError>>
            + Send
            + Sync
            + 'static,
    {
        self.shared.conn.transact(in_tx(&self.shared.sql, args, body)).await
    }

    async fn row(&self, name: &LockName) -> Result<Option<Row>, LockError> {
        let answer = self.run(&self.shared.sql.inspect, Args::name(name.as_str())).await?;
        answer.rows.first().map(|r| Row::parse(r)).transpose()
    }

    fn hold_args(hold: &SqlHold, ttl: Duration) -> Args<'_> {
        Args {
            owner: hold.owner.as_str(),
            fence: hold.fence,
            ttl_us: ttl_us(ttl),
            grant: &hold.grant,
            ..Args::name(hold.name.as_str())
        }
    }

    /// Sends a take-back (a release, a give-back: `take` applied to a clone of this
    /// backend) until its outcome is known, each send bounded by the operation timeout, for
    /// at most `lasting` (after which the database has freed what it would take back). A
    /// take-back removes its own grant id, so one applied twice takes back one hold: sending
    /// it again is safe. The first outcome goes to the caller; the sends after it go on in
    /// the background when the caller gives up (or is given up on) first.
    async fn settle<F>(&self, take: F, lasting: Duration) -> Result<bool, LockError>
    where
        F: Fn(SqlBackend) -> BoxFuture<'static, Result<bool, LockError>> + Send + 'static,
    {
        let (first, answer) = tokio::sync::oneshot::channel();
        let (this, op_timeout) = (self.clone(), self.shared.conn.config().common.op_timeout);
        let until = Instant::now() + lasting;
        tokio::spawn(async move {
            let mut first = Some(first);
            let mut pause = SETTLE_BACKOFF.0;
            loop {
                let outcome = match tokio::time::timeout(op_timeout, take(this.clone())).await {
                    Ok(outcome) => outcome,
                    Err(_) => Err(LockError::unavailable(format!("no answer within {op_timeout:?}"))),
                };
                let known = !matches!(&outcome, Err(err) if err.is_transient());
                if let Some(first) = first.take() {
                    let _ = first.send(outcome);
                }
                if known || Instant::now() + pause >= until {
                    return;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(SETTLE_BACKOFF.1);
            }
        });
        answer.await.unwrap_or_else(|_| Err(LockError::backend("the release task ended without an answer")))
    }

    /// A take-back for [`settle`](Self::settle): `stmt` (of the lease table) with `args`,
    /// or for a shared hold or permit (`kind`), the holds table's `pick` in a transaction.
    fn take_back(
        kind: HoldKind,
        stmt: fn(&LeaseSql) -> &Stmt,
        args: OwnedArgs,
    ) -> impl Fn(SqlBackend) -> BoxFuture<'static, Result<bool, LockError>> + Send + 'static {
        move |this| {
            let args = args.clone();
            Box::pin(async move {
                if kind == HoldKind::Exclusive {
                    let stmt = stmt(&this.shared.sql).clone();
                    return this.run(&stmt, args.args()).await.map(|answer| answer.matched(stmt.reply) > 0);
                }
                this.transact(
                    move |tx, sql, args| Box::pin(holds::take_back(tx, sql, stmt(sql), args.args())),
                    args.args(),
                )
                .await
            })
        }
    }

    /// Renews holds with one statement: the `(name, fence)` pairs it renewed.
    async fn renew_together(&self, holds: &[&SqlHold], ttl: Duration) -> Result<Vec<(String, i64)>, LockError> {
        let sql = &self.shared.sql;
        // One entry per row (the leases of a re-entrant owner share one).
        let mut unique: Vec<(&str, &str, i64)> =
            holds.iter().map(|h| (h.name.as_str(), h.owner.as_str(), h.fence)).collect();
        unique.sort_unstable();
        unique.dedup();
        let ttl = ttl_us(ttl);
        let mut json = String::from("[");
        for (i, (name, owner, fence)) in unique.iter().enumerate() {
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
        let answer = self.run(&sql.renew_batch, Args::batch(&json)).await?;
        let rows = match (sql.renew_batch.reply, &sql.renewed) {
            (Reply::Rows, _) => answer.rows,
            (Reply::Done, Some(check)) => {
                if answer.affected == unique.len() as u64 {
                    return Ok(unique.iter().map(|(n, _, f)| (n.to_string(), *f)).collect());
                }
                self.run(check, Args::batch(&json)).await?.rows
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

    /// Renews exclusive holds with one statement (on MariaDB before 10.6, one each):
    /// whether each was renewed.
    async fn renew_exclusive(&self, holds: &[&SqlHold], ttl: Duration) -> Vec<Result<bool, LockError>> {
        match holds {
            [] => Vec::new(),
            [one] => vec![self.renew_one(one, ttl).await],
            many if self.shared.batch_renewals => match self.renew_together(many, ttl).await {
                Ok(rows) => {
                    let renewed: HashMap<(String, i64), ()> = rows.into_iter().map(|r| (r, ())).collect();
                    many.iter().map(|h| Ok(renewed.contains_key(&(h.name.as_str().to_string(), h.fence)))).collect()
                }
                Err(err) => {
                    // The first hold keeps the error itself; the others get its text.
                    let (transient, why) = (err.is_transient(), err.to_string());
                    let mut first = Some(err);
                    let mut each = || match first.take() {
                        Some(err) => err,
                        None if transient => LockError::unavailable(why.clone()),
                        None => LockError::backend(why.clone()),
                    };
                    many.iter().map(|_| Err(each())).collect()
                }
            },
            many => futures::future::join_all(many.iter().map(|h| self.renew_one(h, ttl))).await,
        }
    }

    /// Renews one hold with its own statement (a transaction for a shared hold or a
    /// permit): whether it was renewed.
    async fn renew_one(&self, hold: &SqlHold, ttl: Duration) -> Result<bool, LockError> {
        let args = Self::hold_args(hold, ttl);
        if hold.kind != HoldKind::Exclusive {
            return self.transact(|tx, sql, args| Box::pin(holds::renew(tx, sql, args.args())), args).await;
        }
        let stmt = &self.shared.sql.renew;
        let answer = self.run(stmt, args).await?;
        Ok(answer.matched(stmt.reply) > 0)
    }

    /// The live rows of `name` in the holds table (shared holds, permits and waiting
    /// writers' places), or none when the lease row `row` says no hold there is live.
    async fn live(&self, name: &LockName, row: Option<&Row>) -> Result<Vec<Live>, LockError> {
        // `shared_us` covers every live hold of the table (a waiting writer's place is no
        // hold, so it is not looked for here).
        if row.is_none_or(|r| r.shared_remaining_us <= 0) {
            return Ok(Vec::new());
        }
        Live::parse_all(&self.run(&self.shared.sql.holds.live, Args::name(name.as_str())).await?)
    }

    /// Why a hold the renewal did not find is gone: `Stolen` when a hold its kind would
    /// have excluded was granted after it, `Expired` otherwise.
    async fn loss(&self, hold: &SqlHold) -> Result<Renewal, LockError> {
        let row = self.row(&hold.name).await?;
        let live = self.live(&hold.name, row.as_ref()).await?;
        let exclusive = row.as_ref().and_then(Row::holder).map(|(_, fence)| (HoldKind::Exclusive, fence));
        let others = live.iter().filter_map(|l| l.kind.map(|kind| (kind, l.fence)));
        let stolen =
            exclusive.into_iter().chain(others).any(|(kind, fence)| fence > hold.fence && !hold.kind.compatible(kind));
        Ok(Renewal::Lost(if stolen { LostReason::Stolen } else { LostReason::Expired }))
    }
}

/// Whether a MySQL or MariaDB server of this `VERSION()` has `JSON_TABLE` (MySQL 8.0.4,
/// MariaDB 10.6).
fn json_table(version: &str) -> bool {
    // MariaDB may prefix its version with `5.5.5-` for old replication clients.
    let version = version.strip_prefix("5.5.5-").unwrap_or(version);
    let mut parts = version.split(|c: char| !c.is_ascii_digit()).map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if version.to_ascii_lowercase().contains("mariadb") {
        (major, minor) >= (10, 6)
    } else {
        major >= 8
    }
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

#[async_trait]
impl Backend for SqlBackend {
    type Hold = SqlHold;
    type Ticket = SqlTicket;

    fn name(&self) -> &'static str {
        self.shared.dialect.name()
    }

    /// The server, database and lease table (`postgres://10.0.0.5:5432/app table
    /// dlock_leases`), or the SQLite file.
    fn target(&self) -> String {
        self.shared.target.clone()
    }

    /// Deletes expired results, expired rows of the holds table (holds nobody renewed,
    /// places nobody refreshed) and the lease rows of names idle for the keep time
    /// ([`ConnectConfig::with_keep_idle`](dlock_core::ConnectConfig::with_keep_idle)), up to a batch of each.
    async fn sweep(&self) -> Result<Swept, LockError> {
        let sql = &self.shared.sql;
        let args = Args { keep_us: ttl_us(self.config().common.keep_idle), ..Args::name("") };
        let mut swept = Swept::default();
        // Holds first: a name whose last hold has just been swept may go in the same call.
        for stmt in [&sql.results.sweep, &sql.sweep.holds, &sql.sweep.leases] {
            let deleted = self.run(stmt, args).await?.matched(stmt.reply);
            swept.removed += deleted;
            swept.more |= deleted >= u64::from(SWEEP_BATCH);
        }
        Ok(swept)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            reentrant: true,
            fifo: false,
            notify: self.wakes_waiters(),
            ttl: true,
            fixed: true,
            extend: true,
            queue_length: false,
            results: true,
            shared: true,
            permits: true,
        }
    }

    async fn attempt(&self, req: &Request, ticket: &mut Option<SqlTicket>) -> Result<Attempt<SqlHold>, LockError> {
        #[cfg(feature = "postgres")]
        if let (Some(waker), true, None) = (&self.shared.waker, req.blocking, ticket.as_ref()) {
            // Subscribe before the attempt, so a release committed after it always wakes us.
            let pool = self.shared.conn.pool().await?;
            let subscription = waker.subscribe(&pool, req.name.as_str()).await?;
            *ticket = Some(SqlTicket { subscription: Some(subscription), waiting: false });
        }
        let ttl = ttl_us(req.ttl());
        let kind_text = holds::kind_text(req.kind);
        let args = Args {
            owner: req.owner.as_str(),
            ttl_us: ttl,
            grant: req.id.as_str(),
            kind: &kind_text,
            lapse_us: ttl_us(req.place_lapse()),
            ..Args::name(req.name.as_str())
        };
        let granted = |fence| -> Result<Attempt<SqlHold>, LockError> {
            let hold = SqlHold {
                name: req.name.clone(),
                owner: req.owner.clone(),
                fence,
                grant: req.id.as_str().to_string(),
                kind: req.kind,
                ttl_us: AtomicI64::new(ttl),
            };
            Ok(Attempt::Granted { hold, token: token(fence)? })
        };
        if req.kind != HoldKind::Exclusive {
            let (kind, blocking) = (req.kind, req.blocking);
            let decided = self
                .transact(move |tx, sql, args| Box::pin(holds::attempt(tx, sql, args.args(), kind, blocking)), args)
                .await?;
            return match decided {
                Attempted::Granted(fence) => granted(fence),
                Attempted::Busy { .. } if !req.blocking => Ok(Attempt::Busy { retry_after: None }),
                Attempted::Busy { retry_after, placed } => {
                    if placed {
                        ticket.get_or_insert_with(SqlTicket::default).waiting = true;
                    }
                    Ok(Attempt::Busy { retry_after: Some(retry_after) })
                }
            };
        }
        let answer = self.run(&self.shared.sql.acquire, args).await?;
        if let Some(fence) = granted_fence(&self.shared.sql, &answer) {
            if ticket.as_ref().is_some_and(|t| t.waiting) {
                // Our place as a waiting writer is used up. Should this fail, the place
                // lapses by itself within a place's lapse (seconds at most), keeping readers
                // out until then, even after we release.
                if let Err(err) = self.run(&self.shared.sql.holds.unwait, args).await {
                    tracing::debug!(lock = %req.name, %err, "removing a waiting writer's place failed");
                }
            }
            return granted(fence);
        }
        if !req.blocking {
            return Ok(Attempt::Busy { retry_after: None });
        }
        // Busy: look again when the hold in the way runs out, at the latest.
        let row = self.row(&req.name).await?;
        let holder = row.as_ref().and_then(|r| r.holder().map(|_| r.remaining_us));
        let shared = row.as_ref().map(|r| r.shared_remaining_us).filter(|us| *us > 0);
        let ticket = ticket.get_or_insert_with(SqlTicket::default);
        if ticket.waiting || shared.is_some() {
            // Readers are in the way: keep later ones out until we are in. A writer that
            // waits behind another writer takes no place, so writers alone cost nothing
            // more than before.
            self.run(&self.shared.sql.holds.wait, args).await?;
            ticket.waiting = true;
        }
        let remaining = holder
            .or(shared)
            .map_or(Duration::ZERO, |us| Duration::from_micros(us.unsigned_abs()) + Duration::from_millis(1));
        Ok(Attempt::Busy { retry_after: Some(remaining) })
    }

    async fn wait(
        &self,
        req: &Request,
        ticket: &mut Option<SqlTicket>,
        until: tokio::time::Instant,
    ) -> Result<(), LockError> {
        // A waiter with a place refreshes it (by its next attempt) four times within its
        // lapse, so the place lasts while the waiter lives, and not much longer.
        let until = match ticket {
            Some(t) if t.waiting => until.min(Instant::now() + req.place_lapse() / 4),
            _ => until,
        };
        #[cfg(feature = "postgres")]
        if let Some(subscription) = ticket.as_ref().and_then(|t| t.subscription.as_ref()) {
            let _ = tokio::time::timeout_at(until, subscription.notified()).await;
            return Ok(());
        }
        tokio::time::sleep_until(until).await;
        Ok(())
    }

    /// Gives up a waiter's place, so that the requests it kept out may go.
    async fn abandon(&self, req: &Request, ticket: SqlTicket) {
        if ticket.waiting {
            let args = Args { grant: req.id.as_str(), ..Args::name(req.name.as_str()) };
            if let Err(err) = self.run(&self.shared.sql.holds.unwait, args).await {
                tracing::debug!(lock = %req.name, %err, "removing a waiter's place failed");
            }
        }
    }

    /// Takes back the grant recorded under the request's id, if the attempt made one:
    /// never another request's grant, even of the same owner. A blocking exclusive request
    /// may also have left a waiting writer's place (the attempt that failed may have been
    /// the one that recorded it): that goes too.
    async fn give_back(&self, req: &Request, ticket: Option<SqlTicket>) {
        // A waiter's subscription (if any) ends with the ticket.
        let _ = ticket;
        let args = Args { owner: req.owner.as_str(), grant: req.id.as_str(), ..Args::name(req.name.as_str()) };
        let lasting = req.ttl() + Duration::from_millis(1);
        let take = Self::take_back(req.kind, |sql| &sql.give_back, args.to_owned());
        let taken = match req.kind {
            HoldKind::Exclusive if req.blocking => {
                let unwait = Self::take_back(req.kind, |sql| &sql.holds.unwait, args.to_owned());
                self.settle(
                    move |this| {
                        let (take, unwait) = (take(this.clone()), unwait(this));
                        Box::pin(async move {
                            let taken = take.await?;
                            unwait.await?;
                            Ok(taken)
                        })
                    },
                    lasting,
                )
                .await
            }
            HoldKind::Exclusive => self.settle(take, lasting).await,
            _ => self.settle(Self::take_back(req.kind, |sql| &sql.holds.give_back, args.to_owned()), lasting).await,
        };
        match taken {
            Ok(taken) => tracing::debug!(lock = %req.name, taken, "gave back an attempt of unknown outcome"),
            Err(err) => tracing::debug!(lock = %req.name, %err, "giving back an attempt of unknown outcome failed"),
        }
    }

    async fn renew(&self, hold: &SqlHold, ttl: Duration) -> Result<Renewal, LockError> {
        self.renew_many(&[hold], ttl).await.pop().unwrap_or_else(|| Err(LockError::backend("no renewal answer")))
    }

    /// One statement renews every exclusive hold (on MariaDB before 10.6, one statement
    /// each), and one transaction each shared hold or permit; the holds it did not find are
    /// looked up to tell a stolen lock from an expired one.
    async fn renew_many(&self, holds: &[&SqlHold], ttl: Duration) -> Vec<Result<Renewal, LockError>> {
        let (exclusive, others): (Vec<(usize, &SqlHold)>, Vec<(usize, &SqlHold)>) =
            holds.iter().copied().enumerate().partition(|(_, h)| h.kind == HoldKind::Exclusive);
        let exclusive_holds: Vec<&SqlHold> = exclusive.iter().map(|(_, h)| *h).collect();
        let (mut renewed, others_renewed) = futures::future::join(
            self.renew_exclusive(&exclusive_holds, ttl),
            futures::future::join_all(others.iter().map(|(_, h)| self.renew_one(h, ttl))),
        )
        .await;
        let mut by_index: Vec<Option<Result<bool, LockError>>> = holds.iter().map(|_| None).collect();
        for ((i, _), outcome) in exclusive.iter().zip(renewed.drain(..)) {
            by_index[*i] = Some(outcome);
        }
        for ((i, _), outcome) in others.iter().zip(others_renewed) {
            by_index[*i] = Some(outcome);
        }
        let answers = holds.iter().zip(by_index).map(|(hold, renewed)| async move {
            match renewed.unwrap_or_else(|| Err(LockError::backend("no renewal answer")))? {
                true => {
                    hold.ttl_us.fetch_max(ttl_us(ttl), Ordering::Relaxed);
                    Ok(Renewal::Renewed)
                }
                false => self.loss(hold).await,
            }
        });
        futures::future::join_all(answers).await
    }

    /// Takes back this lease's own grant. When the answer is lost, the release is sent
    /// again until its outcome is known (or the hold has expired anyway): applied twice, it
    /// still takes back one hold.
    async fn release(&self, hold: &SqlHold) -> Result<Release, LockError> {
        let args = Self::hold_args(hold, Duration::ZERO).to_owned();
        let lasting = Duration::from_micros(hold.ttl_us.load(Ordering::Relaxed).unsigned_abs());
        let take = match hold.kind {
            HoldKind::Exclusive => Self::take_back(hold.kind, |sql| &sql.release, args),
            _ => Self::take_back(hold.kind, |sql| &sql.holds.release, args),
        };
        let released = self.settle(take, lasting).await?;
        Ok(if released { Release::Released } else { Release::NotHeld })
    }

    /// One statement (see the crate docs): `NotHeld` when it matched no row, because the
    /// hold is not live or a result of this token or a later one is kept.
    async fn store_result(
        &self,
        hold: &SqlHold,
        token: FencingToken,
        value: &[u8],
        retention: Duration,
    ) -> Result<(), LockError> {
        if u64::try_from(hold.fence).ok() != Some(token.get()) {
            return Err(LockError::not_held());
        }
        let sql = &self.shared.sql;
        let stmt = if hold.kind == HoldKind::Exclusive { &sql.store_result } else { &sql.holds.store_result };
        let retention_us = crate::results::retention_us(retention);
        let args = Args { value, retention_us, ..Self::hold_args(hold, Duration::ZERO) };
        if self.run(stmt, args).await?.matched(stmt.reply) == 0 {
            return Err(LockError::not_held());
        }
        self.shared.sweeper.after_store(&self.shared.conn, &sql.results.sweep);
        Ok(())
    }

    async fn load_result(&self, name: &LockName) -> Result<Option<StoredResult>, LockError> {
        let answer = self.run(&self.shared.sql.results.load, Args::name(name.as_str())).await?;
        crate::results::record(&answer)
    }

    /// The exclusive holder, or else the newest shared hold or permit.
    async fn inspect(&self, name: &LockName) -> Result<LockInfo, LockError> {
        let row = self.row(name).await?;
        if let Some(((owner, fence), row)) = row.as_ref().and_then(|r| r.holder().map(|h| (h, r))) {
            let holder = Holder {
                owner: OwnerId::new(owner)?,
                token: token(fence)?,
                count: u32::try_from(row.holds).unwrap_or(u32::MAX),
                remaining: Some(Duration::from_micros(row.remaining_us.unsigned_abs())),
            };
            return Ok(LockInfo { holder: Some(holder), waiters: None });
        }
        let live = self.live(name, row.as_ref()).await?;
        let newest = live.iter().filter(|l| l.kind.is_some()).max_by_key(|l| l.fence);
        let holder = match newest {
            Some(newest) => {
                let grants =
                    live.iter().filter(|l| l.kind.is_some() && l.fence == newest.fence && l.owner == newest.owner);
                let (count, remaining_us) =
                    grants.fold((0u32, 0i64), |(n, us), l| (n.saturating_add(1), us.max(l.remaining_us)));
                Some(Holder {
                    owner: OwnerId::new(newest.owner.as_str())?,
                    token: token(newest.fence)?,
                    count,
                    remaining: Some(Duration::from_micros(remaining_us.unsigned_abs())),
                })
            }
            None => None,
        };
        Ok(LockInfo { holder, waiters: None })
    }
}

/// The fence an answer to the acquire statement granted, if it granted one.
pub(crate) fn granted_fence(sql: &LeaseSql, answer: &Answer) -> Option<i64> {
    match sql.acquire.reply {
        Reply::Rows => answer.rows.first().and_then(|r| r.first()).and_then(Value::int),
        // MySQL: LAST_INSERT_ID carries the token, 0 when busy.
        Reply::Done => i64::try_from(answer.last_id).ok().filter(|f| *f > 0),
    }
}

#[cfg(test)]
mod tests {
    use super::{json_string, json_table};

    #[test]
    fn escapes_json() {
        let mut out = String::new();
        json_string(&mut out, "a\"b\\c\n\u{1}🔒");
        assert_eq!(out, "\"a\\\"b\\\\c\\u000a\\u0001🔒\"");
    }

    #[test]
    fn knows_which_servers_have_json_table() {
        for (version, has) in [
            ("10.5.23-MariaDB-0+deb11u1", false),
            ("10.6.0-MariaDB", true),
            ("10.11.19-MariaDB-0+deb12u1", true),
            ("11.4.2-MariaDB", true),
            ("5.7.44", false),
            ("8.0.36", true),
            ("5.5.5-10.5.9-MariaDB", false),
            ("5.5.5-10.6.1-MariaDB", true),
        ] {
            assert_eq!(json_table(version), has, "{version}");
        }
    }
}
