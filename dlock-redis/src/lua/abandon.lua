-- Give up a waiter's place in the queue. Runs behind lib/publish.lua (or
-- lib/spublish.lua) and lib/queue.lua.
--
-- KEYS: [1] hold, [2] queue, [3] places.
-- ARGV: [1] place id, [2] wake-up channel prefix.
-- Returns: 1 when the place was there, 0 when not.
-- Invariant: only this place is removed; when it was the head and the lock is free or
--   held by readers or permits, the new head is woken (it would otherwise wait for the
--   old head's place to lapse, though it may be granted now).

local was_head = redis.call('lindex', KEYS[2], 0) == ARGV[1]
if not leave_queue(KEYS[2], KEYS[3], ARGV[1]) then
  return 0
end
if was_head and (redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], 'kind') == 1) then
  wake_head(KEYS[2], KEYS[3], ARGV[2])
end
return 1
