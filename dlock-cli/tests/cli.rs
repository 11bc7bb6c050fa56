//! The `dlock` binary, spawned for real: exclusion between processes on every backend the
//! harness can start, and each of its own exit codes provoked.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use dlock_testkit::supervisor::free_port;

/// The binary under test.
fn dlock(url: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dlock"));
    cmd.arg("--url").arg(url).env_remove("DLOCK_URL");
    cmd
}

fn output(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().expect("spawn dlock")
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or_else(|| panic!("dlock was killed by a signal: {out:?}"))
}

/// 8 `dlock run` processes at once, 3 rounds, each incrementing a number in a file with
/// read, sleep, write: the count comes out exact, and every command saw its token.
fn counts_exactly(url: &str, dir: &Path) {
    const PROCESSES: usize = 8;
    const ROUNDS: usize = 3;
    let file = dir.join("counter");
    let tokens = dir.join("tokens");
    std::fs::write(&file, "0").unwrap();
    let script = format!(
        "n=$(cat {f}); sleep 0.05; echo $((n + 1)) > {f}; echo \"$DLOCK_TOKEN $DLOCK_NAME\" >> {t}",
        f = file.display(),
        t = tokens.display()
    );
    for _ in 0..ROUNDS {
        let children: Vec<_> = (0..PROCESSES)
            .map(|_| {
                dlock(url)
                    .args(["run", "--wait", "60s", "--ttl", "10s", "cli-counter", "--", "sh", "-c", &script])
                    .stdin(Stdio::null())
                    .spawn()
                    .expect("spawn dlock run")
            })
            .collect();
        for child in children {
            let out = child.wait_with_output().expect("wait for dlock run");
            assert!(out.status.success(), "dlock run failed: {out:?}");
        }
    }
    let count: usize = std::fs::read_to_string(&file).unwrap().trim().parse().unwrap();
    assert_eq!(count, PROCESSES * ROUNDS, "increments were lost: the processes did not exclude each other");
    let seen = std::fs::read_to_string(&tokens).unwrap();
    let mut tokens: Vec<u64> = seen
        .lines()
        .map(|line| {
            let (token, name) = line.split_once(' ').unwrap();
            assert_eq!(name, "cli-counter");
            token.parse().expect("DLOCK_TOKEN is a decimal number")
        })
        .collect();
    let in_order = tokens.clone();
    tokens.dedup();
    assert_eq!(tokens.len(), PROCESSES * ROUNDS, "two holders saw the same token");
    assert!(in_order.windows(2).all(|w| w[0] < w[1]), "tokens did not increase in grant order: {in_order:?}");
}

/// 75 when the lock is held past `--wait` (and at once with `--wait 0`).
fn tempfail_when_held(url: &str, dir: &Path) {
    let marker = dir.join("holding");
    let mut holder = dlock(url)
        .args(["run", "busy-lock", "--", "sh", "-c"])
        .arg(format!("trap 'exit 143' TERM; touch {}; sleep 30 & wait", marker.display()))
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn holder");
    let started = Instant::now();
    while !marker.exists() {
        assert!(started.elapsed() < Duration::from_secs(30), "the holder never got the lock");
        std::thread::sleep(Duration::from_millis(20));
    }
    for wait in ["300ms", "0"] {
        let out = output(dlock(url).args(["run", "--wait", wait, "busy-lock", "--", "true"]));
        assert_eq!(code(&out), 75, "--wait {wait}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "one line on stderr: {stderr}");
        assert!(stderr.contains("busy-lock"), "{stderr}");
    }
    // SIGTERM to dlock is forwarded to the command, which ends, and dlock with it.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(holder.id() as i32), nix::sys::signal::Signal::SIGTERM)
        .expect("signal the holder");
    let status = holder.wait().expect("wait for the holder");
    assert_eq!(status.code(), Some(143), "the command's own exit after SIGTERM comes through");
}

/// 76 when the lease is lost while the command runs: a fixed lease runs out, the command
/// gets SIGTERM (its trap writes a marker) and dlock exits 76.
fn lost_lease_stops_the_command(url: &str, dir: &Path) {
    let marker = dir.join("terminated");
    let script = format!("trap 'touch {}; exit 143' TERM; sleep 60 & wait", marker.display());
    let started = Instant::now();
    let out = output(dlock(url).args(["run", "--fixed", "--ttl", "1s", "lost-lock", "--", "sh", "-c", &script]));
    assert_eq!(code(&out), 76, "{out:?}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the lost lease was noticed only after {:?}",
        started.elapsed()
    );
    assert!(marker.exists(), "the command did not get SIGTERM");
    assert!(String::from_utf8_lossy(&out.stderr).contains("lost"), "{out:?}");
}

/// The command's own exit code comes through.
fn passes_exit_code(url: &str) {
    let out = output(dlock(url).args(["run", "exit-code", "--", "sh", "-c", "exit 7"]));
    assert_eq!(code(&out), 7, "{out:?}");
}

#[test]
fn usage_errors_exit_64() {
    for args in [
        &["--url", "nope://somewhere", "run", "x", "--", "true"][..],
        &["--url", "memory://x", "run", "x"][..],
        &["--url", "memory://x", "run", "--ttl", "0s", "x", "--", "true"][..],
        &["--url", "memory://x", "run", "", "--", "true"][..],
        &["--url", "memory://x", "frobnicate"][..],
    ] {
        let out = output(Command::new(env!("CARGO_BIN_EXE_dlock")).args(args));
        assert_eq!(code(&out), 64, "dlock {args:?}: {out:?}");
        assert!(!out.stderr.is_empty(), "dlock {args:?} says nothing");
    }
}

#[test]
fn unreachable_backend_exits_69() {
    let port = free_port().unwrap();
    let started = Instant::now();
    let out = output(dlock(&format!("redis://127.0.0.1:{port}?connect_timeout=1s")).args(["run", "x", "--", "true"]));
    assert_eq!(code(&out), 69, "{out:?}");
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unavailable"), "{out:?}");
}

mod redis {
    use super::*;
    use dlock_testkit::supervisor::redis::{RedisConfig, RedisServer};

    fn server() -> RedisServer {
        RedisServer::start(&RedisConfig::default()).expect("start redis-server")
    }

    #[test]
    fn processes_exclude_each_other() {
        let server = server();
        counts_exactly(&server.url(), tempfile::tempdir().unwrap().path());
    }

    #[test]
    fn exit_codes() {
        let server = server();
        let dir = tempfile::tempdir().unwrap();
        passes_exit_code(&server.url());
        tempfail_when_held(&server.url(), dir.path());
        lost_lease_stops_the_command(&server.url(), dir.path());
    }
}

mod zookeeper {
    use super::*;
    use dlock_testkit::supervisor::zookeeper::ZooKeeperServer;

    #[test]
    fn processes_exclude_each_other() {
        let server = ZooKeeperServer::start().expect("start ZooKeeper");
        counts_exactly(&server.url(), tempfile::tempdir().unwrap().path());
    }

    #[test]
    fn exit_codes() {
        let server = ZooKeeperServer::start().expect("start ZooKeeper");
        let dir = tempfile::tempdir().unwrap();
        passes_exit_code(&server.url());
        tempfail_when_held(&server.url(), dir.path());
        lost_lease_stops_the_command(&server.url(), dir.path());
    }
}

mod sqlite {
    use super::*;

    fn url(dir: &Path) -> String {
        format!("sqlite://{}", dir.join("locks.db").display())
    }

    #[test]
    fn processes_exclude_each_other() {
        let dir = tempfile::tempdir().unwrap();
        counts_exactly(&url(dir.path()), dir.path());
    }

    #[test]
    fn exit_codes() {
        let dir = tempfile::tempdir().unwrap();
        passes_exit_code(&url(dir.path()));
        tempfail_when_held(&url(dir.path()), dir.path());
        lost_lease_stops_the_command(&url(dir.path()), dir.path());
    }

    /// With no --url and no DLOCK_URL, the command uses a SQLite file in the data directory.
    #[test]
    fn the_default_is_a_sqlite_file_in_the_data_directory() {
        let home = tempfile::tempdir().unwrap();
        let out =
            output(
                Command::new(env!("CARGO_BIN_EXE_dlock"))
                    .env_remove("DLOCK_URL")
                    .env("XDG_DATA_HOME", home.path())
                    .args(["run", "default-lock", "--", "sh", "-c", "echo $DLOCK_URL"]),
            );
        assert!(out.status.success(), "{out:?}");
        let url = String::from_utf8_lossy(&out.stdout);
        assert!(url.trim().starts_with("sqlite://"), "{url}");
        assert!(home.path().join("dlock/locks.db").exists(), "no database in {}", home.path().display());
    }

    #[test]
    fn demo_runs_on_the_embedded_default() {
        let out = output(Command::new(env!("CARGO_BIN_EXE_dlock")).env_remove("DLOCK_URL").arg("demo"));
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("with a lock:    sold 10 items from a stock of 10; the counter says 0 left"), "{text}");
        assert!(text.contains("refused"), "{text}");
    }
}

mod postgres {
    use super::*;
    use dlock_testkit::supervisor::postgres::PostgresServer;

    #[test]
    fn processes_exclude_each_other() {
        let server = PostgresServer::start(100).expect("start PostgreSQL");
        counts_exactly(&server.url(), tempfile::tempdir().unwrap().path());
    }

    #[test]
    fn exit_codes() {
        let server = PostgresServer::start(100).expect("start PostgreSQL");
        let dir = tempfile::tempdir().unwrap();
        passes_exit_code(&server.url());
        tempfail_when_held(&server.url(), dir.path());
        lost_lease_stops_the_command(&server.url(), dir.path());
    }
}

mod mariadb {
    use super::*;
    use dlock_testkit::supervisor::mariadb::MariaDbServer;

    #[test]
    fn processes_exclude_each_other() {
        let server = MariaDbServer::start(200).expect("start MariaDB");
        counts_exactly(&server.url(), tempfile::tempdir().unwrap().path());
    }

    #[test]
    fn exit_codes() {
        let server = MariaDbServer::start(200).expect("start MariaDB");
        let dir = tempfile::tempdir().unwrap();
        passes_exit_code(&server.url());
        tempfail_when_held(&server.url(), dir.path());
        lost_lease_stops_the_command(&server.url(), dir.path());
    }
}

#[cfg(feature = "etcd")]
mod etcd {
    use super::*;
    use dlock_testkit::supervisor::etcd::{EtcdConfig, EtcdServer};

    #[test]
    fn processes_exclude_each_other() {
        let server = EtcdServer::start(&EtcdConfig::default()).expect("start etcd");
        counts_exactly(&server.url(), tempfile::tempdir().unwrap().path());
    }

    #[test]
    fn exit_codes() {
        let server = EtcdServer::start(&EtcdConfig::default()).expect("start etcd");
        let dir = tempfile::tempdir().unwrap();
        passes_exit_code(&server.url());
        tempfail_when_held(&server.url(), dir.path());
        lost_lease_stops_the_command(&server.url(), dir.path());
    }
}

mod redlock {
    use super::*;
    use dlock_testkit::supervisor::redis::{RedisConfig, RedisMasters};

    fn masters() -> RedisMasters {
        RedisMasters::start(5, &RedisConfig { persistent: true, ..RedisConfig::default() }).expect("start 5 masters")
    }

    #[test]
    fn processes_exclude_each_other() {
        let masters = masters();
        counts_exactly(&masters.url(), tempfile::tempdir().unwrap().path());
    }

    #[test]
    fn exit_codes() {
        let masters = masters();
        let dir = tempfile::tempdir().unwrap();
        passes_exit_code(&masters.url());
        tempfail_when_held(&masters.url(), dir.path());
        lost_lease_stops_the_command(&masters.url(), dir.path());
    }
}
