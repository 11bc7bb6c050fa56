//! The fault schedule: drawn from a seed, so the same seed replays the same faults.

use std::fmt;
use std::time::Duration;

use dlock_conformance::Fault;

/// One thing the nemesis does to the system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Act {
    /// SIGSTOP a client, SIGCONT it after the step's duration.
    Pause { client: usize },
    /// Plays a fault on every link of a client for the step's duration.
    Link { client: usize, fault: Fault },
    /// kill -9 of `count` servers from `server` on (wrapping), each started again on its
    /// data after the step's duration. A count past the minority loses the quorum.
    Kill { server: usize, count: usize },
    /// Cuts a server off from the other servers (not from its clients), and heals.
    Partition { server: usize },
    /// A server's clock jumps forward by the step's length, at once.
    ClockJump { server: usize },
    /// A Cluster failover by hand: a replica takes over from its primary (`server` is the
    /// replica, or the primary whose replica takes over).
    Failover { server: usize },
    /// The lock's slot moves to another primary (the first from `server` on).
    Migrate { server: usize },
    /// The run's mutant strikes the servers once (`--mutant evict` or `fence-reset`).
    Mutate,
}

impl Act {
    /// The client a client fault hits.
    pub(crate) fn client(&self) -> Option<usize> {
        match *self {
            Act::Pause { client } | Act::Link { client, .. } => Some(client),
            _ => None,
        }
    }

    /// The same fault on another client or server (an aimed fault's target).
    pub(crate) fn aimed_at(self, target: usize) -> Act {
        match self {
            Act::Pause { .. } => Act::Pause { client: target },
            Act::Link { fault, .. } => Act::Link { client: target, fault },
            Act::Kill { count, .. } => Act::Kill { server: target, count },
            Act::Partition { .. } => Act::Partition { server: target },
            Act::ClockJump { .. } => Act::ClockJump { server: target },
            Act::Failover { .. } => Act::Failover { server: target },
            Act::Migrate { .. } => Act::Migrate { server: target },
            Act::Mutate => Act::Mutate,
        }
    }

    /// The kind of fault, as the verdict counts them.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Act::Pause { .. } => "pause",
            Act::Link { .. } => "link",
            Act::Kill { count: 1, .. } => "kill",
            Act::Kill { .. } => "kill_quorum",
            Act::Partition { .. } => "partition",
            Act::ClockJump { .. } => "clock_jump",
            Act::Failover { .. } => "failover",
            Act::Migrate { .. } => "migration",
            Act::Mutate => "mutant",
        }
    }
}

impl fmt::Display for Act {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Act::Pause { client } => write!(f, "pause client {client}"),
            Act::Link { client, fault } => write!(f, "{fault:?} on client {client}'s links"),
            Act::Kill { server, count: 1 } => write!(f, "kill server {server}"),
            Act::Kill { server, count } => write!(f, "kill {count} servers from server {server} on"),
            Act::Partition { server } => write!(f, "partition server {server} from the others"),
            Act::ClockJump { server } => write!(f, "jump server {server}'s clock forward"),
            Act::Failover { server } => write!(f, "fail server {server} or its primary over to its replica"),
            Act::Migrate { server } => write!(f, "move the lock's slot to a primary from server {server} on"),
            Act::Mutate => write!(f, "the mutant strikes"),
        }
    }
}

/// One step: wait `gap`, then do `act` (and `with` during it) for `length`, then heal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    pub(crate) gap: Duration,
    pub(crate) act: Act,
    /// A client fault played while `act`, a server fault, lasts: a pause during a
    /// partition, a cut during a kill.
    pub(crate) with: Option<Act>,
    /// Whether the faults aim at the current holder (a client fault) or the current
    /// leader or primary (a server fault) rather than at the one drawn.
    pub(crate) aim: bool,
    pub(crate) length: Duration,
}

/// What the schedule may do.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scope {
    pub(crate) clients: usize,
    pub(crate) servers: usize,
    /// Whether the clients reach the servers through fault proxies.
    pub(crate) links: bool,
    /// Whether servers can be partitioned from each other.
    pub(crate) partitions: bool,
    /// Whether a server's clock can jump.
    pub(crate) clock_jumps: bool,
    /// Whether primaries can be failed over and the lock's slot moved (a Cluster).
    pub(crate) slot_moves: bool,
    /// How many servers must go down together for the quorum to be lost, where a
    /// quorum is what the backend needs (RedLock's masters, a cluster's majority).
    pub(crate) quorum_loss: Option<usize>,
    /// Whether a mutant strikes from the run (evict, fence-reset).
    pub(crate) mutant_strikes: bool,
    pub(crate) ttl: Duration,
}

/// Steps until their gaps and lengths fill `duration`.
///
/// Every schedule opens the same way, whatever the seed, so that even a short run is
/// evidence: a pause of the holder for 1.5 ttl (its lease runs out while it sleeps),
/// then, where there are servers, a kill of the leader or primary during which the
/// holder's links are cut. Then the steps are drawn.
pub(crate) fn schedule(seed: u64, scope: Scope, duration: Duration) -> Vec<Step> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let ttl = scope.ttl;
    // A time between `lo` and `hi` times the ttl.
    let span = |rng: &mut fastrand::Rng, lo: f64, hi: f64| ttl.mul_f64(lo + rng.f64() * (hi - lo));
    let mut steps =
        vec![Step { gap: ttl, act: Act::Pause { client: 0 }, with: None, aim: true, length: ttl.mul_f64(1.5) }];
    if scope.servers > 0 {
        steps.push(Step {
            gap: ttl,
            act: Act::Kill { server: 0, count: 1 },
            with: scope.links.then_some(Act::Link { client: 0, fault: Fault::Cut }),
            aim: true,
            length: ttl.mul_f64(0.5),
        });
    }
    let mut total: Duration = steps.iter().map(|s| s.gap + s.length).sum();
    while total < duration {
        let client = rng.usize(..scope.clients);
        let server = rng.usize(..scope.servers.max(1));
        let aim = rng.bool();
        let act = match rng.u32(..10) {
            _ if scope.mutant_strikes && rng.u32(..3) == 0 => Act::Mutate,
            0..=2 => Act::Pause { client },
            3..=6 if scope.links => Act::Link { client, fault: link_fault(&mut rng, ttl) },
            7..=9 if scope.servers > 0 => server_fault(&mut rng, scope, server),
            _ => Act::Pause { client },
        };
        // One server fault in three has a client fault played during it.
        let with = match act {
            Act::Kill { .. } | Act::Partition { .. } | Act::Failover { .. } | Act::Migrate { .. }
                if rng.u32(..3) == 0 =>
            {
                Some(if scope.links && rng.bool() {
                    Act::Link { client, fault: link_fault(&mut rng, ttl) }
                } else {
                    Act::Pause { client }
                })
            }
            _ => None,
        };
        let length = match act {
            Act::Pause { .. } => span(&mut rng, 0.5, 2.0),
            Act::Link { .. } => span(&mut rng, 0.5, 2.0),
            Act::Kill { .. } => span(&mut rng, 0.1, 1.0),
            // After the failover or the move, done when the step begins.
            Act::Failover { .. } | Act::Migrate { .. } => span(&mut rng, 0.1, 1.0),
            Act::Partition { .. } => span(&mut rng, 0.5, 2.0),
            // Past the expiry of every hold the server keeps.
            Act::ClockJump { .. } => span(&mut rng, 1.0, 2.0),
            Act::Mutate => Duration::ZERO,
        };
        let gap = span(&mut rng, 0.5, 2.0);
        total += gap + length;
        steps.push(Step { gap, act, with, aim, length });
    }
    steps
}

fn link_fault(rng: &mut fastrand::Rng, ttl: Duration) -> Fault {
    let span = |rng: &mut fastrand::Rng, lo: f64, hi: f64| ttl.mul_f64(lo + rng.f64() * (hi - lo));
    match rng.u32(..7) {
        0 => Fault::Cut,
        1 => Fault::Blackhole,
        2 => Fault::BlackholeRequests,
        3 => Fault::BlackholeReplies,
        4 => Fault::DropReplies,
        5 => Fault::DelayReplies(span(rng, 0.2, 1.5)),
        _ => Fault::Delay(span(rng, 0.05, 0.5)),
    }
}

/// Where servers can be partitioned, half the server faults are partitions; where
/// clocks can jump, half of the rest are jumps; on a Cluster, a third of the rest are
/// failovers and a third moves of the lock's slot; the rest are kills, one in four of
/// them of enough servers to lose the quorum.
fn server_fault(rng: &mut fastrand::Rng, scope: Scope, server: usize) -> Act {
    if scope.partitions && rng.bool() {
        return Act::Partition { server };
    }
    if scope.clock_jumps && rng.bool() {
        return Act::ClockJump { server };
    }
    if scope.slot_moves {
        match rng.u32(..3) {
            0 => return Act::Failover { server },
            1 => return Act::Migrate { server },
            _ => {}
        }
    }
    match scope.quorum_loss {
        Some(count) if rng.u32(..4) == 0 => Act::Kill { server, count },
        _ => Act::Kill { server, count: 1 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCOPE: Scope = Scope {
        clients: 4,
        servers: 1,
        links: true,
        partitions: false,
        clock_jumps: false,
        slot_moves: false,
        quorum_loss: None,
        mutant_strikes: false,
        ttl: Duration::from_secs(1),
    };

    #[test]
    fn a_seed_replays_its_schedule_and_another_seed_differs() {
        let minute = Duration::from_secs(60);
        assert_eq!(schedule(7, SCOPE, minute), schedule(7, SCOPE, minute));
        assert_ne!(schedule(7, SCOPE, minute), schedule(8, SCOPE, minute));
    }

    #[test]
    fn partitions_are_drawn_only_where_servers_can_be_partitioned() {
        let hour = Duration::from_secs(3600);
        let partitioned = |scope| schedule(3, scope, hour).iter().any(|s| matches!(s.act, Act::Partition { .. }));
        assert!(!partitioned(Scope { servers: 3, ..SCOPE }));
        assert!(partitioned(Scope { servers: 3, partitions: true, ..SCOPE }));
    }

    #[test]
    fn clock_jumps_are_drawn_only_where_clocks_can_jump() {
        let hour = Duration::from_secs(3600);
        let jumped = |scope| schedule(3, scope, hour).iter().any(|s| matches!(s.act, Act::ClockJump { .. }));
        assert!(!jumped(Scope { servers: 5, partitions: true, ..SCOPE }));
        assert!(jumped(Scope { servers: 5, clock_jumps: true, ..SCOPE }));
    }

    #[test]
    fn failovers_and_slot_moves_are_drawn_only_on_a_cluster_beside_kills() {
        let hour = Duration::from_secs(3600);
        let kinds = |scope| {
            let steps = schedule(3, scope, hour);
            let count = |kind| steps.iter().filter(|s| s.act.kind() == kind).count();
            (count("failover"), count("migration"), count("kill"))
        };
        let (failovers, moves, _) = kinds(Scope { servers: 6, ..SCOPE });
        assert_eq!((failovers, moves), (0, 0));
        let (failovers, moves, kills) = kinds(Scope { servers: 6, slot_moves: true, ..SCOPE });
        assert!(failovers > 10 && moves > 10 && kills > 10, "{failovers} {moves} {kills}");
    }

    #[test]
    fn without_links_or_servers_only_pauses_are_drawn() {
        let scope = Scope { servers: 0, links: false, ..SCOPE };
        let steps = schedule(1, scope, Duration::from_secs(120));
        assert!(steps.len() > 10);
        assert!(steps.iter().all(|s| matches!(s.act, Act::Pause { client } if client < 4) && s.with.is_none()));
    }

    #[test]
    fn every_schedule_opens_with_a_long_pause_of_the_holder_and_a_kill_of_the_leader() {
        for seed in 0..20 {
            let steps = schedule(seed, Scope { servers: 3, ..SCOPE }, Duration::from_secs(20));
            assert!(matches!(steps[0].act, Act::Pause { .. }) && steps[0].aim && steps[0].length > SCOPE.ttl);
            assert!(matches!(steps[1].act, Act::Kill { count: 1, .. }) && steps[1].aim && steps[1].with.is_some());
        }
        let steps = schedule(1, Scope { servers: 0, ..SCOPE }, Duration::from_secs(20));
        assert!(!steps.iter().any(|s| matches!(s.act, Act::Kill { .. })));
    }

    #[test]
    fn quorums_are_lost_only_where_asked_and_faults_overlap() {
        let hour = Duration::from_secs(3600);
        let steps = schedule(5, Scope { servers: 5, quorum_loss: Some(3), ..SCOPE }, hour);
        assert!(steps.iter().any(|s| s.act == Act::Kill { server: s.act_server(), count: 3 }));
        assert!(steps.iter().any(|s| s.with.is_some()));
        assert!(steps.iter().any(|s| s.aim) && steps.iter().any(|s| !s.aim));
        let steps = schedule(5, Scope { servers: 5, ..SCOPE }, hour);
        assert!(steps.iter().all(|s| !matches!(s.act, Act::Kill { count, .. } if count > 1)));
    }

    #[test]
    fn a_mutant_strikes_only_when_there_is_one() {
        let hour = Duration::from_secs(3600);
        assert!(!schedule(2, SCOPE, hour).iter().any(|s| s.act == Act::Mutate));
        assert!(schedule(2, Scope { mutant_strikes: true, ..SCOPE }, hour).iter().any(|s| s.act == Act::Mutate));
    }

    impl Step {
        fn act_server(&self) -> usize {
            match self.act {
                Act::Kill { server, .. }
                | Act::Partition { server }
                | Act::ClockJump { server }
                | Act::Failover { server }
                | Act::Migrate { server } => server,
                _ => usize::MAX,
            }
        }
    }
}
