#!lua flags=allow-oom
-- needs: guard.lua claim/limit.lua
-- RESERVE: takes up to ARGV[1] passes of a whole-queue rate limit for a claim that runs in other
-- slots (a partitioned queue's partitions each live in a slot of their own; the limiter in the
-- logical queue's). Charged now, before the claim; what the claim does not use goes back with
-- claim/refund.lua. Runs under maxmemory (allow-oom): it writes one small key. Called through
-- `crate::claim::Reserve`.
--
-- KEYS: the limiter's key.
-- ARGV: most passes to take, then the limit (limit.lua's rate_spec: mode 'all', n, per us,
--       header '').
-- Returns {passes taken, ms until the next may pass when none could}.
local lim = rate_spec(ARGV, 2, KEYS[1])
local bad = wrong_types({rate_check(lim)})
if bad then return redis.error_reply(bad) end
local want = tonumber(ARGV[1])
if want < 1 then return {0, 0} end
local got, wait = rate_reserve(lim, want)
return {got, wait}
