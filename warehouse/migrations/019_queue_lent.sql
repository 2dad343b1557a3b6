-- What a queue lent (docs/architecture.md#quota-held-but-unused). Kueue states what a
-- ClusterQueue borrowed; no manager states what it lent. A queue's unused entitlement is lent
-- to the siblings under its parent (a Kueue cohort, a KAI or Volcano parent queue) in
-- proportion: lent = unused x min(1, the siblings' borrowed / their unused), per hour. KAI and
-- Volcano state no borrowing: a queue's holdings beyond its entitlement are what it borrowed.
-- And unused now counts what the manager said a queue held as well as what gpugap mapped to it
-- (pods without a queue label still hold a queue's quota): entitled - max(allocated, reported).
-- The hourly view's body moves to v_queue_quota_hourly_base.
CREATE OR REPLACE VIEW v_queue_quota_hourly_base AS
SELECT
    hour, cluster, kind, namespace, queue, parent,
    entitled_gpu_h, limit_gpu_h, reported_held_gpu_h, borrowed_gpu_h, pending_workload_h,
    allocated_gpu_h, consumed_gpu_h, idle_gpu_h, waited_gpu_h,
    greatest(entitled_gpu_h - greatest(allocated_gpu_h, reported_held_gpu_h), 0) AS unused_gpu_h
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
            coalesce(borrowed_gpus, if(held_gpus IS NULL OR entitled_gpus IS NULL, 0,
                greatest(held_gpus - entitled_gpus, 0))) * interval_s / 3600 AS borrowed,
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

CREATE OR REPLACE VIEW v_queue_quota_hourly AS
SELECT
    hour, cluster, kind, namespace, queue, parent,
    entitled_gpu_h, limit_gpu_h, reported_held_gpu_h, borrowed_gpu_h, pending_workload_h,
    allocated_gpu_h, consumed_gpu_h, idle_gpu_h, waited_gpu_h, unused_gpu_h,
    if(parent = '' OR siblings_unused <= 0, 0,
        unused_gpu_h * least(1, siblings_borrowed / siblings_unused)) AS lent_gpu_h
FROM
(
    SELECT *,
        sum(borrowed_gpu_h) OVER siblings AS siblings_borrowed,
        sum(unused_gpu_h) OVER siblings AS siblings_unused
    FROM v_queue_quota_hourly_base
    WINDOW siblings AS (PARTITION BY hour, cluster, kind, parent)
);
