//! MySQL 8 and MariaDB: one `INSERT … ON DUPLICATE KEY UPDATE` per acquire, which answers
//! with the granted token through `LAST_INSERT_ID(expr)` (0 when busy), since neither has
//! `RETURNING` on an upsert.
//!
//! MySQL evaluates the assignments of `ON DUPLICATE KEY UPDATE` and `UPDATE` from left to
//! right, each seeing the values assigned before it: the order below is deliberate (the
//! decision columns `owner` and `expires_us` come last, `expires_us` after `owner`).
//! Names and owners are `VARBINARY`, so they compare byte by byte and a 1024-byte name
//! fits InnoDB's 3072-byte key limit.

use super::{
    AdvisorySql, HoldSql, LeaseSql, Param::*, Reply, ResultSql, Stmt, SweepSql, Tables, CLOCK_SLACK_US, SWEEP_BATCH,
    WAITING,
};

/// Microseconds since the epoch at the start of the statement (the session time zone is
/// UTC, so `UNIX_TIMESTAMP(NOW(6))` is exact).
const NOW: &str = "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)";

pub(super) fn lease_sql(tables: Tables<'_>) -> LeaseSql {
    let (t, r, h) = (tables.leases, tables.results, tables.holds);
    // Free for an exclusive grant: no live exclusive hold, and no live shared hold or permit.
    let free = format!("((owner IS NULL OR expires_us <= {NOW}) AND shared_us <= {NOW})");
    // Re-entry needs our hold live: the row may be busy only with shared holds while an
    // expired hold of ours is still written in it.
    let mine = format!("(owner = ? AND expires_us > {NOW})");
    // The batch as a table; names compare as bytes, so the join uses the primary key.
    let batch = "JSON_TABLE(?, '$[*]' COLUMNS (n VARCHAR(1024) PATH '$.n', o VARCHAR(256) PATH '$.o', \
                 f BIGINT PATH '$.f', t BIGINT PATH '$.t')) AS d \
                 ON l.name = CAST(d.n AS BINARY) AND l.owner = CAST(d.o AS BINARY) AND l.fence = d.f";
    let results = result_sql(r);
    let mut create = vec![format!(
        "CREATE TABLE IF NOT EXISTS {t} (\
         name VARBINARY(1024) NOT NULL PRIMARY KEY, \
         owner VARBINARY(256) NULL, \
         holds BIGINT NOT NULL DEFAULT 0, \
         fence BIGINT NOT NULL DEFAULT 0, \
         expires_us BIGINT NOT NULL DEFAULT 0, \
         grants VARBINARY(16384) NOT NULL DEFAULT '', \
         shared_us BIGINT NOT NULL DEFAULT 0) ENGINE=InnoDB"
    )];
    create.extend(results.create.iter().cloned());
    create.push(format!(
        "CREATE TABLE IF NOT EXISTS {h} (\
         name VARBINARY(1024) NOT NULL, \
         request VARBINARY(64) NOT NULL, \
         owner VARBINARY(256) NOT NULL, \
         kind VARCHAR(16) NOT NULL, \
         fence BIGINT NOT NULL, \
         expires_us BIGINT NOT NULL, \
         PRIMARY KEY (name, request)) ENGINE=InnoDB"
    ));
    LeaseSql {
        create,
        acquire: Stmt::new(
            format!(
                "INSERT INTO {t} (name, owner, holds, fence, expires_us, grants) \
                 VALUES (?, ?, 1, LAST_INSERT_ID({NOW}), {NOW} + ? + {CLOCK_SLACK_US}, CONCAT(',', ?, ',')) \
                 ON DUPLICATE KEY UPDATE \
                 fence = IF({free}, LAST_INSERT_ID(fence + 1), IF({mine}, LAST_INSERT_ID(fence), fence + LAST_INSERT_ID(0))), \
                 holds = IF({free}, 1, IF({mine}, holds + 1, holds)), \
                 grants = IF({free}, CONCAT(',', ?, ','), IF({mine}, CONCAT(grants, ?, ','), grants)), \
                 owner = IF({free}, ?, owner), \
                 expires_us = IF(owner = ? AND (expires_us > {NOW} OR shared_us <= {NOW}), \
                 GREATEST(expires_us, {NOW} + ? + {CLOCK_SLACK_US}), expires_us)"
            ),
            &[Name, Owner, TtlUs, Grant, Owner, Owner, Grant, Owner, Grant, Owner, Owner, TtlUs],
            Reply::Done,
        ),
        inspect: Stmt::new(
            format!("SELECT owner, fence, holds, expires_us - {NOW}, shared_us - {NOW} FROM {t} WHERE name = ?"),
            &[Name],
            Reply::Rows,
        ),
        renew: Stmt::new(
            format!(
                "UPDATE {t} SET expires_us = GREATEST(expires_us, {NOW} + ? + {CLOCK_SLACK_US}) \
                 WHERE name = ? AND owner = ? AND fence = ? AND expires_us > {NOW}"
            ),
            &[TtlUs, Name, Owner, Fence],
            Reply::Done,
        ),
        renew_batch: Stmt::new(
            format!(
                "UPDATE {t} AS l JOIN {batch} \
                 SET l.expires_us = GREATEST(l.expires_us, {NOW} + d.t + {CLOCK_SLACK_US}) \
                 WHERE l.expires_us > {NOW}"
            ),
            &[Batch],
            Reply::Done,
        ),
        // Ours and live after the update means the update matched it: a hold that was not
        // live then cannot be live again under the same owner and fence.
        renewed: Some(Stmt::new(
            format!("SELECT l.name, l.fence FROM {t} AS l JOIN {batch} WHERE l.expires_us > {NOW}"),
            &[Batch],
            Reply::Rows,
        )),
        release: Stmt::new(
            take_back(t, &format!("AND fence = ? AND expires_us > {NOW}")),
            &[Grant, Name, Owner, Grant, Fence],
            Reply::Done,
        ),
        give_back: Stmt::new(take_back(t, ""), &[Grant, Name, Owner, Grant], Reply::Done),
        evict: Stmt::new(
            format!(
                "UPDATE {t} SET owner = NULL, holds = 0, expires_us = {NOW}, grants = '', shared_us = {NOW} WHERE name = ?"
            ),
            &[Name],
            Reply::Done,
        ),
        // `LOCK IN SHARE MODE`: the lease row and the stored result are read as they are
        // now (not from a snapshot, whatever the isolation level) and stay locked until the
        // write commits, so a release, eviction or grant cannot slip in between.
        store_result: Stmt::new(
            format!(
                "INSERT INTO {r} (name, token, value, expires_us) \
                 SELECT l.name, l.fence, ?, {NOW} + ? FROM {t} AS l LEFT JOIN {r} AS o ON o.name = l.name \
                 WHERE l.name = ? AND l.owner = ? AND l.fence = ? AND LOCATE(CONCAT(',', ?, ','), l.grants) > 0 \
                 AND l.expires_us > {NOW} AND {older} LOCK IN SHARE MODE {REPLACE}",
                older = older("l.fence"),
            ),
            &[Value, RetentionUs, Name, Owner, Fence, Grant],
            Reply::Done,
        ),
        results,
        holds: hold_sql(t, r, h),
        sweep: sweep_sql(t, h),
        upgrade: vec![
            (
                format!("SELECT grants FROM {t} WHERE 1 = 0"),
                format!("ALTER TABLE {t} ADD COLUMN grants VARBINARY(16384) NOT NULL DEFAULT ''"),
            ),
            (
                format!("SELECT shared_us FROM {t} WHERE 1 = 0"),
                format!("ALTER TABLE {t} ADD COLUMN shared_us BIGINT NOT NULL DEFAULT 0"),
            ),
        ],
        indexes: vec![index(t, "expires", "expires_us"), index(h, "expires", "expires_us")],
        channel: None,
    }
}

/// The index `<table>_<suffix>` on `column`, and a probe that fails while it is missing
/// (MySQL 8 has no `CREATE INDEX IF NOT EXISTS`).
fn index(table: &str, suffix: &str, column: &str) -> (String, String) {
    (
        format!("SELECT 1 FROM {table} FORCE INDEX ({table}_{suffix}) WHERE 1 = 0"),
        format!("CREATE INDEX {table}_{suffix} ON {table} ({column})"),
    )
}

/// The sweep of the lease table `t` and the holds table `h` (see [`SweepSql`]). A
/// `DELETE` reads each row as it is when it locks it (a locking read, whatever the
/// isolation level), so a grant committed meanwhile keeps its row.
fn sweep_sql(t: &str, h: &str) -> SweepSql {
    SweepSql {
        holds: Stmt::new(format!("DELETE FROM {h} WHERE expires_us <= {NOW} LIMIT {SWEEP_BATCH}"), &[], Reply::Done),
        leases: Stmt::new(
            format!(
                "DELETE FROM {t} WHERE expires_us <= {NOW} - ? AND shared_us <= {NOW} - ? \
                 AND NOT EXISTS (SELECT 1 FROM {h} AS h WHERE h.name = {t}.name AND h.expires_us > {NOW}) \
                 LIMIT {SWEEP_BATCH}"
            ),
            &[KeepUs, KeepUs],
            Reply::Done,
        ),
    }
}

/// The statements of the holds table `h` beside the lease table `t` (see [`HoldSql`]).
fn hold_sql(t: &str, r: &str, h: &str) -> HoldSql {
    HoldSql {
        // The upsert locks the row even when it changes nothing; `locked` then reads it as
        // it is now (a locking read, whatever the isolation level).
        lock: Stmt::new(
            format!("INSERT INTO {t} (name, fence) VALUES (?, {NOW}) ON DUPLICATE KEY UPDATE fence = fence"),
            &[Name],
            Reply::Done,
        ),
        locked: Some(Stmt::new(
            format!("SELECT owner, holds, expires_us - {NOW}, fence, {NOW} FROM {t} WHERE name = ? FOR UPDATE"),
            &[Name],
            Reply::Rows,
        )),
        live: Stmt::new(
            format!(
                "SELECT request, owner, kind, fence, expires_us - {NOW} FROM {h} WHERE name = ? AND expires_us > {NOW}"
            ),
            &[Name],
            Reply::Rows,
        ),
        bump: Stmt::new(
            format!(
                "UPDATE {t} SET fence = LAST_INSERT_ID(fence + 1), shared_us = GREATEST(shared_us, ?) WHERE name = ?"
            ),
            &[ExpiresUs, Name],
            Reply::Done,
        ),
        insert: Stmt::new(
            format!(
                "INSERT INTO {h} (name, request, owner, kind, fence, expires_us) VALUES (?, ?, ?, ?, ?, ?) \
                 ON DUPLICATE KEY UPDATE owner = VALUES(owner), kind = VALUES(kind), fence = VALUES(fence), \
                 expires_us = VALUES(expires_us)"
            ),
            &[Name, Grant, Owner, Kind, Fence, ExpiresUs],
            Reply::Done,
        ),
        touch: Stmt::new(
            format!(
                "UPDATE {h} SET expires_us = GREATEST(expires_us, ?) \
                 WHERE name = ? AND owner = ? AND fence = ? AND kind <> '{WAITING}' AND expires_us > {NOW}"
            ),
            &[ExpiresUs, Name, Owner, Fence],
            Reply::Done,
        ),
        extend: Stmt::new(
            format!("UPDATE {t} SET shared_us = GREATEST(shared_us, ?) WHERE name = ?"),
            &[ExpiresUs, Name],
            Reply::Done,
        ),
        release: Stmt::new(
            format!(
                "DELETE FROM {h} WHERE name = ? AND owner = ? AND request = ? AND fence = ? \
                 AND kind <> '{WAITING}' AND expires_us > {NOW}"
            ),
            &[Name, Owner, Grant, Fence],
            Reply::Done,
        ),
        give_back: Stmt::new(
            format!("DELETE FROM {h} WHERE name = ? AND owner = ? AND request = ?"),
            &[Name, Owner, Grant],
            Reply::Done,
        ),
        recount: Stmt::new(
            format!(
                "UPDATE {t} SET shared_us = COALESCE((SELECT MAX(h.expires_us) FROM {h} AS h \
                 WHERE h.name = ? AND h.kind <> '{WAITING}' AND h.expires_us > {NOW}), {NOW}) WHERE name = ?"
            ),
            &[Name, Name],
            Reply::Done,
        ),
        wait: Stmt::new(
            format!(
                "INSERT INTO {h} (name, request, owner, kind, fence, expires_us) \
                 VALUES (?, ?, ?, '{WAITING}', ?, {NOW} + ? + {CLOCK_SLACK_US}) \
                 ON DUPLICATE KEY UPDATE fence = IF(kind = '{WAITING}', VALUES(fence), fence), \
                 expires_us = IF(kind = '{WAITING}', VALUES(expires_us), expires_us)"
            ),
            &[Name, Grant, Owner, Fence, LapseUs],
            Reply::Done,
        ),
        unwait: Stmt::new(
            format!("DELETE FROM {h} WHERE name = ? AND request = ? AND kind = '{WAITING}'"),
            &[Name, Grant],
            Reply::Done,
        ),
        evict: Stmt::new(format!("DELETE FROM {h} WHERE name = ?"), &[Name], Reply::Done),
        // `LOCK IN SHARE MODE`, as for the lease table's store.
        store_result: Stmt::new(
            format!(
                "INSERT INTO {r} (name, token, value, expires_us) \
                 SELECT h.name, h.fence, ?, {NOW} + ? FROM {h} AS h LEFT JOIN {r} AS o ON o.name = h.name \
                 WHERE h.name = ? AND h.owner = ? AND h.fence = ? AND h.request = ? \
                 AND h.kind <> '{WAITING}' AND h.expires_us > {NOW} AND {older} LOCK IN SHARE MODE {REPLACE}",
                older = older("h.fence"),
            ),
            &[Value, RetentionUs, Name, Owner, Fence, Grant],
            Reply::Done,
        ),
        notify: None,
    }
}

/// Takes back the grant of an owner on a lock (under `extra` conditions): one hold less,
/// the lock freed with the last. Parameters: grant, name, owner, grant, then `extra`'s.
/// `holds` is assigned first, so the assignments after it see the new count.
fn take_back(t: &str, extra: &str) -> String {
    format!(
        "UPDATE {t} SET holds = holds - 1, \
         grants = REPLACE(grants, CONCAT(',', ?, ','), ','), \
         owner = IF(holds = 0, NULL, owner), \
         expires_us = IF(holds = 0, {NOW}, expires_us) \
         WHERE name = ? AND owner = ? AND LOCATE(CONCAT(',', ?, ','), grants) > 0 {extra}"
    )
}

/// The statements of the results table `r`. `LONGBLOB`: `BLOB` stops at 64 KiB; a 512 KiB
/// result also needs `max_allowed_packet` above it (the default is 16 MiB on MariaDB, 64 MiB
/// on MySQL 8).
pub(super) fn result_sql(r: &str) -> ResultSql {
    ResultSql {
        create: vec![format!(
            "CREATE TABLE IF NOT EXISTS {r} (\
             name VARBINARY(1024) NOT NULL PRIMARY KEY, \
             token BIGINT NOT NULL, \
             value LONGBLOB NOT NULL, \
             expires_us BIGINT NOT NULL, \
             KEY {r}_expires (expires_us)) ENGINE=InnoDB"
        )],
        load: Stmt::new(
            format!("SELECT token, value FROM {r} WHERE name = ? AND expires_us > {NOW}"),
            &[Name],
            Reply::Rows,
        ),
        sweep: Stmt::new(format!("DELETE FROM {r} WHERE expires_us <= {NOW} LIMIT {SWEEP_BATCH}"), &[], Reply::Done),
    }
}

/// The store of an advisory hold's result (see [`super::advisory_store`]).
pub(super) fn advisory_store(r: &str, a: &str) -> String {
    format!(
        "INSERT INTO {r} (name, token, value, expires_us) \
         SELECT a.name, a.fence, ?, {NOW} + ? FROM {a} AS a LEFT JOIN {r} AS o ON o.name = a.name \
         WHERE a.id = ? AND a.fence = ? AND IS_USED_LOCK(CONCAT('{a}:', a.id)) = CONNECTION_ID() \
         AND {older} LOCK IN SHARE MODE {REPLACE}",
        older = older("a.fence"),
    )
}

/// Whether the name's stored result (`o`, from a left join) may be replaced by one of token
/// `token`: there is none, or it is of a lower token, or it has expired. The upsert after it
/// then writes unconditionally, since MySQL's `ON DUPLICATE KEY UPDATE` has no `WHERE`.
fn older(token: &str) -> String {
    format!("(o.name IS NULL OR o.token < {token} OR o.expires_us <= {NOW})")
}

/// The upsert of a store whose checks passed.
const REPLACE: &str =
    "ON DUPLICATE KEY UPDATE token = VALUES(token), value = VALUES(value), expires_us = VALUES(expires_us)";

/// The statements of the advisory table `a` (see [`AdvisorySql`]).
pub(super) fn advisory_sql(a: &str) -> AdvisorySql {
    AdvisorySql {
        create: format!(
            "CREATE TABLE IF NOT EXISTS {a} (id INT NOT NULL AUTO_INCREMENT UNIQUE, \
             name VARBINARY(1024) NOT NULL PRIMARY KEY, owner VARBINARY(256) NULL, \
             fence BIGINT NOT NULL DEFAULT 0, used_us BIGINT NOT NULL DEFAULT 0) ENGINE=InnoDB"
        ),
        upgrade: vec![(
            format!("SELECT used_us FROM {a} WHERE 1 = 0"),
            format!("ALTER TABLE {a} ADD COLUMN used_us BIGINT NOT NULL DEFAULT 0"),
        )],
        indexes: vec![index(a, "used", "used_us")],
        resolve: format!(
            "INSERT INTO {a} (name, fence, used_us) VALUES (?, {NOW}, {NOW}) ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id)"
        ),
        // InnoDB locks the row before it judges the condition. The lock name reads
        // `fence`, which no index holds, so the condition cannot be pushed down to the index
        // and judged before the row is locked. A busy lock sets `LAST_INSERT_ID` to 1 as it
        // refuses, which a missing row (nothing judged) leaves at 0: the answer tells a lock
        // held by another session from a row a sweep deleted since the id was looked up.
        try_lock: format!(
            "UPDATE {a} SET fence = LAST_INSERT_ID(fence + 1), owner = ?, used_us = {NOW} \
             WHERE id = ? AND IF(GET_LOCK(CONCAT('{a}:', id + 0 * fence), 0) = 1, TRUE, LAST_INSERT_ID(1) = 0)"
        ),
        // Every grant holds the row locked while it takes the lock, and so does the delete
        // while it looks whether the lock is free: neither slips between the other's steps.
        sweep: Stmt::new(
            format!(
                "DELETE FROM {a} WHERE used_us <= {NOW} - ? AND IS_FREE_LOCK(CONCAT('{a}:', id)) = 1 LIMIT {SWEEP_BATCH}"
            ),
            &[KeepUs],
            Reply::Done,
        ),
        orphan: None,
    }
}
