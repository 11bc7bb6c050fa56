-- Read the stored result.
--
-- KEYS: [1] result.
-- ARGV: none.
-- Returns: {} when there is none, else {token, value, call} as stored (a missing field
--   comes back as nil, which the client reports as a corrupt record).
-- Invariant: reads only; it writes no key.

if redis.call('exists', KEYS[1]) == 0 then
  return {}
end
return redis.call('hmget', KEYS[1], 'token', 'value', 'call')
