#!lua
-- needs: guard.lua back.lua
-- GROUP_PUSH: a publish onto a grouped list (list/groups.rs): each frame onto its group's
-- sub-queue (its `rs.group` header; '' without), a group that was empty joining the ring and
-- announced on the ring's name (back.lua's groups destination, the one way onto a queue).
-- Called through
-- `crate::list::groups::GroupPush`.
-- KEYS: the queue (its inbox), its ring. ARGV: the sub-queues' ttl in ms (0: none), the frames.
-- Returns how many were pushed. Refused under maxmemory (no allow-oom flag), like every publish.
local dest = groups_dest(KEYS[1], KEYS[2], ARGV[1])
if not tonumber(ARGV[1]) then return redis.error_reply('RSARGS group_push.lua: malformed ttl') end
local bad = wrong_types(dest_checks(dest, {}))
if bad then return redis.error_reply(bad) end
local items = {}
for i = 2, #ARGV do items[#items + 1] = ARGV[i] end
return put_back(dest, items, false)
