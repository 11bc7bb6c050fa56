-- Store a result as results/store.lua does, for a reader's share or a permit. Runs behind
-- lib/above.lua and lib/write_result.lua.
--
-- KEYS: [1] hold, [2] result, [3] leases.
-- ARGV: [1] hold id, [2] token, [3] request id, [4] call id, [5] value, [6] retention in
--   ms.
-- Returns: what results/store.lua returns.
-- Invariant: a result is written only under this grant's live hold, and a stored
--   result's token never goes down.
--
-- The hold check is release_shared.lua's: the owner's hold has this token, its lease has
-- not lapsed, whether or not a script dropped it yet, and this grant is still there.

if redis.call('hget', KEYS[2], 'call') == ARGV[4] then
  return 2
end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lapse = redis.call('zscore', KEYS[3], ARGV[1])
if not lapse or tonumber(lapse) <= now or redis.call('hget', KEYS[1], 'holder:' .. ARGV[1]) ~= ARGV[2] then
  return 0
end
if redis.call('hget', KEYS[1], 'request:' .. ARGV[3]) ~= ARGV[1] then
  return 0
end
return write_result(KEYS[2], ARGV[2], ARGV[5], ARGV[4], ARGV[6])
