//! `dlock inspect`: who holds a lock.

use std::process::ExitCode;

use clap::Args;
use dlock::LockName;

use crate::exit::Failure;
use crate::target;

#[derive(Debug, Args)]
pub(crate) struct InspectArgs {
    /// The lock's name.
    name: String,
}

pub(crate) async fn inspect(url: Option<String>, args: InspectArgs) -> Result<ExitCode, Failure> {
    let url = target::resolve(url)?;
    let name = LockName::new(&args.name)?;
    let locker = dlock::connect(&url).await?;
    let info = locker.inspect(&name).await?;
    println!("lock       {name}");
    match info.holder {
        None => println!("holder     none (free)"),
        Some(holder) => {
            println!("holder     {}", holder.owner);
            println!("token      {}", holder.token);
            println!("holds      {}", holder.count);
            match holder.remaining {
                Some(left) => println!("remaining  {:.3}s", left.as_secs_f64()),
                None => println!("remaining  unknown (held by a session)"),
            }
        }
    }
    match info.waiters {
        Some(n) => println!("waiters    {n}"),
        None => println!("waiters    unknown on {}", locker.backend_name()),
    }
    Ok(ExitCode::SUCCESS)
}
