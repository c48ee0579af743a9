-- Bounds a stream as its publish policy says (`stream::Publish::maxlen`/`minid`), for the scripts
-- that re-add entries to a stream: settle.lua (stream retries), move_due.lua (due delayed
-- entries) and requeue.lua (dead letters). A bound is `''` (none), `maxlen:<n>` or
-- `minage:<ms>`. The trim is one XTRIM after the script's XADDs, which is what XADD's own MAXLEN
-- or MINID would do per entry, at one call.

-- An error reply's message when `spec` is not a bound, else nil (checked before any write).
local function bound_error(spec)
  if spec == '' or string.match(spec, '^maxlen:[1-9]%d*$') or string.match(spec, '^minage:[1-9]%d*$') then
    return nil
  end
  return 'RSARGS malformed stream bound `' .. tostring(spec) .. '`: expected maxlen:<n> or minage:<ms>'
end

-- Trims the stream `key` to `spec`: XTRIM key MAXLEN ~ n, or XTRIM key MINID ~ <server now - ms>.
-- Approximate: Redis drops whole macro nodes only. Called after the XADDs: if it failed, the
-- entries are added and the stream is trimmed by the next call instead.
local function bound(key, spec)
  local kind, n = string.match(spec, '^(%a+):(%d+)$')
  if kind == 'maxlen' then
    redis.call('XTRIM', key, 'MAXLEN', '~', n)
  elseif kind == 'minage' then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    redis.call('XTRIM', key, 'MINID', '~', string.format('%d-0', math.max(now - tonumber(n), 0)))
  end
end
