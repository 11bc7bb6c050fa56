-- Library: the fence counter of a single server, put in front of the scripts that grant,
-- renew or release.
--
-- KEYS: none (the functions are given the fence counter's key).
-- ARGV: none (the keep time in ms is passed to the functions).
-- Returns: nothing; defines next_token(fence, keep), which returns the name's next token,
--   and keep_fence(fence, keep).
-- Invariant: the tokens of a name strictly increase, also across the counter's expiry
--   (given the clock condition below); both functions leave the counter, where there is
--   one, lasting the keep time from now.
--
-- The counter lasts the keep time (`keep`, in ms) from the name's last grant, renewal or
-- release, so that an idle name leaves nothing behind. A grant that finds it missing
-- (INCR answers 1) starts it from the server's clock in microseconds instead: above
-- every token the name had before its counter went, as long as the server's clock never
-- steps back by the keep time (a counter starts at the clock and takes one step per
-- grant, and one script takes more than a microsecond).

local function next_token(fence, keep)
  local token = redis.call('incr', fence)
  if token == 1 then
    local t = redis.call('time')
    token = tonumber(t[1]) * 1000000 + tonumber(t[2])
    redis.call('set', fence, string.format('%d', token), 'px', keep)
  else
    redis.call('pexpire', fence, keep)
  end
  return token
end
local function keep_fence(fence, keep)
  redis.call('pexpire', fence, keep)
end
