//! One clock for the run and its client processes: the machine's monotonic clock, which
//! every process on it shares, counted from the run's epoch.

use std::time::Duration;

use nix::time::{clock_gettime, ClockId};

/// Nanoseconds of `CLOCK_MONOTONIC` (the clock behind `Instant` on Linux, so a history
/// started in this process and the times its clients report agree).
pub(crate) fn now_ns() -> u64 {
    // CLOCK_MONOTONIC exists on every Linux; an error here would be a broken kernel.
    let ts = clock_gettime(ClockId::CLOCK_MONOTONIC).unwrap_or_else(|e| panic!("CLOCK_MONOTONIC: {e}"));
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

/// The time since `epoch_ns`.
pub(crate) fn since(epoch_ns: u64) -> Duration {
    Duration::from_nanos(now_ns().saturating_sub(epoch_ns))
}
