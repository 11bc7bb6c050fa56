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
    /// kill -9 a server, start it again on its data after the step's duration.
    Kill { server: usize },
    /// Cuts a server off from the other servers (not from its clients), and heals.
    Partition { server: usize },
    /// A server's clock jumps forward by the step's length, at once.
    ClockJump { server: usize },
}

impl fmt::Display for Act {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Act::Pause { client } => write!(f, "pause client {client}"),
            Act::Link { client, fault } => write!(f, "{fault:?} on client {client}'s links"),
            Act::Kill { server } => write!(f, "kill server {server}"),
            Act::Partition { server } => write!(f, "partition server {server} from the others"),
            Act::ClockJump { server } => write!(f, "jump server {server}'s clock forward"),
        }
    }
}

/// One step: wait `gap`, then do `act` for `length`, then heal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    pub(crate) gap: Duration,
    pub(crate) act: Act,
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
    pub(crate) ttl: Duration,
}

/// Steps until their gaps and lengths fill `duration`.
pub(crate) fn schedule(seed: u64, scope: Scope, duration: Duration) -> Vec<Step> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let ttl = scope.ttl;
    // A time between `lo` and `hi` times the ttl.
    let span = |rng: &mut fastrand::Rng, lo: f64, hi: f64| ttl.mul_f64(lo + rng.f64() * (hi - lo));
    let mut steps = Vec::new();
    let mut total = Duration::ZERO;
    while total < duration {
        let client = rng.usize(..scope.clients);
        let act = match rng.u32(..10) {
            0..=2 => Act::Pause { client },
            3..=7 if scope.links => {
                let fault = match rng.u32(..7) {
                    0 => Fault::Cut,
                    1 => Fault::Blackhole,
                    2 => Fault::BlackholeRequests,
                    3 => Fault::BlackholeReplies,
                    4 => Fault::DropReplies,
                    5 => Fault::DelayReplies(span(&mut rng, 0.2, 1.5)),
                    _ => Fault::Delay(span(&mut rng, 0.05, 0.5)),
                };
                Act::Link { client, fault }
            }
            // Where servers can be partitioned, half the server faults are partitions; where
            // clocks can jump, half of the rest are jumps.
            8..=9 if scope.partitions && rng.bool() => Act::Partition { server: rng.usize(..scope.servers) },
            8..=9 if scope.clock_jumps && rng.bool() => Act::ClockJump { server: rng.usize(..scope.servers) },
            8..=9 if scope.servers > 0 => Act::Kill { server: rng.usize(..scope.servers) },
            _ => Act::Pause { client },
        };
        let length = match act {
            Act::Pause { .. } => span(&mut rng, 0.5, 2.0),
            Act::Link { .. } => span(&mut rng, 0.5, 2.0),
            Act::Kill { .. } => span(&mut rng, 0.1, 1.0),
            Act::Partition { .. } => span(&mut rng, 0.5, 2.0),
            // Past the expiry of every hold the server keeps.
            Act::ClockJump { .. } => span(&mut rng, 1.0, 2.0),
        };
        let gap = span(&mut rng, 0.5, 2.0);
        total += gap + length;
        steps.push(Step { gap, act, length });
    }
    steps
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
    fn without_links_or_servers_only_pauses_are_drawn() {
        let scope = Scope { servers: 0, links: false, ..SCOPE };
        let steps = schedule(1, scope, Duration::from_secs(120));
        assert!(steps.len() > 10);
        assert!(steps.iter().all(|s| matches!(s.act, Act::Pause { client } if client < 4)));
    }
}
