-- Stranded GPUs (docs/architecture.md#stranded-gpus). node-capacity.v1: one row per node per
-- poll, what each allocation holds of it in arrays (one row: a poll is stored whole or not at
-- all); a re-delivered poll (same cluster, node, time) collapses, views read FINAL.
CREATE TABLE IF NOT EXISTS node_capacity
(
    cluster LowCardinality(String),
    node LowCardinality(String),
    time DateTime64(3, 'UTC'),
    interval_s Float64,
    scheduler LowCardinality(String),
    source LowCardinality(String),
    pool LowCardinality(String),
    gpu_model LowCardinality(String),
    gpu_memory_mib Nullable(Float64),
    gpus Float64,
    cpus Float64,
    memory_mib Float64,
    schedulable UInt8,
    allocation_ids Array(String),
    allocation_gpus Array(Float64),
    allocation_cpus Array(Float64),
    allocation_memory_mib Array(Float64),
    ingested_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(ingested_at)
PARTITION BY toYYYYMM(time)
ORDER BY (cluster, node, time);

-- One node, one poll: its GPUs split into allocated, usable free, stranded by CPU, stranded by
-- memory, and unavailable (an unschedulable node's free GPUs: down, drained, cordoned).
-- A free GPU is usable only with CPUs and memory beside it: the free CPUs feed
-- free_cpus / (cpus / gpus) GPUs at the node's own CPUs per GPU, the free memory
-- free_memory / (memory / gpus); the GPUs beyond the lesser of the two are stranded, by CPU
-- first (the GPUs beyond what the CPUs feed), by memory for the rest. Everything is in
-- GPU-equivalents and continuous (a job holding 12 of a 64-core 8-GPU node's cores with one
-- GPU strands half a GPU): the figure then splits exactly over the allocations that hold more
-- than their per-GPU share (v_stranded_by_allocation). The GPU-hours: the poll's figure for
-- the interval it stands for.
CREATE OR REPLACE VIEW v_stranded AS
SELECT
    cluster, node, time, interval_s, scheduler, pool, gpu_model, gpus, cpus, memory_mib,
    schedulable, allocated_gpus, allocated_cpus, allocated_memory_mib, free_gpus,
    if(schedulable, stranded_total, 0) AS stranded_gpus,
    if(schedulable, least(stranded_total, greatest(free_gpus - cpu_fed, 0)), 0)
        AS stranded_cpu_gpus,
    stranded_gpus - stranded_cpu_gpus AS stranded_memory_gpus,
    if(schedulable, 0, free_gpus) AS unavailable_gpus,
    free_gpus - stranded_gpus - unavailable_gpus AS usable_free_gpus,
    allocated_gpus * interval_s / 3600 AS allocated_gpu_h,
    free_gpus * interval_s / 3600 AS unallocated_gpu_h,
    usable_free_gpus * interval_s / 3600 AS usable_free_gpu_h,
    stranded_cpu_gpus * interval_s / 3600 AS stranded_cpu_gpu_h,
    stranded_memory_gpus * interval_s / 3600 AS stranded_memory_gpu_h,
    stranded_gpus * interval_s / 3600 AS stranded_gpu_h,
    unavailable_gpus * interval_s / 3600 AS unavailable_gpu_h
FROM
(
    SELECT
        cluster, node, time, interval_s, scheduler, pool, gpu_model, gpus, cpus, memory_mib,
        schedulable,
        least(arraySum(allocation_gpus), gpus) AS allocated_gpus,
        arraySum(allocation_cpus) AS allocated_cpus,
        arraySum(allocation_memory_mib) AS allocated_memory_mib,
        gpus - allocated_gpus AS free_gpus,
        -- the GPUs the free CPUs and memory could feed at the node's own share per GPU (a
        -- node stating no CPUs or memory: not a constraint)
        if(cpus > 0, greatest(cpus - allocated_cpus, 0) * gpus / cpus, free_gpus) AS cpu_fed,
        if(memory_mib > 0, greatest(memory_mib - allocated_memory_mib, 0) * gpus / memory_mib,
            free_gpus) AS memory_fed,
        greatest(free_gpus - least(cpu_fed, memory_fed), 0) AS stranded_total
    FROM node_capacity FINAL
    WHERE gpus > 0
);

-- Who stranded them: each poll's stranded-by-CPU GPUs split over the allocations holding more
-- CPUs than their GPUs' share (excess = cpus x gpus/node_cpus - gpus, in GPU-equivalents, in
-- proportion to it), memory likewise. A CPU-only job on a GPU node holds no GPU: all of its
-- CPUs are excess.
CREATE OR REPLACE VIEW v_stranded_by_allocation AS
SELECT
    cluster, node, time, interval_s, pool, gpu_model, allocation_id, cause, gpus, cpus,
    memory_mib, excess_gpus, stranded * excess_gpus / total_excess AS stranded_gpus,
    stranded_gpus * interval_s / 3600 AS stranded_gpu_h
FROM
(
    SELECT
        v.cluster AS cluster, v.node AS node, v.time AS time, v.interval_s AS interval_s,
        v.pool AS pool, v.gpu_model AS gpu_model, cause,
        if(cause = 'cpu', v.stranded_cpu_gpus, v.stranded_memory_gpus) AS stranded,
        c.allocation_ids AS ids, c.allocation_gpus AS held_gpus, c.allocation_cpus AS held_cpus,
        c.allocation_memory_mib AS held_memory,
        arrayMap((g, cpu, mem) -> greatest(
            if(cause = 'cpu', if(v.cpus > 0, cpu * v.gpus / v.cpus, 0),
                if(v.memory_mib > 0, mem * v.gpus / v.memory_mib, 0)) - g, 0),
            held_gpus, held_cpus, held_memory) AS excess,
        arraySum(excess) AS total_excess
    FROM v_stranded AS v
    INNER JOIN
    (
        SELECT cluster, node, time, allocation_ids, allocation_gpus, allocation_cpus,
            allocation_memory_mib
        FROM node_capacity FINAL
    ) AS c ON c.cluster = v.cluster AND c.node = v.node AND c.time = v.time
    ARRAY JOIN ['cpu', 'memory'] AS cause
    WHERE stranded > 0
)
ARRAY JOIN ids AS allocation_id, held_gpus AS gpus, held_cpus AS cpus,
    held_memory AS memory_mib, excess AS excess_gpus
WHERE excess_gpus > 0 AND total_excess > 0;

-- Multi-node GPU work spread thin (docs/architecture.md#spread-thin): a unit of work (a Slurm
-- job run, or a gang of pods as one) that held GPUs on more nodes than it needed: its GPUs
-- (on each node the most it held on any day, summed) would fit on min_nodes of the largest
-- node it ran on (that node's GPUs: its capacity record's, else the devices it reported).
-- Its GPUs talk across the network instead of within a node, and it leaves partial nodes that
-- a whole-node job cannot use. The GPU-hours are the unit's own, what the packing would make
-- faster; not a part of capacity.
CREATE OR REPLACE VIEW v_spread_work AS
SELECT
    cluster, unit AS allocation_id, gang_id, scheduler, workload_class, team, owner, nodes,
    gpus, largest_node_gpus, toUInt32(ceil(gpus / largest_node_gpus)) AS min_nodes,
    nodes - min_nodes AS extra_nodes, allocated_gpu_h, consumed_gpu_h, first_day, last_day
FROM
(
    SELECT
        p.cluster AS cluster, if(a.gang_id = '', p.allocation_id, a.gang_id) AS unit,
        any(a.gang_id) AS gang_id, any(p.scheduler) AS scheduler,
        any(p.class) AS workload_class, any(p.team_name) AS team, any(p.who) AS owner,
        toUInt32(uniqExact(p.node)) AS nodes, sum(p.node_gpus) AS gpus,
        max(greatest(s.node_gpus, p.node_gpus)) AS largest_node_gpus,
        sum(p.allocated) AS allocated_gpu_h, sum(p.consumed) AS consumed_gpu_h,
        min(p.first) AS first_day, max(p.last) AS last_day
    FROM
    (
        SELECT cluster, allocation_id, node, any(scheduler) AS scheduler,
            any(workload_class) AS class, any(team) AS team_name, any(owner) AS who,
            toFloat64(max(gpus)) AS node_gpus, sum(allocated_gpu_h) AS allocated,
            sum(consumed_gpu_h) AS consumed, min(day) AS first, max(day) AS last
        FROM v_capacity_gap_daily
        GROUP BY cluster, allocation_id, node
    ) AS p
    LEFT JOIN (SELECT cluster, allocation_id, gang_id FROM v_allocations) AS a
        ON a.cluster = p.cluster AND a.allocation_id = p.allocation_id
    LEFT JOIN
    (
        SELECT cluster, node, max(node_gpus) AS node_gpus
        FROM
        (
            SELECT cluster, node,
                toFloat64(uniqExact(if(physical_uuid = '', gpu_uuid, physical_uuid))) AS node_gpus
            FROM gpu_hours FINAL
            GROUP BY cluster, node
            UNION ALL
            SELECT cluster, node, max(gpus) AS node_gpus
            FROM node_capacity FINAL
            GROUP BY cluster, node
        )
        GROUP BY cluster, node
    ) AS s ON s.cluster = p.cluster AND s.node = p.node
    GROUP BY cluster, unit
)
WHERE nodes > 1 AND extra_nodes > 0;
