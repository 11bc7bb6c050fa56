//! A short nemesis run per topology and mode: any anomaly (a token regression, a stale
//! write accepted, a grant beside a holder whose lease was valid by its own clock, work
//! run twice) fails it, and so does a run that is no evidence. Every schedule opens with
//! a pause of the holder past its ttl and, where there are servers, a kill of the leader
//! or primary; the test checks that both happened to a hold and that leases renewed.

mod common;

use common::nemesis;

fn short_run(topology: &str, extra: &[&str]) {
    run_for(topology, "20s", extra)
}

fn run_for(topology: &str, duration: &str, extra: &[&str]) {
    let run = nemesis(topology, duration, extra);
    let report = &run.output;
    assert_eq!(run.code, Some(0), "nemesis on {topology} {extra:?} failed:\n{report}");
    assert_eq!(run.count("anomalies"), 0, "{report}");
    assert_eq!(run.count("stale_writes_accepted"), 0, "{report}");
    assert_eq!(run.count("token_regressions"), 0, "{report}");
    assert_eq!(run.verdict["proves_nothing"], serde_json::json!([]), "{report}");
    if extra.contains(&"idempotent") {
        assert!(run.count("work_runs") >= 10, "too little work to judge:\n{report}");
        return;
    }
    assert!(run.count("holds") >= 10, "too few holds to judge:\n{report}");
    assert!(run.count("holder_paused_past_ttl") >= 1, "no holder was paused past its ttl:\n{report}");
    assert!(run.count("renewals") >= 1, "no lease was renewed:\n{report}");
    assert!(run.count("holds_interrupted") >= 1, "no fault hit a hold:\n{report}");
    if topology != "sqlite" {
        assert!(run.count("server_faults_played") >= 1, "no server fault:\n{report}");
    }
}

#[test]
fn sqlite() {
    short_run("sqlite", &[]);
}

#[test]
fn postgres() {
    short_run("postgres", &[]);
}

#[test]
fn postgres_advisory() {
    short_run("postgres-advisory", &[]);
}

#[test]
fn mariadb() {
    short_run("mariadb", &[]);
}

#[test]
fn redis() {
    short_run("redis", &[]);
}

#[test]
fn redlock() {
    short_run("redlock", &[]);
}

#[test]
fn zookeeper() {
    short_run("zk", &[]);
}

#[test]
fn etcd() {
    short_run("etcd", &[]);
}

#[test]
fn zookeeper_ensemble() {
    short_run("zk-ensemble", &[]);
}

#[test]
fn etcd_cluster() {
    short_run("etcd-cluster", &[]);
}

#[test]
fn redis_sentinel() {
    // Every failover leaves the group without a primary for seconds (a third of the run
    // or more is unavailable by design), so it takes longer to gather holds to judge.
    run_for("redis-sentinel", "30s", &[]);
}

/// Failovers by hand, kills (a primary's replica then promoted), and moves of the
/// lock's slot, with `wait_replicas=1`; client link faults reach every node through the
/// client's own proxies.
#[test]
fn redis_cluster() {
    short_run("redis-cluster", &[]);
}

#[test]
fn readers_and_writers_on_redis() {
    short_run("redis", &["--mode", "rw"]);
}

#[test]
fn permits_of_mixed_counts_on_etcd() {
    short_run("etcd", &["--mode", "permits"]);
}

#[test]
fn idempotent_work_on_postgres() {
    short_run("postgres", &["--mode", "idempotent"]);
}
