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
    let holder = start_holding(url, &["busy-lock"], &dir.join("holding"), "");
    for wait in ["300ms", "0"] {
        let out = output(dlock(url).args(["run", "--wait", wait, "busy-lock", "--", "true"]));
        assert_eq!(code(&out), 75, "--wait {wait}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "one line on stderr: {stderr}");
        assert!(stderr.contains("busy-lock"), "{stderr}");
    }
    // SIGTERM to dlock is forwarded to the command, which ends, and dlock with it.
    assert_eq!(terminate(holder).code(), Some(143), "the command's own exit after SIGTERM comes through");
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

/// Starts `dlock run ARGS -- sh -c '<touch marker>; sleep 30'` and returns once the
/// command runs (its marker exists).
fn start_holding(url: &str, args: &[&str], marker: &Path, before: &str) -> std::process::Child {
    start_running(url, "run", args, marker, before)
}

/// As [`start_holding`], for any subcommand that runs a command (`run`, `elect`).
fn start_running(url: &str, sub: &str, args: &[&str], marker: &Path, before: &str) -> std::process::Child {
    let script = format!("trap 'exit 143' TERM; {before} touch {}; sleep 30 & wait", marker.display());
    let holder = dlock(url)
        .arg(sub)
        .args(args)
        .args(["--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn holder");
    let started = Instant::now();
    while !marker.exists() {
        assert!(started.elapsed() < Duration::from_secs(30), "the holder never got the lock");
        std::thread::sleep(Duration::from_millis(20));
    }
    holder
}

fn terminate(mut holder: std::process::Child) -> std::process::ExitStatus {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(holder.id() as i32), nix::sys::signal::Signal::SIGTERM)
        .expect("signal the holder");
    holder.wait().expect("wait for the holder")
}

/// `--names`: every lock is held while the command runs, the command sees every name and
/// token, and a multi-lock that cannot get one part holds none of them.
fn names_hold_every_lock(url: &str, dir: &Path) {
    let (marker, seen) = (dir.join("multi-holding"), dir.join("multi-env"));
    let env = format!("echo \"$DLOCK_NAMES $DLOCK_TOKENS\" > {};", seen.display());
    let holder = start_holding(url, &["--names", "multi-b,multi-a"], &marker, &env);
    for name in ["multi-a", "multi-b"] {
        let out = output(dlock(url).args(["run", "--wait", "0", name, "--", "true"]));
        assert_eq!(code(&out), 75, "{name} is a part of the running multi-lock: {out:?}");
    }
    let out = output(dlock(url).args(["run", "--wait", "300ms", "--names", "multi-c,multi-a", "--", "true"]));
    assert_eq!(code(&out), 75, "{out:?}");
    let out = output(dlock(url).args(["run", "--wait", "0", "multi-c", "--", "true"]));
    assert_eq!(code(&out), 0, "the failed multi-lock left multi-c held: {out:?}");
    assert_eq!(terminate(holder).code(), Some(143));
    let seen = std::fs::read_to_string(&seen).expect("the command wrote its environment");
    let (names, tokens) = seen.trim().split_once(' ').expect("names and tokens");
    assert_eq!(names, "multi-a,multi-b", "taken in one global order");
    let tokens: Vec<&str> = tokens.split(',').collect();
    assert!(tokens.len() == 2 && tokens[0].starts_with("multi-a=") && tokens[1].starts_with("multi-b="), "{tokens:?}");
}

/// `--once`: a failed run is not remembered, a successful one is; a later run exits 79
/// with the stored status and does not run the command; a run while another is under
/// way exits 75.
fn once_runs_at_most_once(url: &str, dir: &Path) {
    let out = output(dlock(url).args(["run", "--once", "job-1", "--", "sh", "-c", "exit 3"]));
    assert_eq!(code(&out), 3, "a failing run passes its code through: {out:?}");
    let out = output(dlock(url).args(["run", "--once", "job-1", "--", "true"]));
    assert_eq!(code(&out), 0, "after a failure the key runs again: {out:?}");
    let again = dir.join("ran-again");
    let out = output(dlock(url).args(["run", "--once", "job-1", "--", "touch"]).arg(&again));
    assert_eq!(code(&out), 79, "{out:?}");
    assert!(!again.exists(), "the command ran a second time");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("job-1") && stderr.contains("exit status 0"), "{stderr}");

    let marker = dir.join("once-running");
    let holder = start_holding(url, &["--once", "job-2"], &marker, "");
    let out = output(dlock(url).args(["run", "--once", "job-2", "--", "true"]));
    assert_eq!(code(&out), 75, "a duplicate during the run: {out:?}");
    assert_eq!(terminate(holder).code(), Some(143));
    let out = output(dlock(url).args(["run", "--once", "job-2", "--", "true"]));
    assert_eq!(code(&out), 0, "an interrupted run is not remembered: {out:?}");
}

/// `--read` and `--permits` on a backend that has them: readers run together and a
/// writer waits for them; at most N commands hold one of N permits. On a backend without
/// them, both are refused as usage errors (64) and nothing runs.
fn readers_and_permits(url: &str, dir: &Path, supported: bool) {
    if !supported {
        for args in [&["run", "--read", "rw", "--", "false"][..], &["run", "--permits", "2", "pool", "--", "false"]] {
            let out = output(dlock(url).args(args));
            assert_eq!(code(&out), 64, "{args:?}: {out:?}");
            assert!(String::from_utf8_lossy(&out.stderr).contains("unsupported"), "{out:?}");
        }
        return;
    }
    let reader = start_holding(url, &["--read", "rw"], &dir.join("reading"), "");
    let out = output(dlock(url).args(["run", "--read", "--wait", "0", "rw", "--", "true"]));
    assert_eq!(code(&out), 0, "a second reader runs beside the first: {out:?}");
    for writer in
        [&["run", "--wait", "0", "rw", "--", "true"][..], &["run", "--write", "--wait", "300ms", "rw", "--", "true"]]
    {
        let out = output(dlock(url).args(writer));
        assert_eq!(code(&out), 75, "{writer:?} beside a reader: {out:?}");
    }
    assert_eq!(terminate(reader).code(), Some(143));
    let out = output(dlock(url).args(["run", "--write", "--wait", "0", "rw", "--", "true"]));
    assert_eq!(code(&out), 0, "the writer once the reader left: {out:?}");

    let first = start_holding(url, &["--permits", "2", "pool"], &dir.join("permit-1"), "");
    let second = start_holding(url, &["--permits", "2", "pool"], &dir.join("permit-2"), "");
    let out = output(dlock(url).args(["run", "--permits", "2", "--wait", "0", "pool", "--", "true"]));
    assert_eq!(code(&out), 75, "a third of two permits: {out:?}");
    assert_eq!(terminate(first).code(), Some(143));
    let out = output(dlock(url).args(["run", "--permits", "2", "--wait", "0", "pool", "--", "true"]));
    assert_eq!(code(&out), 0, "a permit given back: {out:?}");
    assert_eq!(terminate(second).code(), Some(143));
}

/// `dlock elect`: the leader's command runs and sees its term; a second candidate is
/// not elected while it runs (75 past --wait); once the leader's command ends, the next
/// leader's term is higher.
fn elect_runs_while_leading(url: &str, dir: &Path) {
    let term_file = dir.join("term");
    let before = format!("echo \"$DLOCK_TERM\" > {};", term_file.display());
    let leader = start_running(url, "elect", &["--value", "first", "leader"], &dir.join("leading"), &before);
    let out = output(dlock(url).args(["elect", "--wait", "300ms", "leader", "--", "true"]));
    assert_eq!(code(&out), 75, "a second leader: {out:?}");
    assert_eq!(terminate(leader).code(), Some(143));
    let first: u64 = std::fs::read_to_string(&term_file).expect("term").trim().parse().expect("DLOCK_TERM is a number");
    let out = output(dlock(url).args(["elect", "--wait", "5s", "leader", "--", "sh", "-c", "echo $DLOCK_TERM"]));
    assert_eq!(code(&out), 0, "{out:?}");
    let second: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("a term");
    assert!(second > first, "term {second} after term {first}");
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

/// A short `dlock bench` of the scenarios that count: every herd point reports at least
/// one attempt per grant (the client counts what it sends), and the tasks of one client
/// hand the lock to each other on every grant.
#[test]
fn bench_herd_and_shared_report_what_they_count() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    let out_dir = dir.path().join("out");
    let out = output(
        Command::new(env!("CARGO_BIN_EXE_dlock"))
            .args([
                "bench",
                "--url",
                &url,
                "--scenario",
                "herd",
                "--scenario",
                "shared",
                "--waiters",
                "2,16",
                "--duration",
                "300ms",
                "--out",
            ])
            .arg(&out_dir),
    );
    assert_eq!(code(&out), 0, "{out:?}");
    let rows: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("bench.json")).unwrap()).unwrap();
    let value = |scenario: &str, unit: &str| -> Vec<f64> {
        let rows = rows.as_array().unwrap().iter();
        rows.filter(|r| r["scenario"] == scenario && r["unit"] == unit)
            .map(|r| r["library"].as_f64().unwrap())
            .collect()
    };
    let per_grant = value("herd", "attempts per grant");
    assert_eq!(per_grant.len(), 2, "{rows}");
    assert!(per_grant.iter().all(|&a| a >= 1.0), "fewer attempts than grants: {per_grant:?}");
    let (grants, handoffs) = (value("shared", "handoffs/s"), value("shared", "handoffs between tasks/s"));
    assert!(grants[0] > 0.0 && handoffs[0] >= grants[0] * 0.8, "the tasks did not take turns: {grants:?} {handoffs:?}");
}

#[test]
fn an_unreachable_database_is_reported_with_its_cause() {
    let port = free_port().unwrap();
    let url = format!("postgres://postgres@127.0.0.1:{port}/dlock?connect_timeout=1s");
    let out = output(dlock(&url).args(["run", "x", "--", "true"]));
    assert_eq!(code(&out), 69, "{out:?}");
    let text = String::from_utf8_lossy(&out.stderr);
    // Where, and why: the server and the refused connection, not only the time it took.
    assert!(text.contains(&format!("127.0.0.1:{port}")), "the server is not named: {text}");
    assert!(text.to_lowercase().contains("connection refused"), "the cause is not said: {text}");
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
        names_hold_every_lock(&server.url(), dir.path());
        readers_and_permits(&server.url(), dir.path(), true);
        elect_runs_while_leading(&server.url(), dir.path());
        once_runs_at_most_once(&server.url(), dir.path());
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
        names_hold_every_lock(&server.url(), dir.path());
        readers_and_permits(&server.url(), dir.path(), true);
        elect_runs_while_leading(&server.url(), dir.path());
        once_runs_at_most_once(&server.url(), dir.path());
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
        names_hold_every_lock(&url(dir.path()), dir.path());
        readers_and_permits(&url(dir.path()), dir.path(), true);
        elect_runs_while_leading(&url(dir.path()), dir.path());
        once_runs_at_most_once(&url(dir.path()), dir.path());
    }

    /// `dlock gc` removes the row of a name idle for the URL's keep time, and the name's
    /// next grant still gets a higher token.
    #[test]
    fn gc_removes_idle_names_and_tokens_still_rise() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("{}?keep_idle=200ms", url(dir.path()));
        let token = |url: &str| -> u64 {
            let out = output(dlock(url).args(["run", "gc-probe", "--", "sh", "-c", "echo $DLOCK_TOKEN"]));
            assert_eq!(code(&out), 0, "{out:?}");
            String::from_utf8_lossy(&out.stdout).trim().parse().expect("a token")
        };
        let first = token(&url);
        std::thread::sleep(Duration::from_millis(400));
        let out = output(dlock(&url).arg("gc"));
        assert_eq!(code(&out), 0, "{out:?}");
        let report = String::from_utf8_lossy(&out.stdout);
        let removed: u64 = report
            .lines()
            .find_map(|line| line.strip_prefix("removed"))
            .map(|n| n.trim().parse().expect("a count"))
            .unwrap_or_else(|| panic!("no count in {report}"));
        assert!(removed >= 1, "the idle name stayed: {report}");
        assert!(token(&url) > first, "a swept name came back with a lower token");
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
        names_hold_every_lock(&server.url(), dir.path());
        readers_and_permits(&server.url(), dir.path(), true);
        elect_runs_while_leading(&server.url(), dir.path());
        once_runs_at_most_once(&server.url(), dir.path());
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
        names_hold_every_lock(&server.url(), dir.path());
        readers_and_permits(&server.url(), dir.path(), true);
        elect_runs_while_leading(&server.url(), dir.path());
        once_runs_at_most_once(&server.url(), dir.path());
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
        names_hold_every_lock(&server.url(), dir.path());
        readers_and_permits(&server.url(), dir.path(), true);
        elect_runs_while_leading(&server.url(), dir.path());
        once_runs_at_most_once(&server.url(), dir.path());
    }
}

mod redlock {
    use super::*;
    use dlock_testkit::supervisor::redis::{RedisConfig, RedisMasters};

    fn masters() -> RedisMasters {
        RedisMasters::start(5, &RedisConfig { persistent: true, ..RedisConfig::default() }).expect("start 5 masters")
    }

    /// Eight processes start at once, each connecting to five masters and loading the
    /// scripts on each: on a shared two-core machine a node can take longer than the
    /// 100 ms default node timeout to answer then.
    fn url(masters: &RedisMasters) -> String {
        format!("{}?node_timeout=500ms", masters.url())
    }

    #[test]
    fn processes_exclude_each_other() {
        let masters = masters();
        counts_exactly(&url(&masters), tempfile::tempdir().unwrap().path());
    }

    #[test]
    fn exit_codes() {
        let masters = masters();
        let dir = tempfile::tempdir().unwrap();
        passes_exit_code(&url(&masters));
        tempfail_when_held(&url(&masters), dir.path());
        lost_lease_stops_the_command(&url(&masters), dir.path());
        names_hold_every_lock(&url(&masters), dir.path());
        readers_and_permits(&url(&masters), dir.path(), false);
        elect_runs_while_leading(&url(&masters), dir.path());
        once_runs_at_most_once(&url(&masters), dir.path());
    }
}
