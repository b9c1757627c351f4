-- Ends the head delivery of a webhook's list for one run (delivered, or given up),
-- only if the head is byte for byte the one attempted; the next one is due at once.
-- KEYS: the list, hooks, tries, failures. ARGV: expected head, member, now (unix s),
-- failure record json ('' when delivered), failures cap.
-- Returns 1 when ended, 0 when the head changed meanwhile.
if redis.call('LINDEX', KEYS[1], 0) ~= ARGV[1] then return 0 end
redis.call('LPOP', KEYS[1])
redis.call('HDEL', KEYS[3], ARGV[2])
if ARGV[4] ~= '' then
  redis.call('LPUSH', KEYS[4], ARGV[4])
  redis.call('LTRIM', KEYS[4], 0, tonumber(ARGV[5]) - 1)
end
if redis.call('LLEN', KEYS[1]) > 0 then
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
else
  redis.call('ZREM', KEYS[2], ARGV[2])
end
return 1
