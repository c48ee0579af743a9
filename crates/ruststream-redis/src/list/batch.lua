-- BATCH: the record of one claimed batch of a reliable list with recovery, shared by the claim
-- (list/claim.lua: records it, and its sweep reads it back) and the settle (list/settle.lua:
-- marks its entries settled). A claim call records its batch once: one member `<id>` in the
-- recovery set (`<reader id>:<first seq>.<run>`, scored by the last renewal), and two fields in
-- the batch hash: `<id>` = the batch's values, each `<length>:<bytes>`, in claim order, written
-- once; `<id>.s` = one byte per entry, `0` claimed, `1` settled. An entry is named to its
-- settle as `<id>/<index>` (index from 0). The last settle of a batch deletes its record.

-- Whether the recovery-set member `m` names a batch (else it is a claim of the old form,
-- `<reader id>:<seq>.<run>:<value>`, recorded before batches).
local function batch_id(m)
  return string.find(m, '^[^:]*:%d+%.%d+%.%d+$') ~= nil
end

-- The values t[from..to], packed as one string.
local function batch_pack(t, from, to)
  local parts = {}
  for i = from, to do
    parts[#parts + 1] = #t[i]
    parts[#parts + 1] = ':'
    parts[#parts + 1] = t[i]
  end
  return table.concat(parts)
end

-- The values packed in `s` (batch_pack), in order.
local function batch_unpack(s)
  local out, pos = {}, 1
  while pos <= #s do
    local c = string.find(s, ':', pos, true)
    if not c then break end
    local len = tonumber(string.sub(s, pos, c - 1))
    if not len then break end
    out[#out + 1] = string.sub(s, c + 1, c + len)
    pos = c + 1 + len
  end
  return out
end

-- The marks `s` with the entries at `idxs` (0-based, ascending, each once) marked settled.
local function batch_marked(s, idxs)
  local parts, pos = {}, 1
  for _, i in ipairs(idxs) do
    parts[#parts + 1] = string.sub(s, pos, i)
    parts[#parts + 1] = '1'
    pos = i + 2
  end
  parts[#parts + 1] = string.sub(s, pos)
  return table.concat(parts)
end
