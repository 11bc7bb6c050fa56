//! The measurements.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{
    campaign, idempotent, HoldKind, IdempotentOptions, LockError, LockName, LockOptions, Locker, MultiLock,
    RawBaseline, RunOutcome,
};
use futures::stream::{self, StreamExt, TryStreamExt};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};

use super::report::Row;
use super::{BenchArgs, Scenario};
use crate::exit::Failure;

pub(super) struct Bench<'a> {
    pub url: String,
    pub backend: String,
    pub locker: Arc<dyn Locker>,
    pub raw: Arc<dyn RawBaseline>,
    pub args: &'a BenchArgs,
}

/// Every scenario uses names of its own, so runs never meet.
fn bench_name(parts: &str) -> LockName {
    LockName::new(format!("dlock-bench/{:08x}/{parts}", fastrand::u32(..))).expect("valid name")
}

fn progress(len: u64, message: String) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg:<48} [{bar:30}] {pos}/{len}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(message);
    bar
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds")
}

/// Holds for `d` of wall time. Tokio's timer wakes on whole-millisecond ticks, so its
/// 1 ms sleep lasts 1 to 2 ms and would bound a hand-off rate below what the lock allows;
/// a blocking thread's sleep lasts `d` plus the kernel's timer slack.
async fn hold(d: Duration) {
    // A failed join only means the runtime is shutting down; there is nothing to hold then.
    let _ = tokio::task::spawn_blocking(move || std::thread::sleep(d)).await;
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

impl Bench<'_> {
    pub(super) async fn run(&self, scenario: Scenario) -> Result<Vec<Row>, Failure> {
        Ok(match scenario {
            Scenario::Uncontended => self.uncontended().await?,
            Scenario::Throughput => self.throughput().await?,
            Scenario::Handoff => self.handoff().await?,
            Scenario::Fairness => self.fairness().await?,
            Scenario::Herd => self.herd().await?,
            Scenario::Renewal => self.renewal().await?,
            Scenario::Shared => self.shared().await?,
            Scenario::Idempotent => self.idempotent().await?,
            Scenario::Multi => self.multi().await?,
            Scenario::Primitives => self.primitives().await?,
        })
    }

    fn row(&self, scenario: &'static str, point: impl Into<String>, unit: &'static str, library: f64) -> Row {
        Row {
            backend: self.backend.clone(),
            scenario,
            point: point.into(),
            unit,
            library,
            raw: None,
            ratio: None,
            note: String::new(),
        }
    }

    async fn uncontended(&self) -> Result<Vec<Row>, Failure> {
        let name = bench_name("uncontended");
        let opts = LockOptions::new();
        let (lib, raw) = self
            .paired(
                "uncontended",
                || async { self.locker.acquire(&name, &opts).await?.release().await },
                || self.raw.acquire_release(&name),
            )
            .await?;
        let raw = raw.expect("the exclusive raw baseline always runs");
        Ok([("p50", 50.0), ("p99", 99.0), ("p999", 99.9)]
            .into_iter()
            .map(|(label, q)| {
                let (l, r) = (lib.value_at_percentile(q) as f64, raw.value_at_percentile(q) as f64);
                Row { raw: Some(r), ratio: Some(l / r), ..self.row("uncontended", label, "µs", l) }
            })
            .collect())
    }

    /// Times `lib` and `raw` for `--iterations` rounds each, after a warm-up. Library and
    /// raw calls alternate, so that drift in the machine's load hits both. A raw side
    /// that answers `Unsupported` is left out (`None`).
    async fn paired<L, LF, R, RF>(
        &self,
        what: &str,
        lib: L,
        raw: R,
    ) -> Result<(Histogram<u64>, Option<Histogram<u64>>), Failure>
    where
        L: Fn() -> LF,
        LF: std::future::Future<Output = Result<(), LockError>>,
        R: Fn() -> RF,
        RF: std::future::Future<Output = Result<(), LockError>>,
    {
        let n = self.args.iterations;
        let bar = progress(n as u64, format!("{}: {what}", self.backend));
        let mut with_raw = match raw().await {
            Ok(()) => true,
            Err(LockError::Unsupported(_)) => false,
            Err(e) => return Err(e.into()),
        };
        for _ in 0..n.min(50) {
            lib().await?;
            if with_raw {
                raw().await?;
            }
        }
        let (mut lib_hist, mut raw_hist) = (histogram(), histogram());
        for _ in 0..n {
            let started = Instant::now();
            lib().await?;
            lib_hist.saturating_record(micros(started.elapsed()));
            if with_raw {
                let started = Instant::now();
                raw().await?;
                raw_hist.saturating_record(micros(started.elapsed()));
            }
            bar.inc(1);
        }
        bar.finish_and_clear();
        with_raw &= !raw_hist.is_empty();
        Ok((lib_hist, with_raw.then_some(raw_hist)))
    }

    /// Uncontended acquire+release of a reader's share, a writer, a permit of 4, and a
    /// campaign+resign, each beside its raw baseline where the backend has one.
    async fn primitives(&self) -> Result<Vec<Row>, Failure> {
        let caps = self.locker.capabilities();
        let mut kinds = vec![("write", HoldKind::Exclusive)];
        if caps.shared {
            kinds.push(("read", HoldKind::Shared));
        }
        if caps.permits {
            kinds.push(("permit of 4", HoldKind::Permit { permits: 4 }));
        }
        let mut rows = Vec::new();
        for (point, kind) in kinds {
            let name = bench_name(&format!("primitive-{}", kind.as_str()));
            let opts = LockOptions::new().kind(kind);
            let (lib, raw) = self
                .paired(
                    point,
                    || async { self.locker.acquire(&name, &opts).await?.release().await },
                    || self.raw.acquire_release_kind(&name, kind),
                )
                .await?;
            rows.push(self.p50_row(point, &lib, raw.as_ref(), "no raw form of this kind on this backend yet"));
        }
        if caps.results {
            let name = bench_name("primitive-election");
            let opts = LockOptions::new();
            let (lib, raw) = self
                .paired(
                    "campaign",
                    || async { campaign(&*self.locker, &name, b"bench", &opts).await?.resign().await },
                    || self.raw.campaign_resign(&name, b"bench"),
                )
                .await?;
            rows.push(self.p50_row(
                "campaign+resign",
                &lib,
                raw.as_ref(),
                "no raw form of a campaign on this backend yet",
            ));
        }
        Ok(rows)
    }

    fn p50_row(&self, point: &str, lib: &Histogram<u64>, raw: Option<&Histogram<u64>>, missing: &str) -> Row {
        let l = lib.value_at_percentile(50.0) as f64;
        match raw {
            Some(raw) => {
                let r = raw.value_at_percentile(50.0) as f64;
                Row { raw: Some(r), ratio: Some(l / r), ..self.row("primitives", format!("{point} p50"), "µs", l) }
            }
            None => Row { note: missing.to_string(), ..self.row("primitives", format!("{point} p50"), "µs", l) },
        }
    }

    async fn throughput(&self) -> Result<Vec<Row>, Failure> {
        let mut rows = Vec::new();
        let duration = self.args.duration;
        for &tasks in &self.args.tasks {
            let bar = progress(2, format!("{}: throughput, {tasks} tasks", self.backend));
            let names: Vec<LockName> = (0..tasks).map(|i| bench_name(&format!("throughput/{i}"))).collect();
            let locker = self.locker.clone();
            let lib = run_for(duration, names.clone(), move |name| {
                let locker = locker.clone();
                async move { locker.acquire(&name, &LockOptions::new()).await?.release().await }
            })
            .await?;
            bar.inc(1);
            let raw_client = self.raw.clone();
            let raw = run_for(duration, names.clone(), move |name| {
                let raw = raw_client.clone();
                async move { raw.acquire_release(&name).await }
            })
            .await?;
            bar.finish_and_clear();
            // The ratio compares costs: raw throughput over library throughput.
            rows.push(Row {
                raw: Some(raw),
                ratio: Some(raw / lib),
                ..self.row("throughput", format!("{tasks} tasks"), "ops/s", lib)
            });
        }
        Ok(rows)
    }

    async fn handoff(&self) -> Result<Vec<Row>, Failure> {
        let rounds = self.args.handoffs;
        let name = bench_name("handoff");
        let opts = LockOptions::new().wait(Duration::from_secs(60));
        let clients = [dlock::connect(&self.url).await?, dlock::connect(&self.url).await?];
        let bar = progress(rounds as u64, format!("{}: hand-off", self.backend));
        let mut hist = histogram();
        let mut holder = clients[0].acquire(&name, &opts).await?;
        for round in 0..rounds {
            let next = clients[(round + 1) % 2].clone();
            let (waiting_name, waiting_opts) = (name.clone(), opts.clone());
            let waiter = {
                let next = next.clone();
                tokio::spawn(async move {
                    let lease = next.acquire(&waiting_name, &waiting_opts).await;
                    (Instant::now(), lease)
                })
            };
            while next.stats().waiting == 0 {
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            holder.release().await?;
            let released = Instant::now();
            let (granted, lease) = waiter.await.map_err(|e| Failure::new(crate::exit::UNAVAILABLE, e.to_string()))?;
            holder = lease?;
            hist.saturating_record(micros(granted.saturating_duration_since(released)));
            bar.inc(1);
        }
        holder.release().await?;
        bar.finish_and_clear();
        let floor = self.raw_pair_p50(&name).await?;
        let mechanism = if self.locker.capabilities().notify { "notified" } else { "polling" };
        Ok([("p50", 50.0), ("p99", 99.0)]
            .into_iter()
            .map(|(label, q)| {
                let l = hist.value_at_percentile(q) as f64;
                Row {
                    raw: Some(floor),
                    ratio: Some(l / floor),
                    note: format!("waiter {mechanism}; raw = one raw acquire+release (p50)"),
                    ..self.row("handoff", label, "µs", l)
                }
            })
            .collect())
    }

    async fn raw_pair_p50(&self, name: &LockName) -> Result<f64, Failure> {
        let mut hist = histogram();
        for _ in 0..200 {
            let started = Instant::now();
            self.raw.acquire_release(name).await?;
            hist.saturating_record(micros(started.elapsed()));
        }
        Ok(hist.value_at_percentile(50.0) as f64)
    }

    /// Jain's index over 8 clients' grant counts, in any order and, on a FIFO backend,
    /// with `fair(true)`.
    async fn fairness(&self) -> Result<Vec<Row>, Failure> {
        let mut rows = vec![self.fairness_of(false).await?];
        if self.locker.capabilities().fifo {
            rows.push(self.fairness_of(true).await?);
        }
        Ok(rows)
    }

    async fn fairness_of(&self, fair: bool) -> Result<Row, Failure> {
        const WORKERS: usize = 8;
        let name = bench_name("fairness");
        let bar = progress(1, format!("{}: fairness, {WORKERS} clients", self.backend));
        let deadline = Instant::now() + self.args.duration;
        let mut workers = Vec::new();
        for _ in 0..WORKERS {
            let client = dlock::connect(&self.url).await?;
            let name = name.clone();
            workers.push(tokio::spawn(async move {
                let opts = LockOptions::new().wait(Duration::from_secs(60)).fair(fair);
                let mut count = 0u64;
                while Instant::now() < deadline {
                    let lease = client.acquire(&name, &opts).await?;
                    hold(Duration::from_millis(1)).await;
                    lease.release().await?;
                    count += 1;
                }
                Ok::<u64, LockError>(count)
            }));
        }
        let mut counts = Vec::new();
        for worker in workers {
            counts.push(worker.await.map_err(|e| Failure::new(crate::exit::UNAVAILABLE, e.to_string()))??);
        }
        bar.finish_and_clear();
        let jain = jain(&counts);
        let point = format!("{WORKERS} clients{}", if fair { ", fair" } else { "" });
        Ok(Row { note: format!("grants per client: {counts:?}"), ..self.row("fairness", point, "Jain", jain) })
    }

    /// W waiters on one name spread over 8 clients (each with its own connections), each
    /// looping acquire, 1 ms hold, release: hand-offs per second, the p50 and p99 wait,
    /// and the attempts the clients sent per grant (the server work a hand-off costs: it
    /// stays flat as W grows unless every release wakes every waiter). In any order and,
    /// where the backend is FIFO, fair. No raw column: the point is the curve over W.
    async fn herd(&self) -> Result<Vec<Row>, Failure> {
        const CLIENTS: usize = 8;
        let mut rows = Vec::new();
        let orders: &[bool] = if self.locker.capabilities().fifo { &[false, true] } else { &[false] };
        for &fair in orders {
            for &waiters in &self.args.waiters {
                let bar =
                    progress(1, format!("{}: herd of {waiters}{}", self.backend, if fair { ", fair" } else { "" }));
                let mut clients = Vec::with_capacity(CLIENTS);
                for _ in 0..CLIENTS {
                    clients.push(dlock::connect(&self.url).await?);
                }
                let attempts = |clients: &[Arc<dyn Locker>]| clients.iter().map(|c| c.stats().attempts).sum::<u64>();
                let before = attempts(&clients);
                let name = bench_name("herd");
                let opts = LockOptions::new().wait(Duration::from_secs(120)).fair(fair);
                let shared = Arc::new(clients);
                let turns = take_turns(waiters, self.args.duration, {
                    let clients = shared.clone();
                    move |waiter| {
                        let (client, name, opts) = (clients[waiter % CLIENTS].clone(), name.clone(), opts.clone());
                        async move {
                            let lease = client.acquire(&name, &opts).await?;
                            Ok(async move { lease.release().await.map(drop) })
                        }
                    }
                })
                .await?;
                let sent = attempts(&shared) - before;
                bar.finish_and_clear();
                let point = format!("{waiters} waiters, {CLIENTS} clients{}", if fair { ", fair" } else { "" });
                let note = format!("{} grants, {sent} attempts", turns.granted);
                rows.push(Row { note: note.clone(), ..self.row("herd", point.clone(), "handoffs/s", turns.grants) });
                rows.push(self.row("herd", point.clone(), "p50 wait µs", turns.p50_wait));
                rows.push(self.row("herd", point.clone(), "p99 wait µs", turns.p99_wait));
                let per_grant = if turns.granted == 0 { 0.0 } else { sent as f64 / turns.granted as f64 };
                rows.push(Row { note, ..self.row("herd", point, "attempts per grant", per_grant) });
            }
        }
        Ok(rows)
    }

    /// 8 tasks of one client take turns holding one lock for 1 ms, as a new user would
    /// write it: grants per second, how many of them went to another task (a hand-off)
    /// rather than back to the task that had just let go, the p99 and longest wait of an
    /// acquire, and Jain's index over the tasks' grants. The raw column is
    /// the same loop over a process-local FIFO mutex: the ceiling the hold itself sets on
    /// this machine, which no backend can pass.
    async fn shared(&self) -> Result<Vec<Row>, Failure> {
        const TASKS: usize = 8;
        let bar = progress(1, format!("{}: {TASKS} tasks on one client", self.backend));
        let local = Arc::new(tokio::sync::Mutex::new(()));
        let ceiling = take_turns(TASKS, self.args.duration, move |_| {
            let local = local.clone();
            async move {
                let guard = local.lock_owned().await;
                Ok(async move {
                    drop(guard);
                    Ok(())
                })
            }
        })
        .await?;
        let mut rows = Vec::new();
        let orders: &[bool] = if self.locker.capabilities().fifo { &[false, true] } else { &[false] };
        for &fair in orders {
            let name = bench_name("shared");
            let opts = LockOptions::new().wait(Duration::from_secs(60)).fair(fair);
            let locker = self.locker.clone();
            let turns = take_turns(TASKS, self.args.duration, move |_| {
                let (locker, name, opts) = (locker.clone(), name.clone(), opts.clone());
                async move {
                    let lease = locker.acquire(&name, &opts).await?;
                    Ok(async move { lease.release().await.map(drop) })
                }
            })
            .await?;
            let point = format!("{TASKS} tasks, 1 ms hold{}", if fair { ", fair" } else { "" });
            let raw = "raw = a process-local FIFO mutex";
            let row = |unit, library: f64, ceiling: f64, lower_is_better: bool, note: String| Row {
                raw: Some(ceiling),
                ratio: Some(if lower_is_better { library / ceiling } else { ceiling / library }),
                note,
                ..self.row("shared", point.clone(), unit, library)
            };
            rows.push(row("handoffs/s", turns.grants, ceiling.grants, false, raw.to_string()));
            rows.push(row(
                "handoffs between tasks/s",
                turns.handoffs,
                ceiling.handoffs,
                false,
                format!("of {:.0} grants/s; {raw}", turns.grants),
            ));
            rows.push(row("p99 wait µs", turns.p99_wait, ceiling.p99_wait, true, raw.to_string()));
            rows.push(row("max wait µs", turns.max_wait, ceiling.max_wait, true, raw.to_string()));
            rows.push(Row {
                raw: Some(ceiling.jain),
                note: format!("over the {TASKS} tasks' grants; {raw}"),
                ..self.row("shared", point, "Jain", turns.jain)
            });
        }
        bar.finish_and_clear();
        Ok(rows)
    }

    /// A first run (look, try to lock, look again, store the result, release) and a
    /// replay (one look), each beside one raw acquire+release.
    async fn idempotent(&self) -> Result<Vec<Row>, Failure> {
        if !self.locker.capabilities().results {
            return Ok(vec![]);
        }
        let n = self.args.iterations.min(1000);
        let opts = IdempotentOptions::new();
        let bar = progress(n as u64, format!("{}: idempotent", self.backend));
        let (mut first, mut replay) = (histogram(), histogram());
        for i in 0..n {
            let key = bench_name(&format!("idempotent/{i}"));
            let started = Instant::now();
            let ran = idempotent(&*self.locker, &key, &opts, |_| async { Ok::<_, LockError>(i) }, || 0).await;
            first.saturating_record(micros(started.elapsed()));
            let started = Instant::now();
            let stored = idempotent(&*self.locker, &key, &opts, |_| async { Ok::<_, LockError>(i) }, || 0).await;
            replay.saturating_record(micros(started.elapsed()));
            match (ran, stored) {
                (Ok(RunOutcome::Ran(_)), Ok(RunOutcome::Stored(_))) => {}
                other => return Err(Failure::new(crate::exit::UNAVAILABLE, format!("idempotent: {other:?}"))),
            }
            bar.inc(1);
        }
        bar.finish_and_clear();
        let floor = self.raw_pair_p50(&bench_name("idempotent-raw")).await?;
        let note = "raw = one raw acquire+release (p50)".to_string();
        Ok([("first run p50", &first, 50.0), ("first run p99", &first, 99.0), ("replay p50", &replay, 50.0)]
            .into_iter()
            .map(|(label, hist, q)| {
                let l = hist.value_at_percentile(q) as f64;
                Row {
                    raw: Some(floor),
                    ratio: Some(l / floor),
                    note: note.clone(),
                    ..self.row("idempotent", label, "µs", l)
                }
            })
            .collect())
    }

    /// A multi-lock of 3 names, acquire+release, beside 3 raw acquire+release pairs.
    async fn multi(&self) -> Result<Vec<Row>, Failure> {
        const PARTS: usize = 3;
        let n = self.args.iterations.min(1000);
        let names: Vec<LockName> = (0..PARTS).map(|i| bench_name(&format!("multi/{i}"))).collect();
        let multi = MultiLock::on(self.locker.clone(), names.clone())?;
        let opts = LockOptions::new();
        let bar = progress(n as u64, format!("{}: multi-lock of {PARTS}", self.backend));
        let (mut lib, mut raw) = (histogram(), histogram());
        for _ in 0..n {
            let started = Instant::now();
            multi.acquire(&opts).await?.release().await?;
            lib.saturating_record(micros(started.elapsed()));
            let started = Instant::now();
            for name in &names {
                self.raw.acquire_release(name).await?;
            }
            raw.saturating_record(micros(started.elapsed()));
            bar.inc(1);
        }
        bar.finish_and_clear();
        Ok([("p50", 50.0), ("p99", 99.0)]
            .into_iter()
            .map(|(label, q)| {
                let (l, r) = (lib.value_at_percentile(q) as f64, raw.value_at_percentile(q) as f64);
                Row {
                    raw: Some(r),
                    ratio: Some(l / r),
                    note: format!("raw = {PARTS} raw acquire+release in a row"),
                    ..self.row("multi", format!("{PARTS} names {label}"), "µs", l)
                }
            })
            .collect())
    }

    /// Holds many leases through two ttls of watchdog renewals (none may be lost), then
    /// compares one explicit renewal of each, through the library, with raw renewals.
    async fn renewal(&self) -> Result<Vec<Row>, Failure> {
        let mut rows = Vec::new();
        for &n in &self.args.leases {
            rows.extend(self.renewal_of(n).await?);
        }
        Ok(rows)
    }

    /// `n` watchdog leases on the one client, held for two ttls: how many renewals it
    /// sent and how many leases it lost, its CPU share and the resident memory each lease
    /// costs it meanwhile (the servers run in other processes, except SQLite's), and the
    /// rate of explicit extensions beside raw renewals.
    async fn renewal_of(&self, n: usize) -> Result<Vec<Row>, Failure> {
        let ttl = self.args.renew_ttl;
        let resident_before = resident_bytes();
        let names: Vec<LockName> = (0..n).map(|i| bench_name(&format!("renewal/{i}"))).collect();
        let opts = LockOptions::watchdog(ttl);
        let bar = progress(4, format!("{}: {n} leases renewed", self.backend));
        let leases: Vec<_> = stream::iter(names.clone())
            .map(|name| {
                let (locker, opts) = (self.locker.clone(), opts.clone());
                async move { locker.acquire(&name, &opts).await }
            })
            .buffered(256)
            .try_collect()
            .await?;
        bar.inc(1);
        let per_lease =
            resident_before.zip(resident_bytes()).map(|(before, after)| after.saturating_sub(before) as f64 / n as f64);
        let before = self.locker.stats().renewals;
        let cpu_before = cpu_time();
        tokio::time::sleep(ttl * 2).await;
        let cpu_share =
            cpu_before.zip(cpu_time()).map(|(before, after)| (after - before).as_secs_f64() / (ttl * 2).as_secs_f64());
        let renewed = self.locker.stats().renewals - before;
        let lost = leases.iter().filter(|l| l.is_lost()).count();
        bar.inc(1);

        let extend = self.locker.capabilities().extend;
        let lib_rate = if extend {
            let started = Instant::now();
            let done = AtomicU64::new(0);
            stream::iter(leases.iter())
                .for_each_concurrent(256, |lease| {
                    let done = &done;
                    async move {
                        if lease.extend(ttl).await.is_ok() {
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
                .await;
            Some(done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
        } else {
            None
        };
        bar.inc(1);
        let started = Instant::now();
        stream::iter(names.clone())
            .map(|name| {
                let raw = self.raw.clone();
                async move { raw.renew(&name).await }
            })
            .buffer_unordered(256)
            .try_collect::<Vec<()>>()
            .await?;
        let raw_rate = n as f64 / started.elapsed().as_secs_f64();
        stream::iter(leases).for_each_concurrent(256, |lease| async move { drop(lease.release().await) }).await;
        bar.finish_and_clear();
        let note = format!("watchdog over 2 ttls: {renewed} renewals, {lost} of {n} lost");
        let point = format!("{n} leases");
        let mut rows = Vec::new();
        if let Some(share) = cpu_share {
            rows.push(Row { note: note.clone(), ..self.row("renewal", point.clone(), "client CPU %", share * 100.0) });
        }
        if let Some(bytes) = per_lease {
            rows.push(Row {
                note: note.clone(),
                ..self.row("renewal", point.clone(), "client bytes per lease", bytes)
            });
        }
        rows.push(match lib_rate {
            Some(lib) => Row {
                raw: Some(raw_rate),
                ratio: Some(raw_rate / lib),
                note,
                ..self.row("renewal", point.clone(), "renewals/s", lib)
            },
            None => Row {
                raw: Some(raw_rate),
                note: format!("{note}; extend unsupported, renewals follow the session"),
                ..self.row("renewal", point, "renewals/s", renewed as f64 / (ttl * 2).as_secs_f64())
            },
        });
        Ok(rows)
    }
}

/// The CPU time this process has used, user and system, where the platform tells.
fn cpu_time() -> Option<Duration> {
    use nix::sys::resource::{getrusage, UsageWho};
    let usage = getrusage(UsageWho::RUSAGE_SELF).ok()?;
    let time = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec().try_into().unwrap_or(0))
            + Duration::from_micros(t.tv_usec().try_into().unwrap_or(0))
    };
    Some(time(usage.user_time()) + time(usage.system_time()))
}

/// This process's resident memory in bytes, where the platform tells (Linux).
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// What [`take_turns`] saw.
struct Turns {
    /// How many grants there were, and how many per second.
    granted: u64,
    grants: f64,
    /// Grants per second that went to another task than the grant before (a task that
    /// lets go and takes the lock straight back is not a hand-off).
    handoffs: f64,
    /// The p50, the p99 and the longest wait of an acquire, in µs.
    p50_wait: f64,
    p99_wait: f64,
    max_wait: f64,
    /// Jain's index over the tasks' grant counts.
    jain: f64,
}

/// Jain's fairness index of `counts`: 1 when all are equal, 1/n when one has them all.
fn jain(counts: &[u64]) -> f64 {
    let sum: f64 = counts.iter().map(|&c| c as f64).sum();
    let squares: f64 = counts.iter().map(|&c| (c as f64).powi(2)).sum();
    if squares == 0.0 {
        0.0
    } else {
        sum * sum / (counts.len() as f64 * squares)
    }
}

/// `tasks` tasks take turns for `duration`: acquire (through `acquire`, called with the
/// task's index, whose output releases), hold for 1 ms, release.
async fn take_turns<A, Fut, R>(tasks: usize, duration: Duration, acquire: A) -> Result<Turns, Failure>
where
    A: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<R, LockError>> + Send,
    R: std::future::Future<Output = Result<(), LockError>> + Send,
{
    let started = Instant::now();
    let deadline = started + duration;
    // The task that was granted last, and how many grants changed hands.
    let last = Arc::new(AtomicU64::new(u64::MAX));
    let handoffs = Arc::new(AtomicU64::new(0));
    let mut running = Vec::new();
    for task in 0..tasks as u64 {
        let (acquire, last, handoffs) = (acquire.clone(), last.clone(), handoffs.clone());
        running.push(tokio::spawn(async move {
            let mut waits = histogram();
            while Instant::now() < deadline {
                let asked = Instant::now();
                let release = acquire(task as usize).await?;
                waits.saturating_record(micros(asked.elapsed()));
                if last.swap(task, Ordering::SeqCst) != task {
                    handoffs.fetch_add(1, Ordering::Relaxed);
                }
                hold(Duration::from_millis(1)).await;
                release.await?;
            }
            Ok::<_, LockError>(waits)
        }));
    }
    let mut waits = histogram();
    let mut counts = Vec::new();
    for task in running {
        let task = task.await.map_err(|e| Failure::new(crate::exit::UNAVAILABLE, e.to_string()))??;
        counts.push(task.len());
        waits.add(task).map_err(|e| Failure::new(crate::exit::UNAVAILABLE, e.to_string()))?;
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(Turns {
        granted: waits.len(),
        grants: waits.len() as f64 / seconds,
        p50_wait: waits.value_at_percentile(50.0) as f64,
        handoffs: handoffs.load(Ordering::Relaxed) as f64 / seconds,
        p99_wait: waits.value_at_percentile(99.0) as f64,
        max_wait: waits.max() as f64,
        jain: jain(&counts),
    })
}

/// Runs `op` in one task per name until `duration` passes; returns operations per second.
async fn run_for<F, Fut>(duration: Duration, names: Vec<LockName>, op: F) -> Result<f64, Failure>
where
    F: Fn(LockName) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<(), LockError>> + Send,
{
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = Vec::new();
    for name in names {
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let mut count = 0u64;
            while Instant::now() < deadline {
                op(name.clone()).await?;
                count += 1;
            }
            Ok::<u64, LockError>(count)
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.map_err(|e| Failure::new(crate::exit::UNAVAILABLE, e.to_string()))??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}
