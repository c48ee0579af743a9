#!lua
-- needs: guard.lua
-- STEP_WRITE: records one step of a message in its step record, a hash (step name -> value),
-- and sets the record's expiry, atomically. Called through `crate::steps::WriteStep`.
--
-- KEYS: the record (K.steps:<id>, in the queue's slot).
-- ARGV: the step's name, its value (JSON; '' for a sleep), the ttl in ms, the most steps a
--       record holds, then a sleep's length in ms ('' for a step).
-- A step's value is stored as given. A sleep stores its wake-up time, ms since the epoch on the
-- server's clock (TIME), and keeps the record until then plus the ttl. The record's expiry is
-- never shortened: a step written after a long sleep's keeps the sleep's.
-- A new name past the most steps is refused with `RSFULL` before any write.
-- Refused under maxmemory (no allow-oom flag): it only adds.
-- Returns the value stored.
local name, value, ttl, most = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local sleep = ARGV[5]
if not ttl or ttl < 1 or not most then
  return redis.error_reply('RSARGS steps/write.lua: the ttl or the most steps is not a number')
end
local bad = wrong_types({{KEYS[1], 'hash'}})
if bad then return redis.error_reply(bad) end
if sleep ~= '' then
  local ms = tonumber(sleep)
  if not ms or ms < 0 then
    return redis.error_reply('RSARGS steps/write.lua: the sleep is not a number of ms')
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  value = string.format('%d', now + ms)
  ttl = ttl + ms
end
if redis.call('HEXISTS', KEYS[1], name) == 0 and redis.call('HLEN', KEYS[1]) >= most then
  return redis.error_reply('RSFULL the step record ' .. KEYS[1] .. ' holds ' .. most ..
    ' steps, the most a message records: give the message fewer steps')
end
redis.call('HSET', KEYS[1], name, value)
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
return value
