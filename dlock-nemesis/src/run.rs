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

use clap::ValueEnum;
use dlock::HoldKind;

use crate::client::parse_kind;
use crate::clock::now_ns;
use crate::mutant::Mutant;
use crate::plan::{self, Act, Scope};
use crate::register::Register;
use crate::strike;
use crate::topology::Topology;
use crate::verdict::{Clocks, Played, RunFacts, Seen, Verdict, WorkEvent};
use crate::RunArgs;

type BoxError = Box<dyn Error>;

/// Plays one run; its verdict, and its timeline as JSON lines.
pub(crate) async fn run(args: &RunArgs) -> Result<(Verdict, String), BoxError> {
    let clients = usize::from(args.clients);
    let (mut topology, target) = match &args.url {
        Some(url) => (Topology::External(url.clone()), url.clone()),
        None => (Topology::start(&args.topology).await?, args.topology.clone()),
    };
    if let Some(mutant) = args.mutant {
        strike::applies(mutant, &topology)?;
    }
    // Kept for the whole run: the servers' clocks run at twice the pace.
    let _halved = match args.mutant {
        Some(Mutant::HalfTtl) => tokio::task::block_in_place(|| topology.halve_ttls())?,
        _ => Vec::new(),
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
        let mut argv = vec![
            "client".to_string(),
            format!("--id={id}"),
            format!("--url={url}"),
            format!("--register={}", register.addr),
            format!("--epoch-ns={epoch_ns}"),
            format!("--until-ns={until_ns}"),
            format!("--ttl-ms={}", args.ttl.as_millis()),
            format!("--events={}", events.display()),
            format!("--mode={}", args.mode.to_possible_value().map_or("lock".into(), |v| v.get_name().to_string())),
        ];
        if let Some(mutant) = args.mutant {
            argv.push(format!("--mutant={mutant}"));
        }
        children.push(ServerProcess::spawn(
            format!("client {id}"),
            CommandSpec::new(&exe).args(argv),
            work.path().join(format!("client-{id}.log")),
        )?);
    }

    let scope = Scope {
        clients,
        servers: topology.servers(),
        links: !servers.is_empty(),
        partitions: topology.partitions(),
        clock_jumps: topology.clock_jumps(),
        slot_moves: topology.slot_moves(),
        quorum_loss: topology.quorum_loss(),
        mutant_strikes: matches!(args.mutant, Some(Mutant::Evict | Mutant::FenceReset)),
        ttl: args.ttl,
    };
    let mut timeline = Vec::new();
    for step in plan::schedule(args.seed, scope, args.duration) {
        let left = Duration::from_nanos(until_ns.saturating_sub(now_ns()));
        if step.gap + step.length >= left {
            break;
        }
        tokio::time::sleep(step.gap).await;
        // A failover, a slot move or the kill of a Cluster primary (which waits for its
        // replica's promotion) is done by the time it returns: a client fault during it
        // begins first.
        let blocks = match step.act {
            Act::Failover { .. } | Act::Migrate { .. } => true,
            Act::Kill { .. } => topology.slot_moves(),
            _ => false,
        };
        let mut acts: Vec<Act> = match blocks {
            true => step.with.into_iter().chain([step.act]).collect(),
            false => [step.act].into_iter().chain(step.with).collect(),
        };
        if step.aim {
            let holder = match step.act.client() {
                // A fault aimed at the holder waits (a little) for a client that holds
                // now: on a topology that is often unavailable, the last writer may have
                // let go long ago, and the fault would then prove nothing.
                Some(_) => holder_within(&register, epoch_ns, args.ttl).await.or_else(|| register.last_writer()),
                None => register.last_writer(),
            };
            let leader =
                if step.act.client().is_none() { tokio::task::block_in_place(|| topology.leader()) } else { None };
            for act in &mut acts {
                match (act.client(), holder, leader) {
                    (Some(_), Some(holder), _) => *act = act.aimed_at(holder),
                    (None, _, Some(leader)) => *act = act.aimed_at(leader),
                    _ => {}
                }
            }
        }
        let from = crate::clock::since(epoch_ns);
        let mut played = Vec::new();
        for act in &acts {
            eprintln!("[{:>7.1}s] {act} for {:?}", from.as_secs_f64(), step.length);
            let began = begin(*act, &mut topology, &mut children, &proxies, step.length, args.mutant).await;
            if let Err(err) = &began {
                eprintln!("  it failed: {err}");
            }
            played.push((*act, began.map_err(|e| e.to_string())));
        }
        if !step.length.is_zero() {
            tokio::time::sleep(step.length).await;
        }
        // Healed in the reverse order: the client fault ends before the server fault.
        for (act, began) in played.iter_mut().rev() {
            let ended = end(*act, &mut topology, &mut children, &proxies);
            if let (Ok(()), Err(err)) = (&began, ended) {
                eprintln!("  healing {act} failed: {err}");
                *began = Err(format!("healing failed: {err}"));
            }
        }
        if topology.slot_moves() && step.act.client().is_none() {
            let owner = tokio::task::block_in_place(|| topology.leader());
            eprintln!("  the lock's slot is served by server {}", owner.map_or("(none)".into(), |o| o.to_string()));
        }
        let to = crate::clock::since(epoch_ns);
        timeline.extend(played.into_iter().map(|(act, result)| Played { act, from, to, failed: result.err() }));
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

    let mut read = Read::default();
    for id in 0..clients {
        read.file(&work.path().join(format!("client-{id}.events")), id)?;
    }
    // Holds are read in the order of their events, so the clients' events go in by time.
    read.events.sort_by_key(|e| e.at);
    for (at, process, kind) in &read.kinds {
        history.set_kind_at(*at, *process, *kind);
    }
    for event in read.events {
        history.record_at(event);
    }
    let claims = lock_unpoisoned(&register.claims).clone();
    let clocks = Clocks {
        fast: topology.fast_clock(),
        jumps: timeline
            .iter()
            .filter_map(|p| match p.act {
                Act::ClockJump { server } if p.failed.is_none() => Some((server, p.from, p.to)),
                _ => None,
            })
            .collect(),
    };
    let seen = Seen {
        lost: read.lost,
        acquire_errors: read.acquire_errors,
        renewals: read.renewals,
        unsent_writes: read.unsent,
        work: read.work,
    };
    let run = RunFacts {
        seed: args.seed,
        target,
        mode: args.mode,
        mutant: args.mutant,
        unsafe_by_design: topology.documented_unsafe(),
        duration: args.duration,
        ttl: args.ttl,
        clients,
        servers: topology.servers(),
    };
    let lines: String = timeline
        .iter()
        .map(|p| {
            let entry = serde_json::json!({
                "from_s": p.from.as_secs_f64(),
                "to_s": p.to.as_secs_f64(),
                "kind": p.act.kind(),
                "act": p.act.to_string(),
                "failed": p.failed,
            });
            entry.to_string() + "\n"
        })
        .collect();
    Ok((Verdict::judge(run, &history, &claims, &clocks, &timeline, seen), lines))
}

/// Starts one fault.
async fn begin(
    act: Act,
    topology: &mut Topology,
    children: &mut [ServerProcess],
    proxies: &[Vec<FaultProxy>],
    length: Duration,
    mutant: Option<Mutant>,
) -> Result<(), BoxError> {
    let servers = topology.servers().max(1);
    match act {
        Act::Pause { client } => children[client].pause()?,
        Act::Link { client, fault } => proxies[client].iter().for_each(|p| p.set_fault(fault)),
        Act::Kill { server, count } => {
            tokio::task::block_in_place(|| (0..count).try_for_each(|k| topology.kill((server + k) % servers)))?;
        }
        Act::Partition { server } => tokio::task::block_in_place(|| topology.isolate(server))?,
        Act::ClockJump { server } => tokio::task::block_in_place(|| topology.jump(server, length))?,
        Act::Failover { server } => tokio::task::block_in_place(|| topology.fail_over(server))?,
        Act::Migrate { server } => tokio::task::block_in_place(|| topology.migrate(server))?,
        Act::Mutate => match mutant {
            Some(mutant) => strike::strike(mutant, topology).await?,
            None => return Err("no mutant to strike".into()),
        },
    }
    Ok(())
}

/// Ends one fault: the client resumes, its links heal, the servers come back.
fn end(
    act: Act,
    topology: &mut Topology,
    children: &mut [ServerProcess],
    proxies: &[Vec<FaultProxy>],
) -> Result<(), BoxError> {
    let servers = topology.servers().max(1);
    match act {
        Act::Pause { client } => children[client].resume()?,
        Act::Link { client, .. } => proxies[client].iter().for_each(|p| p.set_fault(Fault::None)),
        Act::Kill { server, count } => {
            tokio::task::block_in_place(|| (0..count).try_for_each(|k| topology.start_again((server + k) % servers)))?
        }
        Act::Partition { .. } => tokio::task::block_in_place(|| topology.heal()),
        Act::ClockJump { .. } | Act::Failover { .. } | Act::Migrate { .. } | Act::Mutate => {}
    }
    Ok(())
}

/// What the clients' events files say besides the history's events.
#[derive(Debug, Default)]
struct Read {
    events: Vec<Event>,
    kinds: Vec<(Duration, usize, HoldKind)>,
    lost: BTreeMap<String, usize>,
    acquire_errors: usize,
    renewals: u64,
    unsent: usize,
    work: Vec<WorkEvent>,
}

impl Read {
    /// Reads one client's events file: `op phase at_ns token extra` per line.
    fn file(&mut self, path: &Path, process: usize) -> Result<(), BoxError> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        for line in text.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            let [op, phase, at, token, extra] = fields[..] else {
                return Err(format!("{}: malformed line {line:?}", path.display()).into());
            };
            let at = Duration::from_nanos(at.parse()?);
            let token = token.parse::<u64>().ok();
            let op = match op {
                "acquire" => Op::Acquire,
                "release" => Op::Release,
                "lost" => Op::Lost,
                "kind" => {
                    let kind =
                        parse_kind(extra).ok_or_else(|| format!("{}: unknown kind in {line:?}", path.display()))?;
                    self.kinds.push((at, process, kind));
                    continue;
                }
                "renewals" => {
                    self.renewals += token.unwrap_or(0);
                    continue;
                }
                "unsent" => {
                    self.unsent += 1;
                    continue;
                }
                "work" => {
                    let key = extra.parse()?;
                    self.work.push(WorkEvent { process, at, phase: phase.to_string(), key });
                    continue;
                }
                _ => return Err(format!("{}: unknown operation in {line:?}", path.display()).into()),
            };
            let phase = match phase {
                "invoke" => Phase::Invoke,
                "ok" => Phase::Ok,
                "fail" => Phase::Fail,
                _ => Phase::Unknown,
            };
            if op == Op::Lost {
                *self.lost.entry(extra.to_string()).or_default() += 1;
            }
            if op == Op::Acquire && phase != Phase::Ok && phase != Phase::Invoke && extra != "timeout" {
                self.acquire_errors += 1;
            }
            self.events.push(Event { process, op, phase, at, token: token.map(FencingToken::new) });
        }
        Ok(())
    }
}

/// A client that holds the lock now and for a tenth of `ttl` more (see
/// [`Register::holder_at`]), waiting up to three ttls for one.
async fn holder_within(register: &Register, epoch_ns: u64, ttl: Duration) -> Option<usize> {
    let give_up = tokio::time::Instant::now() + ttl * 3;
    loop {
        if let Some(holder) = register.holder_at(crate::clock::since(epoch_ns), ttl / 10) {
            return Some(holder);
        }
        if tokio::time::Instant::now() >= give_up {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
