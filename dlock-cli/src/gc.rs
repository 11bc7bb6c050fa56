//! `dlock gc`: remove what the backend keeps for names nobody uses any more.

use std::process::ExitCode;

use clap::Args;

use crate::exit::Failure;
use crate::target;

#[derive(Debug, Args)]
pub(crate) struct GcArgs {}

pub(crate) async fn gc(url: Option<String>, _args: GcArgs) -> Result<ExitCode, Failure> {
    let url = target::resolve(url)?;
    let locker = dlock::connect(&url).await?;
    let swept = locker.sweep().await?;
    println!("removed    {}", swept.removed);
    println!("target     {}", locker.target());
    Ok(ExitCode::SUCCESS)
}
