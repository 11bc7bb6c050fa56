//! The line protocol between the lease server and its clients.
//!
//! Every request is one line, `<tag> <VERB> <field>...\n`, and gets one answer line,
//! `<tag> <WORD> <field>...\n`, with the request's tag, so that a client can pipeline
//! many requests on one connection and match the answers. Fields are separated by one
//! space; text fields (names, owners, request ids, messages) are percent-encoded so that
//! they never hold a space, a newline or a `%` of their own: any UTF-8 a lock name may
//! hold travels unchanged, and two names never meet on the wire as one.
//!
//! The requests and their answers are listed in the crate docs.
//!
//! Any request may also be answered `ERR <message>`. A line longer than [`MAX_LINE`]
//! bytes ends the connection: nothing after it could be trusted to start a line.

use std::io;
use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt};

/// The protocol version `HELLO` agrees on.
pub(crate) const VERSION: u32 = 1;

/// The longest line either side accepts, newline excluded. The longest legal request (a
/// 1,024-byte name and a 256-byte owner, each byte percent-encoded to three) is under
/// 4.5 KiB.
pub(crate) const MAX_LINE: usize = 8 * 1024;

/// The longest ttl or keep time the server accepts: a year, as the lock options allow.
pub(crate) const MAX_MILLIS: u64 = dlock_core::MAX_DURATION.as_secs() * 1000;

/// One request, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    Hello { version: u32 },
    Acquire { name: String, owner: String, grant: String, ttl_ms: u64 },
    Renew { name: String, owner: String, token: u64, ttl_ms: u64 },
    Release { name: String, owner: String, token: u64, grant: String },
    GiveBack { name: String, owner: String, grant: String, ttl_ms: u64 },
    Inspect { name: String },
    Sweep { keep_ms: u64, batch: u64 },
    Evict { name: String },
    Count { prefix: String },
}

/// One answer, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Hello { version: u32 },
    Granted { token: u64 },
    Busy { ms_left: u64 },
    Void,
    Renewed,
    Expired,
    Stolen,
    Released,
    NotHeld,
    Ok,
    Free,
    Held { owner: String, token: u64, count: u32, ms_left: u64 },
    Swept { removed: u64, more: bool },
    Count { names: u64 },
    Err { message: String },
}

impl Request {
    /// The request as a line, newline included.
    pub(crate) fn to_line(&self, tag: u64) -> Vec<u8> {
        let e = encode;
        let body = match self {
            Request::Hello { version } => format!("HELLO {version}"),
            Request::Acquire { name, owner, grant, ttl_ms } => {
                format!("ACQUIRE {} {} {} {ttl_ms}", e(name), e(owner), e(grant))
            }
            Request::Renew { name, owner, token, ttl_ms } => format!("RENEW {} {} {token} {ttl_ms}", e(name), e(owner)),
            Request::Release { name, owner, token, grant } => {
                format!("RELEASE {} {} {token} {}", e(name), e(owner), e(grant))
            }
            Request::GiveBack { name, owner, grant, ttl_ms } => {
                format!("GIVEBACK {} {} {} {ttl_ms}", e(name), e(owner), e(grant))
            }
            Request::Inspect { name } => format!("INSPECT {}", e(name)),
            Request::Sweep { keep_ms, batch } => format!("SWEEP {keep_ms} {batch}"),
            Request::Evict { name } => format!("EVICT {}", e(name)),
            Request::Count { prefix } => format!("COUNT {}", e(prefix)),
        };
        format!("{tag} {body}\n").into_bytes()
    }

    /// Decodes a request line (without its newline): its tag, and the request or why it
    /// is not one. The tag is `0` when even the tag cannot be read.
    pub(crate) fn parse(line: &[u8]) -> (u64, Result<Request, String>) {
        let Ok(line) = std::str::from_utf8(line) else { return (0, Err("a request that is not UTF-8".into())) };
        let mut fields = line.split(' ');
        let Some(tag) = fields.next().and_then(|t| t.parse::<u64>().ok()) else {
            return (0, Err("a request without a numeric tag".into()));
        };
        let verb = fields.next().unwrap_or_default();
        let args: Vec<&str> = fields.collect();
        (tag, Self::parse_args(verb, &args))
    }

    fn parse_args(verb: &str, args: &[&str]) -> Result<Request, String> {
        let request = match (verb, args) {
            ("HELLO", [version]) => Request::Hello { version: number(version)? },
            ("ACQUIRE", [name, owner, grant, ttl]) => Request::Acquire {
                name: decode(name)?,
                owner: decode(owner)?,
                grant: decode(grant)?,
                ttl_ms: millis(ttl)?,
            },
            ("RENEW", [name, owner, token, ttl]) => Request::Renew {
                name: decode(name)?,
                owner: decode(owner)?,
                token: number(token)?,
                ttl_ms: millis(ttl)?,
            },
            ("RELEASE", [name, owner, token, grant]) => Request::Release {
                name: decode(name)?,
                owner: decode(owner)?,
                token: number(token)?,
                grant: decode(grant)?,
            },
            ("GIVEBACK", [name, owner, grant, ttl]) => Request::GiveBack {
                name: decode(name)?,
                owner: decode(owner)?,
                grant: decode(grant)?,
                ttl_ms: millis(ttl)?,
            },
            ("INSPECT", [name]) => Request::Inspect { name: decode(name)? },
            ("SWEEP", [keep, batch]) => Request::Sweep { keep_ms: millis(keep)?, batch: number(batch)? },
            ("EVICT", [name]) => Request::Evict { name: decode(name)? },
            ("COUNT", [prefix]) => Request::Count { prefix: decode(prefix)? },
            _ => return Err(format!("an unknown request {verb:?} with {} fields", args.len())),
        };
        Ok(request)
    }
}

impl Reply {
    /// The answer as a line, newline included.
    pub(crate) fn to_line(&self, tag: u64) -> Vec<u8> {
        let body = match self {
            Reply::Hello { version } => format!("HELLO {version}"),
            Reply::Granted { token } => format!("GRANTED {token}"),
            Reply::Busy { ms_left } => format!("BUSY {ms_left}"),
            Reply::Void => "VOID".into(),
            Reply::Renewed => "RENEWED".into(),
            Reply::Expired => "EXPIRED".into(),
            Reply::Stolen => "STOLEN".into(),
            Reply::Released => "RELEASED".into(),
            Reply::NotHeld => "NOTHELD".into(),
            Reply::Ok => "OK".into(),
            Reply::Free => "FREE".into(),
            Reply::Held { owner, token, count, ms_left } => format!("HELD {} {token} {count} {ms_left}", encode(owner)),
            Reply::Swept { removed, more } => format!("SWEPT {removed} {}", u8::from(*more)),
            Reply::Count { names } => format!("COUNT {names}"),
            Reply::Err { message } => format!("ERR {}", encode(message)),
        };
        format!("{tag} {body}\n").into_bytes()
    }

    /// Decodes an answer line (without its newline): its tag and the answer.
    pub(crate) fn parse(line: &[u8]) -> Result<(u64, Reply), String> {
        let line = std::str::from_utf8(line).map_err(|_| "an answer that is not UTF-8".to_string())?;
        let mut fields = line.split(' ');
        let tag = number(fields.next().unwrap_or_default())?;
        let word = fields.next().unwrap_or_default();
        let args: Vec<&str> = fields.collect();
        let reply = match (word, args.as_slice()) {
            ("HELLO", [version]) => Reply::Hello { version: number(version)? },
            ("GRANTED", [token]) => Reply::Granted { token: number(token)? },
            ("BUSY", [ms]) => Reply::Busy { ms_left: number(ms)? },
            ("VOID", []) => Reply::Void,
            ("RENEWED", []) => Reply::Renewed,
            ("EXPIRED", []) => Reply::Expired,
            ("STOLEN", []) => Reply::Stolen,
            ("RELEASED", []) => Reply::Released,
            ("NOTHELD", []) => Reply::NotHeld,
            ("OK", []) => Reply::Ok,
            ("FREE", []) => Reply::Free,
            ("HELD", [owner, token, count, ms]) => Reply::Held {
                owner: decode(owner)?,
                token: number(token)?,
                count: number(count)?,
                ms_left: number(ms)?,
            },
            ("SWEPT", [removed, more]) => Reply::Swept {
                removed: number(removed)?,
                more: match *more {
                    "0" => false,
                    "1" => true,
                    other => return Err(format!("a bad flag {other:?}")),
                },
            },
            ("COUNT", [names]) => Reply::Count { names: number(names)? },
            ("ERR", [message]) => Reply::Err { message: decode(message)? },
            _ => return Err(format!("an unknown answer {word:?} with {} fields", args.len())),
        };
        Ok((tag, reply))
    }
}

/// Reads one line into `line`, without its newline. `Ok(false)` at the end of the
/// stream; an error for a line over [`MAX_LINE`] or a stream that ends mid-line.
pub(crate) async fn read_line<R: AsyncBufRead + Unpin>(reader: &mut R, line: &mut Vec<u8>) -> io::Result<bool> {
    line.clear();
    // The bound keeps a peer that never sends a newline from growing the buffer forever.
    let limit = u64::try_from(MAX_LINE).unwrap_or(u64::MAX).saturating_add(1);
    let read = (&mut *reader).take(limit).read_until(b'\n', line).await?;
    if read == 0 {
        return Ok(false);
    }
    if line.pop() != Some(b'\n') {
        let why = if line.len() >= MAX_LINE { "a line over the length bound" } else { "a line cut short" };
        return Err(io::Error::new(io::ErrorKind::InvalidData, why));
    }
    Ok(true)
}

/// Percent-encodes `text`: every byte but ASCII letters, digits, `_` and `-` becomes
/// `%XX`, so an encoded field never holds a separator and the encoding is one-to-one.
pub(crate) fn encode(text: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-' {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0xF)]));
        }
    }
    out
}

/// Reverses [`encode`]; refuses anything `encode` cannot have made, and text that is not
/// UTF-8 once decoded.
pub(crate) fn decode(field: &str) -> Result<String, String> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'%' => {
                let hex = bytes.get(at + 1..at + 3).ok_or_else(|| format!("a cut escape in {field:?}"))?;
                let hex = std::str::from_utf8(hex).map_err(|_| format!("a bad escape in {field:?}"))?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| format!("a bad escape in {field:?}"))?);
                at += 3;
            }
            byte if byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-' => {
                out.push(byte);
                at += 1;
            }
            byte => return Err(format!("a raw byte {byte:#04x} in {field:?}")),
        }
    }
    let text = String::from_utf8(out).map_err(|_| format!("{field:?} is not UTF-8 once decoded"))?;
    // One text, one spelling: `%2f`, `%41` or `%+F` would decode, but `encode` never
    // writes them.
    if encode(&text) != field {
        return Err(format!("{field:?} is not in the canonical encoding"));
    }
    Ok(text)
}

/// A duration in whole milliseconds, rounded up: the server must keep a hold at least as
/// long as the client counts on it, never a rounding less.
pub(crate) fn ceil_millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

fn number<T: std::str::FromStr>(field: &str) -> Result<T, String> {
    field.parse().map_err(|_| format!("{field:?} is not a number in range"))
}

/// A ttl or keep time: 1 ms to a year.
fn millis(field: &str) -> Result<u64, String> {
    let ms: u64 = number(field)?;
    if !(1..=MAX_MILLIS).contains(&ms) {
        return Err(format!("{ms} ms is outside 1 ms..=a year"));
    }
    Ok(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn awkward_text_survives_the_wire() {
        for text in ["a b", "a\nb", "%", "%25", "🔒 ключ", "a\\b", "", "x-y_z", "e\u{301}"] {
            let encoded = encode(text);
            assert!(!encoded.contains([' ', '\n']), "{encoded:?}");
            assert_eq!(decode(&encoded).as_deref(), Ok(text));
        }
        assert_ne!(encode("a/b"), encode("a%2Fb"), "the encoding is one-to-one");
    }

    #[test]
    fn garbage_is_refused_not_panicked_on() {
        for field in ["%", "%4", "%zz", "a b", "%FF", "é", "%2f", "%41", "%+F"] {
            assert!(decode(field).is_err(), "{field:?}");
        }
        for line in [&b""[..], b"x ACQUIRE", b"7", b"7 ACQUIRE a", b"7 ACQUIRE a b c 0", b"7 RENEW a b -1 5", b"\xff"] {
            assert!(Request::parse(line).1.is_err(), "{:?}", String::from_utf8_lossy(line));
        }
        assert!(Reply::parse(b"7 SWEPT 1 2").is_err());
        assert!(Reply::parse(b"nope").is_err());
    }

    #[test]
    fn requests_and_replies_round_trip() {
        let request =
            Request::Acquire {
                name: "orders/42 🔒".into(), owner: "job 7".into(), grant: "c1:9".into(), ttl_ms: 1500
            };
        let line = request.to_line(9);
        assert_eq!(Request::parse(&line[..line.len() - 1]), (9, Ok(request)));
        let reply = Reply::Held { owner: "job 7".into(), token: 3, count: 2, ms_left: 10 };
        let line = reply.to_line(9);
        assert_eq!(Reply::parse(&line[..line.len() - 1]), Ok((9, reply)));
        let empty = Request::Count { prefix: String::new() };
        let line = empty.to_line(1);
        assert_eq!(Request::parse(&line[..line.len() - 1]), (1, Ok(empty)));
    }

    #[test]
    fn ttls_round_up_and_stay_in_range() {
        assert_eq!(ceil_millis(Duration::from_micros(1500)), 2);
        assert_eq!(ceil_millis(Duration::from_millis(3)), 3);
        assert!(millis("0").is_err());
        assert!(millis(&(MAX_MILLIS + 1).to_string()).is_err());
    }

    #[tokio::test]
    async fn long_lines_end_the_stream() {
        let mut long = vec![b'x'; MAX_LINE + 10];
        long.push(b'\n');
        let mut reader = tokio::io::BufReader::new(&long[..]);
        let mut line = Vec::new();
        assert!(read_line(&mut reader, &mut line).await.is_err());

        let mut reader = tokio::io::BufReader::new(&b"1 OK\n2 FREE"[..]);
        assert!(read_line(&mut reader, &mut line).await.unwrap());
        assert_eq!(line, b"1 OK");
        assert!(read_line(&mut reader, &mut line).await.is_err(), "a line cut short");
    }
}
