//! MySQL 8 and MariaDB: one `INSERT … ON DUPLICATE KEY UPDATE` per acquire, which answers
//! with the granted token through `LAST_INSERT_ID(expr)` (0 when busy), since neither has
//! `RETURNING` on an upsert.
//!
//! MySQL evaluates the assignments of `ON DUPLICATE KEY UPDATE` and `UPDATE` from left to
//! right, each seeing the values assigned before it: the order below is deliberate (the
//! decision columns `owner` and `expires_us` come last, `expires_us` after `owner`).
//! Names and owners are `VARBINARY`, so they compare byte by byte and a 1024-byte name
//! fits InnoDB's 3072-byte key limit.

use super::{LeaseSql, Param::*, Reply, Stmt, CLOCK_SLACK_US};

/// Microseconds since the epoch at the start of the statement (the session time zone is
/// UTC, so `UNIX_TIMESTAMP(NOW(6))` is exact).
const NOW: &str = "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)";

pub(super) fn lease_sql(t: &str) -> LeaseSql {
    let free = format!("(owner IS NULL OR expires_us <= {NOW})");
    // The batch as a table; names compare as bytes, so the join uses the primary key.
    let batch = "JSON_TABLE(?, '$[*]' COLUMNS (n VARCHAR(1024) PATH '$.n', o VARCHAR(256) PATH '$.o', \
                 f BIGINT PATH '$.f', t BIGINT PATH '$.t')) AS d \
                 ON l.name = CAST(d.n AS BINARY) AND l.owner = CAST(d.o AS BINARY) AND l.fence = d.f";
    LeaseSql {
        create: vec![format!(
            "CREATE TABLE IF NOT EXISTS {t} (\
             name VARBINARY(1024) NOT NULL PRIMARY KEY, \
             owner VARBINARY(256) NULL, \
             holds BIGINT NOT NULL DEFAULT 0, \
             fence BIGINT NOT NULL DEFAULT 0, \
             expires_us BIGINT NOT NULL DEFAULT 0, \
             grants VARBINARY(16384) NOT NULL DEFAULT '') ENGINE=InnoDB"
        )],
        acquire: Stmt::new(
            format!(
                "INSERT INTO {t} (name, owner, holds, fence, expires_us, grants) \
                 VALUES (?, ?, 1, LAST_INSERT_ID(1), {NOW} + ? + {CLOCK_SLACK_US}, CONCAT(',', ?, ',')) \
                 ON DUPLICATE KEY UPDATE \
                 fence = IF({free}, LAST_INSERT_ID(fence + 1), IF(owner = ?, LAST_INSERT_ID(fence), fence + LAST_INSERT_ID(0))), \
                 holds = IF({free}, 1, IF(owner = ?, holds + 1, holds)), \
                 grants = IF({free}, CONCAT(',', ?, ','), IF(owner = ?, CONCAT(grants, ?, ','), grants)), \
                 owner = IF({free}, ?, owner), \
                 expires_us = IF(owner = ?, GREATEST(expires_us, {NOW} + ? + {CLOCK_SLACK_US}), expires_us)"
            ),
            &[Name, Owner, TtlUs, Grant, Owner, Owner, Grant, Owner, Grant, Owner, Owner, TtlUs],
            Reply::Done,
        ),
        inspect: Stmt::new(
            format!("SELECT owner, fence, holds, expires_us - {NOW} FROM {t} WHERE name = ?"),
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
            format!("UPDATE {t} SET owner = NULL, holds = 0, expires_us = 0, grants = '' WHERE name = ?"),
            &[Name],
            Reply::Done,
        ),
        upgrade: vec![(
            format!("SELECT grants FROM {t} WHERE 1 = 0"),
            format!("ALTER TABLE {t} ADD COLUMN grants VARBINARY(16384) NOT NULL DEFAULT ''"),
        )],
        channel: None,
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
         expires_us = IF(holds = 0, 0, expires_us) \
         WHERE name = ? AND owner = ? AND LOCATE(CONCAT(',', ?, ','), grants) > 0 {extra}"
    )
}
