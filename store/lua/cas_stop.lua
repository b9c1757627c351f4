-- Replaces a stop only if it is byte for byte the one read, and moves its deadlines
-- in the same step.
-- KEYS: stop, deadlines. ARGV: expected json, new json, n, n members to remove, then
-- optionally a member to add and its score.
-- Returns 1 when replaced, 0 when the stop changed meanwhile.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
local n = tonumber(ARGV[3])
for i = 1, n do redis.call('ZREM', KEYS[2], ARGV[3 + i]) end
if #ARGV >= 5 + n then redis.call('ZADD', KEYS[2], ARGV[5 + n], ARGV[4 + n]) end
return 1
