#!lua
-- needs: guard.lua
-- STEP_SIGNAL: sends a signal to a message, atomically: records its payload in the message's
-- step record and, when the message is parked waiting for it, makes it due now. Called through
-- `crate::steps::SendSignal`.
--
-- KEYS: the record (K.steps:<id>), the queue's delayed set, its delayed payload hash (all in
--       the queue's slot).
-- ARGV: the message's id, the signal's field (`signal:<name>`), the wait's field
--       (`wait:<name>`), the payload (JSON), the record's ttl in ms, the most fields a record
--       holds.
-- A signal already recorded is kept (the first wins): `already`, nothing written. A wait whose
-- deadline passed took its timeout: `late`, nothing written, so a replay of the handler reads
-- the timeout again. Else the payload is recorded and the record's expiry set to at least the
-- ttl (a signal to a message not known, or finished, lives that long). When the wait is
-- recorded and the message is in the delayed set (parked), its entry is due now and
-- `PUBLISH <delayed set> ''` wakes the readers, and the id leaves the parked set
-- (`<delayed set>.parked`, delayed/schedule_retry.lua): `woken`. Else `kept`: the message has not
-- reached its wait, or is running, and its wait or its park reads the signal.
-- A new field past the most fields a record holds is refused with `RSFULL` before any write.
-- Refused under maxmemory (no allow-oom flag): it only adds.
local id, signal, wait, payload = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local ttl, most = tonumber(ARGV[5]), tonumber(ARGV[6])
if not ttl or ttl < 1 or not most then
  return redis.error_reply('RSARGS steps/signal.lua: the ttl or the most fields is not a number')
end
local bad = wrong_types({{KEYS[1], 'hash'}, {KEYS[2], 'zset'}, {KEYS[3], 'hash'}})
if bad then return redis.error_reply(bad) end
if redis.call('HEXISTS', KEYS[1], signal) == 1 then return 'already' end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = tonumber(redis.call('HGET', KEYS[1], wait))
if deadline and deadline <= now then return 'late' end
if redis.call('HLEN', KEYS[1]) >= most then
  return redis.error_reply('RSFULL the step record ' .. KEYS[1] .. ' holds ' .. most ..
    ' fields, the most a message records: give the message fewer steps')
end
redis.call('HSET', KEYS[1], signal, payload)
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
if deadline and redis.call('ZSCORE', KEYS[2], id) and redis.call('HEXISTS', KEYS[3], id) == 1 then
  redis.call('ZADD', KEYS[2], now, id)
  redis.call('ZREM', KEYS[2] .. '.parked', id)
  redis.call('PUBLISH', KEYS[2], '')
  return 'woken'
end
return 'kept'
