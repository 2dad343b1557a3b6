-- v_lost_work as in 015, with the pods whose node is gone: the pod garbage collector deletes a
-- pod bound to a node that no longer exists (DisruptionTarget DeletionByPodGC); the Kubernetes
-- producer now says `node_lost` for it, and it counts as a node failure, like Slurm's NODE_FAIL.
CREATE OR REPLACE VIEW v_lost_work AS
SELECT
    a.cluster AS cluster, a.scheduler AS scheduler, a.allocation_id AS allocation_id,
    multiIf(
        a.final_state IN ('PREEMPTED', 'preempted'), 'preempted',
        a.final_state = 'REQUEUED', 'requeued',
        a.final_state IN ('NODE_FAIL', 'BOOT_FAIL', 'node_lost'), 'node_failure',
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
            'node_lost', 'evicted', 'OUT_OF_MEMORY', 'oom_killed')
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
                'BOOT_FAIL', 'node_lost', 'evicted', 'OUT_OF_MEMORY', 'oom_killed')
        )
        GROUP BY cluster, allocation_id, node
    )
    GROUP BY cluster, allocation_id
) AS g ON g.cluster = a.cluster AND g.allocation_id = a.allocation_id;
