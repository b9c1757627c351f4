-- Takes the lease on a pending deadline.
-- KEYS: deadlines, lease. ARGV: member, worker id, lease ms.
-- Returns 1 when this caller holds the lease, 0 when the deadline is gone or leased.
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
if redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', ARGV[3]) then return 1 end
return 0
