#!lua
-- needs: guard.lua
-- JOB: one write to a job's record, a hash {progress, result | error, state}, and its expiry,
-- atomically.
--
-- KEYS: the job's hash. ARGV: kind (`progress`, `result` or `failed`), the value, the ttl in ms.
-- Returns 1 when it wrote, 0 when the record was final already (a result or an error stays:
-- the first one wins, so a redelivery or a resent command changes nothing).
-- Refused under maxmemory (no allow-oom flag): it only adds.
local kind, value, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
if not ttl or ttl < 1 then return redis.error_reply('RSARGS job.lua: the ttl is not a positive number') end
local bad = wrong_types({{KEYS[1], 'hash'}})
if bad then return redis.error_reply(bad) end
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'done' or state == 'failed' then return 0 end
if kind == 'progress' then
  redis.call('HSET', KEYS[1], 'progress', value, 'state', 'running')
elseif kind == 'result' then
  redis.call('HSET', KEYS[1], 'result', value, 'state', 'done')
elseif kind == 'failed' then
  redis.call('HSET', KEYS[1], 'error', value, 'state', 'failed')
else
  return redis.error_reply('RSARGS job.lua: unknown write ' .. tostring(kind))
end
redis.call('PEXPIRE', KEYS[1], ttl)
return 1
