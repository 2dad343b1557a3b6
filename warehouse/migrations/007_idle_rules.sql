-- The idle policy each minute was judged by, stamped by the stream (its class's values, or a
-- GPUGAP_IDLE_RULES rule's over them): rollups and v_idle_now judge with what the stream's
-- alerts used. idle_after_minutes = 0 marks a row written before: judged by its class in
-- idle_policy, as then. The threshold is in basis points, like activity_max_bp.
ALTER TABLE gpu_minutes
    ADD COLUMN IF NOT EXISTS idle_threshold_bp UInt16 DEFAULT 0 CODEC(ZSTD(1)) AFTER no_samples,
    ADD COLUMN IF NOT EXISTS idle_after_minutes UInt16 DEFAULT 0 CODEC(ZSTD(1))
        AFTER idle_threshold_bp;

-- Allocations idle right now: every measured GPU-minute of the allocation's last N minutes of
-- data below its threshold (both as stamped on the rows, else its class's in idle_policy),
-- and the allocation still present in the latest minute.
CREATE OR REPLACE VIEW v_idle_now AS
WITH (
    -- each step narrows the next one's range: the latest day, its latest hour, its minute
    -- (conditions on toStartOfHour(minute) itself: the key's first column, so they prune)
    SELECT max(minute) FROM gpu_minutes
    WHERE toStartOfHour(minute) >= (
        SELECT max(hour) FROM gpu_hours WHERE hour >= (SELECT max(day) FROM gpu_days)
    ) - INTERVAL 1 HOUR
) AS latest,
greatest(
    (SELECT max(minutes) FROM idle_policy FINAL),
    (SELECT max(idle_after_minutes) FROM gpu_minutes
        WHERE toStartOfHour(minute) = toStartOfHour(latest) AND minute = latest)
) AS longest
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
WHERE g.minute > latest - toIntervalMinute(
    if(g.idle_after_minutes > 0, g.idle_after_minutes, p.minutes))
GROUP BY g.cluster, g.allocation_id
HAVING last_minute = latest
    AND max(g.consumed_ms / greatest(g.allocated_ms, 1)
        - if(g.idle_after_minutes > 0, g.idle_threshold_bp / 10000, p.threshold)) < 0;
