-- The registry's bound, the part of register.lua and fired.lua: each job has a keep-until time
-- in the seen hash (name -> epoch ms, the server's clock), pushed forward whenever an instance
-- registers the job or fires one of its ticks; a job whose time passed (its code was removed,
-- or no instance ran it for that long) is forgotten from the registry, the last-tick and the
-- seen hashes. A registry field without a seen one (written by an older version) is given one.

-- The server's now, in ms since the epoch.
local function periodic_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Marks `name` seen at `now`, kept `keep_ms`, then forgets every job of `registry`, `last` and
-- `seen` kept until before `now` (at most 1,000 a call, so one HDEL's unpack fits); returns how
-- many it forgot. One HGETALL and one HKEYS: a service has tens of jobs, not thousands.
local function periodic_forget(registry, last, seen, name, now, keep_ms)
  redis.call('HSET', seen, name, now + keep_ms)
  local known = {}
  local gone = {}
  local all = redis.call('HGETALL', seen)
  for i = 1, #all, 2 do
    known[all[i]] = true
    if (tonumber(all[i + 1]) or 0) < now and #gone < 1000 then gone[#gone + 1] = all[i] end
  end
  for _, job in ipairs(redis.call('HKEYS', registry)) do
    if not known[job] then redis.call('HSET', seen, job, now + keep_ms) end
  end
  if #gone > 0 then
    redis.call('HDEL', registry, unpack(gone))
    redis.call('HDEL', last, unpack(gone))
    redis.call('HDEL', seen, unpack(gone))
  end
  return #gone
end
