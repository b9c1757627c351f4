-- Releases a lock only while this token holds it.
-- KEYS: lock. ARGV: token. Returns 1 when released, 0 when not held.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
