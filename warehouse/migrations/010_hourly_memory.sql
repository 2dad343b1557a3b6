-- The peak memory of each GPU-hour (the highest of its minutes' readings) and how many of its
-- measured minutes had a reading, for `gpugap recommend`'s MIG fit: it reads the hourly
-- rollup instead of every minute of the window. Hours rolled up before this migration read
-- 0 (memory unknown: no MIG recommendation rests on them) until the sink rolls them up again.
ALTER TABLE gpu_hours
    ADD COLUMN IF NOT EXISTS memory_max_mib UInt32 DEFAULT 0 AFTER activity_max,
    ADD COLUMN IF NOT EXISTS memory_minutes UInt16 DEFAULT 0 AFTER memory_max_mib;
