-- Priority levels of a list queue, as the scripts that put entries onto one read them. `levels`
-- is the keys of the levels, lowest first ({queue, queue.p1, ..}); a queue without levels is
-- {queue}. A frame carries its level in the `rs.priority` header; a value without one (a raw
-- value, a publish without a priority) is level 0, and a level past the highest is the highest.
-- Prepended after frame.lua.

-- The levels of a script whose KEYS hold the queue at `queue` and, from `first` on, its levels
-- above 0.
local function levels_of(queue, first)
  local levels = {KEYS[queue]}
  for i = first, #KEYS do levels[#levels + 1] = KEYS[i] end
  return levels
end

-- The index into `levels` (1 = level 0) of the frame `v`.
local function level_of(v, levels)
  if #levels < 2 then return 1 end
  local layout = frame_layout(v)
  if not layout then return 1 end
  for _, h in ipairs(layout.headers) do
    if string.sub(v, h[1], h[2]) == 'rs.priority' then
      local l = tonumber(string.sub(v, h[3], h[4]))
      if not l or l < 1 then return 1 end
      return math.min(math.floor(l), #levels - 1) + 1
    end
  end
  return 1
end

-- Pushes `vals` onto the level at index `l` (LPUSH, or RPUSH when `right`: the consuming end).
-- A level above 0 that was empty before announces its first entry with a PUBLISH on its own
-- name: readers wait on level 0's list and would not see it otherwise.
local function push_onto(levels, l, vals, right)
  local cmd = right and 'RPUSH' or 'LPUSH'
  local len = 0
  for i = 1, #vals, 1000 do
    len = redis.call(cmd, levels[l], unpack(vals, i, math.min(i + 999, #vals)))
  end
  if l > 1 and len == #vals then redis.call('PUBLISH', levels[l], '') end
end

-- Pushes `v` onto its own level (see push_onto).
local function push_level(levels, v, right)
  push_onto(levels, level_of(v, levels), {v}, right)
end

-- The wrong_types checks of every level.
local function level_checks(checks, levels)
  for i = 2, #levels do checks[#checks + 1] = {levels[i], 'list'} end
  return checks
end
