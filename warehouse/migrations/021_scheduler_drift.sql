-- gpugap checks itself against the scheduler's own count (docs/architecture.md#checking-against-the-scheduler).
-- scheduler-gpu-counts.v1: slurmctld's OpenMetrics GPU gauges per poll (Slurm 26.05+): the GPUs
-- its running jobs hold, per cluster, partition, account, user and node; a re-delivered poll
-- collapses.
CREATE TABLE IF NOT EXISTS scheduler_gpu_counts
(
    cluster LowCardinality(String),
    time DateTime64(3, 'UTC'),
    interval_s Float64,
    scheduler LowCardinality(String),
    source LowCardinality(String),
    scope LowCardinality(String),
    name String,
    gpus_allocated Float64,
    gpus_total Nullable(Float64),
    ingested_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(ingested_at)
PARTITION BY toYYYYMM(time)
ORDER BY (cluster, scope, name, time);

-- At each cluster's latest poll: the scheduler's count beside gpugap's own, the GPUs of the
-- allocations running at that instant (started at or before it, not ended by it), per scope:
--   cluster    every Slurm allocation of the cluster
--   partition  allocations.partition
--   account    allocations.team (a Slurm job's account)
--   user       allocations.owner
-- Only the scopes the poll reported are compared; within one, a name only gpugap has counts
-- against a scheduler's 0.
-- drift_gpus = gpugap - scheduler: above 0 gpugap counts GPUs the scheduler does not (an end
-- it missed), below 0 it misses some (a start it never saw). Node counts are kept, not compared
-- (an allocation's GPUs per node are in gpu_allocations, by GPU).
CREATE OR REPLACE VIEW v_scheduler_drift AS
WITH latest AS
(
    SELECT cluster, max(time) AS at
    FROM scheduler_gpu_counts
    WHERE scheduler = 'slurm'
    GROUP BY cluster
),
counted AS
(
    SELECT c.cluster AS cluster, c.time AS at, c.scope AS scope, c.name AS name,
        argMax(c.gpus_allocated, c.ingested_at) AS scheduler_gpus
    FROM scheduler_gpu_counts AS c
    INNER JOIN latest AS l ON l.cluster = c.cluster AND l.at = c.time
    WHERE c.scope IN ('cluster', 'partition', 'account', 'user')
    GROUP BY cluster, at, scope, name
),
running AS
(
    SELECT cluster, k.1 AS scope, k.2 AS name, sum(gpus) AS gpugap_gpus
    FROM
    (
        SELECT a.cluster AS cluster, a.partition AS partition, a.team AS team, a.owner AS owner,
            toFloat64(a.gpus_requested) AS gpus
        FROM v_allocations AS a
        INNER JOIN latest AS l ON l.cluster = a.cluster
        WHERE a.scheduler = 'slurm' AND a.start_time <= l.at
            AND (a.end_time IS NULL OR a.end_time > l.at)
    )
    ARRAY JOIN [('cluster', ''), ('partition', partition), ('account', team), ('user', owner)] AS k
    GROUP BY cluster, scope, name
)
SELECT both.cluster AS cluster, l.at AS time, both.scope AS scope, both.name AS name,
    sum(both.scheduler_side) AS scheduler_gpus,
    sum(both.gpugap_side) AS gpugap_gpus,
    gpugap_gpus - scheduler_gpus AS drift_gpus
FROM
(
    SELECT cluster, scope, name, scheduler_gpus AS scheduler_side, 0. AS gpugap_side FROM counted
    UNION ALL
    SELECT cluster, scope, name, 0. AS scheduler_side, gpugap_gpus AS gpugap_side FROM running
) AS both
INNER JOIN latest AS l ON l.cluster = both.cluster
-- a scope the poll did not report (an older Slurm, a page that failed) is not compared
WHERE (both.cluster, both.scope) IN (SELECT cluster, scope FROM counted)
GROUP BY cluster, time, scope, name;
