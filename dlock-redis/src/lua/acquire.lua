-- Acquire an exclusive hold: grants when the hold is free or already the owner's and no
-- other waiter queues ahead, else reports how long to wait, taking or keeping a place in
-- the queue. Runs behind lib/publish.lua (or lib/spublish.lua), lib/fence.lua,
-- lib/clock.lua, lib/queue.lua and lib/lengthen.lua.
--
-- KEYS: [1] hold, [2] fence counter, [3] void marker, [4] queue, [5] places.
-- ARGV: [1] owner field, [2] ttl in ms, [3] grant field, [4] place id, [5] place mode,
--   [6] wake-up channel prefix, [7] place lapse in ms, [8] keep time in ms.
-- Returns: {1, token} when granted; {0, wait, placed} when busy (or given back already):
--   wait is the hold's pttl, or the time until another waiter's place at the head lapses
--   if that comes first (a dead head is then skipped without waiting for the holder);
--   placed is 1 when the request has a place in the queue.
-- Invariant: one owner holds the lock; while the queue has a live place only its head is
--   granted a free lock; a request is granted at most once, and never after it was given
--   back (while its void marker lasts); every grant to a new owner takes the next token
--   of the fence counter.
--
-- Each grant is recorded under its own field (`grant:<request id>`), so that the call is
-- idempotent (a second delivery of one request, by a retry or a client library that
-- re-sends, answers the grant already made and counts nothing twice) and so that the
-- request's grant, and only it, can be given back when its reply was lost. A request
-- given back leaves a marker key (the void marker) that refuses a late delivery of it.
--
-- While the queue has a live place, only its head is granted a free lock, whatever order
-- the request asked for: a non-fair request cannot overtake queued fair ones. The place
-- mode says when a busy request takes a place: `0` never (a try), `1` only when a queue
-- exists already or readers or permits hold the lock (a blocking non-fair request:
-- queued, it keeps later readers out, so that a stream of them cannot starve it), `2`
-- always (a blocking fair one). A request that has a place keeps it, refreshed to lapse
-- its place lapse from now. When dropping lapsed places leaves a free lock with a new
-- head, that head is woken.
--
-- A request granted already (by an earlier delivery of it, or by a release that handed
-- the lock to its place) answers that grant, kept for at least the ttl from now: the
-- client counts the lease from when it sent this request, which may be after the grant.
--
-- Every grant keeps the fence counter for the keep time (see lib/fence.lua).

if redis.call('exists', KEYS[3]) == 1 then
  return {0, redis.call('pttl', KEYS[1]), 0}
end
local ttl = tonumber(ARGV[2])
if redis.call('hexists', KEYS[1], ARGV[3]) == 1 then
  lengthen(KEYS[1], ttl, ARGV[3])
  return {1, redis.call('hget', KEYS[1], 'token')}
end
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[1], 1)
  redis.call('hset', KEYS[1], ARGV[3], 1)
  lengthen(KEYS[1], ttl, ARGV[3])
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
