-- Stores a new run record with its indexes, only if no run has this id; a run in
-- `preparing` also enters the index of preparing runs, and a launch's run is mapped
-- from its idempotency key, all in this one step.
-- KEYS: run, runs index, runs-of-target index, preparing index, preparing keys hash,
--   the set of runs in the record's state, launch key (only with a key).
-- ARGV: record json, score, run id, "1" when the run is preparing else "0", launch key
--   ("" for none), the run id the launch key may map to now ("" for none: the key
--   must be free).
-- Returns 1 when created (or when the key already maps to this very run: a retry of
-- this creation whose reply was lost), 0 when the id was taken, -1 when the launch
-- key maps to another run than ARGV[6] says (then nothing changed).
if ARGV[5] ~= '' then
  local current = redis.call('GET', KEYS[7])
  if current == ARGV[3] then return 1 end
  if (current or '') ~= ARGV[6] then return -1 end
end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX') then return 0 end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[3])
redis.call('SADD', KEYS[6], ARGV[3])
if ARGV[4] == '1' then
  redis.call('ZADD', KEYS[4], ARGV[2], ARGV[3])
  if ARGV[5] ~= '' then redis.call('HSET', KEYS[5], ARGV[3], ARGV[5]) end
end
if ARGV[5] ~= '' then redis.call('SET', KEYS[7], ARGV[3]) end
return 1
