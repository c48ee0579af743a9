#!lua flags=allow-oom
-- POP: a rate-limited simple list's `RPOP key n`: takes up to ARGV[1] entries from the consuming
-- (right) end, as many as the rate limit allows (limit.lua's `take`). Runs under maxmemory
-- (allow-oom): it removes entries, and its limiter state is one small key. Prepended with
-- guard.lua, frame.lua and limit.lua.
--
-- KEYS: queue, the rate limit's key.
-- ARGV: most entries to take, then the rate limit (limit.lua's rate_spec: mode, n, per us,
--       header).
-- Returns {held back by the rate limit, ms until the limit lets the next pass, value...}, values
-- oldest first.
local lim = rate_spec(ARGV, 2, KEYS[2])
local bad = wrong_types({{KEYS[1], 'list'}, rate_check(lim)})
if bad then return redis.error_reply(bad) end
local want = tonumber(ARGV[1])
if want < 1 then return {0, 0} end
local taken, held, wait = take(KEYS[1], want, lim)
local out = {held, wait}
for i = 1, #taken do out[#out + 1] = taken[i] end
return out
