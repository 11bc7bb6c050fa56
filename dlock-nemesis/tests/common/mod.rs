//! Runs the `nemesis` binary and reads its JSON verdict.

use std::process::Command;

/// What one run left: its exit code, its JSON verdict, and its output for messages.
pub(crate) struct Run {
    pub(crate) code: Option<i32>,
    pub(crate) verdict: serde_json::Value,
    pub(crate) output: String,
}

impl Run {
    /// A counter of the verdict.
    pub(crate) fn count(&self, key: &str) -> u64 {
        self.verdict[key].as_u64().unwrap_or_else(|| panic!("no counter {key} in the verdict:\n{}", self.output))
    }
}

/// Runs `nemesis` on `topology` with 4 clients, a 1 s ttl, seed 1 and `extra` arguments.
pub(crate) fn nemesis(topology: &str, duration: &str, extra: &[&str]) -> Run {
    let dir = tempfile::tempdir().expect("temp dir");
    let json = dir.path().join("verdict.json");
    let output = Command::new(env!("CARGO_BIN_EXE_nemesis"))
        .args(["--topology", topology, "--clients", "4", "--duration", duration, "--ttl", "1s", "--seed", "1"])
        .args(extra)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("nemesis runs");
    let text = format!("{}\n{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    let verdict = std::fs::read_to_string(&json)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| panic!("nemesis on {topology} wrote no verdict ({}):\n{text}", output.status));
    Run { code: output.status.code(), verdict, output: text }
}
