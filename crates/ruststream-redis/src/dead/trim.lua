-- needs: frame.lua
-- A dead-letter list's bound, the part of every script that pushes dead letters (list/settle.lua,
-- stream/settle.lua, delayed/move_due.lua, dead/push.lua): each dead letter gets a `dead-at`
-- header (the server's ms since the epoch), and after the pushes the list is trimmed to its
-- most entries (exactly: LTRIM of the oldest, at its tail) and then the oldest are popped while
-- they died longer ago than the most age (at most DEAD_AGE_STEP a call, so one call's cost stays
-- bounded; the count bound holds whatever the ages). A tail without a `dead-at` (a value pushed
-- by another tool) stops the age trim until the count trims it.
-- A bound is `<max_len>:<max_age_ms>`, both at least 1 (`crate::dead::DeadBound`).

-- Most dead letters one call pops for their age.
local DEAD_AGE_STEP = 16

-- The bound `spec` says, {len = n, age = ms}, or nil when it is malformed.
local function dead_bound(spec)
  local len, age = string.match(spec or '', '^(%d+):(%d+)$')
  len, age = tonumber(len), tonumber(age)
  if not len or not age or len < 1 or age < 1 then return nil end
  return {len = len, age = age}
end

-- The server's now, in ms since the epoch.
local function dead_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The `dead-at` of the dead letter `v` (ms), or nil when it has none.
local function dead_at(v)
  local layout = frame_layout(v)
  if not layout then return nil end
  for _, h in ipairs(layout.headers) do
    if string.sub(v, h[1], h[2]) == 'dead-at' then
      return tonumber(string.sub(v, h[3], h[4]))
    end
  end
  return nil
end

-- `v` as a dead letter that died at `now`: its `dead-at` header set (an earlier one dropped).
local function dead_letter(v, now)
  local layout = frame_layout(v)
  if layout and dead_at(v) then
    local kept = {}
    for _, h in ipairs(layout.headers) do
      if string.sub(v, h[1], h[2]) ~= 'dead-at' then
        kept[#kept + 1] = string.sub(v, h[1] - 2, h[4])
      end
    end
    v = string.sub(v, 1, layout.id[2]) .. u16_bytes(#kept) .. table.concat(kept) ..
      string.sub(v, layout.payload)
  end
  return with_header(v, 'dead-at', string.format('%d', now))
end

-- Trims the dead-letter list `key` to the bound `b` at `now`; returns how many it removed.
local function dead_trim(key, b, now)
  local trimmed = 0
  local len = redis.call('LLEN', key)
  if len > b.len then
    redis.call('LTRIM', key, 0, b.len - 1)
    trimmed = len - b.len
  end
  for _ = 1, DEAD_AGE_STEP do
    local tail = redis.call('LINDEX', key, -1)
    if not tail then break end
    local at = dead_at(tail)
    if not at or at >= now - b.age then break end
    redis.call('RPOP', key)
    trimmed = trimmed + 1
  end
  return trimmed
end
