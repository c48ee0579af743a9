-- RATE LIMIT: the limiter of a subscription's `.rate_limit(n, per)`, shared by every worker of
-- every instance, on the server's clock (TIME). Prepended (after guard.lua and frame.lua) to the
-- scripts that take from a limited queue: list/claim.lua, list/pop.lua, stream/read.lua.
--
-- A GCRA (generic cell rate algorithm): one number per limit, its theoretical arrival time `tat`
-- in microseconds. A message may pass at `now` when `tat + step - now <= per`, with
-- `step = per / n`; passing adds `step` to max(tat, now). So `n` may pass at once after a quiet
-- spell (the burst), and then one every `step`: in any window of length W at most
-- n + n * W / per pass. A `tat` at or before `now` is the same as none, so the state expires
-- `per` after the last pass and an idle limit costs no memory.
--
-- The whole-queue limit keeps `tat` in a string (`K.rate`); a per-key limit keeps one member per
-- key value in a sorted set (`K.rate.keys`), scored by its `tat`. Permits are charged only for
-- the messages taken in the same script run, so a run sent twice (a lost reply) charges only for
-- what each run took.

-- The server's clock in microseconds.
local function rate_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- `x` as an integer in text: redis.call turns a Lua number into text with 14 digits, too few
-- for microseconds since the epoch.
local function rate_num(x)
  return string.format('%.0f', x)
end

-- A limit from a script's arguments, starting at ARGV[first]: mode ('' none, 'all', 'key'), n,
-- per in microseconds, the header naming the key (mode 'key'); `key` is the limiter's key.
-- nil when there is no limit.
local function rate_spec(argv, first, key)
  local mode = argv[first]
  if mode == nil or mode == '' then return nil end
  local n, per = tonumber(argv[first + 1]), tonumber(argv[first + 2])
  local lim = {key = key, n = n, per = per, step = per / n, header = argv[first + 3]}
  lim.keyed = mode == 'key'
  return lim
end

-- The type check of the limiter's key: {key, wanted type}, or nil without a limit.
local function rate_check(lim)
  if not lim then return nil end
  return {lim.key, lim.keyed and 'zset' or 'string'}
end

-- How many of `want` may pass now under the state `tat` (nil = none), and the microseconds until
-- the next one may when none may.
local function rate_free(lim, tat, now, want)
  local base = math.max(tat or now, now)
  local free = math.floor((lim.per - (base - now)) / lim.step + 1e-9)
  if free >= 1 then return math.min(want, free), 0 end
  return 0, math.max(1, math.ceil(base + lim.step - lim.per - now))
end

-- The state after `took` passed under `tat` at `now`: rounded up, so rounding never lets one
-- more through.
local function rate_after(lim, tat, now, took)
  return math.ceil(math.max(tat or now, now) + took * lim.step)
end

-- The state of the whole-queue limit (a number or nil).
local function rate_get(lim)
  local v = redis.call('GET', lim.key)
  return v and tonumber(v) or nil
end

-- Charges `took` passes to the whole-queue limit; its key expires when it would be no limit.
local function rate_charge(lim, tat, now, took)
  if took < 1 then return end
  local after = rate_after(lim, tat, now, took)
  redis.call('SET', lim.key, rate_num(after), 'PX',
    math.max(1, math.ceil((after - now) / 1000)))
end

-- Milliseconds (rounded up) of `us` microseconds, for a reply.
local function rate_ms(us)
  return math.ceil(us / 1000)
end

-- The value of the header `name` of the list value `v`; '' for a raw value or a frame without it.
local function rate_key_of(v, name)
  local layout = frame_layout(v)
  if not layout then return '' end
  for _, h in ipairs(layout.headers) do
    if string.sub(v, h[1], h[2]) == name then return string.sub(v, h[3], h[4]) end
  end
  return ''
end

-- Most entries a per-key claim looks at, from the consuming end: a key held back keeps its
-- entries in place, and this bounds how far past them a claim looks for other keys.
local RATE_WINDOW = 1000

-- Takes up to `want` entries from the consuming (right) end of the list `queue`, as the limit
-- `lim` (nil = none) allows, and removes them. Returns the entries oldest first, how many of the
-- entries it could have taken the limit held back, and the ms until the limit lets the next pass
-- (0 when it held none back).
local function take(queue, want, lim)
  if not lim then
    local got = redis.call('LRANGE', queue, -want, -1)
    local out = {}
    for i = #got, 1, -1 do out[#out + 1] = got[i] end
    if #out > 0 then redis.call('LTRIM', queue, 0, -#out - 1) end
    return out, 0, 0
  end
  local now = rate_now()
  if not lim.keyed then
    local tat = rate_get(lim)
    local avail = math.min(want, redis.call('LLEN', queue))
    local free, wait = rate_free(lim, tat, now, avail)
    local out = {}
    if free > 0 then
      local got = redis.call('LRANGE', queue, -free, -1)
      for i = #got, 1, -1 do out[#out + 1] = got[i] end
      redis.call('LTRIM', queue, 0, -#out - 1)
      rate_charge(lim, tat, now, #out)
      local _, next_wait = rate_free(lim, rate_after(lim, tat, now, #out), now, 1)
      wait = next_wait
    end
    if avail == #out then wait = 0 end
    return out, avail - #out, rate_ms(wait)
  end
  -- Per key: oldest first through the window, each key charged in a table first and written
  -- once; held entries stay where they are, so a key's own order holds.
  redis.call('ZREMRANGEBYSCORE', lim.key, '-inf', rate_num(now))
  local keys, out, kept = {}, {}, {}
  local held, wait, scanned, last_taken = 0, nil, 0, 0
  while #out < want and scanned < RATE_WINDOW do
    local chunk = math.min(100, RATE_WINDOW - scanned)
    local got = redis.call('LRANGE', queue, -(scanned + chunk), -(scanned + 1))
    if #got == 0 then break end
    for i = #got, 1, -1 do
      if #out >= want then break end
      local v = got[i]
      scanned = scanned + 1
      local k = rate_key_of(v, lim.header)
      local s = keys[k]
      if not s then
        local score = redis.call('ZSCORE', lim.key, k)
        s = {tat = score and tonumber(score) or nil, took = 0}
        keys[k] = s
      end
      local free, w = rate_free(lim, rate_after(lim, s.tat, now, s.took), now, 1)
      if free > 0 then
        s.took = s.took + 1
        out[#out + 1] = v
        last_taken = scanned
      else
        held = held + 1
        kept[#kept + 1] = {scanned, v}
        if not wait or w < wait then wait = w end
      end
    end
    if #got < chunk then break end
  end
  if #out > 0 then
    -- Remove what was scanned up to the last entry taken, and put back what was held there.
    redis.call('LTRIM', queue, 0, -last_taken - 1)
    local back = {}
    for i = #kept, 1, -1 do
      if kept[i][1] < last_taken then back[#back + 1] = kept[i][2] end
    end
    for i = 1, #back, 1000 do
      redis.call('RPUSH', queue, unpack(back, i, math.min(i + 999, #back)))
    end
    local members = {}
    for k, s in pairs(keys) do
      if s.took > 0 then
        members[#members + 1] = rate_num(rate_after(lim, s.tat, now, s.took))
        members[#members + 1] = k
      end
    end
    for i = 1, #members, 1000 do
      redis.call('ZADD', lim.key, unpack(members, i, math.min(i + 999, #members)))
    end
    redis.call('PEXPIRE', lim.key, math.ceil(lim.per / 1000) + 1)
  end
  return out, held, wait and rate_ms(wait) or 0
end
