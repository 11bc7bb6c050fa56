//! SQLite: the same single-statement UPSERT … RETURNING as PostgreSQL (SQLite ≥ 3.35). A
//! write statement takes the file's write lock before it reads, so it is atomic across
//! processes; waiting for that lock is bounded by the busy timeout.

use super::{
    HoldSql, LeaseSql, Param::*, Reply, ResultSql, Stmt, SweepSql, Tables, CLOCK_SLACK_US, SWEEP_BATCH, WAITING,
};

/// Microseconds since the epoch, from the statement's `'now'` (millisecond resolution).
const NOW: &str = "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)";

pub(super) fn lease_sql(tables: Tables<'_>) -> LeaseSql {
    let (t, r, h) = (tables.leases, tables.results, tables.holds);
    let results = result_sql(r);
    // TEXT compares with the BINARY collation: byte by byte.
    let mut create = vec![format!(
        "CREATE TABLE IF NOT EXISTS {t} (\
         name TEXT NOT NULL PRIMARY KEY, \
         owner TEXT, \
         holds INTEGER NOT NULL DEFAULT 0, \
         fence INTEGER NOT NULL DEFAULT 0, \
         expires_us INTEGER NOT NULL DEFAULT 0, \
         grants TEXT NOT NULL DEFAULT '', \
         shared_us INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID"
    )];
    create.extend(results.create.iter().cloned());
    create.push(format!(
        "CREATE TABLE IF NOT EXISTS {h} (\
         name TEXT NOT NULL, \
         request TEXT NOT NULL, \
         owner TEXT NOT NULL, \
         kind TEXT NOT NULL, \
         fence INTEGER NOT NULL, \
         expires_us INTEGER NOT NULL, \
         PRIMARY KEY (name, request)) WITHOUT ROWID"
    ));
    LeaseSql {
        create,
        acquire: Stmt::new(
            format!(
                "INSERT INTO {t} AS l (name, owner, holds, fence, expires_us, grants) \
                 VALUES (?1, ?2, 1, {NOW}, {NOW} + ?3 + {CLOCK_SLACK_US}, ',' || ?4 || ',') \
                 ON CONFLICT (name) DO UPDATE SET \
                 holds = CASE WHEN l.owner = excluded.owner AND l.expires_us > {NOW} THEN l.holds + 1 ELSE 1 END, \
                 fence = CASE WHEN l.owner = excluded.owner AND l.expires_us > {NOW} THEN l.fence ELSE l.fence + 1 END, \
                 grants = CASE WHEN l.owner = excluded.owner AND l.expires_us > {NOW} \
                 THEN l.grants || ?4 || ',' ELSE excluded.grants END, \
                 expires_us = MAX(l.expires_us, excluded.expires_us), \
                 owner = excluded.owner \
                 WHERE (l.owner IS NULL OR l.owner = excluded.owner OR l.expires_us <= {NOW}) \
                 AND l.shared_us <= {NOW} \
                 RETURNING fence, holds"
            ),
            &[Name, Owner, TtlUs, Grant],
            Reply::Rows,
        ),
        inspect: Stmt::new(
            format!("SELECT owner, fence, holds, expires_us - {NOW}, shared_us - {NOW} FROM {t} WHERE name = ?1"),
            &[Name],
            Reply::Rows,
        ),
        renew: Stmt::new(
            format!(
                "UPDATE {t} SET expires_us = MAX(expires_us, {NOW} + ?4 + {CLOCK_SLACK_US}) \
                 WHERE name = ?1 AND owner = ?2 AND fence = ?3 AND expires_us > {NOW}"
            ),
            &[Name, Owner, Fence, TtlUs],
            Reply::Done,
        ),
        renew_batch: Stmt::new(
            format!(
                "UPDATE {t} AS l SET expires_us = MAX(l.expires_us, {NOW} + d.t + {CLOCK_SLACK_US}) \
                 FROM (SELECT json_extract(value, '$.n') AS n, json_extract(value, '$.o') AS o, \
                 json_extract(value, '$.f') AS f, json_extract(value, '$.t') AS t FROM json_each(?1)) AS d \
                 WHERE l.name = d.n AND l.owner = d.o AND l.fence = d.f AND l.expires_us > {NOW} \
                 RETURNING name, fence"
            ),
            &[Batch],
            Reply::Rows,
        ),
        renewed: None,
        release: Stmt::new(
            take_back(t, &format!("AND fence = ?4 AND expires_us > {NOW}")),
            &[Name, Owner, Grant, Fence],
            Reply::Done,
        ),
        give_back: Stmt::new(take_back(t, ""), &[Name, Owner, Grant], Reply::Done),
        evict: Stmt::new(
            format!(
                "UPDATE {t} SET owner = NULL, holds = 0, expires_us = {NOW}, grants = '', shared_us = {NOW} WHERE name = ?1"
            ),
            &[Name],
            Reply::Done,
        ),
        // The statement holds the file's write lock from before it reads the lease row until
        // it commits. The SELECT needs its WHERE for SQLite to parse the upsert after it.
        store_result: Stmt::new(
            format!(
                "INSERT INTO {r} AS r (name, token, value, expires_us) \
                 SELECT name, fence, ?5, {NOW} + ?6 FROM {t} \
                 WHERE name = ?1 AND owner = ?2 AND fence = ?3 \
                 AND instr(grants, ',' || ?4 || ',') > 0 AND expires_us > {NOW} \
                 {replace} RETURNING token",
                replace = replace_older()
            ),
            &[Name, Owner, Fence, Grant, Value, RetentionUs],
            Reply::Rows,
        ),
        results,
        holds: hold_sql(t, r, h),
        sweep: sweep_sql(t, h),
        upgrade: vec![
            (
                format!("SELECT grants FROM {t} WHERE 1 = 0"),
                format!("ALTER TABLE {t} ADD COLUMN grants TEXT NOT NULL DEFAULT ''"),
            ),
            (
                format!("SELECT shared_us FROM {t} WHERE 1 = 0"),
                format!("ALTER TABLE {t} ADD COLUMN shared_us INTEGER NOT NULL DEFAULT 0"),
            ),
        ],
        indexes: vec![index(t, "expires", "expires_us"), index(h, "expires", "expires_us")],
        channel: None,
    }
}

/// The index `<table>_<suffix>` on `column`, and a probe that fails while it is missing.
fn index(table: &str, suffix: &str, column: &str) -> (String, String) {
    (
        format!("SELECT 1 FROM {table} INDEXED BY {table}_{suffix} WHERE 1 = 0"),
        format!("CREATE INDEX IF NOT EXISTS {table}_{suffix} ON {table} ({column})"),
    )
}

/// The sweep of the lease table `t` and the holds table `h` (see [`SweepSql`]): one
/// statement is one write, which no other statement of any process interleaves.
fn sweep_sql(t: &str, h: &str) -> SweepSql {
    SweepSql {
        holds: Stmt::new(
            format!(
                "DELETE FROM {h} WHERE (name, request) IN \
                 (SELECT name, request FROM {h} WHERE expires_us <= {NOW} LIMIT {SWEEP_BATCH})"
            ),
            &[],
            Reply::Done,
        ),
        leases: Stmt::new(
            format!(
                "DELETE FROM {t} WHERE name IN (SELECT l.name FROM {t} AS l \
                 WHERE l.expires_us <= {NOW} - ?1 AND l.shared_us <= {NOW} - ?1 \
                 AND NOT EXISTS (SELECT 1 FROM {h} AS h WHERE h.name = l.name AND h.expires_us > {NOW}) \
                 LIMIT {SWEEP_BATCH})"
            ),
            &[KeepUs],
            Reply::Done,
        ),
    }
}

/// The statements of the holds table `h` beside the lease table `t` (see [`HoldSql`]).
/// The transaction they run in is `BEGIN IMMEDIATE`: it holds the file's write lock from
/// its start, so `lock` need not lock anything itself.
fn hold_sql(t: &str, r: &str, h: &str) -> HoldSql {
    HoldSql {
        lock: Stmt::new(
            format!(
                "INSERT INTO {t} AS l (name, fence) VALUES (?1, {NOW}) ON CONFLICT (name) DO UPDATE SET fence = l.fence \
                 RETURNING owner, holds, expires_us - {NOW}, fence, {NOW}"
            ),
            &[Name],
            Reply::Rows,
        ),
        locked: None,
        live: Stmt::new(
            format!("SELECT request, owner, kind, fence, expires_us - {NOW} FROM {h} WHERE name = ?1 AND expires_us > {NOW}"),
            &[Name],
            Reply::Rows,
        ),
        bump: Stmt::new(
            format!("UPDATE {t} SET fence = fence + 1, shared_us = MAX(shared_us, ?2) WHERE name = ?1 RETURNING fence"),
            &[Name, ExpiresUs],
            Reply::Rows,
        ),
        insert: Stmt::new(
            format!(
                "INSERT INTO {h} (name, request, owner, kind, fence, expires_us) VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
                 ON CONFLICT (name, request) DO UPDATE SET owner = excluded.owner, kind = excluded.kind, \
                 fence = excluded.fence, expires_us = excluded.expires_us"
            ),
            &[Name, Grant, Owner, Kind, Fence, ExpiresUs],
            Reply::Done,
        ),
        touch: Stmt::new(
            format!(
                "UPDATE {h} SET expires_us = MAX(expires_us, ?4) \
                 WHERE name = ?1 AND owner = ?2 AND fence = ?3 AND kind <> '{WAITING}' AND expires_us > {NOW}"
            ),
            &[Name, Owner, Fence, ExpiresUs],
            Reply::Done,
        ),
        extend: Stmt::new(
            format!("UPDATE {t} SET shared_us = MAX(shared_us, ?2) WHERE name = ?1"),
            &[Name, ExpiresUs],
            Reply::Done,
        ),
        release: Stmt::new(
            format!(
                "DELETE FROM {h} WHERE name = ?1 AND owner = ?2 AND request = ?3 AND fence = ?4 \
                 AND kind <> '{WAITING}' AND expires_us > {NOW}"
            ),
            &[Name, Owner, Grant, Fence],
            Reply::Done,
        ),
        give_back: Stmt::new(
            format!("DELETE FROM {h} WHERE name = ?1 AND owner = ?2 AND request = ?3"),
            &[Name, Owner, Grant],
            Reply::Done,
        ),
        recount: Stmt::new(
            format!(
                "UPDATE {t} SET shared_us = COALESCE((SELECT MAX(h.expires_us) FROM {h} AS h \
                 WHERE h.name = ?1 AND h.kind <> '{WAITING}' AND h.expires_us > {NOW}), {NOW}) WHERE name = ?1"
            ),
            &[Name],
            Reply::Done,
        ),
        wait: Stmt::new(
            format!(
                "INSERT INTO {h} AS h (name, request, owner, kind, fence, expires_us) \
                 VALUES (?1, ?2, ?3, '{WAITING}', ?4, {NOW} + ?5 + {CLOCK_SLACK_US}) \
                 ON CONFLICT (name, request) DO UPDATE SET fence = excluded.fence, expires_us = excluded.expires_us \
                 WHERE h.kind = '{WAITING}'"
            ),
            &[Name, Grant, Owner, Fence, LapseUs],
            Reply::Done,
        ),
        unwait: Stmt::new(
            format!("DELETE FROM {h} WHERE name = ?1 AND request = ?2 AND kind = '{WAITING}'"),
            &[Name, Grant],
            Reply::Done,
        ),
        evict: Stmt::new(format!("DELETE FROM {h} WHERE name = ?1"), &[Name], Reply::Done),
        // The statement holds the file's write lock from before it reads the hold's row
        // until it commits, as the lease table's store does.
        store_result: Stmt::new(
            format!(
                "INSERT INTO {r} AS r (name, token, value, expires_us) \
                 SELECT name, fence, ?5, {NOW} + ?6 FROM {h} \
                 WHERE name = ?1 AND owner = ?2 AND fence = ?3 AND request = ?4 \
                 AND kind <> '{WAITING}' AND expires_us > {NOW} \
                 {replace} RETURNING token",
                replace = replace_older()
            ),
            &[Name, Owner, Fence, Grant, Value, RetentionUs],
            Reply::Rows,
        ),
        notify: None,
    }
}

/// Takes back the grant `?3` of owner `?2` on lock `?1` (under `extra` conditions): one
/// hold less, the lock freed with the last.
fn take_back(t: &str, extra: &str) -> String {
    format!(
        "UPDATE {t} SET holds = holds - 1, \
         grants = replace(grants, ',' || ?3 || ',', ','), \
         owner = CASE WHEN holds <= 1 THEN NULL ELSE owner END, \
         expires_us = CASE WHEN holds <= 1 THEN {NOW} ELSE expires_us END \
         WHERE name = ?1 AND owner = ?2 AND instr(grants, ',' || ?3 || ',') > 0 {extra}"
    )
}

/// The statements of the results table `r`: a rowid table, unlike the lease table, since
/// SQLite keeps the large rows of a `WITHOUT ROWID` table badly.
pub(super) fn result_sql(r: &str) -> ResultSql {
    ResultSql {
        create: vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {r} (\
                 name TEXT NOT NULL PRIMARY KEY, \
                 token INTEGER NOT NULL, \
                 value BLOB NOT NULL, \
                 expires_us INTEGER NOT NULL)"
            ),
            format!("CREATE INDEX IF NOT EXISTS {r}_expires ON {r} (expires_us)"),
        ],
        load: Stmt::new(
            format!("SELECT token, value FROM {r} WHERE name = ?1 AND expires_us > {NOW}"),
            &[Name],
            Reply::Rows,
        ),
        sweep: Stmt::new(
            format!(
                "DELETE FROM {r} WHERE name IN \
                 (SELECT name FROM {r} WHERE expires_us <= {NOW} LIMIT {SWEEP_BATCH})"
            ),
            &[],
            Reply::Done,
        ),
    }
}

/// Replaces the name's stored result only when it is of a lower token or expired.
fn replace_older() -> String {
    format!(
        "ON CONFLICT (name) DO UPDATE SET \
         token = excluded.token, value = excluded.value, expires_us = excluded.expires_us \
         WHERE r.token < excluded.token OR r.expires_us <= {NOW}"
    )
}
