-- Library: a wake-up message by classic pub/sub, put first in front of every script that
-- publishes, on a single server, through Sentinel, on RedLock's masters, and on a Cluster
-- of servers before Redis 7.
--
-- KEYS: none.
-- ARGV: none (the channel and the message are passed to it).
-- Returns: nothing; defines publish(channel, message).
-- Invariant: lib/spublish.lua defines the same function with the sharded command; a
--   script is composed with exactly one of the two, so its own logic exists once.
--
-- On a Cluster, PUBLISH goes to every node over the cluster bus.

local function publish(channel, message)
  redis.call('publish', channel, message)
end
