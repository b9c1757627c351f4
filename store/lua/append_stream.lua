-- Appends entries to a run's stream and trims it, in one step, to at most a byte
-- budget and an entry cap, the oldest entries dropped first, exactly.
-- An entry's size is the bytes of its value plus a fixed overhead. Its id is
-- `<n>-1`, n the bytes the stream had taken in before it (its start; sequence 1,
-- as 0-0 is no id); a field of the counter hash keeps the start of the next one.
-- So the bytes from an entry to the end are the counter minus its start, and
-- trimming to the budget is one XTRIM MINID, nothing read. A stream written before
-- its bytes were counted (time ids, no field) goes on after its newest id; its old
-- entries go once a budget's worth of new ones came.
-- KEYS: the stream, the counter hash.
-- ARGV: counter field, entry field, byte budget, entry cap, overhead per entry,
--       then one value per entry to append.
-- Returns the id of the last entry appended (false for none).
local stream, counter = KEYS[1], KEYS[2]
local name, field = ARGV[1], ARGV[2]
local budget, cap, extra = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

local total = tonumber(redis.call('HGET', counter, name)) or 0
local newest = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
if #newest > 0 then
  -- Never below the newest id (a counter lost or behind): ids only grow.
  local start = tonumber(string.match(newest[1][1], '^(%d+)'))
  if start >= total then total = start + 1 end
end

local last = false
for i = 6, #ARGV do
  last = redis.call('XADD', stream, string.format('%.0f-1', total), field, ARGV[i])
  total = total + #ARGV[i] + extra
end
if last then
  if total > budget then
    redis.call('XTRIM', stream, 'MINID', string.format('%.0f', total - budget))
  end
  redis.call('XTRIM', stream, 'MAXLEN', cap)
  redis.call('HSET', counter, name, string.format('%.0f', total))
end
return last
