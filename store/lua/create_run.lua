-- Stores a new run record with its indexes, only if no run has this id.
-- KEYS: run, runs index, runs-of-target index. ARGV: record json, score, run id.
-- Returns 1 when created, 0 when the id was taken.
if redis.call('SET', KEYS[1], ARGV[1], 'NX') then
  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
  redis.call('ZADD', KEYS[3], ARGV[2], ARGV[3])
  return 1
end
return 0
