#!lua
-- needs: guard.lua frame.lua cancel/record.lua
-- CANCEL: cancels message ARGV[1] of one list queue (one partition) wherever it is, once (see
-- crate::cancel). Called through `crate::cancel::CancelList`.
--
-- KEYS: the cancel record (K.cancels, a hash id → what the cancel did), the delayed set, the
--       delayed payload hash, the queue's levels (lowest first, ARGV[5] of them), then the
--       processing list when the queue may have one.
-- ARGV: the id, the signal channel (K.cancel), most ids the record holds, its ttl ms, the number
--       of levels, the message's step record (K.steps:<id>, in the queue's slot).
--
-- In the delayed set (member and payload field are the id): removed, `removed`. Else claimed
-- (a frame with the id in the processing list: bounded by what is in flight): `signalled`.
-- Else with entries in the queue: `marked` (a list cannot be searched for an id in one step;
-- the claim's cancel gate removes it when it comes up, claim/cancels.lua). Each of these is
-- recorded (the record's ttl re-armed), and for the last two the id is PUBLISHed on the signal
-- channel, so the processes running the queue's handlers tell that handler (a simple list's
-- running handlers are not in any processing list: they are told too). Else `missing`, and
-- nothing is written.
-- A call made again (its reply lost) finds the record and answers the same, writing nothing.
-- Past the record's most ids, a new cancel is refused with `RSFULL` before any write.
local id, channel = ARGV[1], ARGV[2]
local most, ttl, nlevels = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
if not most or not ttl or not nlevels or not ARGV[6] or #KEYS < 3 + nlevels or #KEYS > 4 + nlevels then
  return redis.error_reply('RSARGS cancel.lua takes an id, a channel, a bound, a ttl and the levels, got ' .. #ARGV .. ' arguments and ' .. #KEYS .. ' keys')
end
local record, delayed, payloads = KEYS[1], KEYS[2], KEYS[3]
local processing = KEYS[4 + nlevels]
local checks = {{record, 'hash'}, {delayed, 'zset'}, {payloads, 'hash'}, {ARGV[6], 'hash'},
  {delayed .. '.sleeping', 'zset'}, {delayed .. '.parked', 'zset'}}
for i = 4, 3 + nlevels do checks[#checks + 1] = {KEYS[i], 'list'} end
if processing then checks[#checks + 1] = {processing, 'list'} end
local bad = wrong_types(checks)
if bad then return redis.error_reply(bad) end

-- Whether a frame of message `id` is claimed.
local function running()
  if not processing then return false end
  local claimed = redis.call('LRANGE', processing, 0, -1)
  for _, v in ipairs(claimed) do
    local l = frame_layout(v)
    if l and string.sub(v, l.id[1], l.id[2]) == id then return true end
  end
  return false
end

-- Whether one of the queue's levels holds entries.
local function queued()
  for i = 4, 3 + nlevels do
    if redis.call('LLEN', KEYS[i]) > 0 then return true end
  end
  return false
end

return cancel_once({record = record, id = id, channel = channel, most = most, ttl = ttl,
  delayed = delayed, payloads = payloads, steps = ARGV[6]}, running, queued)
