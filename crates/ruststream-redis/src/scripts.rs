//! The Lua scripts that make every state change atomic (design.md §4). Each is sent with
//! `EVALSHA` and loaded again on `NOSCRIPT`; every key a script touches is passed in `KEYS`, so on
//! a cluster they must share one hash slot (checked at startup).

use std::sync::LazyLock;

use fred::types::scripts::Script;

/// Claims up to `ARGV[1]` entries from the consuming (right) end of the queue into the
/// processing list: the same as that many `LMOVE queue processing RIGHT LEFT`, done as one
/// `LRANGE` + `LTRIM` + `LPUSH` (one `ZADD` for their claims), which costs Redis a third of the
/// per-entry calls (measured: see docs/benchmarks.md).
///
/// `KEYS`: queue, processing, and with recovery the recovery set.
/// `ARGV`: most entries to claim, reader id (`""`: no recovery), first claim sequence number,
/// `min_idle` ms, recovery-set ttl ms (0: none), most claims to recover.
///
/// With recovery, the script first sweeps: each claim scored older than `now - min_idle` leaves
/// the set, and its entry goes from the processing list back to the queue with its attempt
/// number raised by one (a raw value becomes a frame with attempt 2). Then every claim is
/// recorded in the set as `<reader id>:<seq>:<value>` scored by the server's clock, so two claims
/// of identical bytes are two members. Returns `{recovered, value...}`, oldest first.
pub static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r"
local function bump(v)
  if string.sub(v, 1, 4) == '\0rs1' and #v >= 8 then
    local a = struct.unpack('>I4', v, 5)
    return string.sub(v, 1, 4) .. struct.pack('>I4', a + 1) .. string.sub(v, 9)
  end
  return '\0rs1' .. struct.pack('>I4>I2>I2', 2, 0, 0) .. v
end
local out = {0}
local rid = ARGV[2]
local now = 0
if rid ~= '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local stale = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now - tonumber(ARGV[4]),
    'LIMIT', 0, tonumber(ARGV[6]))
  for _, m in ipairs(stale) do
    redis.call('ZREM', KEYS[3], m)
    local p = string.find(m, ':', 1, true)
    local q = string.find(m, ':', p + 1, true)
    local v = string.sub(m, q + 1)
    if redis.call('LREM', KEYS[2], '-1', v) > 0 then
      redis.call('LPUSH', KEYS[1], bump(v))
      out[1] = out[1] + 1
    end
  end
end
local n = tonumber(ARGV[1])
if n < 1 then return out end
local taken = redis.call('LRANGE', KEYS[1], -n, -1)
local m = #taken
if m == 0 then return out end
redis.call('LTRIM', KEYS[1], 0, -m - 1)
for i = m, 1, -1 do out[#out + 1] = taken[i] end
for i = 2, m + 1, 1000 do
  redis.call('LPUSH', KEYS[2], unpack(out, i, math.min(i + 999, m + 1)))
end
if rid ~= '' then
  local seq = tonumber(ARGV[3])
  local members = {}
  for i = 2, m + 1 do
    members[#members + 1] = now
    members[#members + 1] = rid .. ':' .. (seq + i - 2) .. ':' .. out[i]
  end
  for i = 1, #members, 1000 do
    redis.call('ZADD', KEYS[3], unpack(members, i, math.min(i + 999, #members)))
  end
  if tonumber(ARGV[5]) > 0 then redis.call('PEXPIRE', KEYS[3], ARGV[5]) end
end
return out
",
    )
});

/// Lua shared by the settle scripts: schedules a retry frame in a delayed set. `arg` is
/// `delay_ms:id`; the due time is the server's clock (`TIME`, read once per script) plus the delay.
const SCHEDULE_RETRY: &str = r"
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
";

/// Settles a batch of claimed list entries.
///
/// `KEYS`: queue, processing, dead-letter list, delayed set, delayed payload hash, and with
/// recovery the recovery set.
/// `ARGV`: groups of five, `op claimed new arg member`:
/// - `a`: ack, `LREM processing -1 claimed`;
/// - `r`: retry now, remove then `LPUSH queue new`;
/// - `d`: retry later, remove then schedule `new` (`ZADD delayed`, `HSET hash`); `arg` is
///   `delay_ms:id`, the delay counted on the server's clock;
/// - `x`: dead, remove then `LPUSH dead new`.
///
/// `member` is the claim's member in the recovery set (`""` without recovery). The claim is
/// still this worker's only when its member is still in the set (a sweep may have handed the
/// entry to another worker); then the entry is removed from the processing list, and only when
/// that finds it do the follow-up writes happen, so nothing is duplicated. Returns how many
/// claims were still owned.
pub static SETTLE_LIST: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(format!(
        "{SCHEDULE_RETRY}{}",
        r"
local found = 0
for i = 1, #ARGV, 5 do
  local op = ARGV[i]
  local owned
  if ARGV[i + 4] ~= '' then
    owned = redis.call('ZREM', KEYS[6], ARGV[i + 4]) == 1
      and redis.call('LREM', KEYS[2], '-1', ARGV[i + 1]) > 0
  else
    owned = redis.call('LREM', KEYS[2], '-1', ARGV[i + 1]) > 0
  end
  if owned then
    found = found + 1
    if op == 'r' then
      redis.call('LPUSH', KEYS[1], ARGV[i + 2])
    elseif op == 'x' then
      redis.call('LPUSH', KEYS[3], ARGV[i + 2])
    elseif op == 'd' then
      schedule_retry(KEYS[4], KEYS[5], ARGV[i + 3], ARGV[i + 2])
    end
  end
end
return found
"
    ))
});

/// Lua that turns a list frame (see [`frame`](crate::frame)) into stream fields:
/// `rs.id`, `rs.attempt`, the headers, `payload`. A raw value is just `payload`.
const FRAME_TO_FIELDS: &str = r"
local function frame_fields(v)
  if string.sub(v, 1, 4) ~= '\0rs1' or #v < 12 then return {'payload', v} end
  local attempt, pos = struct.unpack('>I4', v, 5)
  local len
  len, pos = struct.unpack('>I2', v, pos)
  local f = {'rs.id', string.sub(v, pos, pos + len - 1), 'rs.attempt', tostring(attempt)}
  pos = pos + len
  local n
  n, pos = struct.unpack('>I2', v, pos)
  for _ = 1, n do
    len, pos = struct.unpack('>I2', v, pos)
    f[#f + 1] = string.sub(v, pos, pos + len - 1)
    pos = pos + len
    len, pos = struct.unpack('>I4', v, pos)
    f[#f + 1] = string.sub(v, pos, pos + len - 1)
    pos = pos + len
  end
  f[#f + 1] = 'payload'
  f[#f + 1] = string.sub(v, pos)
  return f
end
";

/// Moves due entries of a delayed set to their destination, earliest due first in line.
///
/// `KEYS`: delayed set, delayed payload hash, destination (list or stream).
/// `ARGV`: most entries to move, `list` or `stream`. A list gets the frames with `RPUSH` (the
/// consuming end, since the entries are already due), latest first so the earliest is taken
/// first; a stream gets an `XADD` of each frame's fields, earliest first. One `HMGET`, one
/// variadic `RPUSH`, `HDEL` and `ZREM` per call rather than four commands per entry (the
/// delayed benchmark's Redis CPU per message). Returns
/// `{moved, now_ms, next_due_ms or -1, lateness_ms...}` on the server's clock.
pub static MOVE_DUE: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(format!(
        "{FRAME_TO_FIELDS}{}",
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[1]))
local out = {0, now, -1}
if #due > 0 then
  local ids = {}
  for i = 1, #due, 2 do ids[#ids + 1] = due[i] end
  local vals = redis.call('HMGET', KEYS[2], unpack(ids))
  local stream = ARGV[2] == 'stream'
  local from, to, step = #ids, 1, -1
  if stream then from, to, step = 1, #ids, 1 end
  local push = {}
  for j = from, to, step do
    local v = vals[j]
    if v then
      if stream then
        redis.call('XADD', KEYS[3], '*', unpack(frame_fields(v)))
      else
        push[#push + 1] = v
      end
      out[#out + 1] = now - tonumber(due[2 * j])
    end
  end
  out[1] = #out - 3
  if #push > 0 then redis.call('RPUSH', KEYS[3], unpack(push)) end
  redis.call('HDEL', KEYS[2], unpack(ids))
  redis.call('ZREM', KEYS[1], unpack(ids))
end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if nxt[2] then out[3] = tonumber(nxt[2]) end
return out
"
    ))
});

/// Schedules entries in a delayed set; an id already waiting keeps its first schedule.
///
/// `KEYS`: delayed set, delayed payload hash. `ARGV`: groups of four, `kind ms id value`, where
/// `kind` is `in` (ms from the server's now) or `at` (ms since the epoch). When an entry becomes
/// the earliest in the set, `PUBLISH <delayed set> ''` wakes the readers of the destination so
/// they shorten their wait. Returns how many were scheduled (ids already waiting do not count).
pub static SCHEDULE: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local earliest = tonumber(first[2])
local wake = false
local added = 0
for i = 1, #ARGV, 4 do
  local due = tonumber(ARGV[i + 1])
  if ARGV[i] == 'in' then due = now + due end
  if redis.call('HSETNX', KEYS[2], ARGV[i + 2], ARGV[i + 3]) == 1 then
    redis.call('ZADD', KEYS[1], due, ARGV[i + 2])
    added = added + 1
    if not earliest or due < earliest then
      earliest = due
      wake = true
    end
  end
end
if wake then redis.call('PUBLISH', KEYS[1], '') end
return added
",
    )
});

/// `LPUSH` values, then `PEXPIRE` the list, atomically.
///
/// `KEYS`: list. `ARGV`: ttl in ms, then the values. Returns the list's length.
pub static PUSH_TTL: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r"
local n = 0
for i = 2, #ARGV, 1000 do
  n = redis.call('LPUSH', KEYS[1], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return n
",
    )
});

/// Settles a batch of stream entries of one consumer group.
///
/// `KEYS`: stream, dead-letter list, delayed set, delayed payload hash. `ARGV`: group, then per
/// entry `op entry_id n v1..vn`: `a` ack (`XACK`, n = 0); `r` retry now (`XACK`, then
/// `XADD stream * v1..vn`, the new entry's field/value pairs); `d` retry later (`XACK`, then
/// schedule frame `v2` after `v1` = `delay_ms:id`, n = 2); `x` dead (`XACK`, then
/// `LPUSH dead v1`, n = 1). Follow-up writes happen only when `XACK` found the entry pending.
/// Returns how many were found.
pub static SETTLE_STREAM: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(format!(
        "{SCHEDULE_RETRY}{}",
        r"
local found = 0
local i = 2
while i <= #ARGV do
  local op = ARGV[i]
  local n = tonumber(ARGV[i + 2])
  if redis.call('XACK', KEYS[1], ARGV[1], ARGV[i + 1]) > 0 then
    found = found + 1
    if op == 'r' then
      redis.call('XADD', KEYS[1], '*', unpack(ARGV, i + 3, i + 2 + n))
    elseif op == 'x' then
      redis.call('LPUSH', KEYS[2], ARGV[i + 3])
    elseif op == 'd' then
      schedule_retry(KEYS[3], KEYS[4], ARGV[i + 3], ARGV[i + 4])
    end
  end
  i = i + 3 + n
end
return found
"
    ))
});
