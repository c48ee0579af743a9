#!lua flags=allow-oom
-- CLAIM: claims up to ARGV[1] entries from the consuming (right) end of the queue into the
-- processing list: the same as that many `LMOVE queue processing RIGHT LEFT`, done as one
-- LRANGE + LPUSH + LTRIM (and one ZADD for their claims). A queue with priority levels is
-- claimed from its highest non-empty level first, then the next, until ARGV[1] are taken. Runs
-- under maxmemory (allow-oom): it moves entries, so a full Redis can still drain its queues.
-- Prepended with guard.lua, frame.lua, list/levels.lua and limit.lua.
--
-- KEYS: queue (level 0), processing, with recovery the recovery set, then the levels above 0
--       (none without priority levels) or, with a rate limit, its key (a queue has one or the
--       other: the combination is refused at startup).
-- ARGV: most entries to claim, reader id ('' = no recovery), first claim sequence number,
--       min_idle ms, recovery-set ttl ms (0 = none), most claims to recover, then the rate
--       limit (see limit.lua's rate_spec: mode, n, per us, header; mode '' = none).
--
-- With recovery, it first sweeps: each claim scored older than now - min_idle leaves the set,
-- and its entry goes from the processing list back to the queue with its attempt raised by one.
-- A swept entry goes back onto its own level (its `rs.priority` header). Then every claim is
-- recorded in the set as `<reader id>:<seq>.<run>:<value>` scored by the
-- server's clock, so two claims of identical bytes are two members. `<run>` is the server's TIME
-- (seconds.microseconds) of this run: a client sends a call again when its reply was lost (fred
-- does, on a new connection), and the second run must not record its claims under the first
-- run's members (the first run's entries would then never be swept back). When the recovery set
-- does not exist (it expired with recovery_ttl, or the queue ran without recovery before) while
-- the processing list holds entries, nobody holds a claim on them: they go back to the queue as
-- well.
-- The entries are taken from the levels, highest first, or by limit.lua's `take`: as many as the
-- rate limit allows, if any.
-- Returns {recovered, run ('' without recovery), held back by the rate limit, ms until the limit
-- lets the next pass, value...}, values oldest first.
local rid = ARGV[2]
local lim = rate_spec(ARGV, 7, KEYS[#KEYS])
local levels = lim and {KEYS[1]} or levels_of(1, rid ~= '' and 4 or 3)
local checks = {{KEYS[1], 'list'}, {KEYS[2], 'list'}}
if rid ~= '' then checks[#checks + 1] = {KEYS[3], 'zset'} end
checks[#checks + 1] = rate_check(lim)
local bad = wrong_types(level_checks(checks, levels))
if bad then return redis.error_reply(bad) end
local out = {0, '', 0, 0}
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
        push_level(levels, bump(v), false)
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
      push_level(levels, bump(string.sub(m, q + 1)), false)
      out[1] = out[1] + 1
    end
  end
end

-- Claims up to `n` entries into `processing`, from the highest non-empty level down, appending
-- them to `out` (oldest of each level first); returns how many.
local function claim_levels(n, processing)
  local m = 0
  for l = #levels, 1, -1 do
    if n - m < 1 then break end
    local taken = redis.call('LRANGE', levels[l], -(n - m), -1)
    if #taken > 0 then
      local first = #out + 1
      for i = #taken, 1, -1 do out[#out + 1] = taken[i] end
      for i = first, #out, 1000 do
        redis.call('LPUSH', processing, unpack(out, i, math.min(i + 999, #out)))
      end
      redis.call('LTRIM', levels[l], 0, -#taken - 1)
      m = m + #taken
    end
  end
  return m
end

local n = tonumber(ARGV[1])
if n < 1 then return out end
local m
if lim then
  local taken, held, wait = take(KEYS[1], n, lim)
  out[3], out[4] = held, wait
  m = #taken
  for i = 1, m do out[#out + 1] = taken[i] end
  for i = 5, m + 4, 1000 do
    redis.call('LPUSH', KEYS[2], unpack(out, i, math.min(i + 999, m + 4)))
  end
else
  m = claim_levels(n, KEYS[2])
end
if m == 0 then return out end
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
