#!lua
-- needs: guard.lua
-- STEP_WRITE: records one step of a message in its step record, a hash (step name -> value),
-- and sets the record's expiry, atomically. Called through `crate::steps::WriteStep`.
--
-- KEYS: the record (K.steps:<id>, in the queue's slot).
-- ARGV: the step's name, its value (JSON; '' for a sleep), the ttl in ms, the most fields a
--       record holds, a sleep's length in ms ('' for a step), then the timing's field
--       (`t:<step>`; '' for none) and how long the step ran in ms ('' for none).
-- A step's value is stored as given. A sleep stores its wake-up time, ms since the epoch on the
-- server's clock (TIME), and keeps the record until then plus the ttl. The record's expiry is
-- never shortened: a step written after a long sleep's keeps the sleep's.
-- With a timing field, the same call stores `<began>,<ms>` there: a step's run began the
-- server's now less the ms it ran; a sleep began now and lasts its length.
-- New fields past the most a record holds are refused with `RSFULL` before any write.
-- Refused under maxmemory (no allow-oom flag): it only adds.
-- Returns the value stored.
local name, value, ttl, most = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local sleep, timing = ARGV[5], ARGV[6] or ''
local took = (ARGV[7] or '') == '' and 0 or tonumber(ARGV[7])
if not ttl or ttl < 1 or not most or not took or took < 0 then
  return redis.error_reply('RSARGS steps/write.lua: the ttl, the most fields or the time taken is not a number')
end
local bad = wrong_types({{KEYS[1], 'hash'}})
if bad then return redis.error_reply(bad) end
local now
if sleep ~= '' or timing ~= '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local began = now and now - took
if sleep ~= '' then
  local ms = tonumber(sleep)
  if not ms or ms < 0 then
    return redis.error_reply('RSARGS steps/write.lua: the sleep is not a number of ms')
  end
  value = string.format('%d', now + ms)
  ttl = ttl + ms
  began, took = now, ms
end
local new = 1 - redis.call('HEXISTS', KEYS[1], name)
if timing ~= '' then new = new + 1 - redis.call('HEXISTS', KEYS[1], timing) end
if new > 0 and redis.call('HLEN', KEYS[1]) + new > most then
  return redis.error_reply('RSFULL the step record ' .. KEYS[1] .. ' holds ' .. most ..
    ' fields, the most a message records: give the message fewer steps')
end
if timing ~= '' then
  redis.call('HSET', KEYS[1], name, value, timing, string.format('%d,%d', began, took))
else
  redis.call('HSET', KEYS[1], name, value)
end
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
return value
