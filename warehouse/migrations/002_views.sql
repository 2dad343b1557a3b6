-- The interface for reports and BI tools. All GPU figures are GPU-hours.

-- Allocated vs consumed per hour, GPU and allocation, with every dimension; group it by any
-- of them. measured = allocated time with telemetry; the gap is measured - consumed (time
-- without telemetry is reported as unmeasured, never as idle or consumed). Rows come from
-- the rollup as they are (FINAL: one per key, correct before merges): no second aggregation.
CREATE OR REPLACE VIEW v_capacity_gap AS
SELECT
    hour, cluster, node, gpu_uuid, scheduler, workload_class, team, owner, allocation_id,
    allocated_s / 3600 AS allocated_gpu_h,
    (allocated_s - unmeasured_s) / 3600 AS measured_gpu_h,
    consumed_gpu_s / 3600 AS consumed_gpu_h,
    (allocated_s - unmeasured_s - consumed_gpu_s) / 3600 AS gap_gpu_h,
    unmeasured_s / 3600 AS unmeasured_gpu_h,
    idle_minutes / 60 AS idle_gpu_h
FROM gpu_hours FINAL
WHERE allocation_id != '';

-- Allocation metadata, merged (FINAL: correct before background merges, and much cheaper
-- than grouping every allocation on each read).
CREATE OR REPLACE VIEW v_allocations AS
SELECT
    cluster, allocation_id, scheduler, name, owner, team, workload_class, partition, qos,
    gang_id, gang_size, gpus_requested, nodes, time_limit_s, submit_time, start_time, end_time,
    final_state, exit_code, interactive,
    if(end_time IS NULL, NULL, dateDiff('millisecond', start_time, end_time) / 1000) AS elapsed_s
FROM allocations FINAL;

-- The same per day and node, from the daily rollup: what reports and "all time" questions
-- read (a few hundred rows a day for a thousand GPUs).
CREATE OR REPLACE VIEW v_capacity_gap_daily AS
SELECT
    day, cluster, node, scheduler, workload_class, team, owner, allocation_id, gpus,
    allocated_s / 3600 AS allocated_gpu_h,
    (allocated_s - unmeasured_s) / 3600 AS measured_gpu_h,
    consumed_gpu_s / 3600 AS consumed_gpu_h,
    (allocated_s - unmeasured_s - consumed_gpu_s) / 3600 AS gap_gpu_h,
    unmeasured_s / 3600 AS unmeasured_gpu_h,
    idle_minutes / 60 AS idle_gpu_h
FROM gpu_days FINAL
WHERE allocation_id != '';

-- Waste per allocation, largest absolute gap first (never ranked by percentage). Metadata
-- (name, requested GPUs, final state) is in v_allocations: join it to the rows you keep
-- (WHERE allocation_id IN ...), not to every allocation.
CREATE OR REPLACE VIEW v_top_waste AS
SELECT
    cluster, allocation_id, any(scheduler) AS scheduler, any(workload_class) AS workload_class,
    any(team) AS team, any(owner) AS owner, min(day) AS first_day, max(day) AS last_day,
    sum(allocated_gpu_h) AS allocated_gpu_h, sum(consumed_gpu_h) AS consumed_gpu_h,
    sum(gap_gpu_h) AS gap_gpu_h, sum(unmeasured_gpu_h) AS unmeasured_gpu_h
FROM v_capacity_gap_daily
GROUP BY cluster, allocation_id
ORDER BY gap_gpu_h DESC;

-- Capacity nobody held, and activity on it (unattributed use: missing events, or work
-- running outside the scheduler), per day and node; per GPU-hour in gpu_hours.
CREATE OR REPLACE VIEW v_unallocated AS
SELECT
    day, cluster, node, gpus,
    unallocated_s / 3600 AS unallocated_gpu_h,
    consumed_gpu_s / 3600 AS unattributed_gpu_h
FROM gpu_days FINAL
WHERE allocation_id = '';

CREATE OR REPLACE VIEW v_unattributed AS
SELECT day, cluster, node, consumed_gpu_s / 3600 AS unattributed_gpu_h
FROM gpu_days FINAL
WHERE allocation_id = '' AND consumed_gpu_s > 0;

-- Slurm time-limit padding of finished jobs: the limit against what the job used.
CREATE OR REPLACE VIEW v_slurm_padding AS
SELECT
    cluster, allocation_id, name, owner AS user, team AS account, partition, gpus_requested,
    time_limit_s, elapsed_s, final_state,
    time_limit_s / greatest(elapsed_s, 1) AS limit_ratio,
    gpus_requested * greatest(time_limit_s - elapsed_s, 0) / 3600 AS padding_gpu_h
FROM v_allocations
WHERE scheduler = 'slurm' AND elapsed_s IS NOT NULL AND time_limit_s > 0;

-- Allocations idle right now: every measured GPU-minute of the last 15 minutes of data
-- below the idle threshold (0.05), and the allocation still present in the latest minute.
CREATE OR REPLACE VIEW v_idle_now AS
WITH (
    -- each step narrows the next one's range: the latest day, its latest hour, its minute
    -- (conditions on toStartOfHour(minute) itself: the key's first column, so they prune)
    SELECT max(minute) FROM gpu_minutes
    WHERE toStartOfHour(minute) >= (
        SELECT max(hour) FROM gpu_hours WHERE hour >= (SELECT max(day) FROM gpu_days)
    ) - INTERVAL 1 HOUR
) AS latest
SELECT
    cluster, allocation_id, any(scheduler) AS scheduler, any(workload_class) AS workload_class,
    any(owner) AS owner, any(team) AS team, uniqExact(gpu_uuid) AS gpus,
    min(minute) AS since, max(minute) AS last_minute,
    sum(consumed_ms) / greatest(sum(allocated_ms), 1) AS activity,
    sum(allocated_ms) / 3600000 AS allocated_gpu_h
FROM gpu_minutes FINAL
WHERE toStartOfHour(minute) >= toStartOfHour(latest - INTERVAL 15 MINUTE)
    AND minute > latest - INTERVAL 15 MINUTE AND allocation_id != '' AND no_samples = 0
GROUP BY cluster, allocation_id
HAVING last_minute = latest AND max(consumed_ms / greatest(allocated_ms, 1)) < 0.05;

-- Alerts: the latest state of each alert.
CREATE OR REPLACE VIEW v_alerts AS
SELECT alert_id, argMax(kind, time) AS kind, argMax(state, time) AS state,
    min(opened_at) AS opened_at, max(resolved_at) AS resolved_at, max(time) AS updated_at,
    argMax(cluster, time) AS cluster, argMax(scheduler, time) AS scheduler,
    argMax(allocation_id, time) AS allocation_id, argMax(gang_id, time) AS gang_id,
    argMax(owner, time) AS owner, argMax(team, time) AS team,
    argMax(workload_class, time) AS workload_class, argMax(gpus, time) AS gpus,
    max(idle_gpu_hours) AS idle_gpu_hours, argMax(message, time) AS message
FROM alerts
GROUP BY alert_id;

CREATE OR REPLACE VIEW v_alerts_open AS
SELECT * FROM v_alerts WHERE state != 'resolved';
