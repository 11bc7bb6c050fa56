//! What a run found: the history checker's report, the claims of validity the backend
//! broke, and the run's statistics; as text and as JSON.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use dlock::{FencingToken, HoldKind};
use dlock_conformance::history::{Event, History, HoldSpan, Op, Phase};
use serde_json::json;

use crate::client::Mode;
use crate::mutant::Mutant;
use crate::plan::Act;
use crate::register::Claim;

/// What the run did to the servers' clocks.
#[derive(Debug, Clone, Default)]
pub(crate) struct Clocks {
    /// How many times too fast one server's clock ran all run long, if one did.
    pub(crate) fast: Option<f64>,
    /// The jumps applied: (server, from before it was sent, to after it was done).
    pub(crate) jumps: Vec<(usize, Duration, Duration)>,
}

impl Clocks {
    /// Whether a clock fault may have cut short the lease a holder granted at
    /// `own_start` claimed valid until `claim.valid_until`, before another was granted
    /// at `newer_start`: a jump applied between the two grants, or a fast clock in the
    /// part of the lease it shortens (a server whose clock runs `f` times too fast keeps
    /// a key for `ttl / f`, so it can only explain a grant within `ttl * (1 - 1/f)` of
    /// the claimed end). Which servers held the lock is not known: a quorum may be a
    /// bare one that includes the faulty server.
    fn explain(&self, claim: &Claim, own_start: Duration, newer_start: Duration, ttl: Duration) -> bool {
        let jumped = self.jumps.iter().any(|&(_, sent, done)| sent <= newer_start && done >= own_start);
        let fast = self.fast.is_some_and(|f| newer_start + ttl.mul_f64(1.0 - 1.0 / f) >= claim.valid_until);
        jumped || fast
    }
}

/// One fault as it was played.
#[derive(Debug, Clone)]
pub(crate) struct Played {
    pub(crate) act: Act,
    pub(crate) from: Duration,
    pub(crate) to: Duration,
    /// Why it could not be applied (or healed), if it could not.
    pub(crate) failed: Option<String>,
}

/// One event of the `idempotent` mode.
#[derive(Debug, Clone)]
pub(crate) struct WorkEvent {
    pub(crate) process: usize,
    pub(crate) at: Duration,
    /// `start`, `ran`, `stored`, `busy` or `error`.
    pub(crate) phase: String,
    pub(crate) key: usize,
}

/// What the run was.
#[derive(Debug, Clone)]
pub(crate) struct RunFacts {
    pub(crate) seed: u64,
    pub(crate) target: String,
    pub(crate) mode: Mode,
    pub(crate) mutant: Option<Mutant>,
    /// Why the topology is known to lose grants under these faults, if it is.
    pub(crate) unsafe_by_design: Option<&'static str>,
    pub(crate) duration: Duration,
    pub(crate) ttl: Duration,
    pub(crate) clients: usize,
    pub(crate) servers: usize,
}

/// What the clients reported besides their holds.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    pub(crate) lost: BTreeMap<String, usize>,
    pub(crate) acquire_errors: usize,
    pub(crate) renewals: u64,
    pub(crate) unsent_writes: usize,
    pub(crate) work: Vec<WorkEvent>,
}

/// The judgement of one run.
#[derive(Debug)]
pub(crate) struct Verdict {
    pub(crate) run: RunFacts,
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
    /// Writes the fenced register accepted from an older holder after a newer hold was
    /// granted (before the newer holder's first write: after it, the register refuses
    /// them), with no clock fault to explain them.
    pub(crate) stale_writes_accepted: Vec<(Duration, u64)>,
    /// The same, where the writer's last claim still covered the newer grant and a clock
    /// fault explains that grant (as for [`Self::clock_broken_claims`]): no lease survives
    /// that, and fencing orders such a write before the newer holder's writes.
    pub(crate) clock_stale_writes: Vec<(Duration, u64)>,
    /// For each stale write (accepted, then after clock faults), what made it stale: the
    /// writer's last claim before it and the newer hold granted before the register
    /// applied it.
    pub(crate) stale_writes_why: Vec<String>,
    /// A holder claimed its lease valid until a time after another holder was granted
    /// beside it (one that excludes it, or one too many permits), with no clock fault to
    /// explain it: the backend broke its own promise.
    pub(crate) broken_claims: Vec<(Claim, HoldSpan)>,
    /// The same, where enough servers' clocks jumped between the two grants: no lease
    /// survives that (each backend's validity assumes bounded drift), and fencing is what
    /// must hold then.
    pub(crate) clock_broken_claims: Vec<(Claim, HoldSpan)>,
    pub(crate) writes: (usize, usize),
    pub(crate) seen: Seen,
    /// The share of the run during which someone held the lock.
    pub(crate) availability: f64,
    /// Per kind of fault: (played, failed).
    pub(crate) faults: BTreeMap<&'static str, (usize, usize)>,
    pub(crate) failures: Vec<String>,
    /// Holds during which a fault hit their client or the servers.
    pub(crate) holds_interrupted: usize,
    /// Pauses longer than the ttl that began while the paused client held the lock.
    pub(crate) holder_paused_past_ttl: usize,
    /// `idempotent` mode: runs of the work, and runs that began after the key's result
    /// had been stored and acknowledged.
    pub(crate) work_runs: usize,
    pub(crate) work_repeated: Vec<WorkEvent>,
}

impl Verdict {
    /// The anomalies: each one fails the run (unless the topology is documented unsafe).
    pub(crate) fn anomalies(&self) -> usize {
        self.token_regressions.len()
            + self.stale_writes_accepted.len()
            + self.broken_claims.len()
            + self.work_repeated.len()
    }

    /// Why the run is no evidence either way, if it is not: it granted or wrote nothing,
    /// played no fault, could not reach the register, or a fault failed to apply.
    pub(crate) fn proves_nothing(&self) -> Vec<String> {
        let mut why = Vec::new();
        if self.run.mode == Mode::Idempotent {
            if self.work_runs == 0 {
                why.push("no work ran".to_string());
            }
        } else {
            if self.holds == 0 {
                why.push("no hold was granted".to_string());
            }
            if self.writes.0 + self.writes.1 == 0 {
                why.push("no write reached the register".to_string());
            }
        }
        if self.faults.values().map(|f| f.0).sum::<usize>() == 0 {
            why.push("no fault was played".to_string());
        }
        if self.seen.unsent_writes > 0 {
            why.push(format!("{} writes could not reach the register", self.seen.unsent_writes));
        }
        why.extend(self.failures.iter().map(|f| format!("a fault failed: {f}")));
        why
    }

    pub(crate) fn judge(
        run: RunFacts,
        history: &History,
        claims: &[Claim],
        clocks: &Clocks,
        timeline: &[Played],
        seen: Seen,
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
        let (clock_broken_claims, broken_claims): (Vec<_>, Vec<_>) = broken_claims(&holds, claims)
            .into_iter()
            .partition(|(claim, own, newer)| clocks.explain(claim, own.start, newer.start, run.ttl));
        let (clock_stale_writes, stale_writes): (Vec<_>, Vec<_>) =
            report.stale_writes.iter().map(|&(at, token)| Stale::find(&holds, claims, at, token)).partition(|stale| {
                stale.claim.zip(stale.own).zip(stale.newer).is_some_and(|((claim, own), newer)| {
                    claim.valid_until > newer.start && clocks.explain(&claim, own.start, newer.start, run.ttl)
                })
            });
        let strip = |v: Vec<(Claim, HoldSpan, HoldSpan)>| v.into_iter().map(|(c, _, n)| (c, n)).collect::<Vec<_>>();
        let writes = events.iter().filter(|e| e.op == Op::Write);
        let accepted = writes.clone().filter(|e| e.phase == Phase::Ok).count();
        let refused = writes.filter(|e| e.phase == Phase::Fail).count();
        let mut faults: BTreeMap<&'static str, (usize, usize)> = BTreeMap::new();
        for played in timeline {
            let entry = faults.entry(played.act.kind()).or_default();
            entry.0 += 1;
            entry.1 += usize::from(played.failed.is_some());
        }
        let failures = timeline.iter().filter_map(|p| p.failed.as_ref().map(|f| format!("{}: {f}", p.act))).collect();
        let hits = |hold: &HoldSpan, played: &Played| {
            played.failed.is_none()
                && played.from < hold.end
                && hold.start < played.to
                && played.act.client().is_none_or(|client| client == hold.process)
        };
        let holds_interrupted = holds.iter().filter(|h| timeline.iter().any(|p| hits(h, p))).count();
        let holder_paused_past_ttl = timeline
            .iter()
            .filter(|p| matches!(p.act, Act::Pause { .. }) && p.to - p.from > run.ttl)
            .filter(|p| holds.iter().any(|h| Some(h.process) == p.act.client() && h.start <= p.from && p.from < h.end))
            .count();
        let work_runs = seen.work.iter().filter(|w| w.phase == "start").count();
        let work_repeated = repeated_work(&seen.work);
        Verdict {
            holds: report.holds,
            overlaps: report.overlaps.clone(),
            overlaps_refused,
            overlaps_silent,
            token_regressions: report.token_regressions,
            stale_writes_accepted: stale_writes.iter().map(|s| (s.at, s.token.get())).collect(),
            clock_stale_writes: clock_stale_writes.iter().map(|s| (s.at, s.token.get())).collect(),
            stale_writes_why: stale_writes
                .iter()
                .map(|s| format!("{s}"))
                .chain(clock_stale_writes.iter().map(|s| format!("{s} (after a clock fault)")))
                .collect(),
            broken_claims: strip(broken_claims),
            clock_broken_claims: strip(clock_broken_claims),
            writes: (accepted, refused),
            availability: availability(&holds, run.duration),
            faults,
            failures,
            holds_interrupted,
            holder_paused_past_ttl,
            work_runs,
            work_repeated,
            seen,
            run,
        }
    }

    pub(crate) fn to_json(&self) -> serde_json::Value {
        let faults: serde_json::Map<String, serde_json::Value> = self
            .faults
            .iter()
            .map(|(kind, (played, failed))| (kind.to_string(), json!({ "played": played, "failed": failed })))
            .collect();
        json!({
            "seed": self.run.seed,
            "target": self.run.target,
            "mode": format!("{:?}", self.run.mode).to_lowercase(),
            "mutant": self.run.mutant.map(|m| m.to_string()),
            "documented_unsafe": self.run.unsafe_by_design,
            "duration_s": self.run.duration.as_secs_f64(),
            "ttl_ms": self.run.ttl.as_millis() as u64,
            "clients": self.run.clients,
            "servers": self.run.servers,
            "holds": self.holds,
            "overlaps": self.overlaps.len(),
            "overlaps_refused_by_fencing": self.overlaps_refused,
            "overlaps_without_writes": self.overlaps_silent,
            "token_regressions": self.token_regressions.len(),
            "stale_writes_accepted": self.stale_writes_accepted.len(),
            "stale_writes_after_clock_faults": self.clock_stale_writes.len(),
            "broken_validity_claims": self.broken_claims.len(),
            "validity_claims_broken_by_clock_faults": self.clock_broken_claims.len(),
            "writes_accepted": self.writes.0,
            "writes_refused": self.writes.1,
            "writes_unsent": self.seen.unsent_writes,
            "renewals": self.seen.renewals,
            "leases_lost": self.seen.lost,
            "acquire_errors": self.seen.acquire_errors,
            "availability": self.availability,
            "faults": faults,
            "faults_played": self.faults.values().map(|f| f.0).sum::<usize>(),
            "server_faults_played": self.server_faults(),
            "holds_interrupted": self.holds_interrupted,
            "holder_paused_past_ttl": self.holder_paused_past_ttl,
            "work_runs": self.work_runs,
            "work_repeated": self.work_repeated.len(),
            "proves_nothing": self.proves_nothing(),
            "first_anomaly_s": self.first_anomaly().map(|at| at.as_secs_f64()),
            "anomalies": self.anomalies(),
        })
    }

    /// When the first anomaly happened (the later grant, write or run that made it).
    pub(crate) fn first_anomaly(&self) -> Option<Duration> {
        let regressions = self.token_regressions.iter().map(|(_, later)| later.start);
        let stale = self.stale_writes_accepted.iter().map(|(at, _)| *at);
        let claims = self.broken_claims.iter().map(|(_, newer)| newer.start);
        let work = self.work_repeated.iter().map(|w| w.at);
        regressions.chain(stale).chain(claims).chain(work).min()
    }

    /// Faults played on the servers (kills, partitions, clock jumps, failovers, slot
    /// moves), not failed.
    pub(crate) fn server_faults(&self) -> usize {
        ["kill", "kill_quorum", "partition", "clock_jump", "failover", "migration"]
            .iter()
            .filter_map(|kind| self.faults.get(kind))
            .map(|(played, failed)| played - failed)
            .sum()
    }
}

/// Whether `hold` was held, with a claim of validity that covered `at`: the claim made
/// last before `at`, else the first made after it.
fn validly_held(hold: &HoldSpan, claims: &[Claim], at: Duration) -> Option<Claim> {
    if !(hold.start <= at && at < hold.end) {
        return None;
    }
    // A claim made with no time left claims nothing (a client that skipped its check).
    let own = claims.iter().filter(|c| c.process == hold.process && c.token == hold.token && c.valid_until > c.at);
    let before = own.clone().filter(|c| c.at <= at).max_by_key(|c| c.at);
    before.or_else(|| own.filter(|c| c.at > at).min_by_key(|c| c.at)).filter(|c| c.valid_until > at).copied()
}

/// Grants the backend made beside a hold whose holder still claimed it valid, where the
/// two may not be held together: (the older holder's claim, its hold, the newer hold).
fn broken_claims(holds: &[HoldSpan], claims: &[Claim]) -> Vec<(Claim, HoldSpan, HoldSpan)> {
    let mut broken = Vec::new();
    for (i, newer) in holds.iter().enumerate() {
        let company: Vec<(Claim, &HoldSpan)> = holds[..i]
            .iter()
            .filter(|o| o.process != newer.process)
            .filter_map(|o| validly_held(o, claims, newer.start).map(|c| (c, o)))
            .collect();
        if let Some((claim, older)) = company.iter().find(|(_, o)| !o.kind.compatible(newer.kind)) {
            broken.push((*claim, **older, *newer));
            continue;
        }
        let count = |kind: HoldKind| match kind {
            HoldKind::Permit { permits } => permits as usize,
            _ => usize::MAX,
        };
        let permits: Vec<&(Claim, &HoldSpan)> =
            company.iter().filter(|(_, o)| matches!(o.kind, HoldKind::Permit { .. })).collect();
        let together = permits.len() + 1;
        if matches!(newer.kind, HoldKind::Permit { .. })
            && permits.iter().map(|(_, o)| o.kind).chain([newer.kind]).any(|k| together > count(k))
        {
            if let Some((claim, older)) = permits.last() {
                broken.push((*claim, **older, *newer));
            }
        }
    }
    broken
}

/// A stale write and what made it stale: the writer's last claim of validity before it,
/// the writer's hold, and the newer hold granted before the register applied it.
struct Stale {
    at: Duration,
    token: FencingToken,
    claim: Option<Claim>,
    own: Option<HoldSpan>,
    newer: Option<HoldSpan>,
}

impl Stale {
    fn find(holds: &[HoldSpan], claims: &[Claim], at: Duration, token: FencingToken) -> Self {
        let claim = claims.iter().filter(|c| c.token == token && c.at <= at).max_by_key(|c| c.at).copied();
        let own = holds.iter().rev().find(|h| h.token == token && h.start <= at).copied();
        let newer = holds.iter().find(|h| h.token > token && h.start <= at).copied();
        Stale { at, token, claim, own, newer }
    }
}

/// Its token and when the register applied it, the writer's claim (when it checked, and
/// until when), and the newer hold.
impl fmt::Display for Stale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let claim = self.claim.map_or_else(
            || "no claim".to_string(),
            |c| format!("checked at {:?}, valid until {:?}", c.at, c.valid_until),
        );
        write!(f, "token {} applied at {:?} ({claim}) after {:?}", self.token, self.at, self.newer)
    }
}

/// Runs of a key's work that began after a result of that key had been stored and
/// acknowledged (a `ran`, or a `stored` answer).
fn repeated_work(work: &[WorkEvent]) -> Vec<WorkEvent> {
    let mut stored: BTreeMap<usize, Duration> = BTreeMap::new();
    for w in work.iter().filter(|w| w.phase == "ran" || w.phase == "stored") {
        let first = stored.entry(w.key).or_insert(w.at);
        *first = (*first).min(w.at);
    }
    work.iter().filter(|w| w.phase == "start" && stored.get(&w.key).is_some_and(|at| *at < w.at)).cloned().collect()
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
        let run = &self.run;
        write!(f, "nemesis on {} for {:?}, seed {}, mode {:?}", run.target, run.duration, run.seed, run.mode)?;
        if let Some(mutant) = run.mutant {
            write!(f, ", mutant {mutant}")?;
        }
        writeln!(f)?;
        if let Some(why) = run.unsafe_by_design {
            writeln!(f, "  documented unsafe: {why}")?;
        }
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
        writeln!(f, "  ... after clock faults   {}", self.clock_stale_writes.len())?;
        writeln!(f, "  broken validity claims   {}", self.broken_claims.len())?;
        writeln!(f, "  ... by clock faults      {}", self.clock_broken_claims.len())?;
        writeln!(f, "  writes accepted/refused  {}/{}", self.writes.0, self.writes.1)?;
        writeln!(f, "  renewals                 {}", self.seen.renewals)?;
        writeln!(f, "  leases lost              {:?}", self.seen.lost)?;
        writeln!(f, "  acquire errors           {}", self.seen.acquire_errors)?;
        writeln!(f, "  faults (played, failed)  {:?}", self.faults)?;
        writeln!(f, "  holds interrupted        {}", self.holds_interrupted)?;
        writeln!(f, "  holder paused past ttl   {}", self.holder_paused_past_ttl)?;
        if run.mode == Mode::Idempotent {
            writeln!(f, "  work runs / repeated     {}/{}", self.work_runs, self.work_repeated.len())?;
        }
        writeln!(f, "  availability             {:.1}%", self.availability * 100.0)?;
        for (a, b) in self.overlaps.iter().take(5) {
            writeln!(f, "  overlap: {a:?} and {b:?}")?;
        }
        for (a, b) in self.token_regressions.iter().take(5) {
            writeln!(f, "  token regression: {a:?} then {b:?}")?;
        }
        for why in self.stale_writes_why.iter().take(5) {
            writeln!(f, "  stale write: {why}")?;
        }
        for (claim, newer) in self.broken_claims.iter().take(5) {
            writeln!(f, "  broken claim: {claim:?}, while {newer:?}")?;
        }
        for w in self.work_repeated.iter().take(5) {
            writeln!(f, "  work of key {} ran again at {:?} on client {}", w.key, w.at, w.process)?;
        }
        for why in self.proves_nothing() {
            writeln!(f, "  proves nothing: {why}")?;
        }
        if let Some(at) = self.first_anomaly() {
            writeln!(f, "  first anomaly at         {:.1}s", at.as_secs_f64())?;
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

    fn facts() -> RunFacts {
        RunFacts {
            seed: 0,
            target: "t".into(),
            mode: Mode::Lock,
            mutant: None,
            unsafe_by_design: None,
            duration: Duration::from_secs(1),
            ttl: Duration::from_millis(100),
            clients: 2,
            servers: 1,
        }
    }

    fn claim(process: usize, token: u64, valid_until: u64) -> Claim {
        Claim {
            process,
            token: FencingToken::new(token),
            at: Duration::from_millis(100),
            valid_until: Duration::from_millis(valid_until),
            ends: Duration::from_millis(valid_until),
        }
    }

    fn two_holds(kinds: [HoldKind; 2]) -> std::sync::Arc<History> {
        let history = History::new();
        history.set_kind_at(Duration::ZERO, 0, kinds[0]);
        history.set_kind_at(Duration::ZERO, 1, kinds[1]);
        for e in [
            event(0, Op::Acquire, Phase::Ok, 0, 1),
            event(1, Op::Acquire, Phase::Ok, 500, 2),
            event(0, Op::Release, Phase::Invoke, 900, 1),
            event(1, Op::Release, Phase::Invoke, 950, 2),
        ] {
            history.record_at(e);
        }
        history
    }

    fn judge(history: &History, claims: &[Claim], clocks: &Clocks) -> Verdict {
        Verdict::judge(facts(), history, claims, clocks, &[], Seen::default())
    }

    #[test]
    fn a_grant_inside_a_holders_claimed_validity_is_an_anomaly() {
        let history = two_holds([HoldKind::Exclusive; 2]);
        let calm = Clocks::default();
        assert_eq!(judge(&history, &[claim(0, 1, 400)], &calm).anomalies(), 0, "validity ended before the next grant");
        assert_eq!(judge(&history, &[claim(0, 1, 600)], &calm).broken_claims.len(), 1);
        assert_eq!(judge(&history, &[claim(0, 1, 600)], &calm).overlaps.len(), 1);
        // A clock that jumped between the two grants explains it; one after does not.
        let jumped =
            |at| Clocks { fast: None, jumps: vec![(0, Duration::from_millis(at), Duration::from_millis(at + 5))] };
        let explained = judge(&history, &[claim(0, 1, 600)], &jumped(300));
        assert_eq!((explained.anomalies(), explained.clock_broken_claims.len()), (0, 1));
        assert_eq!(judge(&history, &[claim(0, 1, 600)], &jumped(700)).anomalies(), 1);
        // So does a jump sent before the newer grant that ended after it.
        assert_eq!(judge(&history, &[claim(0, 1, 600)], &jumped(497)).anomalies(), 0);
        // A clock twice too fast shortens the last half of a lease (the ttl is 100 ms):
        // it explains a grant 40 ms before the claimed end, not one 100 ms before.
        let fast = Clocks { fast: Some(2.0), jumps: Vec::new() };
        assert_eq!(judge(&history, &[claim(0, 1, 540)], &fast).anomalies(), 0);
        assert_eq!(judge(&history, &[claim(0, 1, 600)], &fast).anomalies(), 1);
    }

    #[test]
    fn a_stale_write_is_an_anomaly_unless_a_clock_fault_cut_the_claim_it_was_made_under() {
        // Holder 0 writes at 550, after holder 1's grant at 500 and before holder 1 wrote:
        // the register accepts it.
        let history = two_holds([HoldKind::Exclusive; 2]);
        history.record_at(event(0, Op::Write, Phase::Ok, 550, 1));
        let calm = Clocks::default();
        let jumped = Clocks { fast: None, jumps: vec![(0, Duration::from_millis(300), Duration::from_millis(305))] };
        // Made under a claim that covered the newer grant, with a jump between the grants:
        // the clock explains it.
        let explained = judge(&history, &[claim(0, 1, 600)], &jumped);
        assert_eq!((explained.stale_writes_accepted.len(), explained.clock_stale_writes.len()), (0, 1));
        assert!(explained.stale_writes_why[0].ends_with("(after a clock fault)"), "{:?}", explained.stale_writes_why);
        // Without the jump, it is an anomaly (and so is the claim).
        let calm_verdict = judge(&history, &[claim(0, 1, 600)], &calm);
        assert_eq!((calm_verdict.stale_writes_accepted.len(), calm_verdict.clock_stale_writes.len()), (1, 0));
        // A write in flight past the claim it was made under is one, jump or not: no clock
        // cut that claim short.
        let in_flight = judge(&history, &[claim(0, 1, 400)], &jumped);
        assert_eq!((in_flight.stale_writes_accepted.len(), in_flight.anomalies()), (1, 1));
        // So is a write made under no claim.
        assert_eq!(judge(&history, &[], &jumped).stale_writes_accepted.len(), 1);
    }

    #[test]
    fn holds_that_may_be_held_together_break_no_claim_and_a_writer_beside_a_reader_does() {
        let calm = Clocks::default();
        let readers = two_holds([HoldKind::Shared; 2]);
        assert_eq!(judge(&readers, &[claim(0, 1, 600)], &calm).anomalies(), 0);
        let writer = two_holds([HoldKind::Shared, HoldKind::Exclusive]);
        assert_eq!(judge(&writer, &[claim(0, 1, 600)], &calm).broken_claims.len(), 1);
        let permits = |a, b| two_holds([HoldKind::Permit { permits: a }, HoldKind::Permit { permits: b }]);
        assert_eq!(judge(&permits(2, 2), &[claim(0, 1, 600)], &calm).anomalies(), 0);
        assert_eq!(
            judge(&permits(1, 2), &[claim(0, 1, 600)], &calm).broken_claims.len(),
            1,
            "the first asked to be alone"
        );
        assert_eq!(
            judge(&permits(2, 1), &[claim(0, 1, 600)], &calm).broken_claims.len(),
            1,
            "the second asked to be alone"
        );
    }

    #[test]
    fn work_that_runs_after_its_result_was_stored_is_an_anomaly() {
        let w = |process, at, phase: &str, key| WorkEvent {
            process,
            at: Duration::from_millis(at),
            phase: phase.to_string(),
            key,
        };
        let calm = [w(0, 0, "start", 1), w(1, 10, "busy", 1), w(0, 50, "ran", 1), w(1, 60, "stored", 1)];
        assert!(repeated_work(&calm).is_empty());
        // A run that failed stores nothing: the next run is a retry, not a repeat.
        let retried = [w(0, 0, "start", 1), w(0, 50, "error", 1), w(1, 60, "start", 1), w(1, 90, "ran", 1)];
        assert!(repeated_work(&retried).is_empty());
        let again = [w(0, 0, "start", 1), w(0, 50, "ran", 1), w(1, 60, "start", 1), w(2, 70, "start", 2)];
        let repeated = repeated_work(&again);
        assert_eq!(
            repeated.iter().map(|w| (w.key, w.at, w.process)).collect::<Vec<_>>(),
            [(1, Duration::from_millis(60), 1)]
        );
    }

    #[test]
    fn a_run_without_holds_writes_or_faults_proves_nothing() {
        let history = two_holds([HoldKind::Exclusive; 2]);
        let calm = Clocks::default();
        let verdict = judge(&history, &[], &calm);
        let why = verdict.proves_nothing().join("; ");
        assert!(why.contains("no write") && why.contains("no fault"), "{why}");
        let empty = judge(&History::new(), &[], &calm);
        assert!(empty.proves_nothing().iter().any(|w| w.contains("no hold")));
        let played = Played {
            act: Act::Pause { client: 0 },
            from: Duration::ZERO,
            to: Duration::from_millis(200),
            failed: None,
        };
        let failed = Played { act: Act::ClockJump { server: 0 }, failed: Some("down".into()), ..played.clone() };
        let seen = Seen { unsent_writes: 1, ..Seen::default() };
        let verdict = Verdict::judge(facts(), &history, &[], &calm, &[played, failed], seen);
        let why = verdict.proves_nothing().join("; ");
        assert!(!why.contains("no fault") && why.contains("register") && why.contains("failed"), "{why}");
        assert_eq!(verdict.holds_interrupted, 1, "the pause hit client 0's hold");
        assert_eq!(verdict.holder_paused_past_ttl, 1);
    }
}
