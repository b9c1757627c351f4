-- Takes the lease on a webhook's deliveries for one run, when they are due.
-- KEYS: hooks. ARGV: member, now (unix s), lease end (unix s).
-- Returns 1 when this caller holds it (its score moved to the lease end), 0 when the
-- member is gone or not due (another holds it, or it waits for its next attempt).
local due = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not due or tonumber(due) > tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], 'XX', ARGV[3], ARGV[1])
return 1
