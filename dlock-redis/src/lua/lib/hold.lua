-- Library: reads an exclusive hold from its hash. Put in front of the inspect scripts.
--
-- KEYS: none (read_hold is given the hold key).
-- ARGV: none.
-- Returns: nothing; defines read_hold(key), which returns the owner id (the `owner:` field
--   without its prefix), its re-entrant count and the token as stored (a decimal string);
--   the owner is false, the count 0 and the token '0' when the lock is free.
-- Invariant: reads only; it writes no key.

local function read_hold(key)
  local fields = redis.call('hgetall', key)
  local owner, count, token = false, 0, '0'
  for i = 1, #fields, 2 do
    local field = fields[i]
    if field == 'token' then
      token = fields[i + 1]
    elseif string.sub(field, 1, 6) == 'owner:' then
      owner = string.sub(field, 7)
      count = tonumber(fields[i + 1])
    end
  end
  return owner, count, token
end
