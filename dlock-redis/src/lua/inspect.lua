-- Read an exclusive hold in one consistent view. Runs behind lib/hold.lua.
--
-- KEYS: [1] hold.
-- ARGV: none.
-- Returns: {} when free, else {owner, count, token, pttl} (the token as stored, a decimal
--   string).
-- Invariant: reads only; it writes no key.

local owner, count, token = read_hold(KEYS[1])
if not owner then
  return {}
end
return {owner, count, token, redis.call('pttl', KEYS[1])}
