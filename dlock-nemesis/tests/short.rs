//! A short nemesis run per topology: any anomaly (a token regression, a stale write
//! accepted, a grant inside another holder's claimed validity) fails it, and so does a
//! run that granted nothing.

use std::process::Command;

/// Runs `nemesis` on `topology` for 20 s with 4 clients and a 1 s ttl, and checks its
/// JSON verdict.
fn short_run(topology: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let json = dir.path().join("verdict.json");
    let output = Command::new(env!("CARGO_BIN_EXE_nemesis"))
        .args(["--topology", topology, "--clients", "4", "--duration", "20s", "--ttl", "1s", "--seed", "1"])
        .arg("--json")
        .arg(&json)
        .output()
        .expect("nemesis runs");
    let report = String::from_utf8_lossy(&output.stdout);
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "nemesis on {topology} failed ({}):\n{report}\n{log}", output.status);
    let verdict: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("verdict written")).expect("verdict is JSON");
    assert_eq!(verdict["anomalies"], 0, "{report}");
    assert_eq!(verdict["stale_writes_accepted"], 0, "{report}");
    assert_eq!(verdict["token_regressions"], 0, "{report}");
    assert!(verdict["holds"].as_u64().unwrap_or(0) >= 10, "too few holds to judge:\n{report}\n{log}");
}

#[test]
fn sqlite() {
    short_run("sqlite");
}

#[test]
fn postgres() {
    short_run("postgres");
}

#[test]
fn mariadb() {
    short_run("mariadb");
}

#[test]
fn redis() {
    short_run("redis");
}

#[test]
fn redlock() {
    short_run("redlock");
}

#[test]
fn zookeeper() {
    short_run("zk");
}

#[test]
fn etcd() {
    short_run("etcd");
}

#[test]
fn zookeeper_ensemble() {
    short_run("zk-ensemble");
}

#[test]
fn etcd_cluster() {
    short_run("etcd-cluster");
}

#[test]
fn redis_sentinel() {
    short_run("redis-sentinel");
}
