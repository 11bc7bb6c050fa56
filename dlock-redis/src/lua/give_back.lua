-- Give back whatever grant one request may have made (its reply was lost), whichever
-- token it has, give up the request's place in the queue, and mark the request given
-- back. Runs behind lib/publish.lua (or lib/spublish.lua), lib/clock.lua, lib/queue.lua
-- and lib/lengthen.lua.
--
-- KEYS: [1] hold, [2] void marker, [3] queue, [4] places.
-- ARGV: [1] owner field, [2] grant field, [3] channel, [4] marker ttl in ms, [5] place
--   id, [6] wake-up channel prefix.
-- Returns: 1 when a grant was given back, 0 when there was none.
-- Invariant: another holder, and the owner's other grants, are never touched (the hold's
--   expiry goes back only to one they were all given, see lib/lengthen.lua); a late
--   delivery of the request grants nothing while its void marker lasts.
--
-- When this frees the lock, or removes the head of the queue of a lock that is free or
-- held by readers or permits (whom the next waiter may join), the (new) head is woken.

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
    undo_lengthening(KEYS[1], ARGV[2])
  end
end
local was_head = redis.call('lindex', KEYS[3], 0) == ARGV[5]
leave_queue(KEYS[3], KEYS[4], ARGV[5])
if token or (was_head and (redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], 'kind') == 1)) then
  if not wake_head(KEYS[3], KEYS[4], ARGV[6]) and token then
    publish(ARGV[3], token)
  end
end
redis.pcall('set', KEYS[2], 1, 'px', ARGV[4])
return given
