-- Lost GPU-hours (DESIGN.md, docs/architecture.md#units-and-definitions): the GPU-hours of runs
-- that did not finish by their own doing, by cause. Their work is lost unless they checkpointed,
-- so a run's lost GPU-hours are all the GPU-hours it held (allocated, GPU-equivalents, from the
-- daily rollup), beside what it consumed of them. The causes, from final_state (the Slurm job
-- state, or the pod's termination reason, warehouse/rows.py pod_row):
--   preempted     Slurm PREEMPTED, a pod preempted (DisruptionTarget: the scheduler, Kueue, KAI,
--                 Volcano)
--   requeued      Slurm REQUEUED: the run ended and the job runs again as a new allocation (the
--                 next run is not lost work unless it too ends so)
--   node_failure  Slurm NODE_FAIL, BOOT_FAIL
--   evicted       a pod evicted (kubelet pressure, the eviction API, a taint)
--   oom_killed    Slurm OUT_OF_MEMORY, a pod OOM-killed: counted as DESIGN.md lists it, though
--                 the job asked for too little memory
-- Normal ends are the job's own doing and not lost work: COMPLETED, FAILED (its own exit),
-- CANCELLED (by its user), TIMEOUT and DEADLINE (its own time limit), and pods completed,
-- failed or deleted. Only runs that started (held GPUs) and ended. gpus: the GPUs (devices, a
-- slice as one) it held by the rollup, else what it asked for. The GPU-hours come from the
-- rollup: a run whose minutes are not stored (its events backfilled alone) shows 0.
CREATE OR REPLACE VIEW v_lost_work AS
SELECT
    a.cluster AS cluster, a.scheduler AS scheduler, a.allocation_id AS allocation_id,
    multiIf(
        a.final_state IN ('PREEMPTED', 'preempted'), 'preempted',
        a.final_state = 'REQUEUED', 'requeued',
        a.final_state IN ('NODE_FAIL', 'BOOT_FAIL'), 'node_failure',
        a.final_state = 'evicted', 'evicted',
        a.final_state IN ('OUT_OF_MEMORY', 'oom_killed'), 'oom_killed',
        ''
    ) AS cause,
    if(a.scheduler = 'kubernetes', a.namespace, a.partition) AS queue,
    a.workload_class AS workload_class, a.team AS team, a.owner AS owner,
    a.start_time AS start_time, a.end_time AS end_time,
    if(g.held > 0, g.held, a.gpus_requested) AS gpus,
    coalesce(g.allocated, 0) AS lost_gpu_h,
    coalesce(g.consumed, 0) AS consumed_gpu_h,
    a.final_state AS final_state
FROM (
    SELECT * FROM v_allocations
    WHERE end_time IS NOT NULL AND start_time IS NOT NULL
        AND final_state IN ('PREEMPTED', 'preempted', 'REQUEUED', 'NODE_FAIL', 'BOOT_FAIL',
            'evicted', 'OUT_OF_MEMORY', 'oom_killed')
) AS a
LEFT JOIN (
    -- per allocation: the GPUs it held on each node (the most on any day), summed over nodes
    SELECT cluster, allocation_id, sum(node_gpus) AS held, sum(node_allocated) AS allocated,
        sum(node_consumed) AS consumed
    FROM (
        SELECT cluster, allocation_id, node, max(gpus) AS node_gpus,
            sum(allocated_gpu_h) AS node_allocated, sum(consumed_gpu_h) AS node_consumed
        FROM v_capacity_gap_daily
        WHERE allocation_id IN (
            SELECT allocation_id FROM v_allocations
            WHERE final_state IN ('PREEMPTED', 'preempted', 'REQUEUED', 'NODE_FAIL',
                'BOOT_FAIL', 'evicted', 'OUT_OF_MEMORY', 'oom_killed')
        )
        GROUP BY cluster, allocation_id, node
    )
    GROUP BY cluster, allocation_id
) AS g ON g.cluster = a.cluster AND g.allocation_id = a.allocation_id;
