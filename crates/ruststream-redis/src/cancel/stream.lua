#!lua
-- needs: guard.lua cancel/record.lua
-- CANCEL_STREAM: cancels message ARGV[1] of one stream (one partition) wherever it is, for every
-- consumer group reading it, once (see crate::cancel). Called through
-- `crate::cancel::CancelStream`.
--
-- KEYS: the cancel record (K.cancels, a hash id → what the cancel did), the delayed set, the
--       delayed payload hash, the stream.
-- ARGV: the id, the signal channel (K.cancel), most ids the record holds, its ttl ms, most
--       pending entries looked through per group, the message's step record (K.steps:<id>,
--       in the stream's slot).
--
-- In the delayed set (member and payload field are the id): removed, `removed`. Else pending in
-- a group (an entry of the group's PEL, bounded by ARGV[5], whose `rs.id` field is the id:
-- XPENDING, then XRANGE of each entry id): `signalled`. Else with entries a group has not read
-- yet (or entries and no group yet): `marked` (stream/read.lua acks it when a group reads it,
-- undelivered). Each of these is recorded (the record's ttl re-armed), and for the last two the
-- id is PUBLISHed on the signal channel. Else `missing`, and nothing is written.
-- A call made again (its reply lost) finds the record and answers the same, writing nothing.
-- Past the record's most ids, a new cancel is refused with `RSFULL` before any write.
local id, channel = ARGV[1], ARGV[2]
local most, ttl, inflight = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
if not most or not ttl or not inflight or inflight < 1 or not ARGV[6] or #KEYS ~= 4 then
  return redis.error_reply('RSARGS cancel/stream.lua takes an id, a channel, a bound, a ttl a pending bound and a step record, and 4 keys; got ' .. #ARGV .. ' arguments and ' .. #KEYS .. ' keys')
end
local record, delayed, payloads, stream = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local bad = wrong_types({{record, 'hash'}, {delayed, 'zset'}, {payloads, 'hash'}, {stream, 'stream'}, {ARGV[6], 'hash'},
  {delayed .. '.sleeping', 'zset'}, {delayed .. '.parked', 'zset'}})
if bad then return redis.error_reply(bad) end

-- The value of field `name` in a flat {name, value, ..} list.
local function field(list, name)
  for i = 1, #list - 1, 2 do
    if list[i] == name then return list[i + 1] end
  end
  return nil
end

-- Whether stream entry id `a` comes after `b` (`ms-seq`).
local function after(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if not am or not bm then return false end
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am > bm or (am == bm and as > bs)
end

local groups = {}
if redis.call('EXISTS', stream) == 1 then groups = redis.call('XINFO', 'GROUPS', stream) end

-- Whether an entry of message `id` is pending in a group.
local function running()
  for _, g in ipairs(groups) do
    local pending = tonumber(field(g, 'pending')) or 0
    if pending > 0 then
      local list = redis.call('XPENDING', stream, field(g, 'name'), '-', '+', math.min(pending, inflight))
      for _, p in ipairs(list) do
        local e = redis.call('XRANGE', stream, p[1], p[1])
        if e[1] and type(e[1][2]) == 'table' and field(e[1][2], 'rs.id') == id then return true end
      end
    end
  end
  return false
end

-- Whether the stream holds entries some group has not read (or entries and no group).
local function unread()
  local top = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1]
  if not top then return false end
  if #groups == 0 then return true end
  for _, g in ipairs(groups) do
    if after(top[1], field(g, 'last-delivered-id') or '0-0') then return true end
  end
  return false
end

return cancel_once({record = record, id = id, channel = channel, most = most, ttl = ttl,
  delayed = delayed, payloads = payloads, steps = ARGV[6]}, running, unread)
