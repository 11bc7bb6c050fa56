//! `dlock demo`: the oversell story. Buyers decrement a stock counter with
//! read-modify-write; without a lock they sell more than there is, with a lock the
//! stock comes out exact, and a holder that pauses past its lease is stopped by the
//! fencing token when it wakes.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;
use dlock::{FencingToken, LockName, LockOptions, Locker};
use dlock_core::backend::lock_unpoisoned;

use crate::exit::{Failure, UNAVAILABLE};

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Buyers running at once, each with its own connection to the backend.
    #[arg(long, default_value_t = 8)]
    buyers: usize,
    /// Items in stock at the start.
    #[arg(long, default_value_t = 10)]
    stock: u64,
}

/// The protected resource: a stock counter that can also refuse writes carrying a fencing
/// token older than the newest it has seen (as `UPDATE … WHERE fence < $token` does).
#[derive(Default)]
struct Stock {
    state: Mutex<(u64, Option<FencingToken>)>,
}

impl Stock {
    fn read(&self) -> u64 {
        lock_unpoisoned(&self.state).0
    }

    fn write(&self, value: u64) {
        lock_unpoisoned(&self.state).0 = value;
    }

    fn write_fenced(&self, token: FencingToken, value: u64) -> Result<(), FencingToken> {
        let mut state = lock_unpoisoned(&self.state);
        match state.1 {
            Some(newest) if token < newest => Err(newest),
            _ => {
                *state = (value, Some(token));
                Ok(())
            }
        }
    }
}

pub(crate) async fn demo(url: Option<String>, args: DemoArgs) -> Result<ExitCode, Failure> {
    // A fresh database of its own unless told otherwise, so the demo never meets real locks.
    let scratch = tempfile::Builder::new()
        .prefix("dlock-demo-")
        .tempdir()
        .map_err(|e| Failure::new(UNAVAILABLE, format!("cannot create a scratch directory: {e}")))?;
    let url = match url {
        Some(url) => url,
        None => crate::target::sqlite_url(scratch.path().join("demo.db")),
    };
    let buyers = args.buyers.max(2);
    let mut clients = Vec::with_capacity(buyers);
    for _ in 0..buyers {
        clients.push(dlock::connect(&url).await?);
    }
    let name = LockName::new(format!("demo/stock/{:08x}", fastrand::u32(..)))?;
    println!("dlock demo on {} ({url})", clients[0].backend_name());
    println!(
        "{buyers} buyers, each with its own connection, share a stock counter of {} items and keep buying \
         (read the count, pay, write count - 1) until they see none left.\n",
        args.stock
    );

    let (sold, left) = sell(&clients, None, args.stock).await?;
    println!("1. without a lock: sold {sold} items from a stock of {}; the counter says {left} left", args.stock);
    if sold > args.stock {
        println!(
            "   -> oversold by {}: buyers read the same count and each wrote its own decrement",
            sold - args.stock
        );
    }

    let (sold, left) = sell(&clients, Some(&name), args.stock).await?;
    println!("2. with a lock:    sold {sold} items from a stock of {}; the counter says {left} left", args.stock);
    if sold != args.stock || left != 0 {
        return Err(Failure::new(UNAVAILABLE, "the lock did not prevent the oversell: the backend is broken"));
    }

    fencing(&clients[0], &clients[1], &name).await?;
    Ok(ExitCode::SUCCESS)
}

/// Buyers read the stock, take a moment (payment), and write it back decremented.
async fn sell(clients: &[Arc<dyn Locker>], lock: Option<&LockName>, initial: u64) -> Result<(u64, u64), Failure> {
    let stock = Arc::new(Stock::default());
    stock.write(initial);
    let sold = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for client in clients {
        let (client, stock, sold, lock) = (client.clone(), stock.clone(), sold.clone(), lock.cloned());
        tasks.push(tokio::spawn(async move {
            loop {
                let lease = match &lock {
                    Some(name) => Some(client.acquire(name, &LockOptions::new().wait(Duration::from_secs(60))).await?),
                    None => None,
                };
                let seen = stock.read();
                if seen == 0 {
                    if let Some(lease) = lease {
                        lease.release().await?;
                    }
                    return Ok::<(), dlock::LockError>(());
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                stock.write(seen - 1);
                sold.fetch_add(1, Ordering::SeqCst);
                if let Some(lease) = lease {
                    lease.release().await?;
                }
            }
        }));
    }
    for task in tasks {
        task.await.map_err(|e| Failure::new(UNAVAILABLE, e.to_string()))??;
    }
    Ok((sold.load(Ordering::SeqCst), stock.read()))
}

/// A holder pauses past its lease; the next holder writes; the paused one's late write is
/// refused because its token is older.
async fn fencing(a: &Arc<dyn Locker>, b: &Arc<dyn Locker>, name: &LockName) -> Result<(), Failure> {
    if !a.capabilities().fixed {
        println!("3. fencing: shown with fixed leases, which {} does not have", a.backend_name());
        return Ok(());
    }
    let stock = Stock::default();
    let ttl = Duration::from_secs(1);
    let first = a.acquire(name, &LockOptions::fixed(ttl).wait(Duration::from_secs(10))).await?;
    let old = first.token();
    stock.write_fenced(old, 10).map_err(|_| Failure::new(UNAVAILABLE, "the first write was refused"))?;
    println!("3. fencing: buyer A holds the lock with token {old} on a {ttl:?} lease, then pauses (a long GC pause)");
    let waiting = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move { b.acquire(&name, &LockOptions::new().wait(Duration::from_secs(30))).await })
    };
    // A's pause: longer than its lease.
    tokio::time::sleep(ttl + Duration::from_millis(500)).await;
    let second = waiting.await.map_err(|e| Failure::new(UNAVAILABLE, e.to_string()))??;
    let new = second.token();
    stock.write_fenced(new, 9).map_err(|_| Failure::new(UNAVAILABLE, "the new holder's write was refused"))?;
    println!("   A's lease ran out; buyer B got the lock with token {new} and wrote stock = 9");
    match stock.write_fenced(old, 9) {
        Err(newest) => {
            println!("   A wakes up and writes stock = 9 with token {old}: refused (the store has seen {newest})")
        }
        Ok(()) => return Err(Failure::new(UNAVAILABLE, "a stale token was accepted: the backend's tokens are broken")),
    }
    match first.release().await {
        Err(dlock::LockError::NotHeld { .. }) => println!("   A's release: not held any more, B's lock is untouched"),
        other => return Err(Failure::new(UNAVAILABLE, format!("a stale release was not refused: {other:?}"))),
    }
    second.release().await?;
    println!("\nThe lock stopped the oversell; the fencing token stopped the paused holder.");
    Ok(())
}
