-- The environment a script runs in on the in-memory Redis model, built as Redis 7 builds its
-- own (so a script fails on the model where it fails on Redis):
--
-- * globals are read-only: creating or assigning one fails with "Attempt to modify a readonly
--   table", reading an undefined one with "Script attempted to access nonexistent global
--   variable"; the libraries (string, table, math, coroutine, struct) and `redis` are read-only
--   views, so no run can change what the next one sees;
-- * KEYS and ARGV, fresh tables of strings for each run;
-- * redis.call raises a Redis error reply (its text is the script's error); redis.pcall returns
--   it as an error table {err = ..}; pcall hands a caught error to the script as its message,
--   as Redis 7.0 does;
-- * the base functions Redis keeps (no print, dofile, loadfile, require, module, getfenv,
--   setfenv, newproxy); loadstring and load compile into the run's environment.
--
-- Redis also has the cjson, bit and cmsgpack libraries; the model does not implement them, and
-- a script reading one fails with an error that says so.
--
-- This chunk runs once per Lua state, with the Rust functions below, and returns
-- new_env(call, pcall, keys, argv): the environment of one run, whose redis.call and redis.pcall
-- are `call` and `pcall` (Rust functions, like Redis's C ones: a Lua wrapper would lose the
-- script's frame on a tail call such as `return redis.call(..)`, and with it the error's line).

local struct_pack, struct_unpack, sha1hex_raw, log_raw, error_text = ...

local error, pairs, rawget, select, setmetatable, setfenv, tostring, type, unpack =
  error, pairs, rawget, select, setmetatable, setfenv, tostring, type, unpack
local raw_pcall, raw_loadstring, raw_load, concat = pcall, loadstring, load, table.concat

local function readonly()
  error('Attempt to modify a readonly table', 2)
end

-- A read-only view of the table `t`.
local function protect(t)
  return setmetatable({}, { __index = t, __newindex = readonly, __metatable = false })
end

local not_modelled = { cjson = true, bit = true, cmsgpack = true }

local function missing(_, name)
  if not_modelled[name] then
    error("Script attempted to access nonexistent global variable '" .. name
      .. "': Redis has the " .. name
      .. " library, the in-memory Redis model does not implement it", 2)
  end
  error("Script attempted to access nonexistent global variable '" .. tostring(name) .. "'", 2)
end

-- pcall as Redis 7.0 has it: a caught error table (or an error raised by redis.call or
-- struct, which reach Lua as Rust errors) reaches the script as its message.
local function caught(ok, ...)
  if ok then
    return true, ...
  end
  local e = ...
  if type(e) == 'table' and type(rawget(e, 'err')) == 'string' then
    return false, rawget(e, 'err')
  end
  if type(e) == 'userdata' then
    return false, error_text(e)
  end
  return false, e
end

local base = {
  _VERSION = _VERSION,
  assert = assert,
  collectgarbage = collectgarbage,
  error = error,
  gcinfo = gcinfo,
  getmetatable = getmetatable,
  ipairs = ipairs,
  next = next,
  pairs = pairs,
  pcall = function(f, ...)
    return caught(raw_pcall(f, ...))
  end,
  rawequal = rawequal,
  rawget = rawget,
  rawset = rawset,
  select = select,
  setmetatable = setmetatable,
  tonumber = tonumber,
  tostring = tostring,
  type = type,
  unpack = unpack,
  xpcall = xpcall,
}

local struct = { pack = struct_pack, unpack = struct_unpack }

local libraries = {
  coroutine = coroutine,
  math = math,
  string = string,
  struct = struct,
  table = table,
}

local wrong_arguments = { err = 'ERR wrong number or type of arguments' }

local redis_shared = {
  LOG_DEBUG = 0,
  LOG_VERBOSE = 1,
  LOG_NOTICE = 2,
  LOG_WARNING = 3,
  REDIS_VERSION = '7.2.0',
  REDIS_VERSION_NUM = 0x070200,
  -- A message with no error code gets Redis's generic one, ERR; a leading '-' is dropped.
  error_reply = function(message)
    if type(message) ~= 'string' then
      return { err = wrong_arguments.err }
    end
    if message:sub(1, 1) == '-' then
      message = message:sub(2)
    end
    if not message:find(' ', 1, true) then
      message = 'ERR ' .. message
    end
    return { err = message }
  end,
  status_reply = function(message)
    if type(message) ~= 'string' then
      return { err = wrong_arguments.err }
    end
    return { ok = message }
  end,
  sha1hex = function(text)
    if type(text) ~= 'string' and type(text) ~= 'number' then
      error('wrong number of arguments', 2)
    end
    return sha1hex_raw(text)
  end,
  log = function(level, ...)
    if type(level) ~= 'number' or select('#', ...) == 0 then
      error('redis.log() requires two arguments or more.', 2)
    end
    local parts = {}
    for i = 1, select('#', ...) do
      parts[i] = tostring((select(i, ...)))
    end
    log_raw(level, concat(parts, ' '))
  end,
}

return function(call, pcall, keys, argv)
  local env = {}
  local redis = { call = call, pcall = pcall }
  for name, value in pairs(redis_shared) do
    redis[name] = value
  end
  local vars = { KEYS = keys, ARGV = argv, _G = env, redis = protect(redis) }
  for name, value in pairs(base) do
    vars[name] = value
  end
  for name, library in pairs(libraries) do
    vars[name] = protect(library)
  end
  vars.loadstring = function(text, chunkname)
    local f, message = raw_loadstring(text, chunkname)
    if f then
      setfenv(f, env)
    end
    return f, message
  end
  vars.load = function(reader, chunkname)
    local f, message = raw_load(reader, chunkname)
    if f then
      setfenv(f, env)
    end
    return f, message
  end
  setmetatable(vars, { __index = missing })
  return setmetatable(env, { __index = vars, __newindex = readonly, __metatable = false })
end
