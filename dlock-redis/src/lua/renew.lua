-- Renew one grant of an exclusive hold (with this token): keeps the hold for at least the
-- ttl from now, and the fence counter for the keep time. Runs behind lib/fence.lua,
-- lib/clock.lua and lib/lengthen.lua.
--
-- KEYS: [1] hold, [2] fence counter.
-- ARGV: [1] owner field, [2] token, [3] ttl in ms, [4] grant field, [5] keep time in ms.
-- Returns: 1 when renewed, 0 when the hold (or this grant of it) is gone, -1 when another
--   hold is there.
-- Invariant: a hold is lengthened only while this token, this owner and this grant are
--   all in it, and never shortened; no hold is created.

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
lengthen(KEYS[1], tonumber(ARGV[3]), false)
keep_fence(KEYS[2], ARGV[5])
return 1
