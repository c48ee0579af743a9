-- TAKE: the source part of a list claim: takes entries from the consuming (right) end of a
-- queue's levels, highest level first (a queue without levels is one level), and removes them.
-- With an entry filter (claim/gates.lua's gates_filter: a per-key rate limit), each entry is
-- looked at oldest first and one the filter refuses stays where it is, so each key's own order
-- holds.

-- Most entries a filtered take looks at per level: refused entries stay in place, and this
-- bounds how far past them a claim looks.
local TAKE_WINDOW = 1000

-- Takes up to `n` entries of the list `key` onto `out`, oldest first; returns how many.
local function take_plain(key, n, out)
  local got = redis.call('LRANGE', key, -n, -1)
  for i = #got, 1, -1 do out[#out + 1] = got[i] end
  if #got > 0 then redis.call('LTRIM', key, 0, -#got - 1) end
  return #got
end

-- Takes up to `n` entries of `key` the filter `accept` lets pass onto `out`, oldest first,
-- looking at TAKE_WINDOW at most; returns how many, how many it refused, and the shortest wait
-- (ms) the filter gave for a refused one.
local function take_filtered(key, n, out, accept)
  local kept = {}
  local took, refused, wait, scanned, last_taken = 0, 0, nil, 0, 0
  while took < n and scanned < TAKE_WINDOW do
    local chunk = math.min(100, TAKE_WINDOW - scanned)
    local got = redis.call('LRANGE', key, -(scanned + chunk), -(scanned + 1))
    if #got == 0 then break end
    for i = #got, 1, -1 do
      if took >= n then break end
      local v = got[i]
      scanned = scanned + 1
      local ok, w = accept(v)
      if ok then
        out[#out + 1] = v
        took = took + 1
        last_taken = scanned
      else
        refused = refused + 1
        kept[#kept + 1] = {scanned, v}
        if not wait or w < wait then wait = w end
      end
    end
    if #got < chunk then break end
  end
  if took > 0 then
    -- Remove what was looked at up to the last entry taken, and put back what was refused there.
    redis.call('LTRIM', key, 0, -last_taken - 1)
    local back = {}
    for i = #kept, 1, -1 do
      if kept[i][1] < last_taken then back[#back + 1] = kept[i][2] end
    end
    for i = 1, #back, 1000 do
      redis.call('RPUSH', key, unpack(back, i, math.min(i + 999, #back)))
    end
  end
  return took, refused, wait or 0
end

-- Takes up to `n` entries from `levels` (lowest first, as back.lua's list_dest has them), the highest
-- non-empty level first; `accept` is the gates' entry filter or nil. Returns the entries (oldest
-- of each level first), how many the filter refused, and its shortest wait (ms).
local function take_levels(levels, n, accept)
  local out, refused, wait = {}, 0, 0
  for l = #levels, 1, -1 do
    if #out >= n then break end
    if accept then
      local _, r, w = take_filtered(levels[l], n - #out, out, accept)
      if r > 0 and (refused == 0 or w < wait) then wait = w end
      refused = refused + r
    else
      take_plain(levels[l], n - #out, out)
    end
  end
  return out, refused, wait
end

-- How many entries the levels hold, counted up to `most`.
local function levels_len(levels, most)
  local n = 0
  for l = #levels, 1, -1 do
    if n >= most then break end
    n = n + redis.call('LLEN', levels[l])
  end
  return math.min(n, most)
end
