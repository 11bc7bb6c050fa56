-- One RedLock node's fence counter, for the read phase of a proposal. Runs behind
-- lib/reported_fence.lua.
--
-- KEYS: [1] fence counter.
-- ARGV: [1] lead in µs.
-- Returns: the counter as a decimal string, or the clock plus the lead where there is
--   none.
-- Invariant: reads only; it writes no key.

return reported_fence(redis.call('get', KEYS[1]), ARGV[1])
