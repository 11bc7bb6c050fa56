//! Each mutant the nemesis can plant must be caught: the run exits 1 with the counter
//! that names the defect above zero. A harness that has never reported anything but
//! zeros has not shown that it can.
//!
//! One topology per kind of server a mutant applies to runs here; `scripts/nemesis`
//! runs the whole matrix.

mod common;

use common::nemesis;

/// Runs `mutant` on `topology` for 15 s and checks that `counter` caught it.
fn caught(topology: &str, mutant: &str, counter: &str) {
    caught_in(topology, mutant, counter, "15s");
}

fn caught_in(topology: &str, mutant: &str, counter: &str, duration: &str) {
    let run = nemesis(topology, duration, &["--mutant", mutant]);
    assert_eq!(run.code, Some(1), "the {mutant} mutant on {topology} went unnoticed:\n{}", run.output);
    assert!(run.count(counter) > 0, "{counter} stayed 0:\n{}", run.output);
}

#[test]
fn evict_on_sqlite() {
    caught("sqlite", "evict", "broken_validity_claims");
}

#[test]
fn evict_on_redlock() {
    caught("redlock", "evict", "broken_validity_claims");
}

#[test]
fn evict_on_zookeeper() {
    caught("zk", "evict", "broken_validity_claims");
}

#[test]
fn evict_on_etcd() {
    caught("etcd", "evict", "broken_validity_claims");
}

#[test]
fn fence_reset_on_redis() {
    caught("redis", "fence-reset", "token_regressions");
}

#[test]
fn fence_reset_on_mariadb() {
    caught("mariadb", "fence-reset", "token_regressions");
}

#[test]
fn never_renews_on_redis() {
    caught("redis", "never-renews", "broken_validity_claims");
}

#[test]
fn never_renews_on_postgres() {
    caught("postgres", "never-renews", "broken_validity_claims");
}

/// Renewals every third of the ttl keep a hold alive on a server that expires it at
/// half the ttl; only a renewal held up past half the ttl (a delayed link, a pause)
/// shows it, so this run is longer.
#[test]
fn half_ttl_on_redis() {
    caught_in("redis", "half-ttl", "broken_validity_claims", "30s");
}

/// Without the check, paused holders write after their lease ran out: the fenced
/// register refuses those writes, and it is the register, not the lock, that keeps
/// "stale writes accepted" at zero. The run is clean (exit 0).
#[test]
fn no_self_check_on_sqlite_is_held_by_the_register() {
    let run = nemesis("sqlite", "15s", &["--mutant", "no-self-check"]);
    assert_eq!(run.code, Some(0), "{}", run.output);
    assert!(run.count("writes_refused") > 0, "no write past a lease was refused:\n{}", run.output);
    assert_eq!(run.count("stale_writes_accepted"), 0, "{}", run.output);
}

/// A write sent after its hold was released, while the next holder has been granted
/// but has not written yet: the register has not seen the newer token, so fencing cannot
/// refuse it, and the stale-write counter is what catches it.
#[test]
fn late_write_on_sqlite() {
    caught("sqlite", "late-write", "stale_writes_accepted");
}

#[test]
fn a_mutant_that_does_not_apply_is_refused() {
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_nemesis"))
        .args(["--topology", "etcd", "--mutant", "fence-reset", "--duration", "5s"])
        .output()
        .expect("nemesis runs");
    assert_eq!(run.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&run.stderr).contains("does not apply"));
}
