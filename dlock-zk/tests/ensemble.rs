//! A three-member ensemble whose links between members run through fault proxies, so a
//! test can cut one follower off from the leader while its clients still reach it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_conformance::properties::unique_name;
use dlock_conformance::Fault;
use dlock_core::{LockOptions, Locker};
use dlock_testkit::proxy::FaultProxy;
use dlock_testkit::supervisor::zookeeper::serving_mode;
use dlock_testkit::supervisor::{find_program, free_port, CommandSpec, ServerProcess};
use dlock_zk::{ConnectConfig, ZkConfig};

const SERVER_JAR: &str = "/usr/share/java/zookeeper.jar";
const LOG_JAR: &str = "/usr/share/java/slf4j-simple.jar";
const MEMBERS: usize = 3;

/// The real ports of one member.
#[derive(Clone, Copy)]
struct Ports {
    client: u16,
    quorum: u16,
    election: u16,
}

/// The proxies of one member's quorum and election connections to another.
type LinkProxies = (Arc<FaultProxy>, Arc<FaultProxy>);

/// Three members, each seeing the others through its own proxies: `proxies[i][j]` carries
/// member `i`'s quorum and election connections to member `j`.
struct ProxiedEnsemble {
    members: Vec<ServerProcess>,
    ports: Vec<Ports>,
    proxies: Vec<Vec<Option<LinkProxies>>>,
    dir: PathBuf,
}

impl Drop for ProxiedEnsemble {
    fn drop(&mut self) {
        for member in &mut self.members {
            member.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl ProxiedEnsemble {
    async fn start() -> Self {
        let java = find_program("java", &["/usr/bin"]).expect("java (run scripts/install-backends)");
        assert!(Path::new(SERVER_JAR).is_file(), "{SERVER_JAR} missing (run scripts/install-backends)");
        let ports: Vec<Ports> = (0..MEMBERS)
            .map(|_| Ports {
                client: free_port().expect("port"),
                quorum: free_port().expect("port"),
                election: free_port().expect("port"),
            })
            .collect();
        let loopback = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
        let mut proxies = Vec::new();
        for i in 0..MEMBERS {
            let mut row = Vec::new();
            for (j, target) in ports.iter().enumerate() {
                row.push(if i == j {
                    None
                } else {
                    let quorum = FaultProxy::start(loopback(target.quorum)).await.expect("proxy");
                    let election = FaultProxy::start(loopback(target.election)).await.expect("proxy");
                    Some((Arc::new(quorum), Arc::new(election)))
                });
            }
            proxies.push(row);
        }
        let dir = std::env::temp_dir().join(format!("dlock-zk-proxied-{:016x}", fastrand_u64()));
        let mut members = Vec::new();
        for i in 0..MEMBERS {
            let member_dir = dir.join(format!("member-{}", i + 1));
            let data = member_dir.join("data");
            std::fs::create_dir_all(&data).expect("data dir");
            std::fs::write(data.join("myid"), format!("{}\n", i + 1)).expect("myid");
            let mut cfg = vec![
                "tickTime=100".to_string(),
                "initLimit=50".to_string(),
                // A follower that hears nothing from its leader for 2 s stops serving.
                "syncLimit=20".to_string(),
                format!("dataDir={}", data.display()),
                format!("clientPort={}", ports[i].client),
                "clientPortAddress=127.0.0.1".to_string(),
                "minSessionTimeout=200".to_string(),
                "maxSessionTimeout=120000".to_string(),
                "admin.enableServer=false".to_string(),
                "4lw.commands.whitelist=*".to_string(),
                "forceSync=no".to_string(),
                "maxClientCnxns=0".to_string(),
                "cnxTimeout=1000".to_string(),
            ];
            for (j, port) in ports.iter().enumerate() {
                let (quorum, election) = match &proxies[i][j] {
                    None => (port.quorum, port.election),
                    Some((quorum, election)) => (quorum.addr().port(), election.addr().port()),
                };
                cfg.push(format!("server.{}=127.0.0.1:{quorum}:{election}", j + 1));
            }
            let cfg_path = member_dir.join("zoo.cfg");
            std::fs::write(&cfg_path, cfg.join("\n") + "\n").expect("zoo.cfg");
            let mut classpath = SERVER_JAR.to_string();
            if Path::new(LOG_JAR).is_file() {
                classpath = format!("{classpath}:{LOG_JAR}");
            }
            let spec = CommandSpec::new(&java)
                .args([
                    "-Xmx256m",
                    "-XX:+UseSerialGC",
                    "-XX:TieredStopAtLevel=1",
                    "-Djava.net.preferIPv4Stack=true",
                    "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                    "-cp",
                    &classpath,
                    "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                    &cfg_path.display().to_string(),
                ])
                .cwd(&member_dir);
            let name = format!("zookeeper-proxied-{}:{}", i + 1, ports[i].client);
            members.push(ServerProcess::spawn(name, spec, member_dir.join("server.log")).expect("spawn a member"));
        }
        let ensemble = ProxiedEnsemble { members, ports, proxies, dir };
        ensemble.wait_serving(Duration::from_secs(90)).await;
        ensemble
    }

    fn addr(&self, i: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports[i].client))
    }

    fn mode(&self, i: usize) -> Option<String> {
        serving_mode(self.addr(i))
    }

    /// Waits until every member serves, one of them as the leader.
    async fn wait_serving(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let modes: Vec<Option<String>> =
                tokio::task::block_in_place(|| (0..MEMBERS).map(|i| self.mode(i)).collect());
            if modes.iter().all(Option::is_some) && modes.iter().any(|m| m.as_deref() == Some("leader")) {
                return;
            }
            assert!(Instant::now() < deadline, "the proxied ensemble does not serve: {modes:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn leader(&self) -> usize {
        tokio::task::block_in_place(|| (0..MEMBERS).find(|&i| self.mode(i).as_deref() == Some("leader")))
            .expect("a leader")
    }

    /// Every link between members `a` and `b`, both ways, suffers `fault`.
    fn fault_between(&self, a: usize, b: usize, fault: Fault) {
        for (from, to) in [(a, b), (b, a)] {
            if let Some((quorum, election)) = &self.proxies[from][to] {
                quorum.set_fault(fault);
                election.set_fault(fault);
            }
        }
    }

    fn config(&self, member: usize) -> ZkConfig {
        ZkConfig::from_url(&format!("zk://{}", self.addr(member)))
            .expect("config")
            .with_op_timeout(Duration::from_secs(2))
            .with_connect_timeout(Duration::from_secs(5))
    }
}

fn fastrand_u64() -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    (nanos as u64) ^ u64::from(std::process::id()).rotate_left(32)
}

/// A holder whose follower is cut off from the leader (the follower still answers reads
/// from its stale tree until it notices, after `syncLimit` ticks) learns of its loss
/// before a waiter on the majority side is granted: only answers that went through the
/// leader confirm its session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_behind_a_partitioned_follower_learns_first() {
    dlock_conformance::init_tracing();
    let ensemble = ProxiedEnsemble::start().await;
    let leader = ensemble.leader();
    let follower = (leader + 1) % MEMBERS;
    let majority = (leader + 2) % MEMBERS;

    let holder = dlock_zk::connect(ensemble.config(follower)).await.expect("holder connects to its follower");
    let waiter = dlock_zk::connect(ensemble.config(majority)).await.expect("waiter connects to the majority");
    let name = unique_name("partitioned-follower");
    let ttl = Duration::from_secs(4);
    let lease = holder.acquire(&name, &LockOptions::watchdog(ttl).wait(Duration::from_secs(5))).await.expect("acquire");

    let queued = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move {
            let lease = waiter.acquire(&name, &LockOptions::watchdog(ttl).wait(ttl * 6)).await;
            (Instant::now(), lease)
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while waiter.inspect(&name).await.ok().and_then(|info| info.waiters) != Some(1) {
        assert!(Instant::now() < deadline, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let cut = Instant::now();
    ensemble.fault_between(follower, leader, Fault::Blackhole);
    let handle = lease.handle();
    let lost = tokio::spawn(async move {
        let reason = handle.lost().await;
        (Instant::now(), reason)
    });
    let (granted_at, granted) = queued.await.expect("waiter task");
    let granted = granted.expect("the waiter on the majority side gets the lock");
    let (lost_at, reason) = tokio::time::timeout(Duration::from_secs(1), lost)
        .await
        .expect("the holder's lost signal fired by the time the waiter was granted")
        .expect("lost task");
    assert!(
        lost_at < granted_at,
        "the waiter was granted {:?} after the cut, before the holder learned ({reason}) at {:?}",
        granted_at - cut,
        lost_at - cut
    );
    assert!(granted.token() > lease.token());
    granted.release().await.expect("release");
    ensemble.fault_between(follower, leader, Fault::None);
}
