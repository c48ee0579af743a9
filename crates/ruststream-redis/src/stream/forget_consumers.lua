-- needs: guard.lua
-- FORGET_CONSUMERS: removes a group's consumers that hold no pending entry and have been idle
-- longer than a bound: each instance reads under a name of its own (`<host>-<pid>-<random>`),
-- so the names of instances that are gone would pile up in XINFO CONSUMERS. One with pending
-- entries is left to the sweep (XCLAIM moves them; DELCONSUMER would drop them). Atomic, so a
-- consumer cannot read between the check and the removal; a live consumer removed while idle
-- (paused, or blocked longer than the bound) is made again by its next XREADGROUP. Prepended
-- with guard.lua. Called through `crate::stream::consumers::ForgetConsumers`.
--
-- A process reading with n readers (`RedisStream::readers`) is the consumers `<name>` and
-- `<name>-2` … `<name>-n`: all of them are the caller's, never removed (one of them may be idle
-- past the bound on Redis 7.0, whose `idle` only a read that got entries resets).
-- KEYS: the stream.
-- ARGV: the group, the calling consumer (never removed), the idle bound (ms), most to remove,
--       the caller's readers (n; absent: 1).
-- Returns how many were removed (0 when the stream or the group is missing).
local bad = wrong_types({{KEYS[1], 'stream'}})
if bad then return redis.error_reply(bad) end
local bound, most = tonumber(ARGV[3]), tonumber(ARGV[4])
local mine = {[ARGV[2]] = true}
for i = 2, tonumber(ARGV[5] or '1') or 1 do mine[ARGV[2] .. '-' .. i] = true end
if not bound or not most then
  return redis.error_reply('RSARGS forget_consumers.lua: the bound and the most (arguments 3 and 4) must be numbers')
end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local consumers = redis.pcall('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
if consumers.err then return 0 end
local gone = 0
for _, c in ipairs(consumers) do
  if gone >= most then break end
  local f = {}
  for i = 1, #c, 2 do f[c[i]] = c[i + 1] end
  if not mine[f.name] and f.pending == 0 and (tonumber(f.idle) or 0) > bound then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], f.name)
    gone = gone + 1
  end
end
return gone
