//! One run: start the servers, the register, a proxy per client and server, and the
//! client processes; play the schedule; gather the clients' events into one history and
//! judge it.

use std::collections::BTreeMap;
use std::error::Error;
use std::path::Path;
use std::time::Duration;

use dlock::FencingToken;
use dlock_conformance::history::{Event, History, Op, Phase};
use dlock_conformance::Fault;
use dlock_core::backend::lock_unpoisoned;
use dlock_testkit::proxy::FaultProxy;
use dlock_testkit::supervisor::{CommandSpec, ServerProcess};

use crate::clock::now_ns;
use crate::plan::{self, Act, Scope};
use crate::register::Register;
use crate::topology::Topology;
use crate::verdict::{Clocks, Verdict};
use crate::RunArgs;

type BoxError = Box<dyn Error>;

pub(crate) async fn run(args: &RunArgs) -> Result<Verdict, BoxError> {
    let clients = usize::from(args.clients);
    let (mut topology, target) = match &args.url {
        Some(url) => (Topology::External(url.clone()), url.clone()),
        None => (Topology::start(&args.topology).await?, args.topology.clone()),
    };
    let work = tempfile::Builder::new().prefix("dlock-nemesis-").tempdir()?;
    let servers = topology.endpoints();
    let history = History::new();
    let epoch_ns = now_ns();
    let register = Register::start(history.clone()).await?;
    let mut proxies = Vec::with_capacity(clients);
    for _ in 0..clients {
        let mut own = Vec::with_capacity(servers.len());
        for server in &servers {
            own.push(FaultProxy::start(*server).await?);
        }
        proxies.push(own);
    }

    let until_ns = now_ns() + args.duration.as_nanos() as u64;
    let exe = std::env::current_exe()?;
    let mut children = Vec::with_capacity(clients);
    for (id, own) in proxies.iter().enumerate() {
        let url = topology.url(&own.iter().map(FaultProxy::addr).collect::<Vec<_>>());
        let events = work.path().join(format!("client-{id}.events"));
        let spec = CommandSpec::new(&exe).args([
            "client".to_string(),
            format!("--id={id}"),
            format!("--url={url}"),
            format!("--register={}", register.addr),
            format!("--epoch-ns={epoch_ns}"),
            format!("--until-ns={until_ns}"),
            format!("--ttl-ms={}", args.ttl.as_millis()),
            format!("--events={}", events.display()),
        ]);
        children.push(ServerProcess::spawn(
            format!("client {id}"),
            spec,
            work.path().join(format!("client-{id}.log")),
        )?);
    }

    let scope = Scope {
        clients,
        servers: topology.servers(),
        links: !servers.is_empty(),
        partitions: topology.partitions(),
        clock_jumps: topology.clock_jumps(),
        ttl: args.ttl,
    };
    let mut jumps = Vec::new();
    for step in plan::schedule(args.seed, scope, args.duration) {
        let left = Duration::from_nanos(until_ns.saturating_sub(now_ns()));
        if step.gap + step.length >= left {
            break;
        }
        tokio::time::sleep(step.gap).await;
        eprintln!("[{:>7.1}s] {} for {:?}", crate::clock::since(epoch_ns).as_secs_f64(), step.act, step.length);
        match step.act {
            Act::Pause { client } => {
                children[client].pause()?;
                tokio::time::sleep(step.length).await;
                children[client].resume()?;
            }
            Act::Link { client, fault } => {
                proxies[client].iter().for_each(|p| p.set_fault(fault));
                tokio::time::sleep(step.length).await;
                proxies[client].iter().for_each(|p| p.set_fault(Fault::None));
            }
            Act::Kill { server } => {
                tokio::task::block_in_place(|| topology.kill(server));
                tokio::time::sleep(step.length).await;
                tokio::task::block_in_place(|| topology.start_again(server))?;
            }
            Act::Partition { server } => {
                tokio::task::block_in_place(|| topology.isolate(server))?;
                tokio::time::sleep(step.length).await;
                tokio::task::block_in_place(|| topology.heal());
            }
            Act::ClockJump { server } => {
                let sent = crate::clock::since(epoch_ns);
                // A server that is down cannot jump; the step is then a pause in the plan.
                if let Err(err) = tokio::task::block_in_place(|| topology.jump(server, step.length)) {
                    eprintln!("  the jump failed: {err}");
                }
                jumps.push((sent, crate::clock::since(epoch_ns)));
            }
        }
    }

    // A client finishes the iteration it is in: at most a wait, a hold and a release.
    let grace = args.ttl * 6 + Duration::from_secs(10);
    let deadline = until_ns + grace.as_nanos() as u64;
    for child in &mut children {
        while child.exit_status()?.is_none() && now_ns() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        match child.exit_status()? {
            Some(status) if status.success() => {}
            Some(status) => return Err(format!("{} ended with {status}: {}", child.name(), child.log_tail()).into()),
            None => return Err(format!("{} did not end within {grace:?} of the run", child.name()).into()),
        }
    }

    let mut lost = BTreeMap::new();
    let mut acquire_errors = 0;
    let mut events = Vec::new();
    for id in 0..clients {
        read_events(&work.path().join(format!("client-{id}.events")), id, &mut events, &mut lost, &mut acquire_errors)?;
    }
    // Holds are read in the order of their events, so the clients' events go in by time.
    events.sort_by_key(|e| e.at);
    for event in events {
        history.record_at(event);
    }
    let claims = lock_unpoisoned(&register.claims).clone();
    let clocks = Clocks { fast: topology.fast_clock(), jumps };
    Ok(Verdict::judge(args.seed, target, args.duration, &history, &claims, &clocks, lost, acquire_errors))
}

/// Reads one client's events file: `op phase at_ns token extra` per line.
fn read_events(
    path: &Path,
    process: usize,
    events: &mut Vec<Event>,
    lost: &mut BTreeMap<String, usize>,
    acquire_errors: &mut usize,
) -> Result<(), BoxError> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let [op, phase, at, token, extra] = fields[..] else {
            return Err(format!("{}: malformed line {line:?}", path.display()).into());
        };
        let op = match op {
            "acquire" => Op::Acquire,
            "release" => Op::Release,
            "lost" => Op::Lost,
            _ => return Err(format!("{}: unknown operation in {line:?}", path.display()).into()),
        };
        let phase = match phase {
            "invoke" => Phase::Invoke,
            "ok" => Phase::Ok,
            "fail" => Phase::Fail,
            _ => Phase::Unknown,
        };
        if op == Op::Lost {
            *lost.entry(extra.to_string()).or_default() += 1;
        }
        if op == Op::Acquire && phase != Phase::Ok && phase != Phase::Invoke && extra != "timeout" {
            *acquire_errors += 1;
        }
        let at = Duration::from_nanos(at.parse()?);
        let token = token.parse().ok().map(FencingToken::new);
        events.push(Event { process, op, phase, at, token });
    }
    Ok(())
}
