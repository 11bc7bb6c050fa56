-- Library: the server's clock, put in front of the scripts that read it.
--
-- KEYS: none.
-- ARGV: none.
-- Returns: nothing; defines now_ms(), the server's clock in unix milliseconds (the clock
--   its key expiries follow).
-- Invariant: reads only; it writes no key.

local function now_ms()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
