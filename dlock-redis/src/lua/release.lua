-- Release one grant of an exclusive hold (with this token); the owner's last one frees
-- the lock and publishes the token: to the head of the queue alone when waiters queue,
-- else on the lock's channel. Runs behind lib/publish.lua (or lib/spublish.lua),
-- lib/fence.lua, lib/clock.lua, lib/queue.lua and lib/lengthen.lua.
--
-- KEYS: [1] hold, [2] queue, [3] places, [4] fence counter.
-- ARGV: [1] owner field, [2] token, [3] channel, [4] grant field, [5] wake-up channel
--   prefix, [6] keep time in ms, then four per waiter the releasing client names:
--   [7 + 4i] place id, [8 + 4i] owner field, [9 + 4i] grant field, [10 + 4i] ttl in ms
--   (i = 0, 1, ...).
-- Returns: 1 when released; {1, place id, token} when released and granted to the waiter
--   of that place; 2 when the hold is there but this grant was released already; 0 when
--   the hold is not ours.
-- Invariant: only this grant of this hold is released, and once (a second delivery finds
--   the grant gone and changes nothing); a lock freed while waiters queue is granted to,
--   or wakes, the head of the queue alone; the owner's other grants keep the expiry they
--   were given (a release undoes only its own grant's lengthening, see lib/lengthen.lua).
--
-- The releasing client may name waiters of its own that queue for the lock: when the head
-- of the queue is one of them, the lock is granted to it here, as its own acquire would
-- grant it at the head, and nobody is woken; the client hands the grant over without
-- another call. A waiter that gave up has no place (its give-back took it), so it is
-- never granted this way.
--
-- The last release deletes the hash first: DEL is allowed when the server is out of
-- memory (HINCRBY is not), so unlocking keeps working then.
--
-- A release keeps the fence counter for the keep time, and a grant it makes takes the
-- next token as an acquire does.

if redis.call('hget', KEYS[1], 'token') ~= ARGV[2] or redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
  return 0
end
if redis.call('hexists', KEYS[1], ARGV[4]) == 0 then
  return 2
end
if tonumber(redis.call('hget', KEYS[1], ARGV[1])) <= 1 then
  redis.call('del', KEYS[1])
  keep_fence(KEYS[4], ARGV[6])
  local head = queue_head(KEYS[2], KEYS[3], now_ms())
  if not head then
    publish(ARGV[3], ARGV[2])
    return 1
  end
  for i = 7, #ARGV - 3, 4 do
    if ARGV[i] == head then
      leave_queue(KEYS[2], KEYS[3], head)
      local token = next_token(KEYS[4], ARGV[6])
      redis.call('hset', KEYS[1], ARGV[i + 1], 1, 'token', string.format('%d', token), ARGV[i + 2], 1)
      redis.call('pexpire', KEYS[1], tonumber(ARGV[i + 3]))
      return {1, head, token}
    end
  end
  wake(ARGV[5], head)
  return 1
end
redis.call('hincrby', KEYS[1], ARGV[1], -1)
redis.call('hdel', KEYS[1], ARGV[4])
undo_lengthening(KEYS[1], ARGV[4])
keep_fence(KEYS[4], ARGV[6])
return 1
