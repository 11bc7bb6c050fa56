-- Read the hold and the number of live places in the queue in one consistent view. Runs
-- behind lib/above.lua, lib/queue.lua and lib/hold.lua.
--
-- KEYS: [1] hold, [2] places, [3] leases.
-- ARGV: none.
-- Returns: {waiters} when free, else {waiters, owner, count, token, pttl}.
-- Invariant: reads only; it writes no key (lapsed places and leases are skipped, not
--   dropped).
--
-- Of readers or permits, the holder reported is the newest live hold (the highest
-- token), with its own grant count and remaining lease, named by its owner id (a
-- permit's hold id without its number of permits).

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
