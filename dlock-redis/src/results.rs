//! Results stored under a lock's name for idempotent execution: one hash per lock beside
//! its hold, `<prefix>:{<encoded name>}:result` ([`LockKeys::result`]), written and read
//! by a script each, like every lock operation.
//!
//! ```text
//! dlock:{orders%2F42}:result    hash  token -> 17, value -> <the result's bytes>,
//!                                     call -> <the id of the store call that wrote it>   (PEXPIRE retention)
//! ```
//!
//! The key shares the lock's hash tag, so that the store script can check the hold and
//! write the result in one atomic step on a Cluster too. Releasing or evicting the lock
//! deletes the hold only: the result stays until its retention ends, when Redis expires
//! it. The `call` field makes a store idempotent per call: a second delivery of the same
//! call (a retry after a broken connection) finds its own record and answers "stored"
//! instead of being refused by the token it wrote itself.
//!
//! The scripts' text is under `src/lua/results/`; this module composes them, calls them
//! under a hold and reads their replies.

use std::sync::LazyLock;
use std::time::Duration;

use dlock_core::{FencingToken, HoldKind, LockError, StoredResult};
use redis::aio::ConnectionLike;
use redis::{ErrorKind, RedisResult, Value};

use crate::error::to_lock_error;
use crate::hold::RedisHold;
use crate::keys::LockKeys;
use crate::lua::{ABOVE_LIB, LOAD_RESULT, STORE_RESULT, STORE_RESULT_SHARED, WRITE_RESULT_LIB};
use crate::scripts::{ttl_millis, Invocation, LuaScript};

/// The result scripts, hashed once per process, loaded with the lock scripts when a
/// client connects.
pub struct ResultScripts {
    /// See `src/lua/results/store.lua`.
    pub store: LuaScript,
    /// See `src/lua/results/load.lua`.
    pub load: LuaScript,
    /// See `src/lua/results/store_shared.lua` (readers and permits).
    pub store_shared: LuaScript,
}

impl std::fmt::Debug for ResultScripts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResultScripts").finish_non_exhaustive()
    }
}

static SCRIPTS: LazyLock<ResultScripts> = LazyLock::new(|| ResultScripts {
    store: LuaScript::new(format!("{ABOVE_LIB}{WRITE_RESULT_LIB}{STORE_RESULT}")),
    load: LuaScript::new(LOAD_RESULT),
    store_shared: LuaScript::new(format!("{ABOVE_LIB}{WRITE_RESULT_LIB}{STORE_RESULT_SHARED}")),
});

/// The result scripts of this crate.
pub fn scripts() -> &'static ResultScripts {
    &SCRIPTS
}

impl ResultScripts {
    /// Every result script, for loading them up front.
    pub fn all(&self) -> [&LuaScript; 3] {
        [&self.store, &self.load, &self.store_shared]
    }
}

/// The store script call of `hold`'s result: `NotHeld` when `token` is not the hold's
/// (then it is not this hold's result to store). `call` names this one call; every
/// delivery of it, and on RedLock every node's copy, carries it.
pub(crate) fn store_call(
    hold: &RedisHold,
    token: FencingToken,
    value: &[u8],
    retention: Duration,
) -> Result<Invocation, LockError> {
    if token.get() != hold.token {
        return Err(LockError::not_held());
    }
    let call = format!("{}/{:016x}", hold.grant_field, fastrand::u64(..));
    let invocation = match hold.kind {
        HoldKind::Exclusive => Invocation::new(&scripts().store, &[&hold.keys.hold, &hold.keys.result()])
            .arg(&hold.owner_field)
            .arg(hold.token.to_string())
            .arg(&hold.grant_field),
        HoldKind::Shared | HoldKind::Permit { .. } => {
            Invocation::new(&scripts().store_shared, &[&hold.keys.hold, &hold.keys.result(), &hold.keys.leases])
                .arg(hold.hold_id())
                .arg(hold.token.to_string())
                .arg(hold.request_id())
        }
    };
    Ok(invocation.arg(call).arg(value).arg(ttl_millis(retention).max(1)))
}

/// The load script call of a lock's result.
pub(crate) fn load_call(keys: &LockKeys) -> Invocation {
    Invocation::new(&scripts().load, &[&keys.result()])
}

/// Stores `hold`'s result on one server (the connection decides which). `NotHeld` when
/// the server refused it.
pub(crate) async fn store<C: ConnectionLike + Send>(
    conn: &mut C,
    hold: &RedisHold,
    token: FencingToken,
    value: &[u8],
    retention: Duration,
) -> Result<(), LockError> {
    let call = store_call(hold, token, value, retention)?;
    let reply = StoreReply::parse(call.run(conn).await.map_err(to_lock_error)?).map_err(to_lock_error)?;
    if reply.stored() {
        Ok(())
    } else {
        tracing::debug!(lock = %hold.keys.hold, %token, ?reply, "result refused");
        Err(LockError::not_held())
    }
}

/// The result stored on one server, if any.
pub(crate) async fn load<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &LockKeys,
) -> Result<Option<StoredResult>, LockError> {
    let reply = load_call(keys).run(conn).await.map_err(to_lock_error)?;
    Ok(ResultRecord::parse(reply).map_err(to_lock_error)?.map(ResultRecord::into_stored))
}

/// What the store script answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreReply {
    /// Stored now.
    Stored,
    /// An earlier delivery of the same call stored it.
    StoredBefore,
    /// The hold is not this grant's (gone, expired, released, or another's).
    NotHeld,
    /// A result of this token or a later one is stored.
    Superseded,
}

impl StoreReply {
    /// Reads the script's 1, 2, 0 or -1.
    pub fn parse(reply: Value) -> RedisResult<Self> {
        match redis::from_redis_value::<i64>(reply)? {
            1 => Ok(StoreReply::Stored),
            2 => Ok(StoreReply::StoredBefore),
            0 => Ok(StoreReply::NotHeld),
            -1 => Ok(StoreReply::Superseded),
            other => Err(corrupt("store reply", &other.to_string())),
        }
    }

    /// Whether the result is stored, by this delivery or an earlier one of the call.
    pub fn stored(self) -> bool {
        matches!(self, StoreReply::Stored | StoreReply::StoredBefore)
    }
}

/// A result record as one server keeps it.
#[derive(Clone, PartialEq, Eq)]
pub struct ResultRecord {
    /// The token of the hold that stored it.
    pub token: u64,
    /// The result.
    pub value: Vec<u8>,
    /// The store call that wrote it: copies of one store on several RedLock masters
    /// share it.
    pub call: String,
}

impl std::fmt::Debug for ResultRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Results may be large and may hold user data: show their size, not their bytes.
        f.debug_struct("ResultRecord")
            .field("token", &self.token)
            .field("bytes", &self.value.len())
            .field("call", &self.call)
            .finish()
    }
}

impl ResultRecord {
    /// Reads the load script's `{}` or `{token, value, call}`; a record with a field
    /// missing or a token that is not a positive decimal is an error.
    pub fn parse(reply: Value) -> RedisResult<Option<Self>> {
        let fields: Vec<Value> = redis::from_redis_value(reply)?;
        if fields.is_empty() {
            return Ok(None);
        }
        let [token, value, call]: [Value; 3] =
            fields.try_into().map_err(|fields: Vec<Value>| corrupt("result record", &format!("{fields:?}")))?;
        let text = |field: &str, v: Value| match v {
            Value::BulkString(bytes) => Ok(bytes),
            Value::SimpleString(text) => Ok(text.into_bytes()),
            other => Err(corrupt(field, &format!("{other:?}"))),
        };
        let token_text = text("result token", token)?;
        let token = std::str::from_utf8(&token_text)
            .ok()
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|t| t.parse::<u64>().ok())
            .filter(|t| *t > 0)
            .ok_or_else(|| corrupt("result token", &String::from_utf8_lossy(&token_text)))?;
        let value = text("result value", value)?;
        let call = String::from_utf8(text("result call", call)?)
            .map_err(|e| corrupt("result call", &String::from_utf8_lossy(e.as_bytes())))?;
        Ok(Some(ResultRecord { token, value, call }))
    }

    /// The record as the lock API reports it.
    pub fn into_stored(self) -> StoredResult {
        StoredResult { token: FencingToken::new(self.token), value: self.value }
    }
}

fn corrupt(what: &str, found: &str) -> redis::RedisError {
    redis::RedisError::from((ErrorKind::UnexpectedReturnType, "corrupt result record", format!("{what}: {found}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &[u8]) -> Value {
        Value::BulkString(s.to_vec())
    }

    #[test]
    fn store_replies_parse() {
        assert_eq!(StoreReply::parse(Value::Int(1)).unwrap(), StoreReply::Stored);
        assert_eq!(StoreReply::parse(Value::Int(2)).unwrap(), StoreReply::StoredBefore);
        assert_eq!(StoreReply::parse(Value::Int(0)).unwrap(), StoreReply::NotHeld);
        assert_eq!(StoreReply::parse(Value::Int(-1)).unwrap(), StoreReply::Superseded);
        assert!(StoreReply::parse(Value::Int(3)).is_err());
        assert!(StoreReply::StoredBefore.stored() && !StoreReply::Superseded.stored());
    }

    #[test]
    fn records_parse_and_corrupt_ones_are_errors() {
        assert_eq!(ResultRecord::parse(Value::Array(vec![])).unwrap(), None);
        let max = u64::MAX.to_string();
        let record =
            ResultRecord::parse(Value::Array(vec![bulk(max.as_bytes()), bulk(b"\0\xffok"), bulk(b"grant:c:1/00")]))
                .unwrap()
                .unwrap();
        assert_eq!(
            (record.token, record.value.as_slice(), record.call.as_str()),
            (u64::MAX, &b"\0\xffok"[..], "grant:c:1/00")
        );
        let empty = ResultRecord::parse(Value::Array(vec![bulk(b"7"), bulk(b""), bulk(b"c")])).unwrap().unwrap();
        assert!(empty.value.is_empty());
        for bad in [
            vec![Value::Nil, bulk(b"v"), bulk(b"c")],
            vec![bulk(b"7"), Value::Nil, bulk(b"c")],
            vec![bulk(b"7"), bulk(b"v"), Value::Nil],
            vec![bulk(b"x7"), bulk(b"v"), bulk(b"c")],
            vec![bulk(b"-7"), bulk(b"v"), bulk(b"c")],
            vec![bulk(b"0"), bulk(b"v"), bulk(b"c")],
            vec![bulk(b""), bulk(b"v"), bulk(b"c")],
            vec![bulk(b"18446744073709551616"), bulk(b"v"), bulk(b"c")],
            vec![bulk(b"7"), bulk(b"v")],
            vec![bulk(b"7"), bulk(b"v"), bulk(b"\xff")],
        ] {
            assert!(ResultRecord::parse(Value::Array(bad.clone())).is_err(), "{bad:?}");
        }
        assert!(ResultRecord::parse(Value::Int(1)).is_err());
    }

    #[test]
    fn a_store_with_another_token_than_the_holds_is_not_sent() {
        let layout = crate::keys::KeyLayout::new("p").unwrap();
        let hold = RedisHold {
            keys: layout.lock(&dlock_core::LockName::new("n").unwrap()),
            owner_field: "owner:o".into(),
            grant_field: "grant:g".into(),
            token: 7,
            kind: HoldKind::Exclusive,
            handed_at: None,
        };
        let call = store_call(&hold, FencingToken::new(8), b"v", Duration::from_secs(1));
        assert!(matches!(call, Err(LockError::NotHeld { .. })));
        assert!(store_call(&hold, FencingToken::new(7), b"v", Duration::from_secs(1)).is_ok());
    }
}
