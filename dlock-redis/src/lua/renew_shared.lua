-- Renew a reader's share or a permit (this grant of it, with this token): keeps it for at
-- least the ttl from now, and the fence counter for the keep time, as renew.lua does.
-- Runs behind lib/publish.lua (or lib/spublish.lua), lib/fence.lua, lib/queue.lua and
-- lib/leases.lua.
--
-- KEYS: [1] hold, [2] leases, [3] fence counter.
-- ARGV: [1] hold id, [2] token, [3] ttl in ms, [4] request id, [5] kind, [6] keep time in
--   ms.
-- Returns: 1 when renewed; 0 when the hold (or this grant of it) is gone and nothing it
--   would exclude holds (it expired, or was released); -1 when a hold of another kind is
--   there (it was taken).
-- Invariant: a lease is lengthened only while this hold, with this token and this grant,
--   is there, and never shortened; no hold is created.

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
