-- Closes a stop only if it is byte for byte the one read: no longer open, its
-- deadlines removed, the closed state pushed on the run's capped history.
-- KEYS: stop, open stops set, deadlines, history. ARGV: expected json, closed json,
-- run id, history cap, proof member, end member.
-- Returns 1 when closed, 0 when the stop changed meanwhile.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[3])
redis.call('ZREM', KEYS[3], ARGV[5], ARGV[6])
redis.call('LPUSH', KEYS[4], ARGV[2])
redis.call('LTRIM', KEYS[4], 0, tonumber(ARGV[4]) - 1)
return 1
