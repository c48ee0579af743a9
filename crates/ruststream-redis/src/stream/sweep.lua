-- SWEEP: a stream sweep's claim, run only by its deadline: XCLAIM of the entries a sweep found
-- pending longer than min_idle (XCLAIM takes only those still that idle), unless the server's
-- TIME is past the deadline (the call reached Redis late, and the leases of live consumers may
-- have aged meanwhile: `crate::sweep_clock`). Called through `stream::recover`'s `Sweep`.
-- KEYS: the stream.
-- ARGV: group, consumer, min_idle ms, deadline (server time in ms), the entry ids.
-- Returns {server time ms, the XCLAIM reply ({} past the deadline)}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ms = string.format('%d', now)
if now > tonumber(ARGV[4]) then return {ms, {}} end
return {ms, redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], unpack(ARGV, 5))}
