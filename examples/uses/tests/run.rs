//! Runs every example program against real servers, so that an API change that breaks an
//! example fails the tests: one test per program, each starting the servers it needs on
//! free loopback ports (dlock-testkit's supervisor), running the built binary with the
//! URL, and checking that it exits 0 with the line that says what it did.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use dlock::LockName;
use dlock_testkit::supervisor::etcd::{EtcdConfig, EtcdServer, EtcdTls};
use dlock_testkit::supervisor::mariadb::MariaDbServer;
use dlock_testkit::supervisor::postgres::PostgresServer;
use dlock_testkit::supervisor::redis::{RedisConfig, RedisMasters, RedisSentinel, RedisServer};
use dlock_testkit::supervisor::tls::TestPki;
use dlock_testkit::supervisor::zookeeper::ZooKeeperServer;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// How long one run of an example may take; each takes a few seconds at most.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// Room for the examples' pools (a few connections each, two clients at most).
const PG_CONNECTIONS: u32 = 50;

/// A child process killed when the test ends, so that a failing test leaves none behind.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the example `bin` with `args` (and `env` added, `DLOCK_URL` removed unless given)
/// and returns what it printed, failing unless it exits 0 within [`RUN_TIMEOUT`].
fn run(bin: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let mut command = Command::new(bin);
    command.args(args).env_remove("DLOCK_URL").stdout(Stdio::piped()).stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = Running(command.spawn().unwrap_or_else(|err| panic!("cannot start {bin}: {err}")));
    let (mut stdout, mut stderr) = (child.0.stdout.take().expect("stdout"), child.0.stderr.take().expect("stderr"));
    let (out_tx, out_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (mut out, mut err) = (String::new(), String::new());
        let _ = stdout.read_to_string(&mut out);
        let _ = stderr.read_to_string(&mut err);
        let _ = out_tx.send((out, err));
    });
    let deadline = Instant::now() + RUN_TIMEOUT;
    let status = loop {
        if let Some(status) = child.0.try_wait().expect("wait for the example") {
            break status;
        }
        assert!(Instant::now() < deadline, "{bin} {args:?} still runs after {RUN_TIMEOUT:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let (out, err) = out_rx.recv_timeout(Duration::from_secs(10)).expect("the example's output");
    assert!(status.success(), "{bin} {args:?} exited with {status}\nstdout:\n{out}\nstderr:\n{err}");
    // Shown with the test's output (nextest shows it when a test fails, or with --no-capture).
    print!("{out}");
    out
}

/// The line of `output` that starts with `<program>: `, checked to contain `fragment`.
fn said(output: &str, program: &str, fragment: &str) -> String {
    let prefix = format!("{program}: ");
    let line = output
        .lines()
        .find(|line| line.starts_with(&prefix))
        .unwrap_or_else(|| panic!("{program} printed no line starting with {prefix:?}:\n{output}"));
    assert!(line.contains(fragment), "{program} said {line:?}, without {fragment:?}");
    line.to_string()
}

fn redis() -> RedisServer {
    RedisServer::start(&RedisConfig::default()).expect("start redis-server")
}

fn postgres() -> PostgresServer {
    PostgresServer::start(PG_CONNECTIONS).expect("start PostgreSQL")
}

#[test]
fn redis_watchdog() {
    let server = redis();
    let out = run(env!("CARGO_BIN_EXE_redis_watchdog"), &[&server.url()], &[]);
    said(&out, "redis_watchdog", "wrote 3 parts of reports/nightly fenced by token ");
    // The fenced write landed with the lease's token.
    let fence = server.cli(&["HGET", "reports:nightly", "fence"]).expect("read the report");
    said(&out, "redis_watchdog", &format!("fenced by token {},", fence.trim()));
}

#[test]
fn redis_sentinel() {
    let master = redis();
    let _replica = RedisServer::start_replica_of(&master, &RedisConfig::default()).expect("start a replica");
    let sentinel = RedisSentinel::start(master.addr(), "locks").expect("start a Sentinel");
    // A replica acknowledges within a millisecond here, but the default bound (100 ms) can
    // pass on a machine busy with other tests.
    let url = format!("{}?wait_replicas=1&wait_timeout=2s", sentinel.url());
    let out = run(env!("CARGO_BIN_EXE_redis_sentinel"), &[&url], &[]);
    said(&out, "redis_sentinel", "on the master of group locks with token ");
    said(&out, "redis_sentinel", "acknowledged by 1 replica");
}

#[test]
fn redlock() {
    // Masters as RedLock's safety needs them: an append-only file, fsynced on every write.
    let masters = RedisMasters::start(5, &RedisConfig { persistent: true, ..RedisConfig::default() })
        .expect("start five masters");
    let out = run(env!("CARGO_BIN_EXE_redlock"), &[&masters.url()], &[]);
    said(&out, "redlock", "on a quorum of 3 of 5 masters with token ");
}

#[test]
fn zookeeper_acl() {
    // Digest credentials need nothing on the server's side: the identity is the
    // user:password pair the client presents.
    let server = ZooKeeperServer::start().expect("start ZooKeeper");
    let url = format!("zk://app:s3cret@{}/dlock-examples", server.addr());
    let out = run(env!("CARGO_BIN_EXE_zookeeper_acl"), &[&url], &[]);
    said(&out, "zookeeper_acl", "as digest user app, held jobs/compaction with token ");
    said(&out, "zookeeper_acl", "was refused the lock");
}

#[test]
fn etcd_tls() {
    let pki = TestPki::new("root").expect("test certificates");
    let tls = EtcdTls { cert: pki.path("server.pem"), key: pki.path("server-key.pem"), client_ca: None };
    let server = EtcdServer::start(&EtcdConfig { tls: Some(tls), ..EtcdConfig::default() }).expect("start etcd");
    let ca = pki.path("ca.pem");
    let url = format!("{}?ca={}", server.url(), ca.display());
    assert!(url.starts_with("etcds://"), "{url}");
    let out = run(env!("CARGO_BIN_EXE_etcd_tls"), &[&url], &[]);
    said(&out, "etcd_tls", &format!("over TLS trusting {}, held deploys/production with token ", ca.display()));
}

#[test]
fn sql_lease() {
    // The URL from DLOCK_URL this time, as a deployment would set it.
    let server = postgres();
    let out = run(env!("CARGO_BIN_EXE_sql_lease"), &[], &[("DLOCK_URL", &server.url())]);
    said(&out, "sql_lease", "on postgres (table dlock_leases), held invoices/2026-12 with token ");
    // And on SQLite, which needs no server.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let out = run(env!("CARGO_BIN_EXE_sql_lease"), &[&url], &[]);
    said(&out, "sql_lease", "on sqlite (table dlock_leases)");
}

#[test]
fn advisory() {
    let (postgres, mariadb) = std::thread::scope(|scope| {
        let mariadb = scope.spawn(|| MariaDbServer::start(PG_CONNECTIONS).expect("start MariaDB"));
        (postgres(), mariadb.join().expect("MariaDB's start"))
    });
    let bin = env!("CARGO_BIN_EXE_advisory");
    let out = run(bin, &[&format!("{}?lock=advisory", postgres.url())], &[]);
    said(&out, "advisory", "on postgres, a session held migrations with token ");
    let out = run(bin, &[&format!("{}?lock=advisory", mariadb.url())], &[]);
    said(&out, "advisory", "on mysql, a session held migrations with token ");
    // Without the option the example says what it is about, and fails.
    let mut refused = Command::new(bin);
    refused.arg(postgres.url()).env_remove("DLOCK_URL").stdout(Stdio::null()).stderr(Stdio::null());
    assert_eq!(refused.status().expect("run advisory").code(), Some(1));
}

#[test]
fn row_lock() {
    let server = postgres();
    let out = run(env!("CARGO_BIN_EXE_row_lock"), &[&server.url()], &[]);
    said(&out, "row_lock", "took the stock from 10 to 8; a NOWAIT buyer meanwhile got \"the row is locked");
}

#[test]
fn fenced() {
    let server = postgres();
    let out = run(env!("CARGO_BIN_EXE_fenced"), &[&server.url()], &[]);
    said(&out, "fenced", "and was refused; the next holder's write with token ");
    said(&out, "fenced", "stands (balance 200)");
}

#[test]
fn optimistic() {
    let server = postgres();
    let out = run(env!("CARGO_BIN_EXE_optimistic"), &[&server.url()], &[]);
    said(&out, "optimistic", "8 buyers at once took one item each, stock 100 -> 92");
}

#[test]
fn idempotent() {
    let server = redis();
    let out = run(env!("CARGO_BIN_EXE_idempotent"), &[&server.url()], &[]);
    said(&out, "idempotent", " charged once (receipt for 42.00 fenced by ");
    said(&out, "idempotent", "the retry afterwards got the stored receipt");
}

#[test]
fn election() {
    let server = EtcdServer::start(&EtcdConfig::default()).expect("start etcd");
    let out = run(env!("CARGO_BIN_EXE_election"), &[&server.url()], &[]);
    said(&out, "election", "10.0.0.7:8080 led in term ");
    said(&out, "election", "then 10.0.0.8:8080 led in term ");
}

/// The web service: a job started over HTTP holds its lock; SIGTERM stops the service,
/// which exits 0 after releasing the lease, so the lock is free at once (not a ttl later).
#[test]
fn axum_job() {
    let server = redis();
    let url = server.url();
    let mut service = Running(
        Command::new(env!("CARGO_BIN_EXE_axum_job"))
            .args([url.as_str(), "127.0.0.1:0"])
            .env_remove("DLOCK_URL")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start axum_job"),
    );
    let stdout = service.0.stdout.take().expect("stdout");
    let (lines_tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let listening = lines.recv_timeout(RUN_TIMEOUT).expect("axum_job says where it listens").expect("a line");
    let addr = listening.strip_prefix("axum_job: listening on http://").unwrap_or_else(|| panic!("{listening:?}"));

    let (status, body) = post(addr, "/jobs/nightly-report");
    assert_eq!(status, 202, "{body}");
    let token: u64 = body
        .trim()
        .strip_prefix("started jobs/nightly-report with token ")
        .and_then(|token| token.parse().ok())
        .unwrap_or_else(|| panic!("{body:?}"));
    let (status, body) = post(addr, "/jobs/nightly-report");
    assert_eq!(status, 409, "a second start while the job runs: {body}");

    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let name = LockName::new("jobs/nightly-report").expect("a name");
    let holder = || {
        runtime.block_on(async {
            let locker = dlock::connect(&url).await.expect("connect");
            locker.inspect(&name).await.expect("inspect").holder.map(|holder| holder.token.get())
        })
    };
    assert_eq!(holder(), Some(token), "the job holds its lock");

    let pid = Pid::from_raw(i32::try_from(service.0.id()).expect("a pid"));
    kill(pid, Signal::SIGTERM).expect("send SIGTERM");
    let deadline = Instant::now() + RUN_TIMEOUT;
    let status = loop {
        if let Some(status) = service.0.try_wait().expect("wait for axum_job") {
            break status;
        }
        assert!(Instant::now() < deadline, "axum_job still runs {RUN_TIMEOUT:?} after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    let rest: Vec<String> = lines.iter().map_while(Result::ok).collect();
    assert!(status.success(), "axum_job exited with {status} after SIGTERM; it printed {rest:?}");
    said(&rest.join("\n"), "axum_job", "started 1 job(s); shut down on a signal after releasing 1 lease(s)");
    // Released by the service on its way out: the job's ttl (10 s) has not run out yet.
    assert_eq!(holder(), None, "the lock is free once the service has exited");
}

/// A `POST` with no body; the reply's status and body.
fn post(addr: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect to axum_job");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("a read timeout");
    write!(stream, "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        .expect("send the request");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).expect("read the reply");
    let status = reply.split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    let body = reply.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default();
    (status, body)
}
