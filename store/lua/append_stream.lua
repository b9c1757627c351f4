-- Appends entries to a run's stream and trims it, in one step, to at most a byte
-- budget and an entry cap, the oldest entries dropped first, exactly (XTRIM MINID).
-- An entry's size is the bytes of its values plus a fixed overhead; the bytes the
-- stream holds are kept in a field of a counter hash. A stream written before its
-- bytes were counted (no field yet) is counted once, here; an empty one holds 0
-- whatever the field says (the two keys may expire a moment apart).
-- KEYS: the stream, the counter hash.
-- ARGV: counter field, entry field, byte budget, entry cap, overhead per entry,
--       then one value per entry to append.
-- Returns the id of the last entry appended (false for none).
local stream, counter = KEYS[1], KEYS[2]
local name, field = ARGV[1], ARGV[2]
local budget, cap, extra = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

local function size(entry)
  local n = extra
  local values = entry[2]
  for i = 2, #values, 2 do
    n = n + #values[i]
  end
  return n
end

local length = redis.call('XLEN', stream)
local held = tonumber(redis.call('HGET', counter, name))
if length == 0 then
  held = 0
elseif held == nil then
  held = 0
  local start = '-'
  while true do
    local batch = redis.call('XRANGE', stream, start, '+', 'COUNT', 512)
    if #batch == 0 then break end
    for _, entry in ipairs(batch) do
      held = held + size(entry)
    end
    start = '(' .. batch[#batch][1]
  end
end

local last = false
for i = 6, #ARGV do
  last = redis.call('XADD', stream, '*', field, ARGV[i])
  held = held + #ARGV[i] + extra
  length = length + 1
end

if held > budget or length > cap then
  local keep = nil
  local start = '-'
  while keep == nil do
    local batch = redis.call('XRANGE', stream, start, '+', 'COUNT', 256)
    if #batch == 0 then break end
    for _, entry in ipairs(batch) do
      if held <= budget and length <= cap then
        keep = entry[1]
        break
      end
      held = held - size(entry)
      length = length - 1
    end
    start = '(' .. batch[#batch][1]
  end
  if keep == nil then
    -- Nothing may stay (only when the counter was wrong): start afresh.
    redis.call('XTRIM', stream, 'MAXLEN', 0)
    held = 0
  else
    redis.call('XTRIM', stream, 'MINID', keep)
  end
end
if length == 0 then held = 0 end
redis.call('HSET', counter, name, held)
return last
