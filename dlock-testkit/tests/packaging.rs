//! What makes the published crates publishable, checked on the workspace itself: the
//! declared `rust-version` is the real floor of the locked dependencies, and no published
//! crate reads a file from outside its own directory (it would be missing from the
//! package) or lacks what crates.io and docs.rs show.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The platform the floor is checked for: the one the project supports and tests.
const PLATFORM: &str = "x86_64-unknown-linux-gnu";

/// The workspace's resolved metadata, all features, for [`PLATFORM`].
fn metadata() -> Value {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked", "--all-features", "--filter-platform", PLATFORM])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    assert!(out.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON")
}

/// A `rust-version` as numbers: `1.94` and `1.94.0` compare equal.
fn version(text: &str) -> Vec<u64> {
    let mut parts: Vec<u64> = text.split('.').map(|p| p.parse().expect("a numeric rust-version")).collect();
    parts.resize(3, 0);
    parts
}

/// The workspace's declared `rust-version`, and the locked dependencies (for the
/// platform, all features) that declare a higher one: each as `name version (rust-version)`.
fn above_the_floor(metadata: &Value) -> (String, Vec<String>) {
    let members: Vec<&str> =
        metadata["workspace_members"].as_array().expect("members").iter().filter_map(Value::as_str).collect();
    let resolved: Vec<&str> =
        metadata["resolve"]["nodes"].as_array().expect("resolve").iter().filter_map(|n| n["id"].as_str()).collect();
    let packages = metadata["packages"].as_array().expect("packages");
    let declared = packages
        .iter()
        .filter(|p| members.contains(&p["id"].as_str().unwrap_or_default()))
        .filter_map(|p| p["rust_version"].as_str())
        .max_by_key(|v| version(v))
        .expect("the workspace declares a rust-version")
        .to_string();
    let over = packages
        .iter()
        .filter(|p| {
            let id = p["id"].as_str().unwrap_or_default();
            !members.contains(&id) && resolved.contains(&id)
        })
        .filter_map(|p| {
            let needs = p["rust_version"].as_str()?;
            (version(needs) > version(&declared)).then(|| format!("{} {} ({needs})", p["name"], p["version"]))
        })
        .collect();
    (declared, over)
}

#[test]
fn the_declared_rust_version_is_the_floor_of_the_locked_dependencies() {
    let (declared, over) = above_the_floor(&metadata());
    assert!(over.is_empty(), "rust-version {declared} is below what these locked dependencies need: {over:?}");
}

#[test]
fn the_floor_check_fails_when_the_workspace_claims_less() {
    let mut metadata = metadata();
    let members: Vec<String> = metadata["workspace_members"]
        .as_array()
        .expect("members")
        .iter()
        .filter_map(|m| m.as_str().map(str::to_string))
        .collect();
    for package in metadata["packages"].as_array_mut().expect("packages") {
        if members.iter().any(|m| package["id"] == m.as_str()) {
            package["rust_version"] = Value::from("1.60");
        }
    }
    let (declared, over) = above_the_floor(&metadata);
    assert_eq!(declared, "1.60");
    assert!(!over.is_empty(), "a workspace claiming 1.60 passed the check");
}

/// The directories of the crates that are published (no `publish = false`).
fn published_crates(metadata: &Value) -> Vec<PathBuf> {
    let members: Vec<&str> =
        metadata["workspace_members"].as_array().expect("members").iter().filter_map(Value::as_str).collect();
    metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter(|p| members.contains(&p["id"].as_str().unwrap_or_default()))
        .filter(|p| !p["publish"].as_array().is_some_and(Vec::is_empty))
        .map(|p| Path::new(p["manifest_path"].as_str().expect("manifest")).parent().expect("crate dir").to_path_buf())
        .collect()
}

/// The paths that `include_str!`, `include_bytes!` and `include!` name in `source`.
fn included_paths(source: &str) -> Vec<String> {
    let mut found = Vec::new();
    for mac in ["include_str!(\"", "include_bytes!(\"", "include!(\""] {
        let mut rest = source;
        while let Some(at) = rest.find(mac) {
            let after = &rest[at + mac.len()..];
            if let Some(end) = after.find('"') {
                found.push(after[..end].to_string());
            }
            rest = after;
        }
    }
    found
}

/// Whether `path`, relative to `dir`, stays inside `root` (without touching the disk).
fn stays_inside(root: &Path, dir: &Path, path: &str) -> bool {
    let mut at: Vec<_> = dir.components().collect();
    for part in Path::new(path).components() {
        match part {
            std::path::Component::ParentDir => {
                at.pop();
            }
            std::path::Component::CurDir => {}
            other => at.push(other),
        }
    }
    at.iter().collect::<PathBuf>().starts_with(root)
}

fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read a source directory") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            rust_files(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
}

#[test]
fn published_crates_read_nothing_outside_their_directory_and_carry_their_metadata() {
    let metadata = metadata();
    let crates = published_crates(&metadata);
    assert!(crates.len() >= 8, "too few published crates found: {crates:?}");
    for root in crates {
        let mut sources = Vec::new();
        rust_files(&root.join("src"), &mut sources);
        for file in sources {
            let source = std::fs::read_to_string(&file).expect("read a source file");
            for path in included_paths(&source) {
                let dir = file.parent().expect("a file's directory");
                assert!(
                    stays_inside(&root, dir, &path),
                    "{} includes {path}, outside its crate: the published crate would lack it",
                    file.display()
                );
            }
        }
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("read the manifest");
        for field in ["description", "readme", "keywords", "categories", "documentation", "[package.metadata.docs.rs]"]
        {
            assert!(manifest.contains(field), "{}: no {field}", root.display());
        }
        for file in ["README.md", "LICENSE-MIT", "LICENSE-APACHE"] {
            assert!(root.join(file).is_file(), "{}: no {file}", root.display());
        }
    }
}

#[test]
fn the_include_check_sees_a_path_that_escapes() {
    let root = Path::new("/w/dlock");
    assert!(stays_inside(root, &root.join("src"), "../README.md"));
    assert!(!stays_inside(root, &root.join("src"), "../../README.md"));
    assert!(!stays_inside(root, root, "../other/file"));
    assert_eq!(
        included_paths("#![doc = include_str!(\"../README.md\")] x include!(\"a.rs\")"),
        ["../README.md", "a.rs"]
    );
}
