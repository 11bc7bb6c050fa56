-- Library: the queue of waiters, put in front of the single-server scripts that queue,
-- wake or count waiters, behind lib/publish.lua or lib/spublish.lua (wake publishes) and
-- lib/clock.lua.
--
-- KEYS: none (the functions are given the queue list's and the places hash's keys).
-- ARGV: none (the place id, the lapse and the wake-up channel prefix are passed to them).
-- Returns: nothing; defines queue_head(queue, places, now) (the first live
--   place id or false, and whether lapsed places were dropped), leave_queue(queue, places,
--   id) (whether the place was there), take_place(queue, places, id, now, lapse),
--   wake(prefix, id) and wake_head(queue, places, prefix) (the head woken, or false).
-- Invariant: a place id is in the queue list exactly while it is in the places hash
--   (each function adds or removes it in both), and both keys last at least as long as
--   any place in them; a wake-up names one waiter, the head.
--
-- A waiter is woken on its client's wake-up channel of the lock, named after the place id
-- up to its last `:` (a request id is `<client id>:<n>`), with the place id as the
-- message: one subscription serves all the waiters of a client on one lock, and the
-- client wakes only the waiter named.
--
-- A place lapses at the time stored for it in the places hash (server clock, in ms): its
-- waiter's place lapse (dlock_core::place_lapse, at most a few seconds, whatever lease it
-- asks for) after its last look, so that a waiter that stopped coming back is skipped
-- soon. Lapsed places are dropped when they reach the head; one further back stays until
-- then (its waiter may still come back and refresh it, keeping its turn).

local function queue_head(queue, places, now)
  local dropped = false
  while true do
    local id = redis.call('lindex', queue, 0)
    if not id then
      return false, dropped
    end
    if tonumber(redis.call('hget', places, id) or '0') > now then
      return id, dropped
    end
    redis.call('lpop', queue)
    redis.call('hdel', places, id)
    dropped = true
  end
end
local function leave_queue(queue, places, id)
  if redis.call('hdel', places, id) == 1 then
    redis.call('lrem', queue, 1, id)
    return true
  end
  return false
end
local function take_place(queue, places, id, now, lapse)
  if redis.call('hset', places, id, string.format('%d', now + lapse)) == 1 then
    redis.call('rpush', queue, id)
  end
  for _, key in ipairs({queue, places}) do
    if redis.call('pttl', key) < lapse then
      redis.call('pexpire', key, lapse)
    end
  end
end
local function wake(prefix, id)
  publish(prefix .. (string.match(id, '^(.*):[^:]*$') or id), id)
end
local function wake_head(queue, places, prefix)
  local head = queue_head(queue, places, now_ms())
  if head then
    wake(prefix, head)
  end
  return head
end
