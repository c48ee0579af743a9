#!lua flags=no-writes
-- OLDEST_CLAIM: when the oldest claim recorded in a reliable list's recovery set was made. A member
-- is `<reader id>:<seq>.<run>` (a claimed batch; the per-entry form, one a claimed entry, adds
-- `:<value>`; see list/claim.lua), where `<run>` is the server's TIME (seconds.microseconds) of the
-- claim; the score is the last renewal, not the claim time.
--
-- KEYS: recovery set.
-- ARGV: most members to read.
-- Returns {members read, claim time of the oldest in ms since the epoch, or -1}.
local members = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
local oldest = -1
for _, m in ipairs(members) do
  local s, us = string.match(m, '^[^:]*:%d+%.(%d+)%.(%d+)')
  if s then
    local at = tonumber(s) * 1000 + math.floor(tonumber(us) / 1000)
    if oldest < 0 or at < oldest then oldest = at end
  end
end
return {#members, oldest}
