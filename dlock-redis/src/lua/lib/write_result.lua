-- Library: writes a result record. Put in front of both store scripts, after their hold
-- checks differ, and behind lib/above.lua.
--
-- KEYS: none (write_result is given the result key).
-- ARGV: none (the token, value, call id and retention in ms are passed to it).
-- Returns: nothing; defines write_result(key, token, value, call, retention), which
--   answers 1 when written and -1 when a record of this token or a higher one is kept.
-- Invariant: a record's token never goes down; a written record lasts the retention.

local function write_result(key, token, value, call, retention)
  local stored = redis.call('hget', key, 'token')
  if stored and not above(token, stored) then
    return -1
  end
  redis.call('hset', key, 'token', token, 'value', value, 'call', call)
  redis.call('pexpire', key, retention)
  return 1
end
