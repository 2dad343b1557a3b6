-- GPU-hours in physical GPU-equivalents (DESIGN.md). From this release the stream writes a
-- MIG slice's seconds at its share of its GPU (1g.10gb of an H100: 1/7), a time-sliced GPU's
-- at each holder's share, and the part of a partitioned GPU no slice covers as unallocated:
-- allocated_ms, unallocated_ms and consumed_ms of new rows are GPU-equivalent milliseconds.
-- The device itself stays countable: device_ms (its seconds, a slice's slice-seconds),
-- gpu_share (the row's share per second) and physical_uuid (a slice's GPU).
--
-- Rows written before this release have gpu_share = 0: their MIG slices counted whole slice-
-- seconds, and nothing can recompute them (their profile was not stored). Find them with
-- `gpu_share = 0 AND startsWith(gpu_uuid, 'MIG-')`; the cost view still prices them at the
-- rate card's mig_share, as before.
ALTER TABLE gpu_minutes
    ADD COLUMN IF NOT EXISTS device_ms UInt16 DEFAULT allocated_ms + unallocated_ms
        CODEC(T64, ZSTD(1)),
    ADD COLUMN IF NOT EXISTS gpu_share Float32 DEFAULT 0 CODEC(ZSTD(1)),
    ADD COLUMN IF NOT EXISTS physical_uuid LowCardinality(String) DEFAULT gpu_uuid;

-- Idle time by share (an idle minute of a 1/7 slice is 1/7 of an idle GPU-minute), and the
-- device's own seconds per hour. Hours rolled up before read idle_minutes x 60 and
-- allocated + unallocated until the sink rolls them up again.
ALTER TABLE gpu_hours
    ADD COLUMN IF NOT EXISTS idle_s Float64 DEFAULT idle_minutes * 60,
    ADD COLUMN IF NOT EXISTS device_s Float64 DEFAULT allocated_s + unallocated_s,
    ADD COLUMN IF NOT EXISTS physical_uuid LowCardinality(String) DEFAULT gpu_uuid;

ALTER TABLE gpu_days
    ADD COLUMN IF NOT EXISTS idle_s Float64 DEFAULT idle_minutes * 60;

CREATE OR REPLACE VIEW v_capacity_gap AS
SELECT
    hour, cluster, node, gpu_uuid, scheduler, workload_class, team, owner, allocation_id,
    allocated_s / 3600 AS allocated_gpu_h,
    (allocated_s - unmeasured_s) / 3600 AS measured_gpu_h,
    consumed_gpu_s / 3600 AS consumed_gpu_h,
    (allocated_s - unmeasured_s - consumed_gpu_s) / 3600 AS gap_gpu_h,
    unmeasured_s / 3600 AS unmeasured_gpu_h,
    idle_s / 3600 AS idle_gpu_h
FROM gpu_hours FINAL
WHERE allocation_id != '';

CREATE OR REPLACE VIEW v_capacity_gap_daily AS
SELECT
    day, cluster, node, scheduler, workload_class, team, owner, allocation_id, gpus,
    allocated_s / 3600 AS allocated_gpu_h,
    (allocated_s - unmeasured_s) / 3600 AS measured_gpu_h,
    consumed_gpu_s / 3600 AS consumed_gpu_h,
    (allocated_s - unmeasured_s - consumed_gpu_s) / 3600 AS gap_gpu_h,
    unmeasured_s / 3600 AS unmeasured_gpu_h,
    idle_s / 3600 AS idle_gpu_h
FROM gpu_days FINAL
WHERE allocation_id != '';

-- The device level, for those who count instances: per day and physical GPU, its MIG slices
-- (0 for a GPU used whole), the devices' own hours (slice-hours for a partitioned GPU), how
-- many of them an allocation held, and the same in GPU-equivalents.
CREATE OR REPLACE VIEW v_gpu_devices_daily AS
SELECT
    toDate(hour) AS day, cluster, node, physical_uuid,
    uniqExactIf(gpu_uuid, gpu_uuid != physical_uuid) AS slices,
    sumIf(device_s, gpu_uuid != physical_uuid) / 3600 AS slice_h,
    sum(device_s) / 3600 AS device_h,
    sumIf(device_s, allocation_id != '') / 3600 AS held_device_h,
    sum(allocated_s) / 3600 AS allocated_gpu_h,
    sum(unallocated_s) / 3600 AS unallocated_gpu_h
FROM gpu_hours FINAL
GROUP BY day, cluster, node, physical_uuid;

-- v_cost_hourly as in 008, for rows by share: their GPU-hours and energy (power x GPU-equivalent
-- time; NVML and DCGM report a slice's parent's power) are already the slice's share, so the
-- rate is the physical GPU's. Only rows from before (gpu_share = 0) of MIG slices still take the
-- rate card's mig_share (an hour holding both counts as before: the hour of the upgrade).
CREATE OR REPLACE VIEW v_cost_hourly AS
SELECT
    hour, cluster, node, gpu_uuid, scheduler, workload_class, team, owner, allocation_id,
    gpu_model, environment, currency, share, rate_status,
    allocated_s / 3600 AS allocated_gpu_h,
    (allocated_s - unmeasured_s) / 3600 AS measured_gpu_h,
    consumed_s / 3600 AS consumed_gpu_h,
    (allocated_s - unmeasured_s - consumed_s) / 3600 AS gap_gpu_h,
    unmeasured_s / 3600 AS unmeasured_gpu_h,
    unallocated_s / 3600 AS unallocated_gpu_h,
    unmetered_s / 3600 AS unmetered_gpu_h,
    raw_allocated_kwh * share AS allocated_kwh,
    raw_consumed_kwh * share AS consumed_kwh,
    (raw_allocated_kwh - raw_consumed_kwh) * share AS gap_kwh,
    raw_unallocated_kwh * share AS unallocated_kwh,
    if(rated, rule_rate * share, NULL) AS gpu_hour_rate,
    if(rated, rule_kwh_price * rule_pue, NULL) AS kwh_rate,
    if(rated, allocated_gpu_h * gpu_hour_rate + allocated_kwh * kwh_rate, NULL) AS allocated_cost,
    if(rated, consumed_gpu_h * gpu_hour_rate + consumed_kwh * kwh_rate, NULL) AS consumed_cost,
    if(rated, gap_gpu_h * gpu_hour_rate + gap_kwh * kwh_rate, NULL) AS gap_cost,
    if(rated, unallocated_gpu_h * gpu_hour_rate + unallocated_kwh * kwh_rate, NULL)
        AS unallocated_cost,
    if(rated, rule_pue * rule_emission / 1000, NULL) AS kg_co2_per_kwh,
    allocated_kwh * kg_co2_per_kwh AS allocated_co2_kg,
    consumed_kwh * kg_co2_per_kwh AS consumed_co2_kg,
    gap_kwh * kg_co2_per_kwh AS gap_co2_kg,
    unallocated_kwh * kg_co2_per_kwh AS unallocated_co2_kg
FROM (
    SELECT
        m.*,
        arrayFirstIndex(x -> match(m.node, x.2), r.rules) AS idx,
        idx > 0 AS matched,
        startsWith(m.gpu_uuid, 'MIG-') AS mig,
        m.oldest_share = 0 AS legacy,
        if(matched, tupleElement(r.rules[idx], 3), '') AS gpu_model,
        if(matched, tupleElement(r.rules[idx], 4), '') AS environment,
        if(matched, tupleElement(r.rules[idx], 10), '') AS currency,
        tupleElement(r.rules[idx], 5) AS rule_rate,
        tupleElement(r.rules[idx], 6) AS rule_kwh_price,
        tupleElement(r.rules[idx], 7) AS rule_pue,
        if(matched, tupleElement(r.rules[idx], 8), NULL) AS rule_emission,
        if(mig AND legacy, if(matched, tupleElement(r.rules[idx], 9), NULL), toNullable(1.0))
            AS share,
        matched AND share IS NOT NULL AS rated,
        multiIf(NOT matched, 'no rate', share IS NULL, 'no MIG share', 'rated') AS rate_status
    FROM (
        SELECT
            toStartOfHour(minute) AS hour, cluster, node, gpu_uuid, allocation_id,
            any(scheduler) AS scheduler, any(workload_class) AS workload_class,
            any(owner) AS owner, any(team) AS team,
            sum(allocated_ms) / 1000 AS allocated_s,
            sumIf(allocated_ms, no_samples = 1) / 1000 AS unmeasured_s,
            sum(unallocated_ms) / 1000 AS unallocated_s,
            sumIf(consumed_ms, allocated_ms > 0) / 1000 AS consumed_s,
            sumIf(toUInt32(allocated_ms) + unallocated_ms, power_dw = 0) / 1000 AS unmetered_s,
            sum(toUInt64(power_dw) * allocated_ms) / 3.6e10 AS raw_allocated_kwh,
            sumIf(toUInt64(power_dw) * consumed_ms, allocated_ms > 0) / 3.6e10 AS raw_consumed_kwh,
            sum(toUInt64(power_dw) * unallocated_ms) / 3.6e10 AS raw_unallocated_kwh,
            min(gpu_share) AS oldest_share
        FROM gpu_minutes FINAL
        GROUP BY hour, cluster, node, gpu_uuid, allocation_id
    ) AS m
    LEFT JOIN (
        SELECT cluster, arraySort(x -> x.1, groupArray((priority, node_regex, gpu_model,
            environment, gpu_hour_rate, kwh_price, pue, emission_g_per_kwh, mig_share,
            currency))) AS rules
        FROM rate_card
        WHERE updated_at = (SELECT max(updated_at) FROM rate_card) AND cluster != ''
        GROUP BY cluster
    ) AS r ON r.cluster = m.cluster
);
