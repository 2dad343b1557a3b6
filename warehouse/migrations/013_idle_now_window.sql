-- v_idle_now says what it judged by: the idle window and threshold of each allocation (its
-- rows' stamped rule, else its class's in idle_policy), so a report or page states the
-- window in effect instead of a figure of its own (the report said 15 minutes; the default
-- is 10). Same rows and columns as 007's, these two added last.
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
    sum(g.allocated_ms) / 3600000 AS allocated_gpu_h,
    max(if(g.idle_after_minutes > 0, g.idle_after_minutes, p.minutes)) AS idle_minutes,
    max(if(g.idle_after_minutes > 0, g.idle_threshold_bp / 10000, p.threshold))
        AS idle_threshold
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
