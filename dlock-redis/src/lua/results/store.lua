-- Store a result if the hold is this grant's and no result of this token or a later one
-- is there; a second delivery of the same call answers as the first did. Runs behind
-- lib/above.lua and lib/write_result.lua.
--
-- KEYS: [1] hold, [2] result.
-- ARGV: [1] owner field, [2] token, [3] grant field, [4] call id, [5] value,
--   [6] retention in ms.
-- Returns: 1 when stored, 2 when this call stored it already, 0 when the hold is not this
--   grant's, -1 when a result of this token or a later one is stored.
-- Invariant: a result is written only under this grant's hold, and a stored result's
--   token never goes down.
--
-- The hold check is release.lua's: the hold hash names this token and this owner, and
-- still has this grant's field (a grant released or given back, or a hold expired,
-- evicted or taken by another, does not store). Tokens are compared as decimal strings
-- (length, then text), as redlock/grant.lua does, so that no value loses precision in
-- Lua's doubles.

if redis.call('hget', KEYS[2], 'call') == ARGV[4] then
  return 2
end
if redis.call('hget', KEYS[1], 'token') ~= ARGV[2] or redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
  return 0
end
if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then
  return 0
end
return write_result(KEYS[2], ARGV[2], ARGV[5], ARGV[4], ARGV[6])
