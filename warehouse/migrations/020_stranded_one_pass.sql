-- Who stranded GPUs, in one pass: v_stranded carries each poll's allocations (its columns as
-- in 017, the arrays at the end), so v_stranded_by_allocation reads node_capacity once instead
-- of joining v_stranded back to it (python -m benchmarks stranded: 500 nodes polled for a week,
-- the report's "who stranded them" took 3.7 s). The figures are the same.
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
    unavailable_gpus * interval_s / 3600 AS unavailable_gpu_h,
    allocation_ids, allocation_gpus, allocation_cpus, allocation_memory_mib
FROM
(
    SELECT
        cluster, node, time, interval_s, scheduler, pool, gpu_model, gpus, cpus, memory_mib,
        schedulable, allocation_ids, allocation_gpus, allocation_cpus, allocation_memory_mib,
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

CREATE OR REPLACE VIEW v_stranded_by_allocation AS
SELECT
    cluster, node, time, interval_s, pool, gpu_model, allocation_id, cause, gpus, cpus,
    memory_mib, excess_gpus, stranded * excess_gpus / total_excess AS stranded_gpus,
    stranded_gpus * interval_s / 3600 AS stranded_gpu_h
FROM
(
    SELECT
        cluster, node, time, interval_s, pool, gpu_model, cause,
        if(cause = 'cpu', stranded_cpu_gpus, stranded_memory_gpus) AS stranded,
        allocation_ids AS ids, allocation_gpus AS held_gpus, allocation_cpus AS held_cpus,
        allocation_memory_mib AS held_memory,
        arrayMap((g, cpu, mem) -> greatest(
            if(cause = 'cpu', if(cpus > 0, cpu * gpus / cpus, 0),
                if(memory_mib > 0, mem * gpus / memory_mib, 0)) - g, 0),
            held_gpus, held_cpus, held_memory) AS excess,
        arraySum(excess) AS total_excess
    FROM v_stranded
    ARRAY JOIN ['cpu', 'memory'] AS cause
    WHERE stranded > 0
)
ARRAY JOIN ids AS allocation_id, held_gpus AS gpus, held_cpus AS cpus,
    held_memory AS memory_mib, excess AS excess_gpus
WHERE excess_gpus > 0 AND total_excess > 0;
