-- Library: the holds of readers and permits, put behind lib/queue.lua (hand_on wakes the
-- head of the queue, or publishes with lib/publish.lua's or lib/spublish.lua's publish).
--
-- KEYS: none (the functions are given the hold hash's, the leases set's and the queue's
--   keys).
-- ARGV: none (hold ids, request ids, times and numbers of permits are passed to them).
-- Returns: nothing; defines settle(hold, leases); held_kind(hold, leases, now) (false
--   when free, 'exclusive', 'shared' or 'permit', after dropping lapsed leases);
--   lengthen(hold, leases, id, lapse); take_back(hold, leases, id, request) (whether the
--   hold ended); admits_permit(hold, leases, permits); and hand_on(hold, queue, places,
--   prefix, channel, token, kind) (whether it woke a waiter or published the token).
-- Invariant: a hold hash of readers or permits and its leases set expire together with
--   the latest lease, so the hash is there exactly while a lease is live; a lease is
--   never shortened, only ended; a permit is admitted only within the smallest number of
--   permits among the live permits and the request.
--
-- Readers' and permits' holds live in the hold hash (so that the exclusive scripts see the
-- name held, and wait, without reading anything else) and in the leases set, where each
-- hold's id (see dlock_redis::keys::hold_id) is scored with the time its hold lapses
-- (server clock, in ms). Each hold lapses on its own: a script that finds leases past
-- their time drops them and their fields first (held_kind). The hash and the set
-- themselves lapse with the last lease (settle), so that a writer waiting on the hash's
-- ttl is not held up by leases that ended before it.
--
-- A permit's number of permits is kept beside it (`permits:<hold id>`): a new permit is
-- admitted only while every holder, the new one included, would have no more holds
-- beside it than its own number allows (HoldKind::joins), so the smallest number among
-- the live permits and the request bounds the grant. The holders' numbers are read only
-- when the request's own number admits one more (fewer holders than it).

local function settle(hold, leases)
  local last = redis.call('zrange', leases, -1, -1, 'withscores')
  if #last == 0 then
    redis.call('del', hold, leases)
    return
  end
  local at = string.format('%d', tonumber(last[2]))
  redis.call('pexpireat', hold, at)
  redis.call('pexpireat', leases, at)
end
local function held_kind(hold, leases, now)
  local kind = redis.call('hget', hold, 'kind')
  if not kind then
    if redis.call('exists', hold) == 1 then
      return 'exclusive'
    end
    return false
  end
  local gone = redis.call('zrangebyscore', leases, '-inf', string.format('%d', now))
  if #gone > 0 then
    redis.call('zremrangebyscore', leases, '-inf', string.format('%d', now))
    local dead = {}
    for _, id in ipairs(gone) do
      dead[id] = true
      redis.call('hdel', hold, 'holder:' .. id, 'count:' .. id, 'permits:' .. id)
    end
    local fields = redis.call('hgetall', hold)
    for i = 1, #fields, 2 do
      if dead[fields[i + 1]] and string.sub(fields[i], 1, 8) == 'request:' then
        redis.call('hdel', hold, fields[i])
      end
    end
  end
  if #gone > 0 or redis.call('exists', leases) == 0 then
    settle(hold, leases)
    if redis.call('exists', hold) == 0 then
      return false
    end
  end
  return kind
end
local function lengthen(hold, leases, id, lapse)
  local score = redis.call('zscore', leases, id)
  if not score or tonumber(score) < lapse then
    redis.call('zadd', leases, string.format('%d', lapse), id)
    settle(hold, leases)
  end
end
local function take_back(hold, leases, id, request)
  redis.call('hdel', hold, 'request:' .. request)
  local count = 'count:' .. id
  if tonumber(redis.call('hget', hold, count) or '0') > 1 then
    redis.call('hincrby', hold, count, -1)
    return false
  end
  redis.call('hdel', hold, 'holder:' .. id, count, 'permits:' .. id)
  redis.call('zrem', leases, id)
  settle(hold, leases)
  return true
end
local function admits_permit(hold, leases, permits)
  local held = redis.call('zcard', leases)
  if held >= permits then
    return false
  end
  for _, id in ipairs(redis.call('zrange', leases, 0, -1)) do
    local bound = tonumber(redis.call('hget', hold, 'permits:' .. id) or '0')
    if bound > 0 and bound <= held then
      return false
    end
  end
  return true
end
local function hand_on(hold, queue, places, prefix, channel, token, kind)
  if kind == 'permit' or redis.call('exists', hold) == 0 then
    if not wake_head(queue, places, prefix) then
      publish(channel, token)
    end
    return true
  end
  return false
end
