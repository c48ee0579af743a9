-- needs: guard.lua frame.lua stream/bound.lua
-- BACK: the one way onto a queue for the scripts that put entries there: a retry
-- (list/settle.lua, stream/settle.lua), the recovery sweep (list/claim.lua), the delayed mover
-- (delayed/move_due.lua), the operator's requeue (operate/requeue.lua) and a unique publish
-- (unique/publish.lua). It alone knows a destination's shape: a list's priority levels (each
-- frame onto the level its `rs.priority` header names; a level above 0 that was empty announces
-- its first entry with a PUBLISH on its own name, since readers wait on level 0), a list's ttl,
-- a stream's fields (one XADD each, from the frame) and bound, a channel. A partition is a queue
-- of its own: the caller names the partition's keys.
--
-- In a caller's ARGV a destination is `kind, number of its keys, spec`, and its keys follow one
-- another in KEYS (the Rust side builds both: `crate::back::Dest`):
--   list     keys: its levels, lowest first (the queue alone without levels); spec: the list's
--            ttl in ms, set after a put ('0': none)
--   stream   keys: the stream; spec: its bound (bound.lua: '', maxlen:<n>, minage:<ms>)
--   sharded  keys: the channel (SPUBLISH obeys its slot as a key's); spec: ''
--   pubsub   keys: none; spec: the channel
--   groups   keys: a grouped list's queue (its inbox) and its ring (list/groups.rs); spec: the
--            ttl in ms set on a group's sub-queue after a put ('0': none). Each frame goes onto
--            its group's sub-queue `<ring>:<group>` (its `rs.group` header, '' without); a
--            group whose sub-queue was empty joins the ring (LPUSH: served after those in it)
--            and the ring's name gets a PUBLISH, since readers wait on the queue. A frame whose
--            group's key holds another type goes onto the default group '' instead (then onto
--            the inbox, when that key is wrong too).
-- A caller reads the destination (dest_of), checks its keys with the rest (dest_checks) and
-- turns every value into an item (dest_item) before its first write, then puts the items
-- (put_back).

-- The list destination of `levels` (lowest first) with a ttl of `ttl` ms (0: none).
local function list_dest(levels, ttl)
  return {kind = 'list', keys = levels, spec = tostring(ttl or 0), ttl = tonumber(ttl) or 0}
end

-- The groups destination of a grouped list: its queue (the inbox) and ring, with a ttl of `ttl`
-- ms on each sub-queue put to (0: none).
local function groups_dest(queue, ring, ttl)
  return {kind = 'groups', keys = {queue, ring}, spec = tostring(ttl or 0), ttl = tonumber(ttl) or 0}
end

-- The destination read from KEYS[key_at] and ARGV[arg_at] on; its `key_end` and `arg_end` are
-- the KEYS and ARGV indexes after it. nil and an error message when malformed.
local function dest_of(key_at, arg_at)
  local kind, nk, spec = ARGV[arg_at], tonumber(ARGV[arg_at + 1]), ARGV[arg_at + 2]
  if not nk or not spec or key_at + nk - 1 > #KEYS then
    return nil, 'RSARGS destination at argument ' .. arg_at .. ': short of keys or arguments'
  end
  local keys = {}
  for i = 0, nk - 1 do keys[#keys + 1] = KEYS[key_at + i] end
  local d
  if kind == 'list' and nk >= 1 and tonumber(spec) then
    d = list_dest(keys, spec)
  elseif kind == 'groups' and nk == 2 and tonumber(spec) then
    d = groups_dest(keys[1], keys[2], spec)
  elseif kind == 'stream' and nk == 1 then
    local e = bound_error(spec)
    if e then return nil, e end
    d = {kind = kind, keys = keys, spec = spec}
  elseif (kind == 'sharded' and nk == 1) or (kind == 'pubsub' and nk == 0 and spec ~= '') then
    d = {kind = kind, keys = keys, spec = spec}
  else
    return nil, 'RSARGS destination at argument ' .. arg_at .. ': malformed ' .. tostring(kind)
  end
  d.key_end, d.arg_end = key_at + nk, arg_at + 3
  return d
end

-- `checks` with the {key, type} pairs of `d`'s keys (see guard.lua's wrong_types).
local function dest_checks(d, checks)
  if d.kind == 'list' or d.kind == 'stream' or d.kind == 'groups' then
    local t = d.kind == 'stream' and 'stream' or 'list'
    for _, k in ipairs(d.keys) do checks[#checks + 1] = {k, t} end
  end
  return checks
end

-- What the frame `v` is on `d`, for put_back: the frame itself, or a stream entry's fields;
-- nil and why when it cannot go there (a stream entry takes one XADD, and Lua's unpack bounds
-- its fields).
local function dest_item(d, v)
  if d.kind ~= 'stream' then return v end
  local fields = frame_fields(v)
  if #fields > MAX_UNPACK - 2 then
    return nil, 'too-many-headers: ' .. #fields .. ' stream fields, more than one XADD can take'
  end
  return fields
end

-- The value of the header `name` of the frame `v`, or nil.
local function header_of(v, name)
  local layout = frame_layout(v)
  if not layout then return nil end
  for _, h in ipairs(layout.headers) do
    if string.sub(v, h[1], h[2]) == name then return string.sub(v, h[3], h[4]) end
  end
  return nil
end

-- The index into `levels` (1 = level 0) of the frame `v`: its `rs.priority` header; a value
-- without one is level 0, and a level past the highest is the highest.
local function level_of(v, levels)
  if #levels < 2 then return 1 end
  local l = tonumber(header_of(v, 'rs.priority'))
  if not l or l < 1 then return 1 end
  return math.min(math.floor(l), #levels - 1) + 1
end

-- Puts `items` (frames) onto the groups destination `d`, each onto its group's sub-queue, with
-- `cmd` (LPUSH or RPUSH); see the header.
local function put_groups(d, items, cmd)
  local queue, ring = d.keys[1], d.keys[2]
  local by, order = {}, {}
  -- A group whose key holds another type: its frames go to the default group '' (served, with
  -- their header unchanged), or when that key is wrong too, to the inbox.
  local usable = {}
  local function usable_group(g)
    if usable[g] == nil then
      local t = redis.call('TYPE', ring .. ':' .. g).ok
      usable[g] = t == 'list' or t == 'none'
    end
    return usable[g]
  end
  for _, v in ipairs(items) do
    local g = header_of(v, 'rs.group') or ''
    if not usable_group(g) then g = '' end
    if not by[g] then
      by[g] = {}
      order[#order + 1] = g
    end
    by[g][#by[g] + 1] = v
  end
  local joined = false
  for _, g in ipairs(order) do
    local vals, key = by[g], ring .. ':' .. g
    if not usable_group(g) then key = queue end
    local len = 0
    for i = 1, #vals, 1000 do
      len = redis.call(cmd, key, unpack(vals, i, math.min(i + 999, #vals)))
    end
    if key ~= queue and len == #vals then
      redis.call('LPUSH', ring, g)
      joined = true
    end
    if d.ttl > 0 then redis.call('PEXPIRE', key, d.ttl) end
  end
  if d.ttl > 0 and redis.call('EXISTS', ring) == 1 then redis.call('PEXPIRE', ring, d.ttl) end
  if joined then redis.call('PUBLISH', ring, '') end
end

-- Puts `items` (from dest_item) onto `d`, in their order: onto a list at the consuming end
-- (RPUSH: handled next, the last item first) when `next`, else behind what waits (LPUSH); onto a
-- stream with an XADD each, then one trim to its bound; onto a channel with a PUBLISH (SPUBLISH)
-- each. Returns how many were put.
local function put_back(d, items, next)
  if #items == 0 then return 0 end
  if d.kind == 'list' then
    local by = {}
    for l = 1, #d.keys do by[l] = {} end
    for _, v in ipairs(items) do
      local l = level_of(v, d.keys)
      by[l][#by[l] + 1] = v
    end
    local cmd = next and 'RPUSH' or 'LPUSH'
    for l, vals in ipairs(by) do
      if #vals > 0 then
        local len = 0
        for i = 1, #vals, 1000 do
          len = redis.call(cmd, d.keys[l], unpack(vals, i, math.min(i + 999, #vals)))
        end
        if l > 1 and len == #vals then redis.call('PUBLISH', d.keys[l], '') end
        if d.ttl > 0 then redis.call('PEXPIRE', d.keys[l], d.ttl) end
      end
    end
  elseif d.kind == 'groups' then
    put_groups(d, items, next and 'RPUSH' or 'LPUSH')
  elseif d.kind == 'stream' then
    for _, fields in ipairs(items) do redis.call('XADD', d.keys[1], '*', unpack(fields)) end
    bound(d.keys[1], d.spec)
  elseif d.kind == 'sharded' then
    for _, v in ipairs(items) do redis.call('SPUBLISH', d.keys[1], v) end
  else
    for _, v in ipairs(items) do redis.call('PUBLISH', d.spec, v) end
  end
  return #items
end
