-- Records a failed attempt of the head delivery and when the next is due, only if
-- the head is byte for byte the one attempted.
-- KEYS: the list, hooks, tries. ARGV: expected head, member, attempts, next (unix s).
-- Returns 1 when recorded, 0 when the head changed meanwhile.
if redis.call('LINDEX', KEYS[1], 0) ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[2])
return 1
