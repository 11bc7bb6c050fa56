-- Library: a wake-up message by sharded pub/sub, put first in front of every script that
-- publishes, on a Cluster of Redis 7 or later.
--
-- KEYS: none.
-- ARGV: none (the channel and the message are passed to it).
-- Returns: nothing; defines publish(channel, message).
-- Invariant: lib/publish.lua defines the same function with the classic command; a
--   script is composed with exactly one of the two, so its own logic exists once.
--
-- Every channel of a lock carries the lock's hash tag, so it hashes to the slot of the
-- keys the script declared: the message stays within the shard that serves the slot
-- (its primary and replicas), where the waiters' SSUBSCRIBE is.

local function publish(channel, message)
  redis.call('spublish', channel, message)
end
