#!lua
-- needs: guard.lua
-- STEP_WAIT: begins a message's wait for a signal, atomically: answers the signal's payload
-- when it was sent already, else records the wait with its deadline. Called through
-- `crate::steps::BeginWait`.
--
-- KEYS: the record (K.steps:<id>, in the queue's slot).
-- ARGV: the wait's field (`wait:<name>`), the signal's field (`signal:<name>`), the timeout in
--       ms, the record's ttl in ms, the most fields a record holds.
-- A wait already recorded keeps its deadline (a call made again after a lost reply answers the
-- same). The record lives until the deadline, then the ttl; its expiry is never shortened.
-- The wait's timing (`t:wait:<name>`, as steps/write.lua's) is when it began and its timeout.
-- New fields past the most a record holds are refused with `RSFULL` before any write.
-- Refused under maxmemory (no allow-oom flag): it only adds.
-- Returns {1, payload} when signalled, else {0, the deadline in ms since the epoch}.
local wait, signal = ARGV[1], ARGV[2]
local timeout, ttl, most = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
if not timeout or timeout < 0 or not ttl or ttl < 1 or not most then
  return redis.error_reply('RSARGS steps/wait.lua: the timeout, the ttl or the most fields is not a number')
end
local bad = wrong_types({{KEYS[1], 'hash'}})
if bad then return redis.error_reply(bad) end
local payload = redis.call('HGET', KEYS[1], signal)
if payload then return {1, payload} end
local deadline = redis.call('HGET', KEYS[1], wait)
if deadline then return {0, tonumber(deadline)} end
local timing = 't:' .. wait
if redis.call('HLEN', KEYS[1]) + 2 - redis.call('HEXISTS', KEYS[1], timing) > most then
  return redis.error_reply('RSFULL the step record ' .. KEYS[1] .. ' holds ' .. most ..
    ' fields, the most a message records: give the message fewer steps')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], wait, string.format('%d', now + timeout), timing,
  string.format('%d,%d', now, timeout))
if redis.call('PTTL', KEYS[1]) < ttl + timeout then redis.call('PEXPIRE', KEYS[1], ttl + timeout) end
return {0, now + timeout}
