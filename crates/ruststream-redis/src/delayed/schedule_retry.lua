-- Shared by the settle scripts: schedules a retry frame in a delayed set. `arg` is
-- `delay_ms:id`; the due time is the server's clock (TIME, read once per script) plus the delay.
local now = nil
local function schedule_retry(zset, hash, arg, frame)
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  local sep = string.find(arg, ':', 1, true)
  local id = string.sub(arg, sep + 1)
  redis.call('ZADD', zset, now + tonumber(string.sub(arg, 1, sep - 1)), id)
  redis.call('HSET', hash, id, frame)
end
