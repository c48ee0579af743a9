-- GROUPS_TOP: a grouped list's groups, for `inspect` (list/groups.rs): reads (only) the first
-- `most` groups of the ring and the length of each one's sub-queue. Called through
-- `crate::operate::groups::GroupsTop`.
-- KEYS: the queue (the inbox), the ring, the paused groups' hash. ARGV: most groups to read,
-- how many of the largest to return.
-- Returns {entries in the inbox, groups read, entries in them, paused groups,
-- name1, length1, paused1, ...} for the `top` largest, largest first (ties by name).
local most, top = tonumber(ARGV[1]), tonumber(ARGV[2])
local function len(key)
  if redis.call('TYPE', key).ok ~= 'list' then return 0 end
  return redis.call('LLEN', key)
end
local names = redis.call('LRANGE', KEYS[2], 0, most - 1)
local groups, total = {}, 0
for _, g in ipairs(names) do
  local n = len(KEYS[2] .. ':' .. g)
  total = total + n
  groups[#groups + 1] = {g, n}
end
table.sort(groups, function(a, b)
  if a[2] ~= b[2] then return a[2] > b[2] end
  return a[1] < b[1]
end)
local paused = 0
if redis.call('TYPE', KEYS[3]).ok == 'hash' then paused = redis.call('HLEN', KEYS[3]) end
local out = {len(KEYS[1]), #names, total, paused}
for i = 1, math.min(top, #groups) do
  local p = 0
  if paused > 0 and redis.call('HEXISTS', KEYS[3], groups[i][1]) == 1 then p = 1 end
  out[#out + 1] = groups[i][1]
  out[#out + 1] = groups[i][2]
  out[#out + 1] = p
end
return out
