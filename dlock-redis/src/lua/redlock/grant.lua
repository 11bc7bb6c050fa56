-- One RedLock node's part of a grant with a token proposed by the client. Runs behind
-- lib/above.lua, lib/reported_fence.lua, lib/clock.lua and lib/lengthen.lua.
--
-- KEYS: [1] hold, [2] fence counter, [3] void marker.
-- ARGV: [1] owner field, [2] proposed token, [3] ttl in ms, [4] grant field, [5] keep
--   time in ms, [6] lead in µs (see lib/reported_fence.lua).
-- Returns: {status, value, fence[, holder's token]}: {1, token, fence} granted with the
--   proposal; {2, token, fence} re-entered (count + 1, the hold's own token, or a grant
--   this request made in an earlier round); {0, pttl, fence, token} held by another owner
--   (with that hold's token, so that the client can tell one holder with a quorum from a
--   split vote); {-1, fence, fence} the proposal is not above the counter. fence is the
--   counter after the call, or the clock plus the lead where there is none.
-- Invariant: the node's fence counter only rises, and a new grant's token is above it
--   (or, without a counter, above the node's clock in µs), so the tokens a node grants
--   strictly increase (given the clock conditions of lib/reported_fence.lua); one owner
--   holds the node's hold; a request is granted at most once, and never after it was
--   given back (while its void marker lasts).
--
-- Granted only if the hold is free here and the proposal is above this node's fence
-- counter (or, without a counter, its clock in microseconds), which then rises to it and
-- lasts the keep time. An owner that holds the lock here already re-enters its hold. As
-- with the single server's acquire.lua, the grant is recorded under the request's own
-- field (idempotent per request, and given back by it), and a request given back is
-- refused.
--
-- Tokens travel and are stored as decimal strings, compared by length then text
-- (lib/above.lua), so that no value loses precision in Lua's doubles.

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
  lengthen(KEYS[1], tonumber(ARGV[3]), ARGV[4])
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
