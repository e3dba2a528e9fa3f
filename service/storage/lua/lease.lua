-- Renew a run's lease, only while the run still holds it; with 'read', also record
-- that the job is about to read its dataset (the 'data_read' marker). From then on
-- a failure, or a worker that dies, is charged rather than refunded (settle.lua,
-- service/releases/sweeper.py): a refund that the data decides would be a side channel.
-- KEYS: 1 lease key, 2 release hash. ARGV: 1 run token, 2 lease ttl (s), 3 'renew' | 'read'
-- Returns 1 if the run holds the lease, 0 if it lost it (nothing is changed then).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[2], 'status') ~= 'running' then return 0 end
redis.call('EXPIRE', KEYS[1], ARGV[2])
if ARGV[3] == 'read' then redis.call('HSET', KEYS[2], 'data_read', '1') end
return 1
