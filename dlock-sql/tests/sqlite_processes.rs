//! Separate OS processes lock one SQLite file: they exclude each other. Each child process
//! (this test binary run again, in child mode) does a non-atomic read, pause and write of a
//! shared counter file under the lock, many times: any overlap of two holders loses an
//! increment, and any token that fails to increase shows in the log of grants.

// The shared fixtures start every kind of server; the tests need every database feature.
#![cfg(all(feature = "postgres", feature = "mysql", feature = "sqlite"))]

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use dlock_core::{Backoff, ConnectConfig, LockName, LockOptions, Locker};

const CHILD_ENV: &str = "DLOCK_SQLITE_CHILD_DIR";
const PROCESSES: usize = 3;
const ROUNDS: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_exclude_each_other() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("counter"), "0").unwrap();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..PROCESSES)
        .map(|i| {
            Command::new(&exe)
                .args(["--exact", "child_process", "--nocapture", "--test-threads", "1"])
                .env(CHILD_ENV, dir.path())
                .env("DLOCK_SQLITE_CHILD_ID", i.to_string())
                .spawn()
                .expect("spawn a child process")
        })
        .collect();
    for mut child in children {
        let status = tokio::task::spawn_blocking(move || child.wait()).await.unwrap().unwrap();
        assert!(status.success(), "a child process failed: {status}");
    }
    let count: usize = std::fs::read_to_string(dir.path().join("counter")).unwrap().trim().parse().unwrap();
    assert_eq!(count, PROCESSES * ROUNDS, "increments were lost: two processes held the lock at once");
    let mut tokens: Vec<u64> =
        std::fs::read_to_string(dir.path().join("tokens")).unwrap().lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(tokens.len(), PROCESSES * ROUNDS);
    // Appended under the lock, so in grant order: strictly increasing.
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "tokens out of order: {tokens:?}");
    tokens.dedup();
    assert_eq!(tokens.len(), PROCESSES * ROUNDS, "a token was granted twice");
}

/// The body of a child process; does nothing when run as an ordinary test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_process() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else { return };
    let dir = Path::new(&dir);
    let url = format!("sqlite://{}", dir.join("locks.db").display());
    let config =
        dlock_sql::SqlConfig::from_url(&url).unwrap().with_op_timeout(Duration::from_secs(5)).with_pool_size(2);
    let locker = dlock_sql::connect(config).await.expect("connect");
    let name = LockName::new("shared/counter").unwrap();
    let opts = LockOptions::watchdog(Duration::from_secs(5))
        .wait(Duration::from_secs(120))
        .backoff(Backoff::new(Duration::from_millis(1), Duration::from_millis(20)));
    for _ in 0..ROUNDS {
        let lease = locker.acquire(&name, &opts).await.expect("acquire");
        let counter = dir.join("counter");
        let seen: usize = std::fs::read_to_string(&counter).unwrap().trim().parse().unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
        std::fs::write(&counter, (seen + 1).to_string()).unwrap();
        let mut log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("tokens")).unwrap();
        writeln!(log, "{}", lease.token()).unwrap();
        lease.release().await.expect("release");
    }
}
