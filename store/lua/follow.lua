-- Follows a run: its id in its target's set, the target in the followed targets.
-- KEYS: followed runs of the target, followed targets. ARGV: run id, target.
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('SADD', KEYS[2], ARGV[2])
return 1
