#!lua
-- needs: guard.lua
-- STEP_READ: a message's step record and the server's time, in one call: what a handler reads
-- at its first step. Called through `crate::steps::ReadSteps`.
--
-- KEYS: the record (K.steps:<id>). ARGV: none.
-- Returns {now in ms since the epoch (TIME), name, value, name, value, ...}; no pairs when the
-- record does not exist. A key of another type is refused with WRONGTYPE.
local bad = wrong_types({{KEYS[1], 'hash'}})
if bad then return redis.error_reply(bad) end
local t = redis.call('TIME')
local reply = {tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)}
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields do reply[i + 1] = fields[i] end
return reply
