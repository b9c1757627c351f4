-- Opens a run's stop with its proof deadline, only for a running run without one.
-- KEYS: stop, open stops set, deadlines, run. ARGV: stop json, run id, deadline
-- member, deadline score.
-- Returns 1 opened, 0 a stop is already open, -1 no such run, -2 not running.
local run = redis.call('GET', KEYS[4])
if not run then return -1 end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local ok, record = pcall(cjson.decode, run)
if not ok or type(record) ~= 'table' or record['state'] ~= 'running' then return -2 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SADD', KEYS[2], ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[3])
return 1
