-- The frame of a list value, as the scripts read it: the same layout frame.rs defines,
--   MAGIC '\0rs1' | attempt u32 | id_len u16 | id | n u16 | n x (key_len u16 | key | len u32 | value) | payload
-- (big-endian). A value is a frame when it starts with MAGIC and every length fits in it; anything
-- else is a raw value. Prepended to the scripts that rewrite or convert frames.

-- The big-endian unsigned integer of `n` bytes of `v` at `pos`; nil past the end of `v`.
local function uint_at(v, pos, n)
  if pos + n - 1 > #v then return nil end
  local x = 0
  for i = pos, pos + n - 1 do x = x * 256 + string.byte(v, i) end
  return x
end

-- The layout of `v`: {attempt, id = {from, to}, headers = {{kfrom, kto, vfrom, vto}...},
-- payload = from}, or nil when `v` is not a frame.
local function frame_layout(v)
  if string.sub(v, 1, 4) ~= '\0rs1' then return nil end
  local attempt = uint_at(v, 5, 4)
  local idl = uint_at(v, 9, 2)
  if not attempt or not idl then return nil end
  local pos = 11
  local layout = {attempt = attempt, id = {pos, pos + idl - 1}, headers = {}}
  pos = pos + idl
  local n = uint_at(v, pos, 2)
  if not n then return nil end
  pos = pos + 2
  for i = 1, n do
    local kl = uint_at(v, pos, 2)
    if not kl then return nil end
    local k = {pos + 2, pos + 1 + kl}
    pos = pos + 2 + kl
    local vl = uint_at(v, pos, 4)
    if not vl then return nil end
    local val = {pos + 4, pos + 3 + vl}
    pos = pos + 4 + vl
    if pos - 1 > #v then return nil end
    layout.headers[i] = {k[1], k[2], val[1], val[2]}
  end
  layout.payload = pos
  return layout
end

-- `n` as 4 big-endian bytes.
local function u32_bytes(n)
  return string.char(math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256,
    math.floor(n / 256) % 256, n % 256)
end

-- `n` as 2 big-endian bytes.
local function u16_bytes(n)
  return string.char(math.floor(n / 256) % 256, n % 256)
end

-- `v` with the header `key: value` added (a raw value becomes the payload of a frame with
-- attempt 1 and that one header); `v` itself when it holds the most headers a frame can.
local function with_header(v, key, value)
  local h = u16_bytes(#key) .. key .. u32_bytes(#value) .. value
  local layout = frame_layout(v)
  if not layout then
    return '\0rs1' .. u32_bytes(1) .. u16_bytes(0) .. u16_bytes(1) .. h .. v
  end
  local n = #layout.headers
  if n >= 65535 then return v end
  return string.sub(v, 1, layout.id[2]) .. u16_bytes(n + 1) ..
    string.sub(v, layout.id[2] + 3, layout.payload - 1) .. h .. string.sub(v, layout.payload)
end

-- `v` delivered once more: a frame with its attempt raised by one (up to the u32 maximum), a raw
-- value as the payload of a frame with attempt 2 (its bytes unchanged inside).
local function bump(v)
  local layout = frame_layout(v)
  if layout then
    return '\0rs1' .. u32_bytes(math.min(layout.attempt + 1, 4294967295)) .. string.sub(v, 9)
  end
  return '\0rs1' .. u32_bytes(2) .. '\0\0\0\0' .. v
end

-- A frame's stream fields: `rs.id`, `rs.attempt`, the headers, `payload`; a raw value is just
-- `payload`.
local function frame_fields(v)
  local layout = frame_layout(v)
  if not layout then return {'payload', v} end
  local f = {'rs.id', string.sub(v, layout.id[1], layout.id[2]), 'rs.attempt', tostring(layout.attempt)}
  for _, h in ipairs(layout.headers) do
    f[#f + 1] = string.sub(v, h[1], h[2])
    f[#f + 1] = string.sub(v, h[3], h[4])
  end
  f[#f + 1] = 'payload'
  f[#f + 1] = string.sub(v, layout.payload)
  return f
end
