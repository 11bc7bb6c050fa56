//! What the lock scripts answer, read into Rust values: one type or function per reply
//! (the script files under `src/lua/` state each reply's shape).

use std::time::Duration;

use redis::{ErrorKind, RedisResult, Value};

/// What the acquire script answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireReply {
    /// Granted with this token.
    Granted(u64),
    /// Not granted.
    Busy {
        /// How long to wait before trying again: the hold's remaining ttl, or the rest
        /// of the place of another waiter first in the queue when that ends sooner or
        /// the lock is free (`None`: the hold has no expiry and nobody else queues).
        left: Option<Duration>,
        /// Whether the request has a place in the queue.
        queued: bool,
    },
}

impl AcquireReply {
    /// Reads the script's `{1, token}` or `{0, wait, placed}` (`placed` may be missing:
    /// then the request has no place).
    pub fn parse(reply: Value) -> RedisResult<Self> {
        let fields: Vec<i64> = redis::from_redis_value(reply)?;
        Ok(match fields[..] {
            [1, token] if token > 0 => AcquireReply::Granted(token as u64),
            [0, wait] | [0, wait, 0] => {
                AcquireReply::Busy { left: u64::try_from(wait).ok().map(Duration::from_millis), queued: false }
            }
            [0, wait, 1] => {
                AcquireReply::Busy { left: u64::try_from(wait).ok().map(Duration::from_millis), queued: true }
            }
            _ => return Err(unexpected("acquire", &format!("{fields:?}"))),
        })
    }
}

/// The inspect-with-queue script's answer: the live places and the hold.
pub fn parse_inspect_queue(reply: Value) -> RedisResult<(usize, Option<HoldView>)> {
    let mut fields: Vec<Value> = redis::from_redis_value(reply)?;
    if fields.is_empty() {
        return Err(unexpected("inspect", "{}"));
    }
    let waiters: usize = redis::from_redis_value(fields.remove(0))?;
    Ok((waiters, HoldView::parse(Value::Array(fields))?))
}

/// What one node answered to the grant script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrantReply {
    /// Granted with the proposed token.
    Granted(u64),
    /// This owner held the lock here already, with this token; its count went up.
    Reentered(u64),
    /// Another owner holds it here.
    Busy {
        /// How much longer (`None`: no expiry).
        left: Option<Duration>,
        /// The token of that hold.
        token: u64,
    },
    /// The proposal was not above this node's fence counter, which is this.
    Stale(u64),
}

impl GrantReply {
    /// Reads the script's `{status, value, fence}`, returning the reply and the node's
    /// fence counter.
    pub fn parse(reply: Value) -> RedisResult<(Self, u64)> {
        let mut fields: Vec<Value> = redis::from_redis_value(reply)?;
        let holder = if fields.len() == 4 { fields.pop() } else { None };
        let (status, value, fence): (i64, Value, Value) = redis::from_redis_value(Value::Array(fields))?;
        let fence: u64 = redis::from_redis_value(fence)?;
        let reply = match status {
            1 => GrantReply::Granted(redis::from_redis_value(value)?),
            2 => GrantReply::Reentered(redis::from_redis_value(value)?),
            0 => GrantReply::Busy {
                left: u64::try_from(redis::from_redis_value::<i64>(value)?).ok().map(Duration::from_millis),
                token: holder.map(redis::from_redis_value).transpose()?.unwrap_or(0),
            },
            -1 => GrantReply::Stale(redis::from_redis_value(value)?),
            other => return Err(unexpected("grant", &other.to_string())),
        };
        Ok((reply, fence))
    }
}

/// What the renew script answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewReply {
    /// The hold lasts the ttl from now.
    Renewed,
    /// Nobody holds the lock.
    Gone,
    /// Another hold is there.
    Stolen,
}

impl RenewReply {
    /// Reads the script's 1, 0 or -1.
    pub fn parse(reply: Value) -> RedisResult<Self> {
        match redis::from_redis_value::<i64>(reply)? {
            1 => Ok(RenewReply::Renewed),
            0 => Ok(RenewReply::Gone),
            -1 => Ok(RenewReply::Stolen),
            other => Err(unexpected("renew", &other.to_string())),
        }
    }
}

/// What the release script answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseReply {
    /// This grant was released now.
    Released,
    /// This grant was released now, and the lock granted to the waiter of this place, one
    /// the release named, with this token.
    HandedOn {
        /// The place id (the request id) of the waiter granted.
        place: String,
        /// The token of its grant.
        token: u64,
    },
    /// The hold is there, but this grant of it was released before.
    AlreadyReleased,
    /// The hold is gone, or it is another's.
    NotOurs,
}

impl ReleaseReply {
    /// Reads the script's 1, 2 or 0, or `{1, place, token}`.
    pub fn parse(reply: Value) -> RedisResult<Self> {
        if let Value::Array(items) = &reply {
            return match redis::from_redis_value::<(i64, String, u64)>(Value::Array(items.clone()))? {
                (1, place, token) if token > 0 => Ok(ReleaseReply::HandedOn { place, token }),
                other => Err(unexpected("release", &format!("{other:?}"))),
            };
        }
        match redis::from_redis_value::<i64>(reply)? {
            1 => Ok(ReleaseReply::Released),
            2 => Ok(ReleaseReply::AlreadyReleased),
            0 => Ok(ReleaseReply::NotOurs),
            other => Err(unexpected("release", &other.to_string())),
        }
    }

    /// Whether the grant is released, given whether the call was sent twice: after a
    /// second sending, a grant found gone was most likely released by the first, whose
    /// reply the broken connection lost (and either way it is not held any more).
    pub fn released(&self, sent_twice: bool) -> bool {
        matches!(self, ReleaseReply::Released | ReleaseReply::HandedOn { .. }) || sent_twice
    }
}

/// Reads the give-back script's answer: whether there was a grant to give back.
pub fn parse_given_back(reply: Value) -> RedisResult<bool> {
    match redis::from_redis_value::<i64>(reply)? {
        1 => Ok(true),
        0 => Ok(false),
        other => Err(unexpected("give back", &other.to_string())),
    }
}

/// The hold as the inspect script read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldView {
    /// The owner id.
    pub owner: String,
    /// The hold count.
    pub count: u32,
    /// The fencing token.
    pub token: u64,
    /// The remaining ttl (`None`: no expiry).
    pub remaining: Option<Duration>,
}

impl HoldView {
    /// Reads the script's `{}` or `{owner, count, token, pttl}`.
    pub fn parse(reply: Value) -> RedisResult<Option<Self>> {
        let fields: Vec<Value> = redis::from_redis_value(reply)?;
        if fields.is_empty() {
            return Ok(None);
        }
        let (owner, count, token, pttl): (String, i64, u64, i64) = redis::from_redis_value(Value::Array(fields))?;
        Ok(Some(HoldView {
            owner,
            count: u32::try_from(count).unwrap_or(0),
            token,
            remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
        }))
    }
}

fn unexpected(script: &str, reply: &str) -> redis::RedisError {
    redis::RedisError::from((ErrorKind::UnexpectedReturnType, "unexpected script reply", format!("{script}: {reply}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse() {
        let int = Value::Int;
        assert_eq!(AcquireReply::parse(Value::Array(vec![int(1), int(7)])).unwrap(), AcquireReply::Granted(7));
        assert_eq!(
            AcquireReply::parse(Value::Array(vec![int(0), int(250)])).unwrap(),
            AcquireReply::Busy { left: Some(Duration::from_millis(250)), queued: false }
        );
        assert_eq!(
            AcquireReply::parse(Value::Array(vec![int(0), int(-1), int(1)])).unwrap(),
            AcquireReply::Busy { left: None, queued: true }
        );
        assert!(AcquireReply::parse(Value::Array(vec![int(2), int(1)])).is_err());
        assert!(AcquireReply::parse(Value::Array(vec![int(0), int(1), int(2)])).is_err());
        assert_eq!(parse_inspect_queue(Value::Array(vec![int(3)])).unwrap(), (3, None));
        assert_eq!(RenewReply::parse(int(-1)).unwrap(), RenewReply::Stolen);
        assert_eq!(ReleaseReply::parse(int(1)).unwrap(), ReleaseReply::Released);
        assert_eq!(ReleaseReply::parse(int(2)).unwrap(), ReleaseReply::AlreadyReleased);
        let handed = Value::Array(vec![int(1), Value::BulkString(b"c:7".to_vec()), int(42)]);
        assert_eq!(ReleaseReply::parse(handed).unwrap(), ReleaseReply::HandedOn { place: "c:7".into(), token: 42 });
        assert!(!ReleaseReply::parse(int(0)).unwrap().released(false));
        assert!(ReleaseReply::parse(int(0)).unwrap().released(true));
        assert_eq!(HoldView::parse(Value::Array(vec![])).unwrap(), None);
        let big = u64::MAX.to_string();
        let view = HoldView::parse(Value::Array(vec![
            Value::BulkString(b"o".to_vec()),
            int(2),
            Value::BulkString(big.clone().into_bytes()),
            int(-1),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((view.token, view.remaining), (u64::MAX, None));

        let text = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let grant = |status, value, fence: &str| GrantReply::parse(Value::Array(vec![int(status), value, text(fence)]));
        assert_eq!(grant(1, text(&big), &big).unwrap(), (GrantReply::Granted(u64::MAX), u64::MAX));
        assert_eq!(grant(2, text("7"), "9").unwrap(), (GrantReply::Reentered(7), 9));
        let busy = |left, token: &str| {
            GrantReply::parse(Value::Array(vec![int(0), int(left), text("9"), text(token)])).unwrap()
        };
        assert_eq!(busy(250, "8"), (GrantReply::Busy { left: Some(Duration::from_millis(250)), token: 8 }, 9));
        assert_eq!(busy(-1, "8"), (GrantReply::Busy { left: None, token: 8 }, 9));
        assert_eq!(grant(-1, text("12"), "12").unwrap(), (GrantReply::Stale(12), 12));
        assert!(grant(3, int(1), "1").is_err());
    }
}
