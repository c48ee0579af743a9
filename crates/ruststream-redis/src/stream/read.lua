#!lua flags=allow-oom
-- READ: a rate-limited stream's `XREADGROUP GROUP g c COUNT n STREAMS key >`: reads as many new
-- entries as the rate limit allows (limit.lua) and charges the limit for those it got, in one
-- run, so no permit is taken and given back. Never blocks (a script cannot): when the group has
-- nothing new, it returns the stream's last id, and the reader waits with `XREAD BLOCK` from it.
-- Runs under maxmemory (allow-oom): it adds only the limiter's one small key. Prepended with
-- guard.lua, frame.lua and limit.lua.
--
-- KEYS: stream, the rate limit's key.
-- ARGV: group, consumer, most entries to read, then the rate limit (limit.lua's rate_spec:
--       mode, n, per us).
-- Returns {held back by the rate limit (new entries of the group it left unread), ms until the
-- limit lets the next pass, the stream's last id when nothing was read with permits free (else
-- ''), the XREADGROUP reply}.
local lim = rate_spec(ARGV, 4, KEYS[2])
local bad = wrong_types({{KEYS[1], 'stream'}, rate_check(lim)})
if bad then return redis.error_reply(bad) end
local want = tonumber(ARGV[3])
if want < 1 then return {0, 0, '', false} end
local now = rate_now()
local tat = rate_get(lim)
local free, wait = rate_free(lim, tat, now, want)
local reply = false
local got = 0
if free > 0 then
  reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', free, 'STREAMS', KEYS[1],
    '>')
  if reply then got = #reply[1][2] end
  rate_charge(lim, tat, now, got)
  if got == 0 then
    local top = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
    return {0, 0, top[1] and top[1][1] or '0-0', false}
  end
  -- The stream ran out, or the limit let all that was asked: it held nothing back.
  if got < free or free >= want then return {0, 0, '', reply} end
end
-- The limit held back what it did not let through: how many new entries wait for the group.
local held = 0
local groups = {}
if redis.call('EXISTS', KEYS[1]) == 1 then groups = redis.call('XINFO', 'GROUPS', KEYS[1]) end
for _, g in ipairs(groups) do
  local f = {}
  for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
  if f['name'] == ARGV[1] and type(f['lag']) == 'number' then
    held = math.min(want - got, f['lag'])
  end
end
if held > 0 and free > 0 then
  local _, next_wait = rate_free(lim, rate_after(lim, tat, now, got), now, 1)
  wait = next_wait
end
return {held, rate_ms(wait), '', reply}
