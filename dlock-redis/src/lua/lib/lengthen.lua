-- Library: how a grant or a renewal lengthens an exclusive hold, and how a grant given
-- back undoes its lengthening. Runs behind lib/clock.lua.
--
-- KEYS: none (the functions are given the hold's key).
-- ARGV: none (the ttl and the grant field are passed to them).
-- Returns: nothing; defines lengthen(hold, ttl, grant), which makes the hold last at
--   least ttl ms from now for the grant field `grant` (or for a renewal, when `grant` is
--   false), and undo_lengthening(hold, grant).
-- Invariant: a hold never ends before the expiry that a grant or renewal still in it
--   counted on. A lengthening is undone only while it is the last grant or renewal of the
--   hold (any later one drops its record), and then back to the expiry the hold had,
--   which every earlier grant and renewal had been given.
--
-- A grant that lengthens the hold records itself and the expiry it found ('extended' →
-- "<grant field> <unix ms>"); a grant or renewal that counts on the hold's expiry without
-- lengthening it drops the record. When the recorded grant is given back or released,
-- the hold gets the expiry it found back (one already past ends the hold: every grant in
-- it had expired).
--
-- Without it, a re-entry that an acquire gives back (its RedLock round was lost, or its
-- reply) would keep the hold lengthened: a hold left on one RedLock node by a lease its
-- owner lost would live one more ttl per attempt of that owner to take the lock again.

local function lengthen(hold, ttl, grant)
  local pttl = redis.call('pttl', hold)
  if pttl < ttl then
    redis.call('pexpire', hold, ttl)
  end
  if grant and pttl >= 0 and pttl < ttl then
    redis.call('hset', hold, 'extended', grant .. ' ' .. string.format('%d', now_ms() + pttl))
  else
    redis.call('hdel', hold, 'extended')
  end
end
local function undo_lengthening(hold, grant)
  local record = redis.call('hget', hold, 'extended')
  if not record then
    return
  end
  local field, at = string.match(record, '^(.*) (%d+)$')
  if field == grant then
    redis.call('hdel', hold, 'extended')
    redis.call('pexpireat', hold, at)
  end
end
