//! Which backend the command talks to: `--url`, `DLOCK_URL`, or the embedded default.

use std::path::PathBuf;

use crate::exit::{Failure, UNAVAILABLE, USAGE};

/// The URL to use: the one given (flag or environment), else a SQLite file in the
/// user's data directory, created on first use.
pub(crate) fn resolve(url: Option<String>) -> Result<String, Failure> {
    if let Some(url) = url.filter(|u| !u.trim().is_empty()) {
        return Ok(url);
    }
    let dir = dirs::data_dir().unwrap_or_else(std::env::temp_dir).join("dlock");
    std::fs::create_dir_all(&dir)
        .map_err(|e| Failure::new(UNAVAILABLE, format!("cannot create {}: {e}", dir.display())))?;
    Ok(sqlite_url(dir.join("locks.db")))
}

/// `sqlite://<path>` (the file is created if missing).
pub(crate) fn sqlite_url(path: PathBuf) -> String {
    format!("sqlite://{}", path.display())
}

/// The one URL a command takes (only `bench` takes several).
pub(crate) fn single(mut urls: Vec<String>) -> Result<Option<String>, Failure> {
    match urls.len() {
        0 | 1 => Ok(urls.pop()),
        _ => Err(Failure::new(USAGE, "this command takes one --url")),
    }
}
