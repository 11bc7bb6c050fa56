-- Library: what one RedLock node reports as its fence counter, put in front of the
-- scripts that report it.
--
-- KEYS: none (it touches no key).
-- ARGV: none (the lead in µs is passed to the functions).
-- Returns: nothing; defines clock_us(lead), the clock plus lead in µs as a decimal
--   string, and reported_fence(counter, lead), the counter, or the clock plus the lead
--   where there is none.
-- Invariant: reads only; a node that has a counter reports the counter itself.
--
-- The counter lasts the keep time from the name's last grant, renewal or release on the
-- node, as on a single server. A node without one grants only proposals above its clock
-- in microseconds, which is above every token it accepted before its counter went as long
-- as its clock never steps back by the keep time and no proposal ran ahead of its clock
-- by as much (proposals follow the clients' and masters' clocks plus a lead of at most
-- half the keep time). It reports its clock plus `lead` (µs) as its counter: a proposal
-- above that reaches the node before its clock does, when it comes within the lead, so a
-- proposer that learnt the clock from a refusal or a read is not refused again because
-- the clock moved on meanwhile.

local function clock_us(lead)
  local t = redis.call('time')
  return string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2]) + lead)
end
local function reported_fence(counter, lead)
  return counter or clock_us(tonumber(lead))
end
