-- Adds one worker's counts of one subscription to its history and samples the queue's depth.
-- KEYS[1]: the minutes hash of the hour; KEYS[2]: the hours hash of the day;
-- KEYS[3..]: where depth is read (see ARGV[5]).
-- ARGV[1]: the minute of the hour (0-59); ARGV[2]: the hour of the day (0-23);
-- ARGV[3]: the minutes hash's ttl (s); ARGV[4]: the hours hash's ttl (s);
-- ARGV[5]: `list` (KEYS[3] the processing list, or the first queue level when ARGV[6] is
-- empty; the other KEYS the queue's levels), `stream` (KEYS[3] the stream, ARGV[6] its group),
-- or `none`; ARGV[6]: `processing` or the group's name, or empty;
-- ARGV[7..]: field, count pairs (`h` handled, `f` failed, `r` retried, `d` dead-lettered,
-- `t` timed out, `b<i>` handler times in bucket i).
-- Fields are `<minute>:<name>` (minutes hash) and `<hour>:<name>` (hours hash); `q` (waiting)
-- and `i` (in flight) are the last sample in a minute and the highest in an hour.
local m, h = ARGV[1] .. ':', ARGV[2] .. ':'
for i = 7, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], m .. ARGV[i], ARGV[i + 1])
  redis.call('HINCRBY', KEYS[2], h .. ARGV[i], ARGV[i + 1])
end

local waiting, running
if ARGV[5] == 'list' then
  local first = 3
  if ARGV[6] == 'processing' then
    running = redis.call('LLEN', KEYS[3])
    first = 4
  end
  waiting = 0
  for i = first, #KEYS do
    waiting = waiting + redis.call('LLEN', KEYS[i])
  end
elseif ARGV[5] == 'stream' then
  local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', KEYS[3])
  if ok then
    for _, g in ipairs(groups) do
      local f = {}
      for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
      if f['name'] == ARGV[6] then
        if type(f['lag']) == 'number' then waiting = f['lag'] end
        running = f['pending']
      end
    end
  end
end

local function sample(name, value)
  if value == nil then return end
  redis.call('HSET', KEYS[1], m .. name, value)
  local top = tonumber(redis.call('HGET', KEYS[2], h .. name) or '-1')
  if value > top then redis.call('HSET', KEYS[2], h .. name, value) end
end
sample('q', waiting)
sample('i', running)

redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[4])
return 0
