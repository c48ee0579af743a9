-- CLAIM: claims up to ARGV[1] entries from the consuming (right) end of the queue into the
-- processing list: the same as that many `LMOVE queue processing RIGHT LEFT`, done as one
-- LRANGE + LTRIM + LPUSH (and one ZADD for their claims). Prepended with frame.lua.
--
-- KEYS: queue, processing, and with recovery the recovery set.
-- ARGV: most entries to claim, reader id ('' = no recovery), first claim sequence number,
--       min_idle ms, recovery-set ttl ms (0 = none), most claims to recover.
--
-- With recovery, it first sweeps: each claim scored older than now - min_idle leaves the set,
-- and its entry goes from the processing list back to the queue with its attempt raised by one.
-- Then every claim is recorded in the set as `<reader id>:<seq>:<value>` scored by the server's
-- clock, so two claims of identical bytes are two members.
-- Returns {recovered, value...}, oldest first.
local out = {0}
local rid = ARGV[2]
local now = 0
if rid ~= '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local stale = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now - tonumber(ARGV[4]),
    'LIMIT', 0, tonumber(ARGV[6]))
  for _, m in ipairs(stale) do
    redis.call('ZREM', KEYS[3], m)
    local p = string.find(m, ':', 1, true)
    local q = string.find(m, ':', p + 1, true)
    local v = string.sub(m, q + 1)
    if redis.call('LREM', KEYS[2], '-1', v) > 0 then
      redis.call('LPUSH', KEYS[1], bump(v))
      out[1] = out[1] + 1
    end
  end
end
local n = tonumber(ARGV[1])
if n < 1 then return out end
local taken = redis.call('LRANGE', KEYS[1], -n, -1)
local m = #taken
if m == 0 then return out end
redis.call('LTRIM', KEYS[1], 0, -m - 1)
for i = m, 1, -1 do out[#out + 1] = taken[i] end
for i = 2, m + 1, 1000 do
  redis.call('LPUSH', KEYS[2], unpack(out, i, math.min(i + 999, m + 1)))
end
if rid ~= '' then
  local seq = tonumber(ARGV[3])
  local members = {}
  for i = 2, m + 1 do
    members[#members + 1] = now
    members[#members + 1] = rid .. ':' .. (seq + i - 2) .. ':' .. out[i]
  end
  for i = 1, #members, 1000 do
    redis.call('ZADD', KEYS[3], unpack(members, i, math.min(i + 999, #members)))
  end
  if tonumber(ARGV[5]) > 0 then redis.call('PEXPIRE', KEYS[3], ARGV[5]) end
end
return out
