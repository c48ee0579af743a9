#!lua flags=allow-oom
-- CLAIM: claims up to ARGV[1] entries from the consuming (right) end of the queue into the
-- processing list: the same as that many `LMOVE queue processing RIGHT LEFT`, done as one
-- LRANGE + LPUSH + LTRIM (and one ZADD for their claims). Runs under maxmemory (allow-oom): it
-- moves entries, so a full Redis can still drain its queues. Prepended with guard.lua and
-- frame.lua.
--
-- KEYS: queue, processing, with recovery the recovery set, with a rate limit its key (last).
-- ARGV: most entries to claim, reader id ('' = no recovery), first claim sequence number,
--       min_idle ms, recovery-set ttl ms (0 = none), most claims to recover, then the rate
--       limit (see limit.lua's rate_spec: mode, n, per us, header; mode '' = none).
--
-- With recovery, it first sweeps: each claim scored older than now - min_idle leaves the set,
-- and its entry goes from the processing list back to the queue with its attempt raised by one.
-- Then every claim is recorded in the set as `<reader id>:<seq>.<run>:<value>` scored by the
-- server's clock, so two claims of identical bytes are two members. `<run>` is the server's TIME
-- (seconds.microseconds) of this run: a client sends a call again when its reply was lost (fred
-- does, on a new connection), and the second run must not record its claims under the first
-- run's members (the first run's entries would then never be swept back). When the recovery set
-- does not exist (it expired with recovery_ttl, or the queue ran without recovery before) while
-- the processing list holds entries, nobody holds a claim on them: they go back to the queue as
-- well.
-- The entries are taken by limit.lua's `take`: as many as the rate limit allows, if any.
-- Returns {recovered, run ('' without recovery), held back by the rate limit, ms until the limit
-- lets the next pass, value...}, values oldest first.
local lim = rate_spec(ARGV, 7, KEYS[#KEYS])
local checks = {{KEYS[1], 'list'}, {KEYS[2], 'list'}}
if ARGV[2] ~= '' then checks[#checks + 1] = {KEYS[3], 'zset'} end
checks[#checks + 1] = rate_check(lim)
local bad = wrong_types(checks)
if bad then return redis.error_reply(bad) end
local out = {0, '', 0, 0}
local rid = ARGV[2]
local now = 0
if rid ~= '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  out[2] = t[1] .. '.' .. t[2]
  local most = tonumber(ARGV[6])
  if redis.call('EXISTS', KEYS[3]) == 0 then
    local orphans = redis.call('RPOP', KEYS[2], most)
    if orphans then
      for _, v in ipairs(orphans) do
        redis.call('LPUSH', KEYS[1], bump(v))
        out[1] = out[1] + 1
      end
    end
  end
  local stale = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now - tonumber(ARGV[4]),
    'LIMIT', 0, most)
  for _, m in ipairs(stale) do
    redis.call('ZREM', KEYS[3], m)
    local p = string.find(m, ':', 1, true)
    local q = p and string.find(m, ':', p + 1, true)
    if q and redis.call('LREM', KEYS[2], '-1', string.sub(m, q + 1)) > 0 then
      redis.call('LPUSH', KEYS[1], bump(string.sub(m, q + 1)))
      out[1] = out[1] + 1
    end
  end
end
local n = tonumber(ARGV[1])
if n < 1 then return out end
local taken, held, wait = take(KEYS[1], n, lim)
out[3], out[4] = held, wait
local m = #taken
if m == 0 then return out end
for i = 1, m do out[#out + 1] = taken[i] end
for i = 5, m + 4, 1000 do
  redis.call('LPUSH', KEYS[2], unpack(out, i, math.min(i + 999, m + 4)))
end
if rid ~= '' then
  local seq = tonumber(ARGV[3])
  local members = {}
  for i = 5, m + 4 do
    members[#members + 1] = now
    members[#members + 1] = rid .. ':' .. (seq + i - 5) .. '.' .. out[2] .. ':' .. out[i]
  end
  for i = 1, #members, 1000 do
    redis.call('ZADD', KEYS[3], unpack(members, i, math.min(i + 999, #members)))
  end
  if tonumber(ARGV[5]) > 0 then redis.call('PEXPIRE', KEYS[3], ARGV[5]) end
end
return out
