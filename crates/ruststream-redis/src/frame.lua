-- The frame of a list value (see frame.rs), as the scripts read it. Prepended to the scripts
-- that rewrite or convert frames.

-- `v` with its attempt number raised by one; a raw value becomes a frame with attempt 2.
local function bump(v)
  if string.sub(v, 1, 4) == '\0rs1' and #v >= 8 then
    local a = struct.unpack('>I4', v, 5)
    return string.sub(v, 1, 4) .. struct.pack('>I4', a + 1) .. string.sub(v, 9)
  end
  return '\0rs1' .. struct.pack('>I4>I2>I2', 2, 0, 0) .. v
end

-- A frame's stream fields: `rs.id`, `rs.attempt`, the headers, `payload`; a raw value is just
-- `payload`.
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
