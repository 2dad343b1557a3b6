-- Quota held but unused (docs/architecture.md#quota-held-but-unused). queue-quotas.v1: a queue's
-- GPU entitlement and what its manager says it holds, per poll; a re-delivered poll collapses.
CREATE TABLE IF NOT EXISTS queue_quotas
(
    cluster LowCardinality(String),
    time DateTime64(3, 'UTC'),
    interval_s Float64,
    kind LowCardinality(String),
    queue String,
    namespace String,
    parent String,
    flavor String,
    resource LowCardinality(String),
    entitled_gpus Nullable(Float64),
    limit_gpus Nullable(Float64),
    held_gpus Nullable(Float64),
    borrowed_gpus Nullable(Float64),
    pending_workloads Nullable(UInt32),
    admitted_workloads Nullable(UInt32),
    ingested_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(ingested_at)
PARTITION BY toYYYYMM(time)
ORDER BY (cluster, kind, namespace, queue, flavor, resource, time);

-- A pod's queue manager queue (Kueue LocalQueue, KAI or Volcano queue; '' for Slurm jobs and
-- rows stored before): max, so that '' never wins over a name.
ALTER TABLE allocations ADD COLUMN IF NOT EXISTS queue SimpleAggregateFunction(max, String) DEFAULT '';

CREATE OR REPLACE VIEW v_allocations AS
SELECT
    cluster, allocation_id, scheduler, name, owner, team, workload_class, partition, qos,
    gang_id, gang_size, gpus_requested, nodes, time_limit_s, submit_time, start_time, end_time,
    final_state, exit_code, interactive,
    if(end_time IS NULL, NULL, dateDiff('millisecond', start_time, end_time) / 1000) AS elapsed_s,
    owner_kind, owner_name, eligible_time, namespace, queue
FROM allocations FINAL;

-- Each allocation under every queue that entitles it (one allocation may count under a Kueue
-- LocalQueue and its ClusterQueue, a Slurm QOS and its account's association):
--   kueue_local_queue    a pod's namespace and queue label
--   kueue_cluster_queue  the ClusterQueue its LocalQueue points to (its latest record)
--   kai_queue, volcano_queue  a pod's queue
--   slurm_qos            a job's QOS
--   slurm_association    a job's account (team), and account/user
CREATE OR REPLACE VIEW v_queue_members AS
SELECT cluster, allocation_id, kind, namespace, queue
FROM
(
    SELECT cluster, allocation_id, k.1 AS kind, k.2 AS namespace, k.3 AS queue
    FROM
    (
        SELECT cluster, allocation_id,
            arrayJoin([
                ('kueue_local_queue', namespace, queue), ('kai_queue', '', queue),
                ('volcano_queue', '', queue)]) AS k
        FROM v_allocations
        WHERE scheduler = 'kubernetes' AND queue != ''
    )
    UNION ALL
    SELECT a.cluster AS cluster, a.allocation_id AS allocation_id, 'kueue_cluster_queue' AS kind,
        '' AS namespace, l.cluster_queue AS queue
    FROM v_allocations AS a
    INNER JOIN
    (
        SELECT cluster, namespace, queue, argMax(parent, time) AS cluster_queue
        FROM queue_quotas FINAL
        WHERE kind = 'kueue_local_queue' AND parent != ''
        GROUP BY cluster, namespace, queue
    ) AS l ON l.cluster = a.cluster AND l.namespace = a.namespace AND l.queue = a.queue
    WHERE a.scheduler = 'kubernetes' AND a.queue != ''
    UNION ALL
    SELECT cluster, allocation_id, k.1 AS kind, k.2 AS namespace, k.3 AS queue
    FROM
    (
        SELECT cluster, allocation_id,
            arrayJoin([('slurm_qos', '', qos), ('slurm_association', '', team),
                ('slurm_association', '', concat(team, '/', owner))]) AS k
        FROM v_allocations
        WHERE scheduler = 'slurm'
    )
)
WHERE queue != '' AND (cluster, kind, namespace, queue) IN (
    SELECT cluster, kind, namespace, queue FROM queue_quotas
);

-- Per queue and hour: what it was entitled to (GPU-hours of entitlement: entitled GPUs x the
-- time each poll stands for; a queue manager's flavors and GPU resources summed), the most it
-- could hold, what its manager said it held and borrowed, its pending workloads (workload-
-- hours), and, from the allocations it entitles, what they held (allocated), consumed, idled
-- and waited (GPU-hours waited for the runs that started in the hour, v_queue_wait).
-- unused_gpu_h: entitlement nobody in the queue held.
CREATE OR REPLACE VIEW v_queue_quota_hourly AS
SELECT
    hour, cluster, kind, namespace, queue, parent,
    entitled_gpu_h, limit_gpu_h, reported_held_gpu_h, borrowed_gpu_h, pending_workload_h,
    allocated_gpu_h, consumed_gpu_h, idle_gpu_h, waited_gpu_h,
    greatest(entitled_gpu_h - allocated_gpu_h, 0) AS unused_gpu_h
FROM
(
    SELECT
        hour, cluster, kind, namespace, queue,
        max(parent) AS parent,
        sum(entitled) AS entitled_gpu_h, sum(limit) AS limit_gpu_h,
        sum(reported) AS reported_held_gpu_h, sum(borrowed) AS borrowed_gpu_h,
        sum(pending) AS pending_workload_h, sum(allocated) AS allocated_gpu_h,
        sum(consumed) AS consumed_gpu_h, sum(idle) AS idle_gpu_h, sum(waited) AS waited_gpu_h
    FROM
    (
        SELECT toStartOfHour(time) AS hour, cluster, kind, namespace, queue, parent,
            coalesce(entitled_gpus, 0) * interval_s / 3600 AS entitled,
            coalesce(limit_gpus, 0) * interval_s / 3600 AS limit,
            coalesce(held_gpus, 0) * interval_s / 3600 AS reported,
            coalesce(borrowed_gpus, 0) * interval_s / 3600 AS borrowed,
            coalesce(pending_workloads, 0) * interval_s / 3600 AS pending,
            0 AS allocated, 0 AS consumed, 0 AS idle, 0 AS waited
        FROM queue_quotas FINAL
        UNION ALL
        SELECT h.hour AS hour, m.cluster AS cluster, m.kind AS kind, m.namespace AS namespace,
            m.queue AS queue, '' AS parent, 0, 0, 0, 0, 0,
            h.allocated_s / 3600, h.consumed_gpu_s / 3600, h.idle_s / 3600, 0
        FROM gpu_hours AS h FINAL
        INNER JOIN v_queue_members AS m
            ON m.cluster = h.cluster AND m.allocation_id = h.allocation_id
        WHERE h.allocation_id != ''
        UNION ALL
        SELECT toStartOfHour(w.start_time) AS hour, m.cluster AS cluster, m.kind AS kind,
            m.namespace AS namespace, m.queue AS queue, '' AS parent, 0, 0, 0, 0, 0, 0, 0, 0,
            w.gpu_h_waited
        FROM v_queue_wait AS w
        INNER JOIN v_queue_members AS m
            ON m.cluster = w.cluster AND m.allocation_id = w.allocation_id
    )
    GROUP BY hour, cluster, kind, namespace, queue
);
