-- Release one grant of a reader's share or a permit (with this token); the owner's last
-- one ends the hold. Runs behind lib/publish.lua (or lib/spublish.lua), lib/fence.lua,
-- lib/queue.lua and lib/leases.lua.
--
-- KEYS: [1] hold, [2] queue, [3] places, [4] leases, [5] fence counter.
-- ARGV: [1] hold id, [2] token, [3] channel, [4] request id, [5] wake-up channel prefix,
--   [6] keep time in ms.
-- Returns: what release.lua returns (1, 2 or 0; never a hand-over).
-- Invariant: only this grant of this hold is released, and once; a waiter is woken (or
--   the token published) only when the hold's end may admit one.
--
-- An ended permit, or the end of the last hold, publishes the token as release.lua does
-- (to the head of the queue, else on the lock's channel): a permit handed back may admit
-- a waiter, while a reader leaving others behind admits nobody new. The fence counter is
-- kept for the keep time, as by release.lua.

local held = held_kind(KEYS[1], KEYS[4], now_ms())
if not held or held == 'exclusive' or redis.call('hget', KEYS[1], 'holder:' .. ARGV[1]) ~= ARGV[2] then
  return 0
end
if redis.call('hget', KEYS[1], 'request:' .. ARGV[4]) ~= ARGV[1] then
  return 2
end
keep_fence(KEYS[5], ARGV[6])
if take_back(KEYS[1], KEYS[4], ARGV[1], ARGV[4]) then
  hand_on(KEYS[1], KEYS[2], KEYS[3], ARGV[5], ARGV[3], ARGV[2], held)
end
return 1
