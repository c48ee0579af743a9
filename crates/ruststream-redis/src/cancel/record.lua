-- RECORD: what both cancel scripts (cancel.lua, stream.lua) do once they have checked their
-- arguments: `cancel_once` decides what the cancel finds and `record_cancel` writes it. Prepended
-- to them after guard.lua.
--
-- `missing`: nothing written. Else, past the record's `most` ids a new cancel is refused with
-- `RSFULL` before any write; `removed` deletes the delayed entry (the set's member and the
-- payload field are the id, also in the sleeping and parked sets, delayed/schedule_retry.lua); `removed` and `marked` delete the message's step record
-- (`c.steps`, crate::steps: a sleeping or parked message waits in the delayed set, and a
-- message marked never runs again); the outcome is recorded and the record's ttl re-armed; and, but
-- for `removed`, the id is PUBLISHed on the signal channel. Returns the outcome (or the error).
local function record_cancel(c, outcome)
  if outcome == 'missing' then return outcome end
  if redis.call('HLEN', c.record) >= c.most then
    return redis.error_reply('RSFULL the cancel record ' .. c.record .. ' holds ' .. c.most ..
      ' cancels: it expires ' .. c.ttl .. ' ms after the last one; cancel again later')
  end
  if outcome == 'removed' then
    redis.call('ZREM', c.delayed, c.id)
    redis.call('HDEL', c.payloads, c.id)
    redis.call('ZREM', c.delayed .. '.sleeping', c.id)
    redis.call('ZREM', c.delayed .. '.parked', c.id)
  end
  if outcome ~= 'signalled' then redis.call('DEL', c.steps) end
  redis.call('HSET', c.record, c.id, outcome)
  redis.call('PEXPIRE', c.record, c.ttl)
  if outcome ~= 'removed' then redis.call('PUBLISH', c.channel, c.id) end
  return outcome
end

-- Cancels `c.id` once: a call made again (its reply lost) finds the record and answers what the
-- first did, writing nothing. Else the outcome is `removed` when the id is in the delayed set,
-- `signalled` when `running()` (a claim of the message is in flight), `marked` when `queued()`
-- (entries wait that may be the message), else `missing`; then record_cancel.
local function cancel_once(c, running, queued)
  local before = redis.call('HGET', c.record, c.id)
  if before then return before end
  local outcome = 'missing'
  if redis.call('ZSCORE', c.delayed, c.id) then
    outcome = 'removed'
  elseif running() then
    outcome = 'signalled'
  elseif queued() then
    outcome = 'marked'
  end
  return record_cancel(c, outcome)
end
