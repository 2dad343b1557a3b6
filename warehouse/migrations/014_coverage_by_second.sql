-- Coverage by the second (DESIGN.md, docs/architecture.md#coverage). A sample covers its own
-- interval; the seconds of a row no sample covered are unmeasured even inside a minute that has
-- a reading (a lost scrape), never zero use. measured_ms is the row's covered GPU-equivalent
-- milliseconds: unmeasured = allocated_ms - measured_ms, and idle is judged on what was
-- measured (consumed below the threshold x measured_ms).
--
-- Rows written before this release were measured by the minute: their measured_ms reads all of
-- the row unless no_samples, as they were counted then, and coverage_grain says 'minute'; the
-- sink writes 'second' from this release (`WHERE coverage_grain = 'minute'` finds the old ones).
-- Hours rolled up before keep their unmeasured_s until the sink rolls them up again.
ALTER TABLE gpu_minutes
    ADD COLUMN IF NOT EXISTS measured_ms UInt16
        DEFAULT if(no_samples = 1, 0, allocated_ms + unallocated_ms) CODEC(T64, ZSTD(1))
        AFTER no_samples,
    ADD COLUMN IF NOT EXISTS coverage_grain LowCardinality(String) DEFAULT 'minute'
        AFTER measured_ms;

-- v_cost_hourly as in 011, its unmeasured hours by the second
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
            sum(allocated_ms - least(measured_ms, allocated_ms)) / 1000 AS unmeasured_s,
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

-- v_idle_now as in 013, activity over the measured seconds only
CREATE OR REPLACE VIEW v_idle_now AS
WITH (
    -- each step narrows the next one's range: the latest day, its latest hour, its minute
    -- (conditions on toStartOfHour(minute) itself: the key's first column, so they prune)
    SELECT max(minute) FROM gpu_minutes
    WHERE toStartOfHour(minute) >= (
        SELECT max(hour) FROM gpu_hours WHERE hour >= (SELECT max(day) FROM gpu_days)
    ) - INTERVAL 1 HOUR
) AS latest,
greatest(
    (SELECT max(minutes) FROM idle_policy FINAL),
    (SELECT max(idle_after_minutes) FROM gpu_minutes
        WHERE toStartOfHour(minute) = toStartOfHour(latest) AND minute = latest)
) AS longest
SELECT
    g.cluster AS cluster, g.allocation_id AS allocation_id, any(g.scheduler) AS scheduler,
    any(g.workload_class) AS workload_class, any(g.owner) AS owner, any(g.team) AS team,
    uniqExact(g.gpu_uuid) AS gpus, min(g.minute) AS since, max(g.minute) AS last_minute,
    sum(g.consumed_ms) / greatest(sum(g.measured_ms), 1) AS activity,
    sum(g.allocated_ms) / 3600000 AS allocated_gpu_h,
    max(if(g.idle_after_minutes > 0, g.idle_after_minutes, p.minutes)) AS idle_minutes,
    max(if(g.idle_after_minutes > 0, g.idle_threshold_bp / 10000, p.threshold))
        AS idle_threshold
FROM (
    SELECT * FROM gpu_minutes FINAL
    WHERE toStartOfHour(minute) >= toStartOfHour(latest - toIntervalMinute(longest))
        AND minute > latest - toIntervalMinute(longest) AND allocation_id != ''
        AND measured_ms > 0
) AS g
INNER JOIN (SELECT * FROM idle_policy FINAL) AS p ON p.workload_class = g.workload_class
WHERE g.minute > latest - toIntervalMinute(
    if(g.idle_after_minutes > 0, g.idle_after_minutes, p.minutes))
GROUP BY g.cluster, g.allocation_id
HAVING last_minute = latest
    AND max(g.consumed_ms / greatest(g.measured_ms, 1)
        - if(g.idle_after_minutes > 0, g.idle_threshold_bp / 10000, p.threshold)) < 0;
