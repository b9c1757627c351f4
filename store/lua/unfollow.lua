-- Stops following a run; a target left with no followed run is no longer followed.
-- KEYS: followed runs of the target, followed targets. ARGV: run id, target.
-- Returns 1 when the run was followed, else 0.
local removed = redis.call('SREM', KEYS[1], ARGV[1])
if redis.call('SCARD', KEYS[1]) == 0 then redis.call('SREM', KEYS[2], ARGV[2]) end
return removed
