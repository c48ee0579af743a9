-- Shared by the settle scripts: schedules a retry frame in a delayed set. `arg` is
-- `delay_ms:id`; the due time is the server's clock (TIME, read once per script) plus the delay.
-- A message parked for a signal passes its step record `steps` and the signal's field there:
-- when the signal is recorded already (sent while the handler ran), the entry is due now, and
-- `PUBLISH <delayed set> ''` wakes the readers, so the signal is not lost to the park.
-- A durable sleep or a park also passes `index`, `sleeping` or `parked`: the id goes into the
-- set `<delayed set>.<index>` with its wake-up time as its score, which the queue gauges count
-- (crate::steps). That set drops the ids woken already (score at or before now) and lives until
-- its latest wake-up; a park due now (its signal recorded) is not added.
local now = nil
local function schedule_retry(zset, hash, arg, frame, steps, field, index)
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  local sep = string.find(arg, ':', 1, true)
  local id = string.sub(arg, sep + 1)
  local due = now + tonumber(string.sub(arg, 1, sep - 1))
  if steps and redis.call('HEXISTS', steps, field) == 1 then
    due = now
    index = nil
    redis.call('PUBLISH', zset, '')
  end
  redis.call('ZADD', zset, due, id)
  redis.call('HSET', hash, id, frame)
  if index and due > now then
    local set = zset .. '.' .. index
    redis.call('ZREMRANGEBYSCORE', set, '-inf', now)
    redis.call('ZADD', set, due, id)
    if redis.call('PTTL', set) < due - now then redis.call('PEXPIRE', set, due - now) end
  end
end
