-- Queue time (docs/queue.md). A Slurm job waits for resources from its EligibleTime (after
-- --begin, holds and dependencies; before it the job was not waiting for GPUs), else from its
-- submit time; a pod from its creation (submit_time: metadata.creationTimestamp) to its
-- binding. min: the earliest any event says. A pod's namespace is its queue; max: '' (Slurm
-- jobs, rows stored before) never wins over a name.
ALTER TABLE allocations
    ADD COLUMN IF NOT EXISTS eligible_time
        SimpleAggregateFunction(min, Nullable(DateTime64(3, 'UTC'))),
    ADD COLUMN IF NOT EXISTS namespace SimpleAggregateFunction(max, String) DEFAULT '';

-- v_allocations with the same columns, the two new ones at the end.
CREATE OR REPLACE VIEW v_allocations AS
SELECT
    cluster, allocation_id, scheduler, name, owner, team, workload_class, partition, qos,
    gang_id, gang_size, gpus_requested, nodes, time_limit_s, submit_time, start_time, end_time,
    final_state, exit_code, interactive,
    if(end_time IS NULL, NULL, dateDiff('millisecond', start_time, end_time) / 1000) AS elapsed_s,
    owner_kind, owner_name, eligible_time, namespace
FROM allocations FINAL;

-- How long each started allocation waited for GPUs; a gang waits as one (its pods are one
-- unit of work: a pod bound early waits for the last), from its first member's creation to
-- its last member's binding. queue: the Slurm partition, or the pod's namespace. gpus: what
-- the unit asked for (a gang: every member's). gpu_h_waited = gpus x wait. held_gpu_h: GPUs
-- the gang's bound members held while the rest waited. members < gang_size: the gang has
-- not all started (its wait so far ends at the latest binding seen). Rows without a submit
-- or eligible time (older producers) are left out: their wait is not known. (The inner
-- aliases differ from the column names: ClickHouse would read an alias inside the next
-- aggregate.)
CREATE OR REPLACE VIEW v_queue_wait AS
SELECT
    cluster, sched AS scheduler, queue_name AS queue, gang_id, unit AS allocation_id, members,
    size AS gang_size, class AS workload_class, team_name AS team, who AS owner, gpus,
    limit_s AS time_limit_s, waiting_since, started AS start_time,
    greatest(dateDiff('millisecond', waiting_since, started), 0) / 1000 AS wait_s,
    gpus * wait_s / 3600 AS gpu_h_waited,
    greatest(toUnixTimestamp64Milli(started) * gpus - gpu_start_ms, 0) / 3600000 AS held_gpu_h
FROM
(
    SELECT
        cluster,
        gang_id,
        if(gang_id = '', allocation_id, '') AS unit,
        any(scheduler) AS sched,
        any(if(scheduler = 'kubernetes', namespace, partition)) AS queue_name,
        count() AS members,
        max(gang_size) AS size,
        any(workload_class) AS class,
        any(team) AS team_name,
        any(owner) AS who,
        sum(gpus_requested) AS gpus,
        max(time_limit_s) AS limit_s,
        min(coalesce(eligible_time, submit_time)) AS waiting_since,
        max(start_time) AS started,
        sum(gpus_requested * toUnixTimestamp64Milli(start_time)) AS gpu_start_ms
    FROM v_allocations
    WHERE start_time IS NOT NULL AND coalesce(eligible_time, submit_time) IS NOT NULL
        AND gpus_requested > 0
    GROUP BY cluster, gang_id, unit
);
