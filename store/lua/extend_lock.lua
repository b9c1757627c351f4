-- Extends a lock only while this token holds it.
-- KEYS: lock. ARGV: token, ttl ms. Returns 1 when extended, 0 when not held.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
