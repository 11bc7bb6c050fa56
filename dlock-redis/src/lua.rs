//! The Lua text of every script, one file each under `src/lua/`: the lock scripts at its
//! top, the libraries of functions they share under `lib/`, RedLock's node scripts under
//! `redlock/` and the stored-result scripts under `results/`.
//!
//! Each file opens with a comment stating its keys, its arguments, its replies and the
//! invariant it keeps, so that a script can be read, and changed, without the Rust that
//! calls it. The modules that call the scripts put the libraries in front of them; so a
//! library ends its last line, for the text behind it to start on a line of its own.

pub(crate) const ABOVE_LIB: &str = include_str!("lua/lib/above.lua");
pub(crate) const HOLD_LIB: &str = include_str!("lua/lib/hold.lua");
pub(crate) const CLOCK_LIB: &str = include_str!("lua/lib/clock.lua");
pub(crate) const LENGTHEN_LIB: &str = include_str!("lua/lib/lengthen.lua");
pub(crate) const FENCE_LIB: &str = include_str!("lua/lib/fence.lua");
pub(crate) const QUEUE_LIB: &str = include_str!("lua/lib/queue.lua");
pub(crate) const LEASES_LIB: &str = include_str!("lua/lib/leases.lua");
pub(crate) const REPORTED_FENCE_LIB: &str = include_str!("lua/lib/reported_fence.lua");
pub(crate) const WRITE_RESULT_LIB: &str = include_str!("lua/lib/write_result.lua");
pub(crate) const PUBLISH_LIB: &str = include_str!("lua/lib/publish.lua");
pub(crate) const SPUBLISH_LIB: &str = include_str!("lua/lib/spublish.lua");

pub(crate) const ACQUIRE: &str = include_str!("lua/acquire.lua");
pub(crate) const RENEW: &str = include_str!("lua/renew.lua");
pub(crate) const RELEASE: &str = include_str!("lua/release.lua");
pub(crate) const GIVE_BACK: &str = include_str!("lua/give_back.lua");
pub(crate) const ABANDON: &str = include_str!("lua/abandon.lua");
pub(crate) const ACQUIRE_SHARED: &str = include_str!("lua/acquire_shared.lua");
pub(crate) const RENEW_SHARED: &str = include_str!("lua/renew_shared.lua");
pub(crate) const RELEASE_SHARED: &str = include_str!("lua/release_shared.lua");
pub(crate) const GIVE_BACK_SHARED: &str = include_str!("lua/give_back_shared.lua");
pub(crate) const INSPECT: &str = include_str!("lua/inspect.lua");
pub(crate) const INSPECT_QUEUE: &str = include_str!("lua/inspect_queue.lua");

pub(crate) const GRANT: &str = include_str!("lua/redlock/grant.lua");
pub(crate) const READ_FENCE: &str = include_str!("lua/redlock/read_fence.lua");

pub(crate) const STORE_RESULT: &str = include_str!("lua/results/store.lua");
pub(crate) const STORE_RESULT_SHARED: &str = include_str!("lua/results/store_shared.lua");
pub(crate) const LOAD_RESULT: &str = include_str!("lua/results/load.lua");

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::keys::{
        COUNT_FIELD_PREFIX, EXTENDED_FIELD, HOLDER_FIELD_PREFIX, HOLD_ID_SEPARATOR, KIND_FIELD, OWNER_FIELD_PREFIX,
        PERMITS_FIELD_PREFIX, REQUEST_FIELD_PREFIX, TOKEN_FIELD,
    };

    const ALL: [&str; 27] = [
        ABOVE_LIB,
        HOLD_LIB,
        CLOCK_LIB,
        LENGTHEN_LIB,
        FENCE_LIB,
        QUEUE_LIB,
        LEASES_LIB,
        REPORTED_FENCE_LIB,
        WRITE_RESULT_LIB,
        PUBLISH_LIB,
        SPUBLISH_LIB,
        ACQUIRE,
        RENEW,
        RELEASE,
        GIVE_BACK,
        ABANDON,
        ACQUIRE_SHARED,
        RENEW_SHARED,
        RELEASE_SHARED,
        GIVE_BACK_SHARED,
        INSPECT,
        INSPECT_QUEUE,
        GRANT,
        READ_FENCE,
        STORE_RESULT,
        STORE_RESULT_SHARED,
        LOAD_RESULT,
    ];

    /// A file's Lua without its header, so that a check of the code is not met by a comment.
    fn code(text: &str) -> &str {
        let header: usize = text.lines().take_while(|line| line.starts_with("--")).map(|line| line.len() + 1).sum();
        &text[header..]
    }

    fn lua_files(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                lua_files(&path, found);
            } else if path.extension().is_some_and(|ext| ext == "lua") {
                found.push(path);
            }
        }
    }

    #[test]
    fn every_lua_file_opens_with_its_keys_arguments_replies_and_invariant() {
        let mut files = Vec::new();
        lua_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lua"), &mut files);
        assert_eq!(files.len(), ALL.len(), "a file under src/lua that no script includes, or one missing: {files:?}");
        for path in files {
            let name = path.display();
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(ALL.contains(&text.as_str()), "{name} is included by no script");
            let header: Vec<&str> = text.lines().take_while(|line| line.starts_with("--")).collect();
            assert!(!header.is_empty(), "{name} does not open with a comment");
            for label in ["-- KEYS:", "-- ARGV:", "-- Returns:", "-- Invariant:"] {
                assert!(header.iter().any(|line| line.starts_with(label)), "{name}: no `{label}` in its header");
            }
            assert!(text.ends_with('\n'), "{name} does not end its last line");
        }
    }

    #[test]
    fn scripts_use_the_documented_field_names() {
        for script in [ACQUIRE, RENEW, RELEASE, GIVE_BACK, HOLD_LIB, GRANT] {
            assert!(code(script).contains(&format!("'{TOKEN_FIELD}'")));
        }
        assert!(code(HOLD_LIB).contains(&format!("'{OWNER_FIELD_PREFIX}'")));
        assert_eq!(code(LENGTHEN_LIB).matches(&format!("'{EXTENDED_FIELD}'")).count(), 4);
        assert!(code(HOLD_LIB).contains(&format!("string.sub(field, {})", OWNER_FIELD_PREFIX.len() + 1)));
    }

    #[test]
    fn scripts_publish_only_through_the_publish_libraries() {
        for script in ALL.into_iter().filter(|s| ![PUBLISH_LIB, SPUBLISH_LIB].contains(s)) {
            let code = code(script).to_ascii_lowercase();
            assert!(!code.contains("'publish'") && !code.contains("'spublish'"), "{script}");
        }
        assert_eq!(
            code(PUBLISH_LIB).replace("'publish'", "'spublish'"),
            code(SPUBLISH_LIB),
            "the two libraries differ in their command alone"
        );
    }

    #[test]
    fn lease_scripts_use_the_documented_field_names() {
        for prefix in [HOLDER_FIELD_PREFIX, COUNT_FIELD_PREFIX, PERMITS_FIELD_PREFIX, REQUEST_FIELD_PREFIX] {
            assert!(code(LEASES_LIB).contains(&format!("'{prefix}'")), "{prefix}");
        }
        assert!(code(ACQUIRE_SHARED).contains(&format!("'{PERMITS_FIELD_PREFIX}'")));
        // Lua's `\0` is the separator of a permit's hold id, where inspect cuts the owner.
        assert_eq!(HOLD_ID_SEPARATOR, '\0');
        assert!(code(INSPECT_QUEUE).contains(r"string.find(newest, '\0', 1, true)"));
        let request = REQUEST_FIELD_PREFIX.len();
        assert!(code(LEASES_LIB).contains(&format!("string.sub(fields[i], 1, {request}) == '{REQUEST_FIELD_PREFIX}'")));
        let holder = HOLDER_FIELD_PREFIX.len();
        assert!(code(INSPECT_QUEUE).contains(&format!("string.sub(fields[i], 1, {holder}) == '{HOLDER_FIELD_PREFIX}'")));
        assert!(code(INSPECT_QUEUE).contains(&format!("string.sub(fields[i], {})", holder + 1)));
        for script in [LEASES_LIB, ACQUIRE, GIVE_BACK, ABANDON, INSPECT_QUEUE] {
            assert!(code(script).contains(&format!("'{KIND_FIELD}'")));
        }
    }

    #[test]
    fn the_store_script_checks_the_hold_as_the_release_script_does() {
        assert!(code(STORE_RESULT).contains(&format!("redis.call('hget', KEYS[1], '{TOKEN_FIELD}') ~= ARGV[2]")));
        assert!(code(STORE_RESULT).contains("redis.call('hexists', KEYS[1], ARGV[1]) == 0"));
        assert!(code(STORE_RESULT).contains("redis.call('hexists', KEYS[1], ARGV[3]) == 0"));
    }
}
