//! The Lua scripts that make each lock operation one atomic round trip, and how they are
//! called: `EVALSHA`, loading the script again when the server answers `NOSCRIPT` (after a
//! restart or a `SCRIPT FLUSH`), optionally pipelined with `WAIT` for replicas.

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{cmd, Cmd, ErrorKind, RedisResult, Script, ServerErrorKind, ToRedisArgs, Value};

use crate::config::ReplicaAck;

/// Compares two decimal tokens of any length as numbers: a longer one is larger, else
/// the text order decides (Lua's numbers lose precision above 2^53).
pub(crate) const ABOVE_LIB: &str = r#"
local function above(a, b)
  if #a ~= #b then
    return #a > #b
  end
  return a > b
end
"#;

/// Reads a hold's owner, re-entrant count and token (as stored) from its hash; the owner
/// is `false` when the lock is free.
const HOLD_LIB: &str = r#"
local function read_hold(key)
  local fields = redis.call('hgetall', key)
  local owner, count, token = false, 0, '0'
  for i = 1, #fields, 2 do
    local field = fields[i]
    if field == 'token' then
      token = fields[i + 1]
    elseif string.sub(field, 1, 6) == 'owner:' then
      owner = string.sub(field, 7)
      count = tonumber(fields[i + 1])
    end
  end
  return owner, count, token
end
"#;

/// The fence counter functions of the single-server scripts, put in front of those that
/// grant, renew or release.
///
/// The counter lasts the keep time (`keep`, in ms) from the name's last grant, renewal or
/// release, so that an idle name leaves nothing behind. A grant that finds it missing
/// (`INCR` answers 1) starts it from the server's clock in microseconds instead: above
/// every token the name had before its counter went, as long as the server's clock never
/// steps back by the keep time (a counter starts at the clock and takes one step per
/// grant, and one script takes more than a microsecond).
const FENCE_LIB: &str = r#"
local function next_token(fence, keep)
  local token = redis.call('incr', fence)
  if token == 1 then
    local t = redis.call('time')
    token = tonumber(t[1]) * 1000000 + tonumber(t[2])
    redis.call('set', fence, string.format('%d', token), 'px', keep)
  else
    redis.call('pexpire', fence, keep)
  end
  return token
end
local function keep_fence(fence, keep)
  redis.call('pexpire', fence, keep)
end
"#;

/// The queue functions the single-server scripts share, put in front of each of them.
///
/// A waiter is woken on its client's wake-up channel of the lock, named after the place
/// id up to its last `:` (a request id is `<client id>:<n>`), with the place id as the
/// message: one subscription serves all the waiters of a client on one lock, and the
/// client wakes only the waiter named.
///
/// A place lapses at the time stored for it in the places hash (server clock, in ms): its
/// waiter's place lapse ([`place_lapse`](dlock_core::place_lapse), at most a few seconds,
/// whatever lease it asks for) after its last look, so that a waiter that stopped coming
/// back is skipped soon. Lapsed places are dropped when they reach the head; one further
/// back stays until then (its waiter may still come back and refresh it, keeping its
/// turn).
const QUEUE_LIB: &str = r#"
local function now_ms()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function queue_head(queue, places, now)
  local dropped = false
  while true do
    local id = redis.call('lindex', queue, 0)
    if not id then
      return false, dropped
    end
    if tonumber(redis.call('hget', places, id) or '0') > now then
      return id, dropped
    end
    redis.call('lpop', queue)
    redis.call('hdel', places, id)
    dropped = true
  end
end
local function leave_queue(queue, places, id)
  if redis.call('hdel', places, id) == 1 then
    redis.call('lrem', queue, 1, id)
    return true
  end
  return false
end
local function take_place(queue, places, id, now, lapse)
  if redis.call('hset', places, id, string.format('%d', now + lapse)) == 1 then
    redis.call('rpush', queue, id)
  end
  for _, key in ipairs({queue, places}) do
    if redis.call('pttl', key) < lapse then
      redis.call('pexpire', key, lapse)
    end
  end
end
local function wake(prefix, id)
  redis.call('publish', prefix .. (string.match(id, '^(.*):[^:]*$') or id), id)
end
local function wake_head(queue, places, prefix)
  local head = queue_head(queue, places, now_ms())
  if head then
    wake(prefix, head)
  end
  return head
end
"#;

/// The functions the scripts of shared holds and permits share, put behind the queue
/// functions.
///
/// Readers' and permits' holds live in the hold hash (so that the exclusive scripts see
/// the name held, and wait, without reading anything else) and in the leases set, where
/// each hold's id (see [`hold_id`](crate::keys::hold_id)) is scored with the time its
/// hold lapses (server clock, in ms). Each hold lapses on its own: a script that finds
/// leases past their time drops them and their fields first. The hash and the set
/// themselves lapse with the last lease, so that a writer waiting on the hash's ttl is
/// not held up by leases that ended before it.
///
/// A permit's number of permits is kept beside it (`permits:<hold id>`): a new permit is
/// admitted only while every holder, the new one included, would have no more holds
/// beside it than its own number allows (`HoldKind::joins`), so the smallest number
/// among the live permits and the request bounds the grant. The holders' numbers are
/// read only when the request's own number admits one more (fewer holders than it).
const LEASES_LIB: &str = r#"
local function settle(hold, leases)
  local last = redis.call('zrange', leases, -1, -1, 'withscores')
  if #last == 0 then
    redis.call('del', hold, leases)
    return
  end
  local at = string.format('%d', tonumber(last[2]))
  redis.call('pexpireat', hold, at)
  redis.call('pexpireat', leases, at)
end
local function held_kind(hold, leases, now)
  local kind = redis.call('hget', hold, 'kind')
  if not kind then
    if redis.call('exists', hold) == 1 then
      return 'exclusive'
    end
    return false
  end
  local gone = redis.call('zrangebyscore', leases, '-inf', string.format('%d', now))
  if #gone > 0 then
    redis.call('zremrangebyscore', leases, '-inf', string.format('%d', now))
    local dead = {}
    for _, id in ipairs(gone) do
      dead[id] = true
      redis.call('hdel', hold, 'holder:' .. id, 'count:' .. id, 'permits:' .. id)
    end
    local fields = redis.call('hgetall', hold)
    for i = 1, #fields, 2 do
      if dead[fields[i + 1]] and string.sub(fields[i], 1, 8) == 'request:' then
        redis.call('hdel', hold, fields[i])
      end
    end
  end
  if #gone > 0 or redis.call('exists', leases) == 0 then
    settle(hold, leases)
    if redis.call('exists', hold) == 0 then
      return false
    end
  end
  return kind
end
local function lengthen(hold, leases, id, lapse)
  local score = redis.call('zscore', leases, id)
  if not score or tonumber(score) < lapse then
    redis.call('zadd', leases, string.format('%d', lapse), id)
    settle(hold, leases)
  end
end
local function take_back(hold, leases, id, request)
  redis.call('hdel', hold, 'request:' .. request)
  local count = 'count:' .. id
  if tonumber(redis.call('hget', hold, count) or '0') > 1 then
    redis.call('hincrby', hold, count, -1)
    return false
  end
  redis.call('hdel', hold, 'holder:' .. id, count, 'permits:' .. id)
  redis.call('zrem', leases, id)
  settle(hold, leases)
  return true
end
local function admits_permit(hold, leases, permits)
  local held = redis.call('zcard', leases)
  if held >= permits then
    return false
  end
  for _, id in ipairs(redis.call('zrange', leases, 0, -1)) do
    local bound = tonumber(redis.call('hget', hold, 'permits:' .. id) or '0')
    if bound > 0 and bound <= held then
      return false
    end
  end
  return true
end
local function hand_on(hold, queue, places, prefix, channel, token, kind)
  if kind == 'permit' or redis.call('exists', hold) == 0 then
    if not wake_head(queue, places, prefix) then
      redis.call('publish', channel, token)
    end
    return true
  end
  return false
end
"#;

/// Grants when the hold is free or already the owner's and no other waiter queues ahead,
/// else reports how long to wait, taking or keeping a place in the queue.
///
/// Each grant is recorded under its own field (`grant:<request id>`), so that the call
/// is idempotent (a second delivery of one request, by a retry or a client library that
/// re-sends, answers the grant already made and counts nothing twice) and so that the
/// request's grant, and only it, can be given back when its reply was lost. A request
/// given back leaves a marker key (`void`) that refuses a late delivery of it.
///
/// While the queue has a live place, only its head is granted a free lock, whatever
/// order the request asked for: a non-fair request cannot overtake queued fair ones. The
/// place mode says when a busy request takes a place: `0` never (a try), `1` only when a
/// queue exists already or readers or permits hold the lock (a blocking non-fair
/// request: queued, it keeps later readers out, so that a stream of them cannot starve
/// it), `2` always (a blocking fair one).
/// A request that has a place keeps it, refreshed to lapse its place lapse from now. When
/// dropping lapsed places leaves a free lock with a new head, that head is woken.
///
/// A request granted already (by an earlier delivery of it, or by a release that handed
/// the lock to its place) answers that grant, kept for at least the ttl from now: the
/// client counts the lease from when it sent this request, which may be after the grant.
///
/// Every grant keeps the fence counter for the keep time (see the fence functions).
///
/// KEYS: hold, fence counter, void marker, queue, places. ARGV: owner field, ttl in ms,
/// grant field, place id, place mode, wake-up channel prefix, place lapse in ms, keep
/// time in ms.
/// Returns `{1, token}` when granted, `{0, wait, placed}` when busy (or given back
/// already): `wait` is the hold's pttl, or the time until another waiter's place at the
/// head lapses if that comes first (a dead head is then skipped without waiting for the
/// holder); `placed` is 1 when the request has a place in the queue.
const ACQUIRE: &str = r#"
if redis.call('exists', KEYS[3]) == 1 then
  return {0, redis.call('pttl', KEYS[1]), 0}
end
local ttl = tonumber(ARGV[2])
if redis.call('hexists', KEYS[1], ARGV[3]) == 1 then
  if redis.call('pttl', KEYS[1]) < ttl then
    redis.call('pexpire', KEYS[1], ttl)
  end
  return {1, redis.call('hget', KEYS[1], 'token')}
end
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[1], 1)
  redis.call('hset', KEYS[1], ARGV[3], 1)
  if redis.call('pttl', KEYS[1]) < ttl then
    redis.call('pexpire', KEYS[1], ttl)
  end
  leave_queue(KEYS[4], KEYS[5], ARGV[4])
  keep_fence(KEYS[2], ARGV[8])
  return {1, redis.call('hget', KEYS[1], 'token')}
end
local now = now_ms()
local head, dropped = queue_head(KEYS[4], KEYS[5], now)
local held = redis.call('exists', KEYS[1]) == 1
if not held and (not head or head == ARGV[4]) then
  if head then
    leave_queue(KEYS[4], KEYS[5], ARGV[4])
  end
  local token = next_token(KEYS[2], ARGV[8])
  redis.call('hset', KEYS[1], ARGV[1], 1, 'token', string.format('%d', token), ARGV[3], 1)
  redis.call('pexpire', KEYS[1], ttl)
  return {1, token}
end
local placed = 0
if redis.call('hexists', KEYS[5], ARGV[4]) == 1 or ARGV[5] == '2'
    or (ARGV[5] == '1' and (head or (held and redis.call('hexists', KEYS[1], 'kind') == 1))) then
  take_place(KEYS[4], KEYS[5], ARGV[4], now, tonumber(ARGV[7]))
  placed = 1
end
if held then
  local wait = redis.call('pttl', KEYS[1])
  if head and head ~= ARGV[4] then
    local lapses = tonumber(redis.call('hget', KEYS[5], head)) - now
    if wait < 0 or lapses < wait then
      wait = lapses
    end
  end
  return {0, wait, placed}
end
if dropped then
  wake(ARGV[6], head)
end
return {0, tonumber(redis.call('hget', KEYS[5], head)) - now, placed}
"#;

/// Keeps the hold of one grant (with this token) for at least the ttl from now, and the
/// fence counter for the keep time.
///
/// KEYS: hold, fence counter. ARGV: owner field, token, ttl in ms, grant field, keep time
/// in ms.
/// Returns 1 when renewed, 0 when the hold (or this grant of it) is gone, -1 when
/// another hold is there.
const RENEW: &str = r#"
local token = redis.call('hget', KEYS[1], 'token')
if not token then
  return 0
end
if token ~= ARGV[2] or redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
  return -1
end
if redis.call('hexists', KEYS[1], ARGV[4]) == 0 then
  return 0
end
local ttl = tonumber(ARGV[3])
if redis.call('pttl', KEYS[1]) < ttl then
  redis.call('pexpire', KEYS[1], ttl)
end
keep_fence(KEYS[2], ARGV[5])
return 1
"#;

/// Releases one grant of the hold (with this token); the owner's last one frees the lock
/// and publishes the token: to the head of the queue alone when waiters queue, else on
/// the lock's channel. Idempotent per grant: a second delivery finds the grant gone and
/// changes nothing.
///
/// The releasing client may name waiters of its own that queue for the lock (each by its
/// place id, owner field, grant field and ttl): when the head of the queue is one of them,
/// the lock is granted to it here, as its own acquire would grant it at the head, and
/// nobody is woken; the client hands the grant over without another call. A waiter that
/// gave up has no place (its give-back took it), so it is never granted this way.
///
/// The last release deletes the hash first: `DEL` is allowed when the server is out of
/// memory (`HINCRBY` is not), so unlocking keeps working then.
///
/// A release keeps the fence counter for the keep time, and a grant it makes takes the
/// next token as an acquire does.
///
/// KEYS: hold, queue, places, fence counter. ARGV: owner field, token, channel, grant
/// field, wake-up channel prefix, keep time in ms, then four per waiter named: place id,
/// owner field, grant field, ttl in ms.
/// Returns 1 when released, `{1, place id, token}` when released and granted to the
/// waiter of that place, 2 when the hold is there but this grant was released already, 0
/// when the hold is not ours.
const RELEASE: &str = r#"
if redis.call('hget', KEYS[1], 'token') ~= ARGV[2] or redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
  return 0
end
if redis.call('hexists', KEYS[1], ARGV[4]) == 0 then
  return 2
end
if tonumber(redis.call('hget', KEYS[1], ARGV[1])) <= 1 then
  redis.call('del', KEYS[1])
  keep_fence(KEYS[4], ARGV[6])
  local head = queue_head(KEYS[2], KEYS[3], now_ms())
  if not head then
    redis.call('publish', ARGV[3], ARGV[2])
    return 1
  end
  for i = 7, #ARGV - 3, 4 do
    if ARGV[i] == head then
      leave_queue(KEYS[2], KEYS[3], head)
      local token = next_token(KEYS[4], ARGV[6])
      redis.call('hset', KEYS[1], ARGV[i + 1], 1, 'token', string.format('%d', token), ARGV[i + 2], 1)
      redis.call('pexpire', KEYS[1], tonumber(ARGV[i + 3]))
      return {1, head, token}
    end
  end
  wake(ARGV[5], head)
  return 1
end
redis.call('hincrby', KEYS[1], ARGV[1], -1)
redis.call('hdel', KEYS[1], ARGV[4])
keep_fence(KEYS[4], ARGV[6])
return 1
"#;

/// Gives back whatever grant one request may have made (its reply was lost), whichever
/// token it has, gives up the request's place in the queue, and marks the request given
/// back so that a late delivery of it grants nothing. Another holder, and the owner's
/// other grants, are never touched. When this frees the lock, or removes the head of the
/// queue of a lock that is free or held by readers or permits (whom the next waiter may
/// join), the (new) head is woken.
///
/// KEYS: hold, void marker, queue, places. ARGV: owner field, grant field, channel,
/// marker ttl in ms, place id, wake-up channel prefix.
/// Returns 1 when a grant was given back, 0 when there was none.
const GIVE_BACK: &str = r#"
local given = 0
local token = false
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  given = 1
  if tonumber(redis.call('hget', KEYS[1], ARGV[1]) or '0') <= 1 then
    token = redis.call('hget', KEYS[1], 'token') or '0'
    redis.call('del', KEYS[1])
  else
    redis.call('hincrby', KEYS[1], ARGV[1], -1)
    redis.call('hdel', KEYS[1], ARGV[2])
  end
end
local was_head = redis.call('lindex', KEYS[3], 0) == ARGV[5]
leave_queue(KEYS[3], KEYS[4], ARGV[5])
if token or (was_head and (redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], 'kind') == 1)) then
  if not wake_head(KEYS[3], KEYS[4], ARGV[6]) and token then
    redis.call('publish', ARGV[3], token)
  end
end
redis.pcall('set', KEYS[2], 1, 'px', ARGV[4])
return given
"#;

/// Gives up a waiter's place in the queue; when it was the head and the lock is free or
/// held by readers or permits, the new head is woken (it would otherwise wait for the old
/// head's place to lapse, though it may be granted now).
///
/// KEYS: hold, queue, places. ARGV: place id, wake-up channel prefix.
/// Returns 1 when the place was there, 0 when not.
const ABANDON: &str = r#"
local was_head = redis.call('lindex', KEYS[2], 0) == ARGV[1]
if not leave_queue(KEYS[2], KEYS[3], ARGV[1]) then
  return 0
end
if was_head and (redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], 'kind') == 1) then
  wake_head(KEYS[2], KEYS[3], ARGV[2])
end
return 1
"#;

/// Grants a reader's share or a permit when the holds there admit it (none; readers,
/// for a reader; for a permit, permits fewer than the request's number and than the
/// number of every permit there) and no other waiter queues ahead, else reports how long
/// to wait, taking or keeping a place in the queue as the exclusive acquire does. A
/// blocking permit request that is refused takes a place even when it did not ask for
/// fairness, so that a later request, for more permits say, cannot overtake it: once a
/// queue exists, requests are granted only at its head. The same hold id holding this
/// kind already re-enters its hold (count + 1, same token, its lease never shortened): an
/// owner re-enters a permit only with the same number of permits, and takes another
/// permit with another number; a hold of another kind waits for its own end.
///
/// Each grant takes the next value of the name's one fence counter (and keeps it for the
/// keep time), and is recorded under its request (`request:<request id>` → hold id), as
/// the exclusive acquire's are: the call is idempotent, and a request given back (its
/// void marker set) grants nothing. A grant made at the head of the queue wakes the next
/// waiter, who may join.
///
/// KEYS: hold, fence counter, void marker, queue, places, leases. ARGV: hold id, ttl in
/// ms, request id, place id, place mode, wake-up channel prefix, kind (`shared` or
/// `permit`), permits (the request's number; ignored for `shared`), place lapse in ms,
/// keep time in ms.
/// Returns what the exclusive acquire returns; `wait` is, when the holds do not admit
/// the request, the time until the first permit lapses (permits hold) or the hash's
/// pttl (another kind holds), else the time until another waiter's place at the head
/// lapses.
const ACQUIRE_SHARED: &str = r#"
if redis.call('exists', KEYS[3]) == 1 then
  return {0, redis.call('pttl', KEYS[1]), 0}
end
local now = now_ms()
local ttl = tonumber(ARGV[2])
local id, kind = ARGV[1], ARGV[7]
local held = held_kind(KEYS[1], KEYS[6], now)
local holder = 'holder:' .. id
if held == kind and redis.call('hexists', KEYS[1], holder) == 1 then
  local request = 'request:' .. ARGV[3]
  if redis.call('hget', KEYS[1], request) ~= id then
    redis.call('hincrby', KEYS[1], 'count:' .. id, 1)
    redis.call('hset', KEYS[1], request, id)
    lengthen(KEYS[1], KEYS[6], id, now + ttl)
    leave_queue(KEYS[4], KEYS[5], ARGV[4])
    keep_fence(KEYS[2], ARGV[10])
  end
  return {1, redis.call('hget', KEYS[1], holder)}
end
local head, dropped = queue_head(KEYS[4], KEYS[5], now)
local admitted = not held
if held == kind then
  admitted = kind == 'shared' or admits_permit(KEYS[1], KEYS[6], tonumber(ARGV[8]))
end
if admitted and (not head or head == ARGV[4]) then
  if not held then
    redis.call('del', KEYS[6])
  end
  local token = string.format('%d', next_token(KEYS[2], ARGV[10]))
  redis.call('hset', KEYS[1], 'kind', kind, 'token', token, holder, token, 'count:' .. id, 1,
    'request:' .. ARGV[3], id)
  if kind == 'permit' then
    redis.call('hset', KEYS[1], 'permits:' .. id, ARGV[8])
  end
  redis.call('zadd', KEYS[6], string.format('%d', now + ttl), id)
  settle(KEYS[1], KEYS[6])
  if head then
    leave_queue(KEYS[4], KEYS[5], ARGV[4])
    wake_head(KEYS[4], KEYS[5], ARGV[6])
  end
  return {1, token}
end
local placed = 0
if redis.call('hexists', KEYS[5], ARGV[4]) == 1 or ARGV[5] == '2'
    or (ARGV[5] == '1' and (head or (kind == 'permit' and not admitted))) then
  take_place(KEYS[4], KEYS[5], ARGV[4], now, tonumber(ARGV[9]))
  placed = 1
end
local wait = -1
if not admitted then
  if held == kind then
    local first = redis.call('zrange', KEYS[6], 0, 0, 'withscores')
    wait = math.max(tonumber(first[2]) - now, 0)
  else
    wait = redis.call('pttl', KEYS[1])
  end
end
if head and head ~= ARGV[4] then
  local lapses = tonumber(redis.call('hget', KEYS[5], head)) - now
  if wait < 0 or lapses < wait then
    wait = lapses
  end
end
if not held and dropped and head then
  wake(ARGV[6], head)
end
return {0, wait, placed}
"#;

/// Keeps a reader's share or a permit (this grant of it, with this token) for at least
/// the ttl from now.
///
/// The fence counter is kept for the keep time, as by the exclusive renewal.
///
/// KEYS: hold, leases, fence counter. ARGV: hold id, token, ttl in ms, request id, kind,
/// keep time in ms.
/// Returns 1 when renewed, 0 when the hold (or this grant of it) is gone and nothing
/// it would exclude holds (it expired, or was released), -1 when a hold of another kind
/// is there (it was taken).
const RENEW_SHARED: &str = r#"
local now = now_ms()
local held = held_kind(KEYS[1], KEYS[2], now)
if held == ARGV[5] and redis.call('hget', KEYS[1], 'holder:' .. ARGV[1]) == ARGV[2] then
  if redis.call('hget', KEYS[1], 'request:' .. ARGV[4]) ~= ARGV[1] then
    return 0
  end
  lengthen(KEYS[1], KEYS[2], ARGV[1], now + tonumber(ARGV[3]))
  keep_fence(KEYS[3], ARGV[6])
  return 1
end
if held and held ~= ARGV[5] then
  return -1
end
return 0
"#;

/// Releases one grant of a reader's share or a permit (with this token); the owner's
/// last one ends the hold. An ended permit, or the end of the last hold, publishes the
/// token as the exclusive release does (to the head of the queue, else on the lock's
/// channel): a permit handed back may admit a waiter, while a reader leaving others
/// behind admits nobody new. Idempotent per grant.
///
/// The fence counter is kept for the keep time, as by the exclusive release.
///
/// KEYS: hold, queue, places, leases, fence counter. ARGV: hold id, token, channel,
/// request id, wake-up channel prefix, keep time in ms.
/// Returns what the exclusive release returns.
const RELEASE_SHARED: &str = r#"
local held = held_kind(KEYS[1], KEYS[4], now_ms())
if not held or held == 'exclusive' or redis.call('hget', KEYS[1], 'holder:' .. ARGV[1]) ~= ARGV[2] then
  return 0
end
if redis.call('hget', KEYS[1], 'request:' .. ARGV[4]) ~= ARGV[1] then
  return 2
end
keep_fence(KEYS[5], ARGV[6])
if take_back(KEYS[1], KEYS[4], ARGV[1], ARGV[4]) then
  hand_on(KEYS[1], KEYS[2], KEYS[3], ARGV[5], ARGV[3], ARGV[2], held)
end
return 1
"#;

/// Gives back whatever reader's share or permit one request may have made (its reply
/// was lost), gives up the request's place, and marks the request given back, as the
/// exclusive give-back does for its grants. Waiters are woken as a release and an
/// abandon wake them.
///
/// KEYS: hold, void marker, queue, places, leases. ARGV: hold id, request id, channel,
/// marker ttl in ms, place id, wake-up channel prefix.
/// Returns 1 when a grant was given back, 0 when there was none.
const GIVE_BACK_SHARED: &str = r#"
local was_head = redis.call('lindex', KEYS[3], 0) == ARGV[5]
leave_queue(KEYS[3], KEYS[4], ARGV[5])
local held = held_kind(KEYS[1], KEYS[5], now_ms())
local given = 0
if held and held ~= 'exclusive' and redis.call('hget', KEYS[1], 'request:' .. ARGV[2]) == ARGV[1] then
  given = 1
  local token = redis.call('hget', KEYS[1], 'holder:' .. ARGV[1])
  if take_back(KEYS[1], KEYS[5], ARGV[1], ARGV[2])
      and hand_on(KEYS[1], KEYS[3], KEYS[4], ARGV[6], ARGV[3], token, held) then
    was_head = false
  end
end
if was_head and (redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], 'kind') == 1) then
  wake_head(KEYS[3], KEYS[4], ARGV[6])
end
redis.pcall('set', KEYS[2], 1, 'px', ARGV[4])
return given
"#;

/// What one RedLock node reports as its fence counter, put in front of the scripts that
/// report it.
///
/// The counter lasts the keep time from the name's last grant, renewal or release on
/// the node, as on a single server. A node without one grants only proposals above its
/// clock in microseconds, which is above every token it accepted before its counter went
/// as long as its clock never steps back by the keep time and no proposal ran ahead of
/// its clock by as much (proposals follow the clients' and masters' clocks plus a lead
/// of at most half the keep time). It reports its clock plus `lead` (µs) as its counter:
/// a proposal above that reaches the node before its clock does, when it comes within
/// the lead, so a proposer that learnt the clock from a refusal or a read is not refused
/// again because the clock moved on meanwhile.
const REPORTED_FENCE_LIB: &str = r#"
local function clock_us(lead)
  local t = redis.call('time')
  return string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2]) + lead)
end
local function reported_fence(counter, lead)
  return counter or clock_us(tonumber(lead))
end
"#;

/// One RedLock node's part of a grant with a token proposed by the client: granted only
/// if the hold is free here and the proposal is above this node's fence counter (or,
/// without a counter, its clock in microseconds), which then rises to it and lasts the
/// keep time. An owner that holds the lock here already re-enters its hold. As with the
/// single server's acquire, the grant is recorded under the request's own field
/// (idempotent per request, and given back by it), and a request given back is refused.
///
/// Tokens travel and are stored as decimal strings, compared by length then text, so
/// that no value loses precision in Lua's doubles.
///
/// KEYS: hold, fence counter, void marker. ARGV: owner field, proposed token, ttl in ms,
/// grant field, keep time in ms, lead in µs (see the reported fence functions).
/// Returns `{status, value, fence[, holder's token]}`: `{1, token}` granted with the
/// proposal, `{2, token}` re-entered (count + 1, the hold's own token, or a grant this
/// request made in an earlier round), `{0, pttl, fence, token}` held by another owner
/// (with that hold's token, so that the client can tell one holder with a quorum from a
/// split vote), `{-1, fence}` the proposal is not above the counter; `fence` is the
/// counter after the call, or the clock plus the lead where there is none.
const GRANT: &str = r#"
local counter = redis.call('get', KEYS[2])
local fence = reported_fence(counter, ARGV[6])
if redis.call('exists', KEYS[3]) == 1 then
  return {0, redis.call('pttl', KEYS[1]), fence, redis.call('hget', KEYS[1], 'token') or '0'}
end
if redis.call('hexists', KEYS[1], ARGV[4]) == 1 then
  local token = redis.call('hget', KEYS[1], 'token')
  if token == ARGV[2] then
    return {1, token, fence}
  end
  return {2, token, fence}
end
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[1], 1)
  redis.call('hset', KEYS[1], ARGV[4], 1)
  local ttl = tonumber(ARGV[3])
  if redis.call('pttl', KEYS[1]) < ttl then
    redis.call('pexpire', KEYS[1], ttl)
  end
  redis.call('pexpire', KEYS[2], ARGV[5])
  return {2, redis.call('hget', KEYS[1], 'token'), fence}
end
if redis.call('exists', KEYS[1]) == 1 then
  return {0, redis.call('pttl', KEYS[1]), fence, redis.call('hget', KEYS[1], 'token') or '0'}
end
if not above(ARGV[2], counter or clock_us(0)) then
  return {-1, fence, fence}
end
redis.call('set', KEYS[2], ARGV[2], 'px', ARGV[5])
redis.call('hset', KEYS[1], ARGV[1], 1, 'token', ARGV[2], ARGV[4], 1)
redis.call('pexpire', KEYS[1], ARGV[3])
return {1, ARGV[2], ARGV[2]}
"#;

/// One RedLock node's fence counter, for the read phase of a proposal: the counter, or
/// the clock plus the lead where there is none (see the reported fence functions).
///
/// KEYS: fence counter. ARGV: lead in µs. Returns the counter as a decimal string.
const READ_FENCE: &str = r#"
return reported_fence(redis.call('get', KEYS[1]), ARGV[1])
"#;

/// Reads the hold in one consistent view.
///
/// KEYS: hold. Returns `{}` when free, else `{owner, count, token, pttl}` (the token as
/// stored, a decimal string).
const INSPECT: &str = r#"
local owner, count, token = read_hold(KEYS[1])
if not owner then
  return {}
end
return {owner, count, token, redis.call('pttl', KEYS[1])}
"#;

/// Reads the hold and the number of live places in the queue in one consistent view.
/// Of readers or permits, the holder reported is the newest live hold (the highest
/// token), with its own grant count and remaining lease, named by its owner id (a
/// permit's hold id without its number of permits).
///
/// KEYS: hold, places, leases. Returns `{waiters}` when free, else
/// `{waiters, owner, count, token, pttl}`.
const INSPECT_QUEUE: &str = r#"
local now = now_ms()
local waiters = 0
local places = redis.call('hvals', KEYS[2])
for i = 1, #places do
  if tonumber(places[i]) > now then
    waiters = waiters + 1
  end
end
if redis.call('hexists', KEYS[1], 'kind') == 1 then
  local fields = redis.call('hgetall', KEYS[1])
  local newest, token, lapse = false, '0', 0
  for i = 1, #fields, 2 do
    if string.sub(fields[i], 1, 7) == 'holder:' then
      local id = string.sub(fields[i], 8)
      local score = redis.call('zscore', KEYS[3], id)
      if score and tonumber(score) > now and (not newest or above(fields[i + 1], token)) then
        newest, token, lapse = id, fields[i + 1], tonumber(score)
      end
    end
  end
  if not newest then
    return {waiters}
  end
  local count = tonumber(redis.call('hget', KEYS[1], 'count:' .. newest) or '0')
  local owner = newest
  local cut = string.find(newest, '\0', 1, true)
  if cut then
    owner = string.sub(newest, 1, cut - 1)
  end
  return {waiters, owner, count, token, lapse - now}
end
local owner, count, token = read_hold(KEYS[1])
if not owner then
  return {waiters}
end
return {waiters, owner, count, token, redis.call('pttl', KEYS[1])}
"#;

/// The scripts, hashed once per process.
pub struct Scripts {
    /// See the acquire script.
    pub acquire: Script,
    /// See the renew script.
    pub renew: Script,
    /// See the release script.
    pub release: Script,
    /// See the give-back script.
    pub give_back: Script,
    /// See the inspect script.
    pub inspect: Script,
    /// See the abandon script.
    pub abandon: Script,
    /// See the inspect script that counts the queue too.
    pub inspect_queue: Script,
    /// See the grant script (one RedLock node's part of a grant).
    pub grant: Script,
    /// See the script that reads one RedLock node's fence counter.
    pub read_fence: Script,
    /// See the acquire script of readers and permits.
    pub acquire_shared: Script,
    /// See the renew script of readers and permits.
    pub renew_shared: Script,
    /// See the release script of readers and permits.
    pub release_shared: Script,
    /// See the give-back script of readers and permits.
    pub give_back_shared: Script,
}

impl std::fmt::Debug for Scripts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scripts").finish_non_exhaustive()
    }
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| {
    let queued = |body: &str| Script::new(&format!("{QUEUE_LIB}{body}"));
    let fenced = |body: &str| Script::new(&format!("{FENCE_LIB}{QUEUE_LIB}{body}"));
    let leased = |body: &str| Script::new(&format!("{FENCE_LIB}{QUEUE_LIB}{LEASES_LIB}{body}"));
    Scripts {
        acquire: fenced(ACQUIRE),
        renew: Script::new(&format!("{FENCE_LIB}{RENEW}")),
        release: fenced(RELEASE),
        give_back: queued(GIVE_BACK),
        inspect: Script::new(&format!("{HOLD_LIB}{INSPECT}")),
        abandon: queued(ABANDON),
        inspect_queue: Script::new(&format!("{ABOVE_LIB}{QUEUE_LIB}{HOLD_LIB}{INSPECT_QUEUE}")),
        grant: Script::new(&format!("{ABOVE_LIB}{REPORTED_FENCE_LIB}{GRANT}")),
        read_fence: Script::new(&format!("{REPORTED_FENCE_LIB}{READ_FENCE}")),
        acquire_shared: leased(ACQUIRE_SHARED),
        renew_shared: leased(RENEW_SHARED),
        release_shared: leased(RELEASE_SHARED),
        give_back_shared: leased(GIVE_BACK_SHARED),
    }
});

/// The scripts of this crate.
pub fn scripts() -> &'static Scripts {
    &SCRIPTS
}

impl Scripts {
    /// Every script, for loading them up front.
    pub fn all(&self) -> [&Script; 13] {
        [
            &self.acquire,
            &self.renew,
            &self.release,
            &self.give_back,
            &self.inspect,
            &self.abandon,
            &self.inspect_queue,
            &self.grant,
            &self.read_fence,
            &self.acquire_shared,
            &self.renew_shared,
            &self.release_shared,
            &self.give_back_shared,
        ]
    }

    /// `SCRIPT LOAD`s every script, the [result scripts](crate::results) too (on every
    /// node of a Cluster), so that the first call of each is a plain `EVALSHA`.
    pub async fn load_all<C: ConnectionLike + Send>(&self, conn: &mut C) -> RedisResult<()> {
        for script in self.all().into_iter().chain(crate::results::scripts().all()) {
            script.load_async(conn).await?;
        }
        Ok(())
    }
}

/// One `EVALSHA` of a script with its keys and arguments, built once and sent as often
/// as needed.
pub struct Invocation {
    script: &'static Script,
    cmd: Cmd,
}

impl std::fmt::Debug for Invocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Invocation").finish_non_exhaustive()
    }
}

impl Invocation {
    /// `EVALSHA <sha> <number of keys> <keys...>`; add the arguments with [`arg`](Self::arg).
    pub fn new(script: &'static Script, keys: &[&str]) -> Self {
        let mut cmd = cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(keys.len()).arg(keys);
        Invocation { script, cmd }
    }

    /// Adds an argument.
    pub fn arg(mut self, arg: impl ToRedisArgs) -> Self {
        self.cmd.arg(arg);
        self
    }

    /// Sends the call, loading the script again if the server lost it, and once more on
    /// a fresh connection if the connection broke under it. Every script of this crate
    /// is idempotent per request (each grant is recorded under its request), so a call the broken
    /// connection did deliver changes nothing the second time.
    pub async fn run<C: ConnectionLike + Send>(&self, conn: &mut C) -> RedisResult<Value> {
        self.run_again_if_broken(conn).await.map(|(reply, _)| reply)
    }

    /// As [`run`](Self::run), also telling whether the call was sent twice (so that its
    /// first delivery may have been applied, and the reply is to the second).
    pub async fn run_again_if_broken<C: ConnectionLike + Send>(&self, conn: &mut C) -> RedisResult<(Value, bool)> {
        match self.run_once(conn).await {
            Err(err) if connection_broke(&err) => {
                tracing::debug!(%err, "the connection broke under a script call; sending it again");
                self.run_once(conn).await.map(|reply| (reply, true))
            }
            other => other.map(|reply| (reply, false)),
        }
    }

    async fn run_once<C: ConnectionLike + Send>(&self, conn: &mut C) -> RedisResult<Value> {
        match self.cmd.query_async(conn).await {
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.load_async(conn).await?;
                self.cmd.query_async(conn).await
            }
            other => other,
        }
    }
}

/// Waits until `ack.replicas` replicas have every write this connection made so far (the
/// grant or renewal just sent on it), or `ack.timeout`; returns how many acknowledged.
///
/// `WAIT` blocks the connection it is sent on, so it goes on a connection of its own
/// (never the one every lease shares), and only after a write worth acknowledging. It is
/// pipelined behind a read of the hold's key, which routes it, on a Cluster, to the node
/// (and the connection) that took the write.
pub async fn wait_replicas<C: ConnectionLike + Send>(conn: &mut C, hold: &str, ack: ReplicaAck) -> RedisResult<u32> {
    let mut pipe = redis::pipe();
    pipe.cmd("PTTL").arg(hold).ignore().cmd("WAIT").arg(ack.replicas).arg(wait_millis(ack.timeout));
    let (acked,): (u32,) = pipe.query_async(conn).await?;
    Ok(acked)
}

/// Whether the connection broke (reset, closed, refused) rather than the server
/// answering or the time running out: a reconnecting connection can send again.
fn connection_broke(err: &redis::RedisError) -> bool {
    !err.is_timeout() && (err.is_connection_dropped() || err.is_connection_refusal() || err.is_io_error())
}

/// `WAIT`'s timeout in ms, never 0 (which would wait forever).
fn wait_millis(timeout: Duration) -> u64 {
    u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// A ttl in whole milliseconds, rounded up: the server must keep a hold at least as long
/// as the client counts on it.
pub fn ttl_millis(ttl: Duration) -> u64 {
    let nanos = ttl.as_nanos();
    u64::try_from(nanos.div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

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
    use crate::keys::{
        COUNT_FIELD_PREFIX, HOLDER_FIELD_PREFIX, HOLD_ID_SEPARATOR, KIND_FIELD, OWNER_FIELD_PREFIX,
        PERMITS_FIELD_PREFIX, REQUEST_FIELD_PREFIX, TOKEN_FIELD,
    };

    #[test]
    fn ttls_round_up_to_whole_milliseconds() {
        assert_eq!(ttl_millis(Duration::from_millis(10)), 10);
        assert_eq!(ttl_millis(Duration::from_micros(10_001)), 11);
        assert_eq!(ttl_millis(Duration::from_nanos(1)), 1);
        assert_eq!(wait_millis(Duration::from_micros(10)), 1);
    }

    #[test]
    fn scripts_use_the_documented_field_names() {
        for script in [ACQUIRE, RENEW, RELEASE, GIVE_BACK, HOLD_LIB, GRANT] {
            assert!(script.contains(&format!("'{TOKEN_FIELD}'")));
        }
        assert!(HOLD_LIB.contains(&format!("'{OWNER_FIELD_PREFIX}'")));
        assert!(HOLD_LIB.contains(&format!("string.sub(field, {})", OWNER_FIELD_PREFIX.len() + 1)));
    }

    #[test]
    fn lease_scripts_use_the_documented_field_names() {
        for prefix in [HOLDER_FIELD_PREFIX, COUNT_FIELD_PREFIX, PERMITS_FIELD_PREFIX, REQUEST_FIELD_PREFIX] {
            assert!(LEASES_LIB.contains(&format!("'{prefix}'")), "{prefix}");
        }
        assert!(ACQUIRE_SHARED.contains(&format!("'{PERMITS_FIELD_PREFIX}'")));
        // Lua's `\0` is the separator of a permit's hold id, where inspect cuts the owner.
        assert_eq!(HOLD_ID_SEPARATOR, '\0');
        assert!(INSPECT_QUEUE.contains(r"string.find(newest, '\0', 1, true)"));
        let request = REQUEST_FIELD_PREFIX.len();
        assert!(LEASES_LIB.contains(&format!("string.sub(fields[i], 1, {request}) == '{REQUEST_FIELD_PREFIX}'")));
        let holder = HOLDER_FIELD_PREFIX.len();
        assert!(INSPECT_QUEUE.contains(&format!("string.sub(fields[i], 1, {holder}) == '{HOLDER_FIELD_PREFIX}'")));
        assert!(INSPECT_QUEUE.contains(&format!("string.sub(fields[i], {})", holder + 1)));
        for script in [LEASES_LIB, ACQUIRE, GIVE_BACK, ABANDON, INSPECT_QUEUE] {
            assert!(script.contains(&format!("'{KIND_FIELD}'")));
        }
    }

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
