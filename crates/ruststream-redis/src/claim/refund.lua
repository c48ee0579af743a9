#!lua flags=allow-oom
-- needs: guard.lua claim/limit.lua
-- REFUND: gives back ARGV[1] passes claim/reserve.lua took that the claim did not use (limit.lua's
-- rate_refund). Runs under maxmemory (allow-oom): it shrinks or deletes one small key.
-- Called through
-- `crate::claim::Refund`.
--
-- KEYS: the limiter's key.
-- ARGV: passes to give back, then the limit (limit.lua's rate_spec: mode 'all', n, per us,
--       header '').
-- Returns 1.
local lim = rate_spec(ARGV, 2, KEYS[1])
local bad = wrong_types({rate_check(lim)})
if bad then return redis.error_reply(bad) end
rate_refund(lim, tonumber(ARGV[1]))
return 1
