//! The history checker: a log of every lock operation with monotonic times and tokens,
//! and the checks run over it.
//!
//! A hold runs from the acknowledged acquire to the invoke of its release (or the lost
//! signal, whichever comes first): the span in which the holder believes it holds a
//! valid lease. The checker reports holds that overlap, tokens that do not strictly
//! increase in grant order, and writes a [`FencedRegister`] accepted from a holder that
//! a newer holder had already superseded.
//!
//! Holds are exclusive unless a process said otherwise ([`History::set_kind`]): then
//! only holds that may not be held together count as overlapping (a writer with anyone,
//! more permits than a permit's own count), and tokens must increase between holds of
//! which one excludes the other.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock_core::backend::lock_unpoisoned;
use dlock_core::{FencingToken, HoldKind};

/// The operations the checker knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `acquire` / `try_acquire`.
    Acquire,
    /// `release`.
    Release,
    /// The lease's lost signal fired.
    Lost,
    /// A write to the protected resource.
    Write,
}

/// Where an operation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Sent.
    Invoke,
    /// Acknowledged.
    Ok,
    /// Definitely failed.
    Fail,
    /// Outcome unknown (a timeout).
    Unknown,
}

/// One entry of the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// Which worker did it.
    pub process: usize,
    /// What it did.
    pub op: Op,
    /// How far it got.
    pub phase: Phase,
    /// When, since the history began (monotonic clock).
    pub at: Duration,
    /// The fencing token involved, if any.
    pub token: Option<FencingToken>,
}

/// A concurrent, append-only operation log.
#[derive(Debug)]
pub struct History {
    start: Instant,
    events: Mutex<Vec<Event>>,
    /// (when, process, kind): the kind of the holds a process starts from then on.
    kinds: Mutex<Vec<(Duration, usize, HoldKind)>>,
}

impl Default for History {
    fn default() -> Self {
        History { start: Instant::now(), events: Mutex::new(Vec::new()), kinds: Mutex::new(Vec::new()) }
    }
}

/// One hold derived from the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HoldSpan {
    /// The holder.
    pub process: usize,
    /// Its token.
    pub token: FencingToken,
    /// From the acquire's acknowledgement.
    pub start: Duration,
    /// To the release's invoke or the lost signal (`Duration::MAX` if neither came).
    pub end: Duration,
    /// What kind of hold it was.
    pub kind: HoldKind,
}

impl HoldSpan {
    fn overlaps(&self, other: &HoldSpan) -> bool {
        self.start < other.end && other.start < self.end
    }

    /// Whether the two may not be held together at all (whatever else is held).
    fn excludes(&self, other: &HoldSpan) -> bool {
        !self.kind.compatible(other.kind)
    }
}

/// What the checker found.
#[derive(Debug, Default)]
pub struct Report {
    /// Holds found.
    pub holds: usize,
    /// Pairs of holds that overlap.
    pub overlaps: Vec<(HoldSpan, HoldSpan)>,
    /// Pairs of successive holds whose tokens did not strictly increase.
    pub token_regressions: Vec<(HoldSpan, HoldSpan)>,
    /// Writes accepted (at, token) after a holder with a higher token had been granted.
    pub stale_writes: Vec<(Duration, FencingToken)>,
}

impl Report {
    /// Whether nothing was found.
    pub fn is_clean(&self) -> bool {
        self.overlaps.is_empty() && self.token_regressions.is_empty() && self.stale_writes.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} holds, {} overlapping, {} token regressions, {} stale writes accepted",
            self.holds,
            self.overlaps.len(),
            self.token_regressions.len(),
            self.stale_writes.len()
        )?;
        for (a, b) in self.overlaps.iter().take(5) {
            write!(f, "\n  overlap: {a:?} and {b:?}")?;
        }
        for (a, b) in self.token_regressions.iter().take(5) {
            write!(f, "\n  token regression: {a:?} then {b:?}")?;
        }
        Ok(())
    }
}

impl History {
    /// An empty history starting now.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Appends an event stamped with the current time.
    pub fn record(&self, process: usize, op: Op, phase: Phase, token: Option<FencingToken>) {
        let at = self.start.elapsed();
        lock_unpoisoned(&self.events).push(Event { process, op, phase, at, token });
    }

    /// Says that the holds `process` starts from now on are of `kind` (until it says
    /// otherwise). Without it, every hold is exclusive.
    pub fn set_kind(&self, process: usize, kind: HoldKind) {
        let at = self.start.elapsed();
        lock_unpoisoned(&self.kinds).push((at, process, kind));
    }

    /// Says that the holds `process` starts from `at` on are of `kind`: as
    /// [`set_kind`](Self::set_kind), stamped elsewhere (see [`record_at`](Self::record_at)).
    pub fn set_kind_at(&self, at: Duration, process: usize, kind: HoldKind) {
        lock_unpoisoned(&self.kinds).push((at, process, kind));
    }

    /// The kind `process` had set by `at`.
    fn kind_at(kinds: &[(Duration, usize, HoldKind)], process: usize, at: Duration) -> HoldKind {
        kinds.iter().rev().find(|(when, p, _)| *p == process && *when <= at).map_or(HoldKind::Exclusive, |k| k.2)
    }

    /// Appends an event stamped elsewhere: by another process whose monotonic clock is
    /// this one's (as on one machine), counted from the moment this history began.
    pub fn record_at(&self, event: Event) {
        lock_unpoisoned(&self.events).push(event);
    }

    /// A copy of every event so far, in recording order.
    pub fn events(&self) -> Vec<Event> {
        lock_unpoisoned(&self.events).clone()
    }

    /// The holds the history shows, in grant order.
    pub fn holds(&self) -> Vec<HoldSpan> {
        let events = self.events();
        let kinds = lock_unpoisoned(&self.kinds).clone();
        let mut open: std::collections::HashMap<usize, HoldSpan> = std::collections::HashMap::new();
        let mut holds = Vec::new();
        for e in &events {
            match (e.op, e.phase) {
                (Op::Acquire, Phase::Ok) => {
                    if let Some(token) = e.token {
                        let kind = Self::kind_at(&kinds, e.process, e.at);
                        let hold = HoldSpan { process: e.process, token, start: e.at, end: Duration::MAX, kind };
                        if let Some(prev) = open.insert(e.process, hold) {
                            holds.push(prev);
                        }
                    }
                }
                (Op::Release, Phase::Invoke) | (Op::Lost, Phase::Ok) => {
                    if let Some(mut hold) = open.remove(&e.process) {
                        hold.end = e.at;
                        holds.push(hold);
                    }
                }
                _ => {}
            }
        }
        holds.extend(open.into_values());
        holds.sort_by_key(|h| h.start);
        holds
    }

    /// Runs every check.
    pub fn check(&self) -> Report {
        let holds = self.holds();
        let mut report = Report { holds: holds.len(), ..Report::default() };
        if holds.iter().all(|h| h.kind == HoldKind::Exclusive) {
            let mut latest: Option<HoldSpan> = None;
            for pair in holds.windows(2) {
                if pair[1].token <= pair[0].token {
                    report.token_regressions.push((pair[0], pair[1]));
                }
            }
            for hold in &holds {
                if let Some(prev) = latest {
                    if hold.start < prev.end {
                        report.overlaps.push((prev, *hold));
                    }
                    if hold.end > prev.end {
                        latest = Some(*hold);
                    }
                } else {
                    latest = Some(*hold);
                }
            }
        } else {
            check_kinds(&holds, &mut report);
        }
        for e in self.events() {
            if let (Op::Write, Phase::Ok, Some(token)) = (e.op, e.phase, e.token) {
                // The writer's own hold, for its kind: a reader's write is stale only
                // once a writer (or a hold it may not share with) has been granted.
                let writer = holds.iter().rev().find(|h| h.process == e.process && h.token == token && h.start <= e.at);
                let excludes = |h: &HoldSpan| writer.is_none_or(|w| w.excludes(h));
                if holds.iter().any(|h| h.start <= e.at && h.token > token && excludes(h)) {
                    report.stale_writes.push((e.at, token));
                }
            }
        }
        report
    }
}

/// The checks for holds of several kinds: an overlap is two holds that exclude each
/// other, or a permit granted beside more permit holds than its own count or the count
/// of any of them allows; a token regression is a hold granted after one it excludes
/// with a token not above it.
fn check_kinds(holds: &[HoldSpan], report: &mut Report) {
    for (i, later) in holds.iter().enumerate() {
        let mut company: Vec<&HoldSpan> = Vec::new();
        for earlier in &holds[..i] {
            if earlier.excludes(later) {
                if earlier.overlaps(later) {
                    report.overlaps.push((*earlier, *later));
                } else if later.token <= earlier.token {
                    report.token_regressions.push((*earlier, *later));
                }
            } else if earlier.end > later.start && matches!(earlier.kind, HoldKind::Permit { .. }) {
                // Holds come in grant order: this one was still held when `later` began.
                company.push(earlier);
            }
        }
        if matches!(later.kind, HoldKind::Permit { .. }) {
            let count = |h: &HoldSpan| match h.kind {
                HoldKind::Permit { permits } => permits as usize,
                _ => usize::MAX,
            };
            let together = company.len() + 1;
            if company.iter().copied().chain([later]).any(|h| together > count(h)) {
                // More together than one of them asked for: report it beside the last joined.
                if let Some(joined) = company.last() {
                    report.overlaps.push((**joined, *later));
                }
            }
        }
    }
}

/// A model of the resource a lock protects: it refuses any write carrying a token lower
/// than the highest it has accepted, and records every write in a [`History`].
#[derive(Debug)]
pub struct FencedRegister {
    history: Arc<History>,
    state: Mutex<RegisterState>,
}

#[derive(Debug, Default)]
struct RegisterState {
    /// The highest token accepted from anyone.
    highest: Option<FencingToken>,
    /// The highest token accepted from an exclusive holder.
    highest_exclusive: Option<FencingToken>,
    value: u64,
}

/// A write the register refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaleToken {
    /// The token the write carried.
    pub offered: FencingToken,
    /// The highest token accepted so far.
    pub highest: FencingToken,
}

impl FencedRegister {
    /// An empty register recording into `history`.
    pub fn new(history: Arc<History>) -> Self {
        FencedRegister { history, state: Mutex::new(RegisterState::default()) }
    }

    /// Writes `value` if `token` is not lower than any token accepted before.
    pub fn write(&self, process: usize, token: FencingToken, value: u64) -> Result<(), StaleToken> {
        self.write_as(process, token, HoldKind::Exclusive, value)
    }

    /// Writes `value` from a hold of `kind`: an exclusive holder's write is refused
    /// below any token accepted before; a shared holder's or a permit holder's only
    /// below a token an exclusive holder wrote with, since holders that may hold
    /// together write beside each other in any order.
    pub fn write_as(&self, process: usize, token: FencingToken, kind: HoldKind, value: u64) -> Result<(), StaleToken> {
        self.history.record(process, Op::Write, Phase::Invoke, Some(token));
        let mut state = lock_unpoisoned(&self.state);
        let bar = if kind == HoldKind::Exclusive { state.highest } else { state.highest_exclusive };
        if let Some(highest) = bar.filter(|highest| token < *highest) {
            drop(state);
            self.history.record(process, Op::Write, Phase::Fail, Some(token));
            return Err(StaleToken { offered: token, highest });
        }
        state.highest = state.highest.max(Some(token));
        if kind == HoldKind::Exclusive {
            state.highest_exclusive = Some(token);
        }
        state.value = value;
        drop(state);
        self.history.record(process, Op::Write, Phase::Ok, Some(token));
        Ok(())
    }

    /// The last value written.
    pub fn value(&self) -> u64 {
        lock_unpoisoned(&self.state).value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: u64) -> Option<FencingToken> {
        Some(FencingToken::new(n))
    }

    #[test]
    fn clean_history_is_clean() {
        let h = History::new();
        h.record(0, Op::Acquire, Phase::Ok, t(1));
        h.record(0, Op::Release, Phase::Invoke, None);
        h.record(1, Op::Acquire, Phase::Ok, t(2));
        h.record(1, Op::Lost, Phase::Ok, None);
        h.record(0, Op::Acquire, Phase::Ok, t(3));
        let report = h.check();
        assert_eq!(report.holds, 3);
        assert!(report.is_clean(), "{report}");
    }

    #[test]
    fn finds_overlaps_and_regressions() {
        let h = History::new();
        h.record(0, Op::Acquire, Phase::Ok, t(5));
        h.record(1, Op::Acquire, Phase::Ok, t(4));
        h.record(0, Op::Release, Phase::Invoke, None);
        h.record(1, Op::Release, Phase::Invoke, None);
        let report = h.check();
        assert_eq!(report.overlaps.len(), 1);
        assert_eq!(report.token_regressions.len(), 1);
    }

    #[test]
    fn readers_may_overlap_but_not_a_writer_or_one_permit_too_many() {
        let h = History::new();
        h.set_kind(0, HoldKind::Shared);
        h.set_kind(1, HoldKind::Shared);
        h.record(0, Op::Acquire, Phase::Ok, t(2));
        h.record(1, Op::Acquire, Phase::Ok, t(1));
        h.record(0, Op::Release, Phase::Invoke, None);
        h.record(1, Op::Release, Phase::Invoke, None);
        h.record(2, Op::Acquire, Phase::Ok, t(3));
        h.record(2, Op::Release, Phase::Invoke, None);
        let report = h.check();
        assert_eq!(report.holds, 3);
        assert!(report.is_clean(), "readers together, then a writer above both: {report}");

        h.record(0, Op::Acquire, Phase::Ok, t(4));
        h.record(2, Op::Acquire, Phase::Ok, t(5));
        let report = h.check();
        assert_eq!(report.overlaps.len(), 1, "a writer beside a reader: {report}");

        let h = History::new();
        for p in 0..3 {
            h.set_kind(p, HoldKind::Permit { permits: 2 });
        }
        h.record(0, Op::Acquire, Phase::Ok, t(1));
        h.record(1, Op::Acquire, Phase::Ok, t(2));
        h.record(0, Op::Lost, Phase::Ok, None);
        h.record(2, Op::Acquire, Phase::Ok, t(3));
        assert!(h.check().is_clean(), "two of two permits at a time");
        h.record(0, Op::Acquire, Phase::Ok, t(4));
        assert_eq!(h.check().overlaps.len(), 1, "a third of two permits");
    }

    #[test]
    fn a_permit_holder_never_has_more_company_than_its_own_count() {
        let permits = |permits| HoldKind::Permit { permits };
        // A holder of two, then one of three joins it: two together is within both.
        let h = History::new();
        h.set_kind(0, permits(2));
        h.set_kind(1, permits(3));
        h.set_kind(2, permits(3));
        h.record(0, Op::Acquire, Phase::Ok, t(1));
        h.record(1, Op::Acquire, Phase::Ok, t(2));
        assert!(h.check().is_clean(), "two holders, each of at least two");
        // A third holder asked for three, but the first one asked for at most two.
        h.record(2, Op::Acquire, Phase::Ok, t(3));
        assert_eq!(h.check().overlaps.len(), 1, "a holder of two beside two others");

        // A holder of one never has company, whatever the newcomer asked for.
        let h = History::new();
        h.set_kind(0, permits(1));
        h.set_kind(1, permits(3));
        h.record(0, Op::Acquire, Phase::Ok, t(1));
        h.record(1, Op::Acquire, Phase::Ok, t(2));
        assert_eq!(h.check().overlaps.len(), 1, "a holder of one beside another");
        h.record(0, Op::Release, Phase::Invoke, None);
    }

    #[test]
    fn register_refuses_and_checker_sees_stale_writes() {
        let h = History::new();
        let reg = FencedRegister::new(h.clone());
        h.record(0, Op::Acquire, Phase::Ok, t(1));
        h.record(0, Op::Lost, Phase::Ok, None);
        h.record(1, Op::Acquire, Phase::Ok, t(2));
        reg.write(1, FencingToken::new(2), 7).unwrap();
        assert_eq!(
            reg.write(0, FencingToken::new(1), 8),
            Err(StaleToken { offered: FencingToken::new(1), highest: FencingToken::new(2) })
        );
        assert_eq!(reg.value(), 7);
        assert!(h.check().is_clean());
        // A register that let the stale write through would be caught.
        h.record(0, Op::Write, Phase::Ok, t(1));
        assert_eq!(h.check().stale_writes.len(), 1);
    }

    #[test]
    fn readers_write_beside_each_other_but_never_past_a_writer() {
        let h = History::new();
        let reg = FencedRegister::new(h.clone());
        for (p, kind) in [(0, HoldKind::Shared), (1, HoldKind::Shared), (2, HoldKind::Exclusive)] {
            h.set_kind(p, kind);
        }
        h.record(0, Op::Acquire, Phase::Ok, t(1));
        h.record(1, Op::Acquire, Phase::Ok, t(2));
        reg.write_as(1, FencingToken::new(2), HoldKind::Shared, 1).unwrap();
        reg.write_as(0, FencingToken::new(1), HoldKind::Shared, 2).expect("a reader's write beside a newer reader");
        assert!(h.check().is_clean(), "{:?}", h.check());
        h.record(0, Op::Release, Phase::Invoke, None);
        h.record(1, Op::Release, Phase::Invoke, None);
        h.record(2, Op::Acquire, Phase::Ok, t(3));
        reg.write_as(2, FencingToken::new(3), HoldKind::Exclusive, 3).unwrap();
        assert!(reg.write_as(1, FencingToken::new(2), HoldKind::Shared, 4).is_err(), "a reader past a writer");
        assert!(h.check().is_clean());
        // A register that let it through would be caught.
        h.record(1, Op::Write, Phase::Ok, t(2));
        assert_eq!(h.check().stale_writes.len(), 1);
        // A writer's write below a reader's token is refused too.
        let h = History::new();
        let reg = FencedRegister::new(h.clone());
        reg.write_as(0, FencingToken::new(5), HoldKind::Shared, 1).unwrap();
        assert!(reg.write_as(1, FencingToken::new(4), HoldKind::Exclusive, 2).is_err());
    }
}
