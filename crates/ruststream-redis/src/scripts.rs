//! The Lua scripts that make every state change atomic (design.md §4). Each is sent with
//! `EVALSHA` and loaded again on `NOSCRIPT`; every key a script touches is passed in `KEYS`, so on
//! a cluster they must share one hash slot (checked at startup).

use std::sync::LazyLock;

use fred::types::scripts::Script;

/// Claims up to `ARGV[1]` entries: `LMOVE queue processing RIGHT LEFT`, repeated.
///
/// `KEYS`: queue, processing. Returns the claimed values, oldest first.
pub static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r"
local out = {}
for i = 1, tonumber(ARGV[1]) do
  local v = redis.call('LMOVE', KEYS[1], KEYS[2], 'RIGHT', 'LEFT')
  if not v then break end
  out[i] = v
end
return out
",
    )
});

/// Settles a batch of claimed list entries.
///
/// `KEYS`: queue, processing, dead-letter list, delayed set, delayed payload hash.
/// `ARGV`: groups of four, `op claimed new arg`:
/// - `a`: ack, `LREM processing -1 claimed`;
/// - `r`: retry now, remove then `LPUSH queue new`;
/// - `d`: retry later, remove then schedule `new` under id `arg2` `arg` ms from now
///   (`ZADD delayed`, `HSET hash`); `arg` is `delay_ms:id`;
/// - `x`: dead, remove then `LPUSH dead new`.
///
/// A follow-up write happens only when the remove found the entry, so an entry that was
/// recovered meanwhile is not duplicated. Returns how many entries were found.
pub static SETTLE_LIST: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r"
local found = 0
local now = nil
for i = 1, #ARGV, 4 do
  local op = ARGV[i]
  if redis.call('LREM', KEYS[2], -1, ARGV[i + 1]) > 0 then
    found = found + 1
    if op == 'r' then
      redis.call('LPUSH', KEYS[1], ARGV[i + 2])
    elseif op == 'x' then
      redis.call('LPUSH', KEYS[3], ARGV[i + 2])
    elseif op == 'd' then
      if not now then
        local t = redis.call('TIME')
        now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      end
      local sep = string.find(ARGV[i + 3], ':', 1, true)
      local delay = tonumber(string.sub(ARGV[i + 3], 1, sep - 1))
      local id = string.sub(ARGV[i + 3], sep + 1)
      redis.call('ZADD', KEYS[4], now + delay, id)
      redis.call('HSET', KEYS[5], id, ARGV[i + 2])
    end
  end
end
return found
",
    )
});

/// Moves due entries of a delayed set to their list, earliest due first in line.
///
/// `KEYS`: delayed set, delayed payload hash, destination list. `ARGV`: most entries to move.
/// Returns `{moved, now_ms, next_due_ms or -1}` on the server's clock.
pub static MOVE_DUE: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for i = #ids, 1, -1 do
  local v = redis.call('HGET', KEYS[2], ids[i])
  if v then
    redis.call('RPUSH', KEYS[3], v)
    redis.call('HDEL', KEYS[2], ids[i])
  end
  redis.call('ZREM', KEYS[1], ids[i])
end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local due = -1
if nxt[2] then due = tonumber(nxt[2]) end
return {#ids, now, due}
",
    )
});

/// Schedules entries in a delayed set; an id already waiting keeps its first schedule.
///
/// `KEYS`: delayed set, delayed payload hash. `ARGV`: groups of four, `kind ms id value`, where
/// `kind` is `in` (ms from the server's now) or `at` (ms since the epoch). Returns how many were
/// scheduled (ids already waiting are not counted).
pub static SCHEDULE: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local added = 0
for i = 1, #ARGV, 4 do
  local due = tonumber(ARGV[i + 1])
  if ARGV[i] == 'in' then due = now + due end
  if redis.call('HSETNX', KEYS[2], ARGV[i + 2], ARGV[i + 3]) == 1 then
    redis.call('ZADD', KEYS[1], due, ARGV[i + 2])
    added = added + 1
  end
end
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
/// `KEYS`: stream, dead-letter list. `ARGV`: group, then per entry `op entry_id n v1..vn`:
/// `a` ack (`XACK`, n = 0); `r` retry (`XACK`, then `XADD stream * v1..vn`, the new entry's
/// field/value pairs); `x` dead (`XACK`, then `LPUSH dead v1`, n = 1). Follow-up writes happen
/// only when `XACK` found the entry pending. Returns how many were found.
pub static SETTLE_STREAM: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
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
    end
  end
  i = i + 3 + n
end
return found
",
    )
});
