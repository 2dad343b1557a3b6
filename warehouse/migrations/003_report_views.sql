-- Views `gpugap report` needs beyond 002 (applied migrations are never edited: this adds
-- views, and replaces v_slurm_padding with the same columns plus two at the end).

-- Capacity nobody held, and activity on it, per hour and GPU: reports over windows that do
-- not start or end at midnight take the edge hours from here, whole days from v_unallocated.
CREATE OR REPLACE VIEW v_unallocated_hourly AS
SELECT
    hour, cluster, node, gpu_uuid,
    unallocated_s / 3600 AS unallocated_gpu_h,
    consumed_gpu_s / 3600 AS unattributed_gpu_h
FROM gpu_hours FINAL
WHERE allocation_id = '';

-- v_slurm_padding with the job's start and end, so a report can take the jobs that ended in
-- its window.
CREATE OR REPLACE VIEW v_slurm_padding AS
SELECT
    cluster, allocation_id, name, owner AS user, team AS account, partition, gpus_requested,
    time_limit_s, elapsed_s, final_state,
    time_limit_s / greatest(elapsed_s, 1) AS limit_ratio,
    gpus_requested * greatest(time_limit_s - elapsed_s, 0) / 3600 AS padding_gpu_h,
    start_time, end_time
FROM v_allocations
WHERE scheduler = 'slurm' AND elapsed_s IS NOT NULL AND time_limit_s > 0;

-- Partial gangs now: the latest state of each partial-gang alert not resolved yet, with the
-- pods running and pending (v_alerts leaves those out). idle_gpu_hours is what the running
-- pods held while they waited.
CREATE OR REPLACE VIEW v_partial_gangs_now AS
SELECT
    alert_id, argMax(cluster, time) AS cluster, argMax(scheduler, time) AS scheduler,
    argMax(gang_id, time) AS gang_id, argMax(owner, time) AS owner, argMax(team, time) AS team,
    argMax(workload_class, time) AS workload_class,
    argMax(running_pods, time) AS running_pods, argMax(pending_pods, time) AS pending_pods,
    argMax(nodes, time) AS nodes, argMax(gpus, time) AS gpus,
    min(opened_at) AS opened_at, max(time) AS updated_at,
    max(idle_gpu_hours) AS idle_gpu_hours, argMax(message, time) AS message
FROM alerts
WHERE kind = 'partial_gang'
GROUP BY alert_id
HAVING argMax(state, time) != 'resolved';

-- Where the data starts, and its latest minute (what "now" means in a report): the same
-- narrowing as v_idle_now (latest day, its latest hour, then the minute), so it reads a few
-- granules. Both are 1970-01-01 00:00:00 on an empty warehouse.
CREATE OR REPLACE VIEW v_data_extent AS
SELECT
    (SELECT min(day) FROM gpu_days) AS first_day,
    (
        SELECT max(minute) FROM gpu_minutes
        WHERE toStartOfHour(minute) >= (
            SELECT max(hour) FROM gpu_hours WHERE hour >= (SELECT max(day) FROM gpu_days)
        ) - INTERVAL 1 HOUR
    ) AS latest_minute;
