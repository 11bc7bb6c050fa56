-- Give back whatever reader's share or permit one request may have made (its reply was
-- lost), give up the request's place, and mark the request given back, as give_back.lua
-- does for exclusive grants. Runs behind lib/publish.lua (or lib/spublish.lua),
-- lib/fence.lua, lib/queue.lua and lib/leases.lua.
--
-- KEYS: [1] hold, [2] void marker, [3] queue, [4] places, [5] leases.
-- ARGV: [1] hold id, [2] request id, [3] channel, [4] marker ttl in ms, [5] place id,
--   [6] wake-up channel prefix.
-- Returns: 1 when a grant was given back, 0 when there was none.
-- Invariant: another holder, and the owner's other grants, are never touched; a late
--   delivery of the request grants nothing while its void marker lasts.
--
-- Waiters are woken as release_shared.lua and abandon.lua wake them.

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
