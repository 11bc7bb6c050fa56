//! What a run found: the history checker's report, the claims of validity the backend
//! broke, and the run's statistics; as text and as JSON.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use dlock_conformance::history::{Event, History, HoldSpan, Op, Phase};
use serde_json::json;

use crate::register::Claim;

/// What the run did to the servers' clocks.
#[derive(Debug, Clone, Default)]
pub(crate) struct Clocks {
    /// A server's clock ran fast all along.
    pub(crate) fast: bool,
    /// When a server's clock jumped: from before the jump was sent to after it was done.
    pub(crate) jumps: Vec<(Duration, Duration)>,
}

impl Clocks {
    /// Whether a clock fault may have cut short a hold that began at `from` before
    /// another was granted at `to`.
    fn explain(&self, from: Duration, to: Duration) -> bool {
        self.fast || self.jumps.iter().any(|&(sent, done)| sent <= to && done >= from)
    }
}

/// The judgement of one run.
#[derive(Debug)]
pub(crate) struct Verdict {
    pub(crate) seed: u64,
    pub(crate) target: String,
    pub(crate) duration: Duration,
    pub(crate) holds: usize,
    /// Pairs of holds that overlap in the history (a holder paused past its lease still
    /// counts as holding until it learns of the loss).
    pub(crate) overlaps: Vec<(HoldSpan, HoldSpan)>,
    /// Of those, the ones in which the older holder tried to write and was refused.
    pub(crate) overlaps_refused: usize,
    /// Of those, the ones in which the older holder wrote nothing: it was paused, or
    /// found its lease gone before writing.
    pub(crate) overlaps_silent: usize,
    pub(crate) token_regressions: Vec<(HoldSpan, HoldSpan)>,
    pub(crate) stale_writes_accepted: Vec<(Duration, u64)>,
    /// A holder claimed its lease valid until a time after another holder was granted,
    /// with no clock fault to explain it: the backend broke its own promise.
    pub(crate) broken_claims: Vec<(Claim, HoldSpan)>,
    /// The same, where a server's clock ran fast or jumped: no lease survives that (each
    /// backend's validity assumes bounded drift), and fencing is what must hold then.
    pub(crate) clock_broken_claims: Vec<(Claim, HoldSpan)>,
    pub(crate) writes: (usize, usize),
    pub(crate) lost: BTreeMap<String, usize>,
    pub(crate) acquire_errors: usize,
    /// The share of the run during which someone held the lock.
    pub(crate) availability: f64,
}

impl Verdict {
    /// The anomalies: each one fails the run.
    pub(crate) fn anomalies(&self) -> usize {
        self.token_regressions.len() + self.stale_writes_accepted.len() + self.broken_claims.len()
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn judge(
        seed: u64,
        target: String,
        duration: Duration,
        history: &History,
        claims: &[Claim],
        clocks: &Clocks,
        lost: BTreeMap<String, usize>,
        acquire_errors: usize,
    ) -> Self {
        let report = history.check();
        let holds = history.holds();
        let events = history.events();
        // The older holder's writes that ended, with `phase`, while the newer one held.
        let wrote_in_overlap = |(older, newer): &(HoldSpan, HoldSpan), phase: Phase| {
            events.iter().any(|e: &Event| {
                e.op == Op::Write
                    && e.phase == phase
                    && e.process == older.process
                    && e.token == Some(older.token)
                    && (newer.start..older.end).contains(&e.at)
            })
        };
        let overlaps_refused = report.overlaps.iter().filter(|pair| wrote_in_overlap(pair, Phase::Fail)).count();
        let overlaps_silent = report
            .overlaps
            .iter()
            .filter(|pair| !wrote_in_overlap(pair, Phase::Fail) && !wrote_in_overlap(pair, Phase::Ok))
            .count();
        let (clock_broken_claims, broken_claims): (Vec<_>, Vec<_>) = claims
            .iter()
            .filter_map(|claim| {
                let own = holds.iter().rev().find(|h| h.process == claim.process && h.token == claim.token)?;
                holds
                    .iter()
                    .find(|h| {
                        h.process != claim.process
                            && h.token > claim.token
                            && h.start >= own.start
                            && h.start < claim.valid_until.min(own.end)
                    })
                    .map(|newer| (*claim, *newer, own.start))
            })
            .partition(|(_, newer, own_start)| clocks.explain(*own_start, newer.start));
        let strip = |v: Vec<(Claim, HoldSpan, Duration)>| v.into_iter().map(|(c, n, _)| (c, n)).collect::<Vec<_>>();
        let (clock_broken_claims, broken_claims) = (strip(clock_broken_claims), strip(broken_claims));
        let writes = events.iter().filter(|e| e.op == Op::Write);
        let accepted = writes.clone().filter(|e| e.phase == Phase::Ok).count();
        let refused = writes.filter(|e| e.phase == Phase::Fail).count();
        Verdict {
            seed,
            target,
            duration,
            holds: report.holds,
            overlaps: report.overlaps.clone(),
            overlaps_refused,
            overlaps_silent,
            token_regressions: report.token_regressions,
            stale_writes_accepted: report.stale_writes.iter().map(|(at, t)| (*at, t.get())).collect(),
            broken_claims,
            clock_broken_claims,
            writes: (accepted, refused),
            lost,
            acquire_errors,
            availability: availability(&holds, duration),
        }
    }

    pub(crate) fn to_json(&self) -> serde_json::Value {
        json!({
            "seed": self.seed,
            "target": self.target,
            "duration_s": self.duration.as_secs_f64(),
            "holds": self.holds,
            "overlaps": self.overlaps.len(),
            "overlaps_refused_by_fencing": self.overlaps_refused,
            "overlaps_without_writes": self.overlaps_silent,
            "token_regressions": self.token_regressions.len(),
            "stale_writes_accepted": self.stale_writes_accepted.len(),
            "broken_validity_claims": self.broken_claims.len(),
            "validity_claims_broken_by_clock_faults": self.clock_broken_claims.len(),
            "writes_accepted": self.writes.0,
            "writes_refused": self.writes.1,
            "leases_lost": self.lost,
            "acquire_errors": self.acquire_errors,
            "availability": self.availability,
            "anomalies": self.anomalies(),
        })
    }
}

/// The share of `[0, duration)` covered by some hold.
fn availability(holds: &[HoldSpan], duration: Duration) -> f64 {
    let mut spans: Vec<(Duration, Duration)> =
        holds.iter().map(|h| (h.start.min(duration), h.end.min(duration))).filter(|(s, e)| s < e).collect();
    spans.sort();
    let mut covered = Duration::ZERO;
    let mut reach = Duration::ZERO;
    for (start, end) in spans {
        let start = start.max(reach);
        if end > start {
            covered += end - start;
            reach = end;
        }
    }
    if duration.is_zero() {
        return 0.0;
    }
    covered.as_secs_f64() / duration.as_secs_f64()
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "nemesis on {} for {:?}, seed {}", self.target, self.duration, self.seed)?;
        writeln!(f, "  holds granted            {}", self.holds)?;
        writeln!(
            f,
            "  overlaps                 {} ({} refused by fencing, {} without writes)",
            self.overlaps.len(),
            self.overlaps_refused,
            self.overlaps_silent
        )?;
        writeln!(f, "  token regressions        {}", self.token_regressions.len())?;
        writeln!(f, "  stale writes accepted    {}", self.stale_writes_accepted.len())?;
        writeln!(f, "  broken validity claims   {}", self.broken_claims.len())?;
        writeln!(f, "  ... by clock faults      {}", self.clock_broken_claims.len())?;
        writeln!(f, "  writes accepted/refused  {}/{}", self.writes.0, self.writes.1)?;
        writeln!(f, "  leases lost              {:?}", self.lost)?;
        writeln!(f, "  acquire errors           {}", self.acquire_errors)?;
        writeln!(f, "  availability             {:.1}%", self.availability * 100.0)?;
        for (a, b) in self.overlaps.iter().take(5) {
            writeln!(f, "  overlap: {a:?} and {b:?}")?;
        }
        for (a, b) in self.token_regressions.iter().take(5) {
            writeln!(f, "  token regression: {a:?} then {b:?}")?;
        }
        for (claim, newer) in self.broken_claims.iter().take(5) {
            writeln!(f, "  broken claim: {claim:?}, while {newer:?}")?;
        }
        write!(f, "  anomalies                {}", self.anomalies())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock::FencingToken;

    fn hold(process: usize, token: u64, start: u64, end: u64) -> HoldSpan {
        HoldSpan {
            process,
            token: FencingToken::new(token),
            start: Duration::from_millis(start),
            end: Duration::from_millis(end),
            kind: dlock_core::HoldKind::Exclusive,
        }
    }

    #[test]
    fn availability_counts_covered_time_once() {
        let holds = [hold(0, 1, 0, 100), hold(1, 2, 50, 150), hold(2, 3, 300, 400)];
        assert!((availability(&holds, Duration::from_millis(1000)) - 0.25).abs() < 1e-9);
    }

    fn event(process: usize, op: Op, phase: Phase, at: u64, token: u64) -> Event {
        Event { process, op, phase, at: Duration::from_millis(at), token: Some(FencingToken::new(token)) }
    }

    #[test]
    fn a_grant_inside_a_holders_claimed_validity_is_an_anomaly() {
        let history = History::new();
        for e in [
            event(0, Op::Acquire, Phase::Ok, 0, 1),
            event(1, Op::Acquire, Phase::Ok, 500, 2),
            event(0, Op::Release, Phase::Invoke, 900, 1),
            event(1, Op::Release, Phase::Invoke, 950, 2),
        ] {
            history.record_at(e);
        }
        let claim = |valid_until| Claim {
            process: 0,
            token: FencingToken::new(1),
            at: Duration::from_millis(100),
            valid_until: Duration::from_millis(valid_until),
        };
        let judge = |claims: &[Claim], clocks: &Clocks| {
            Verdict::judge(0, "t".into(), Duration::from_secs(1), &history, claims, clocks, BTreeMap::new(), 0)
        };
        let calm = Clocks::default();
        assert_eq!(judge(&[claim(400)], &calm).anomalies(), 0, "validity ended before the next grant");
        assert_eq!(judge(&[claim(600)], &calm).broken_claims.len(), 1);
        assert_eq!(judge(&[claim(600)], &calm).overlaps.len(), 1);
        // A clock that jumped between the two grants explains it; one after does not.
        let jumped =
            |at| Clocks { fast: false, jumps: vec![(Duration::from_millis(at), Duration::from_millis(at + 5))] };
        let explained = judge(&[claim(600)], &jumped(300));
        assert_eq!((explained.anomalies(), explained.clock_broken_claims.len()), (0, 1));
        assert_eq!(judge(&[claim(600)], &jumped(700)).anomalies(), 1);
        // So does a jump sent before the newer grant that ended after it.
        assert_eq!(judge(&[claim(600)], &jumped(497)).anomalies(), 0);
    }
}
