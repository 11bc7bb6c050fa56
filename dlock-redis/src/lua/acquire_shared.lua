-- Acquire a reader's share or a permit: grants when the holds there admit it (none;
-- readers, for a reader; for a permit, permits fewer than the request's number and than
-- the number of every permit there) and no other waiter queues ahead, else reports how
-- long to wait, taking or keeping a place in the queue as acquire.lua does. Runs behind
-- lib/publish.lua (or lib/spublish.lua), lib/fence.lua, lib/queue.lua and lib/leases.lua.
--
-- KEYS: [1] hold, [2] fence counter, [3] void marker, [4] queue, [5] places, [6] leases.
-- ARGV: [1] hold id, [2] ttl in ms, [3] request id, [4] place id, [5] place mode,
--   [6] wake-up channel prefix, [7] kind (`shared` or `permit`), [8] permits (the
--   request's number; ignored for `shared`), [9] place lapse in ms, [10] keep time in ms.
-- Returns: what acquire.lua returns; wait is, when the holds do not admit the request,
--   the time until the first permit lapses (permits hold) or the hash's pttl (another
--   kind holds), else the time until another waiter's place at the head lapses.
-- Invariant: readers hold only beside readers and permits only beside permits, within
--   the smallest number of permits among the live permits and the request; while the
--   queue has a live place only its head is granted; a request is granted at most once,
--   and never after it was given back (while its void marker lasts); every new hold
--   takes the next token of the name's one fence counter.
--
-- A blocking permit request that is refused takes a place even when it did not ask for
-- fairness, so that a later request, for more permits say, cannot overtake it: once a
-- queue exists, requests are granted only at its head. The same hold id holding this
-- kind already re-enters its hold (count + 1, same token, its lease never shortened): an
-- owner re-enters a permit only with the same number of permits, and takes another
-- permit with another number; a hold of another kind waits for its own end.
--
-- Each grant keeps the fence counter for the keep time, and is recorded under its request
-- (`request:<request id>` -> hold id), as acquire.lua's are: the call is idempotent, and a
-- request given back (its void marker set) grants nothing. A grant made at the head of the
-- queue wakes the next waiter, who may join.

if redis.call('exists', KEYS[3]) == 1 then
  return {0, redis.call('pttl', KEYS[1]), 0}
end
local now = now_ms()
local ttl = tonumber(ARGV[2])
local id, kind = ARGV[1], ARGV[7]
local held = held_kind(KEYS[1], KEYS[6], now)
local holder = 'holder:' .. id
if held == kind and redis.call('hexists', KEYS[1], holder) == 1 then
  local request = 'request:' .. ARGV[3]
  if redis.call('hget', KEYS[1], request) ~= id then
    redis.call('hincrby', KEYS[1], 'count:' .. id, 1)
    redis.call('hset', KEYS[1], request, id)
    lengthen(KEYS[1], KEYS[6], id, now + ttl)
    leave_queue(KEYS[4], KEYS[5], ARGV[4])
    keep_fence(KEYS[2], ARGV[10])
  end
  return {1, redis.call('hget', KEYS[1], holder)}
end
local head, dropped = queue_head(KEYS[4], KEYS[5], now)
local admitted = not held
if held == kind then
  admitted = kind == 'shared' or admits_permit(KEYS[1], KEYS[6], tonumber(ARGV[8]))
end
if admitted and (not head or head == ARGV[4]) then
  if not held then
    redis.call('del', KEYS[6])
  end
  local token = string.format('%d', next_token(KEYS[2], ARGV[10]))
  redis.call('hset', KEYS[1], 'kind', kind, 'token', token, holder, token, 'count:' .. id, 1,
    'request:' .. ARGV[3], id)
  if kind == 'permit' then
    redis.call('hset', KEYS[1], 'permits:' .. id, ARGV[8])
  end
  redis.call('zadd', KEYS[6], string.format('%d', now + ttl), id)
  settle(KEYS[1], KEYS[6])
  if head then
    leave_queue(KEYS[4], KEYS[5], ARGV[4])
    wake_head(KEYS[4], KEYS[5], ARGV[6])
  end
  return {1, token}
end
local placed = 0
if redis.call('hexists', KEYS[5], ARGV[4]) == 1 or ARGV[5] == '2'
    or (ARGV[5] == '1' and (head or (kind == 'permit' and not admitted))) then
  take_place(KEYS[4], KEYS[5], ARGV[4], now, tonumber(ARGV[9]))
  placed = 1
end
local wait = -1
if not admitted then
  if held == kind then
    local first = redis.call('zrange', KEYS[6], 0, 0, 'withscores')
    wait = math.max(tonumber(first[2]) - now, 0)
  else
    wait = redis.call('pttl', KEYS[1])
  end
end
if head and head ~= ARGV[4] then
  local lapses = tonumber(redis.call('hget', KEYS[5], head)) - now
  if wait < 0 or lapses < wait then
    wait = lapses
  end
end
if not held and dropped and head then
  wake(ARGV[6], head)
end
return {0, wait, placed}
