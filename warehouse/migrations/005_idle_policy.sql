-- The idle policy per workload class ('' = no class), the one the stream's alerts use: the sink
-- writes it from GPUGAP_IDLE_* when it starts (these rows are the defaults). Rollups count idle
-- minutes and v_idle_now judges allocations with it (both said 0.05 in their SQL before).
CREATE TABLE IF NOT EXISTS idle_policy
(
    workload_class LowCardinality(String),
    threshold Float64,
    minutes UInt32,
    updated_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(updated_at)
ORDER BY workload_class;

INSERT INTO idle_policy
SELECT c, 0.05, 10, toDateTime64('1970-01-01 00:00:00', 3, 'UTC')
FROM (SELECT arrayJoin(['', 'batch', 'service', 'interactive']) AS c);

-- Allocations idle right now: every measured GPU-minute of the last N minutes of data below
-- the threshold, N and threshold from the allocation's class in idle_policy, and the
-- allocation still present in the latest minute.
CREATE OR REPLACE VIEW v_idle_now AS
WITH (
    -- each step narrows the next one's range: the latest day, its latest hour, its minute
    -- (conditions on toStartOfHour(minute) itself: the key's first column, so they prune)
    SELECT max(minute) FROM gpu_minutes
    WHERE toStartOfHour(minute) >= (
        SELECT max(hour) FROM gpu_hours WHERE hour >= (SELECT max(day) FROM gpu_days)
    ) - INTERVAL 1 HOUR
) AS latest,
(SELECT max(minutes) FROM idle_policy FINAL) AS longest
SELECT
    g.cluster AS cluster, g.allocation_id AS allocation_id, any(g.scheduler) AS scheduler,
    any(g.workload_class) AS workload_class, any(g.owner) AS owner, any(g.team) AS team,
    uniqExact(g.gpu_uuid) AS gpus, min(g.minute) AS since, max(g.minute) AS last_minute,
    sum(g.consumed_ms) / greatest(sum(g.allocated_ms), 1) AS activity,
    sum(g.allocated_ms) / 3600000 AS allocated_gpu_h
FROM (
    SELECT * FROM gpu_minutes FINAL
    WHERE toStartOfHour(minute) >= toStartOfHour(latest - toIntervalMinute(longest))
        AND minute > latest - toIntervalMinute(longest) AND allocation_id != ''
        AND no_samples = 0
) AS g
INNER JOIN (SELECT * FROM idle_policy FINAL) AS p ON p.workload_class = g.workload_class
WHERE g.minute > latest - toIntervalMinute(p.minutes)
GROUP BY g.cluster, g.allocation_id
HAVING last_minute = latest
    AND max(g.consumed_ms / greatest(g.allocated_ms, 1) - p.threshold) < 0;
