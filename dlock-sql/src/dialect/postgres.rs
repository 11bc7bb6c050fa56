//! PostgreSQL: one `INSERT … ON CONFLICT DO UPDATE … RETURNING` per acquire; release
//! announces a freed lock with `pg_notify` (sent at commit).

use super::{
    AdvisorySql, HoldSql, LeaseSql, Param::*, Reply, ResultSql, Stmt, SweepSql, Tables, CLOCK_SLACK_US, SWEEP_BATCH,
    WAITING,
};

/// Microseconds since the epoch at the start of the statement, exact.
const NOW: &str = "(FLOOR(EXTRACT(EPOCH FROM statement_timestamp()) * 1000000))::bigint";

pub(super) fn lease_sql(tables: Tables<'_>) -> LeaseSql {
    let (t, r, h) = (tables.leases, tables.results, tables.holds);
    let channel = t.to_string();
    let results = result_sql(r);
    // `COLLATE "C"`: names and owners compare byte by byte, never case-insensitively.
    let mut create = vec![format!(
        "CREATE TABLE IF NOT EXISTS {t} (\
         name TEXT COLLATE \"C\" NOT NULL PRIMARY KEY, \
         owner TEXT COLLATE \"C\", \
         holds BIGINT NOT NULL DEFAULT 0, \
         fence BIGINT NOT NULL DEFAULT 0, \
         expires_us BIGINT NOT NULL DEFAULT 0, \
         grants TEXT COLLATE \"C\" NOT NULL DEFAULT '', \
         shared_us BIGINT NOT NULL DEFAULT 0)"
    )];
    create.extend(results.create.iter().cloned());
    create.push(format!(
        "CREATE TABLE IF NOT EXISTS {h} (\
         name TEXT COLLATE \"C\" NOT NULL, \
         request TEXT COLLATE \"C\" NOT NULL, \
         owner TEXT COLLATE \"C\" NOT NULL, \
         kind TEXT NOT NULL, \
         fence BIGINT NOT NULL, \
         expires_us BIGINT NOT NULL, \
         PRIMARY KEY (name, request))"
    ));
    LeaseSql {
        create,
        acquire: Stmt::new(
            format!(
                "INSERT INTO {t} AS l (name, owner, holds, fence, expires_us, grants) \
                 VALUES ($1, $2, 1, {NOW}, {NOW} + $3 + {CLOCK_SLACK_US}, ',' || $4 || ',') \
                 ON CONFLICT (name) DO UPDATE SET \
                 holds = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_us > {NOW} THEN l.holds + 1 ELSE 1 END, \
                 fence = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_us > {NOW} THEN l.fence ELSE l.fence + 1 END, \
                 grants = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_us > {NOW} \
                 THEN l.grants || $4 || ',' ELSE EXCLUDED.grants END, \
                 expires_us = GREATEST(l.expires_us, EXCLUDED.expires_us), \
                 owner = EXCLUDED.owner \
                 WHERE (l.owner IS NULL OR l.owner = EXCLUDED.owner OR l.expires_us <= {NOW}) \
                 AND l.shared_us <= {NOW} \
                 RETURNING fence, holds"
            ),
            &[Name, Owner, TtlUs, Grant],
            Reply::Rows,
        ),
        inspect: Stmt::new(
            format!("SELECT owner, fence, holds, expires_us - {NOW}, shared_us - {NOW} FROM {t} WHERE name = $1"),
            &[Name],
            Reply::Rows,
        ),
        renew: Stmt::new(
            format!(
                "UPDATE {t} SET expires_us = GREATEST(expires_us, {NOW} + $4 + {CLOCK_SLACK_US}) \
                 WHERE name = $1 AND owner = $2 AND fence = $3 AND expires_us > {NOW} RETURNING fence"
            ),
            &[Name, Owner, Fence, TtlUs],
            Reply::Rows,
        ),
        renew_batch: Stmt::new(
            format!(
                "UPDATE {t} AS l SET expires_us = GREATEST(l.expires_us, {NOW} + d.t + {CLOCK_SLACK_US}) \
                 FROM jsonb_to_recordset($1::text::jsonb) AS d(n text, o text, f bigint, t bigint) \
                 WHERE l.name = d.n COLLATE \"C\" AND l.owner = d.o COLLATE \"C\" AND l.fence = d.f \
                 AND l.expires_us > {NOW} RETURNING l.name, l.fence"
            ),
            &[Batch],
            Reply::Rows,
        ),
        renewed: None,
        release: Stmt::new(
            take_back(t, &channel, &format!("AND fence = $4 AND expires_us > {NOW}")),
            &[Name, Owner, Grant, Fence],
            Reply::Rows,
        ),
        give_back: Stmt::new(take_back(t, &channel, ""), &[Name, Owner, Grant], Reply::Rows),
        evict: Stmt::new(
            format!(
                "WITH r AS (UPDATE {t} SET owner = NULL, holds = 0, expires_us = {NOW}, grants = '', shared_us = {NOW} \
                 WHERE name = $1 RETURNING name) \
                 SELECT (SELECT 1 FROM pg_notify('{channel}', $1)) FROM r"
            ),
            &[Name],
            Reply::Rows,
        ),
        // `FOR SHARE`: a release, eviction or grant of the lease row waits for the store to
        // commit, and a store that waited sees their outcome (the row is checked again).
        store_result: Stmt::new(
            format!(
                "INSERT INTO {r} AS r (name, token, value, expires_us) \
                 SELECT l.name, l.fence, $5, {NOW} + $6 FROM {t} AS l \
                 WHERE l.name = $1 AND l.owner = $2 AND l.fence = $3 \
                 AND strpos(l.grants, ',' || $4 || ',') > 0 AND l.expires_us > {NOW} \
                 FOR SHARE OF l \
                 {replace} RETURNING token",
                replace = replace_older(),
            ),
            &[Name, Owner, Fence, Grant, Value, RetentionUs],
            Reply::Rows,
        ),
        results,
        holds: hold_sql(t, r, h, &channel),
        sweep: sweep_sql(t, h),
        upgrade: vec![
            (
                format!("SELECT grants FROM {t} WHERE 1 = 0"),
                format!("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS grants TEXT COLLATE \"C\" NOT NULL DEFAULT ''"),
            ),
            (
                format!("SELECT shared_us FROM {t} WHERE 1 = 0"),
                format!("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS shared_us BIGINT NOT NULL DEFAULT 0"),
            ),
        ],
        indexes: vec![index(t, "expires", "expires_us"), index(h, "expires", "expires_us")],
        channel: Some(channel),
    }
}

/// The index `<table>_<suffix>` on `column`, and a probe that fails while it is missing.
fn index(table: &str, suffix: &str, column: &str) -> (String, String) {
    (
        format!("SELECT '{table}_{suffix}'::regclass"),
        format!("CREATE INDEX IF NOT EXISTS {table}_{suffix} ON {table} ({column})"),
    )
}

/// The sweep of the lease table `t` and the holds table `h` (see [`SweepSql`]). `SKIP
/// LOCKED`: a row a grant is using is left for a later sweep; a row that changed since the
/// statement began is judged again as it is now, before it is locked.
fn sweep_sql(t: &str, h: &str) -> SweepSql {
    SweepSql {
        holds: Stmt::new(
            format!(
                "DELETE FROM {h} WHERE (name, request) IN (SELECT name, request FROM {h} \
                 WHERE expires_us <= {NOW} LIMIT {SWEEP_BATCH} FOR UPDATE SKIP LOCKED)"
            ),
            &[],
            Reply::Done,
        ),
        leases: Stmt::new(
            format!(
                "DELETE FROM {t} WHERE name IN (SELECT l.name FROM {t} AS l \
                 WHERE l.expires_us <= {NOW} - $1 AND l.shared_us <= {NOW} - $1 \
                 AND NOT EXISTS (SELECT 1 FROM {h} AS h WHERE h.name = l.name AND h.expires_us > {NOW}) \
                 LIMIT {SWEEP_BATCH} FOR UPDATE OF l SKIP LOCKED)"
            ),
            &[KeepUs],
            Reply::Done,
        ),
    }
}

/// The statements of the holds table `h` beside the lease table `t` (see [`HoldSql`]).
fn hold_sql(t: &str, r: &str, h: &str, channel: &str) -> HoldSql {
    HoldSql {
        // A no-op update still locks the row, and RETURNING reads its latest version.
        lock: Stmt::new(
            format!(
                "INSERT INTO {t} AS l (name, fence) VALUES ($1, {NOW}) ON CONFLICT (name) DO UPDATE SET fence = l.fence \
                 RETURNING l.owner, l.holds, l.expires_us - {NOW}, l.fence, {NOW}"
            ),
            &[Name],
            Reply::Rows,
        ),
        locked: None,
        live: Stmt::new(
            format!("SELECT request, owner, kind, fence, expires_us - {NOW} FROM {h} WHERE name = $1 AND expires_us > {NOW}"),
            &[Name],
            Reply::Rows,
        ),
        bump: Stmt::new(
            format!("UPDATE {t} SET fence = fence + 1, shared_us = GREATEST(shared_us, $2) WHERE name = $1 RETURNING fence"),
            &[Name, ExpiresUs],
            Reply::Rows,
        ),
        insert: Stmt::new(
            format!(
                "INSERT INTO {h} (name, request, owner, kind, fence, expires_us) VALUES ($1, $2, $3, $4, $5, $6) \
                 ON CONFLICT (name, request) DO UPDATE SET owner = EXCLUDED.owner, kind = EXCLUDED.kind, \
                 fence = EXCLUDED.fence, expires_us = EXCLUDED.expires_us"
            ),
            &[Name, Grant, Owner, Kind, Fence, ExpiresUs],
            Reply::Done,
        ),
        touch: Stmt::new(
            format!(
                "UPDATE {h} SET expires_us = GREATEST(expires_us, $4) \
                 WHERE name = $1 AND owner = $2 AND fence = $3 AND kind <> '{WAITING}' AND expires_us > {NOW}"
            ),
            &[Name, Owner, Fence, ExpiresUs],
            Reply::Done,
        ),
        extend: Stmt::new(
            format!("UPDATE {t} SET shared_us = GREATEST(shared_us, $2) WHERE name = $1"),
            &[Name, ExpiresUs],
            Reply::Done,
        ),
        release: Stmt::new(
            format!(
                "DELETE FROM {h} WHERE name = $1 AND owner = $2 AND request = $3 AND fence = $4 \
                 AND kind <> '{WAITING}' AND expires_us > {NOW}"
            ),
            &[Name, Owner, Grant, Fence],
            Reply::Done,
        ),
        give_back: Stmt::new(
            format!("DELETE FROM {h} WHERE name = $1 AND owner = $2 AND request = $3"),
            &[Name, Owner, Grant],
            Reply::Done,
        ),
        recount: Stmt::new(
            format!(
                "UPDATE {t} SET shared_us = COALESCE((SELECT MAX(h.expires_us) FROM {h} AS h \
                 WHERE h.name = $1 AND h.kind <> '{WAITING}' AND h.expires_us > {NOW}), {NOW}) WHERE name = $1"
            ),
            &[Name],
            Reply::Done,
        ),
        wait: Stmt::new(
            format!(
                "INSERT INTO {h} AS h (name, request, owner, kind, fence, expires_us) \
                 VALUES ($1, $2, $3, '{WAITING}', $4, {NOW} + $5 + {CLOCK_SLACK_US}) \
                 ON CONFLICT (name, request) DO UPDATE SET fence = EXCLUDED.fence, expires_us = EXCLUDED.expires_us \
                 WHERE h.kind = '{WAITING}'"
            ),
            &[Name, Grant, Owner, Fence, LapseUs],
            Reply::Done,
        ),
        // Readers that waited behind the writer may go now.
        unwait: Stmt::new(
            format!(
                "WITH d AS (DELETE FROM {h} WHERE name = $1 AND request = $2 AND kind = '{WAITING}' RETURNING name) \
                 SELECT (SELECT 1 FROM pg_notify('{channel}', $1)) FROM d"
            ),
            &[Name, Grant],
            Reply::Rows,
        ),
        evict: Stmt::new(format!("DELETE FROM {h} WHERE name = $1"), &[Name], Reply::Done),
        // `FOR SHARE`, as for the lease table's store: the hold's row cannot be released,
        // given back or evicted until the store commits.
        store_result: Stmt::new(
            format!(
                "INSERT INTO {r} AS r (name, token, value, expires_us) \
                 SELECT h.name, h.fence, $5, {NOW} + $6 FROM {h} AS h \
                 WHERE h.name = $1 AND h.owner = $2 AND h.fence = $3 AND h.request = $4 \
                 AND h.kind <> '{WAITING}' AND h.expires_us > {NOW} \
                 FOR SHARE OF h \
                 {replace} RETURNING token",
                replace = replace_older(),
            ),
            &[Name, Owner, Fence, Grant, Value, RetentionUs],
            Reply::Rows,
        ),
        notify: Some(Stmt::new(format!("SELECT pg_notify('{channel}', $1)"), &[Name], Reply::Rows)),
    }
}

/// Takes back the grant `$3` of owner `$2` on lock `$1` (under `extra` conditions): one
/// hold less, the lock freed (and announced) with the last.
fn take_back(t: &str, channel: &str, extra: &str) -> String {
    format!(
        "WITH r AS (UPDATE {t} SET holds = holds - 1, \
         grants = replace(grants, ',' || $3 || ',', ','), \
         owner = CASE WHEN holds <= 1 THEN NULL ELSE owner END, \
         expires_us = CASE WHEN holds <= 1 THEN {NOW} ELSE expires_us END \
         WHERE name = $1 AND owner = $2 AND strpos(grants, ',' || $3 || ',') > 0 {extra} RETURNING holds) \
         SELECT holds, CASE WHEN holds = 0 THEN (SELECT 1 FROM pg_notify('{channel}', $1)) END FROM r"
    )
}

/// The statements of the results table `r`.
pub(super) fn result_sql(r: &str) -> ResultSql {
    ResultSql {
        create: vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {r} (\
                 name TEXT COLLATE \"C\" NOT NULL PRIMARY KEY, \
                 token BIGINT NOT NULL, \
                 value BYTEA NOT NULL, \
                 expires_us BIGINT NOT NULL)"
            ),
            format!("CREATE INDEX IF NOT EXISTS {r}_expires ON {r} (expires_us)"),
        ],
        load: Stmt::new(
            format!("SELECT token, value FROM {r} WHERE name = $1 AND expires_us > {NOW}"),
            &[Name],
            Reply::Rows,
        ),
        // `SKIP LOCKED`: a row a store is replacing right now is left to it.
        sweep: Stmt::new(
            format!(
                "DELETE FROM {r} WHERE name IN (SELECT name FROM {r} WHERE expires_us <= {NOW} \
                 LIMIT {SWEEP_BATCH} FOR UPDATE SKIP LOCKED)"
            ),
            &[],
            Reply::Done,
        ),
    }
}

/// The store of an advisory hold's result (see [`super::advisory_store`]).
pub(super) fn advisory_store(r: &str, a: &str, classid: i32) -> String {
    format!(
        "INSERT INTO {r} AS r (name, token, value, expires_us) \
         SELECT a.name, a.fence, $1, {NOW} + $2 FROM {a} AS a \
         WHERE a.id = $3 AND a.fence = $4 AND EXISTS (SELECT 1 FROM pg_locks k \
         WHERE k.locktype = 'advisory' AND k.granted AND k.pid = pg_backend_pid() AND k.objsubid = 2 \
         AND k.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         AND k.classid = {classid}::oid AND k.objid = a.id::oid) \
         {replace} RETURNING token",
        replace = replace_older(),
    )
}

/// Replaces the name's stored result only when it is of a lower token or expired.
fn replace_older() -> String {
    format!(
        "ON CONFLICT (name) DO UPDATE SET \
         token = EXCLUDED.token, value = EXCLUDED.value, expires_us = EXCLUDED.expires_us \
         WHERE r.token < EXCLUDED.token OR r.expires_us <= {NOW}"
    )
}

/// PostgreSQL's one-key advisory lock that a grant of row `id` (an SQL expression) holds
/// until it commits, and that a lookup takes shared. One-key locks never meet the two-key
/// locks that are held as the locks themselves.
pub(crate) fn record_key(classid: i32, id: &str) -> String {
    format!("(({classid}::int8 << 32) | ({id})::int8)")
}

/// The statements of the advisory table `a` (see [`AdvisorySql`]), whose locks are of
/// class `classid`.
pub(super) fn advisory_sql(a: &str, classid: i32) -> AdvisorySql {
    // Every advisory lock of this table's class held on this database, by any session.
    let held = format!(
        "SELECT k.objid FROM pg_locks AS k WHERE k.locktype = 'advisory' AND k.objsubid = 2 \
         AND k.classid = {classid}::oid AND k.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    );
    AdvisorySql {
        create: format!(
            "CREATE TABLE IF NOT EXISTS {a} (id INTEGER GENERATED BY DEFAULT AS IDENTITY UNIQUE, \
             name TEXT COLLATE \"C\" NOT NULL PRIMARY KEY, owner TEXT COLLATE \"C\", \
             fence BIGINT NOT NULL DEFAULT 0, used_us BIGINT NOT NULL DEFAULT 0)"
        ),
        upgrade: vec![(
            format!("SELECT used_us FROM {a} WHERE 1 = 0"),
            format!("ALTER TABLE {a} ADD COLUMN IF NOT EXISTS used_us BIGINT NOT NULL DEFAULT 0"),
        )],
        indexes: vec![index(a, "used", "used_us")],
        resolve: format!(
            "INSERT INTO {a} (name, fence, used_us) VALUES ($1, {NOW}, {NOW}) \
             ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name RETURNING id::int8"
        ),
        // The try runs in a materialized CTE, which PostgreSQL runs exactly once per
        // statement, taking the record key first; the update joins its answer, so the fence
        // rises only under the lock. The try must not sit in the update's own condition:
        // when a transaction that committed after the statement took its snapshot changed
        // the row (another client's resolve of the name; a grant whose holder has let go
        // since), the update re-checks its condition on the row's newest version
        // (EvalPlanQual), which runs the sub-select again and takes the session lock a
        // second time. The release's one unlock would then leave the lock held by a
        // session back in the idle pool: until the server ends that session a ttl later,
        // or for as long as later holds on the session keep it alive.
        //
        // The answer: the new fence (granted), whether this session took the lock, and
        // whether the row was there when the statement began. A lock taken without a
        // fence means the row went under the statement (a sweep deleted it since the id
        // was looked up, or while the statement waited for the record key).
        try_lock: format!(
            "WITH tried AS MATERIALIZED (SELECT pg_try_advisory_lock($1, $2) AS got \
             FROM (SELECT pg_advisory_xact_lock({record})) AS recorded), \
             granted AS (UPDATE {a} SET fence = fence + 1, owner = $3, used_us = {NOW} FROM tried \
             WHERE id = $2 AND tried.got RETURNING fence) \
             SELECT (SELECT fence FROM granted), (SELECT got FROM tried), EXISTS (SELECT 1 FROM {a} WHERE id = $2)",
            record = record_key(classid, "$2")
        ),
        // The transaction-level lock on the row's own key cannot be had while a session
        // holds it, and keeps every session from taking it until the row is gone. The
        // candidates leave out keys held now, so that held rows never fill a batch.
        sweep: Stmt::new(
            format!(
                "WITH idle AS MATERIALIZED (SELECT a.id FROM {a} AS a WHERE a.used_us <= {NOW} - $1 \
                 AND a.id::oid NOT IN ({held}) LIMIT {SWEEP_BATCH} FOR UPDATE OF a SKIP LOCKED), \
                 free AS MATERIALIZED (SELECT id FROM idle WHERE pg_try_advisory_xact_lock({classid}, id)) \
                 DELETE FROM {a} WHERE id IN (SELECT id FROM free)"
            ),
            &[KeepUs],
            Reply::Done,
        ),
        // The lock statement takes the lock before it looks for the row: when the row is
        // gone, the session may hold a lock of no row. A session that tries for a lock
        // holds no other, so it lets go of everything.
        orphan: Some("SELECT pg_advisory_unlock_all()".to_string()),
    }
}
