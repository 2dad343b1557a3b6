-- Cost on top of capacity (docs/cost.md). The rate card and the boundary transfers get tables
-- of their own; the views apply the latest card to the GPU-minutes and to the transfers. No
-- GPU-hour table or view changes: currency, energy and CO2 sit beside the GPU-hours.

-- The rate card, one row per node rule of a cluster (its default last), written whole by the
-- sink at start or by `gpugap cost load` (gpugap/cost/card.py). Every write is a new version
-- (updated_at); the views apply the latest, older ones stay as the record of what was used.
-- A card without clusters writes one row with cluster '' so that it still replaces the last.
CREATE TABLE IF NOT EXISTS rate_card
(
    cluster LowCardinality(String),
    priority UInt16,
    node_pattern String,
    node_regex String,
    gpu_model LowCardinality(String),
    environment LowCardinality(String),
    pricing LowCardinality(String),
    gpu_hour_rate Float64,
    capital_per_gpu_h Nullable(Float64),
    overhead_per_gpu_h Float64,
    kwh_price Float64,
    pue Float64,
    emission_g_per_kwh Nullable(Float64),
    mig_share Nullable(Float64),
    currency LowCardinality(String),
    card_id String,
    card_name String,
    source String,
    updated_at DateTime64(3, 'UTC')
)
ENGINE = MergeTree
ORDER BY (updated_at, cluster, priority);

-- Per-GiB egress rates per cluster and direction, versioned with the rate_card rows.
CREATE TABLE IF NOT EXISTS transfer_rate
(
    cluster LowCardinality(String),
    from_env LowCardinality(String),
    to_env LowCardinality(String),
    per_gib Float64,
    currency LowCardinality(String),
    updated_at DateTime64(3, 'UTC')
)
ENGINE = MergeTree
ORDER BY (updated_at, cluster, from_env, to_env);

-- transfers.v1: bytes moved across the boundary between environments; a re-delivered or
-- re-imported record (same cluster and event id) collapses, views read FINAL.
CREATE TABLE IF NOT EXISTS transfers
(
    event_id String,
    time DateTime64(3, 'UTC'),
    interval_s Float64,
    cluster LowCardinality(String),
    from_env LowCardinality(String),
    to_env LowCardinality(String),
    bytes UInt64,
    source LowCardinality(String),
    node String,
    interface String,
    team LowCardinality(String),
    owner LowCardinality(String),
    allocation_id String,
    description String,
    billed_cost Nullable(Float64),
    billed_currency LowCardinality(String),
    ingested_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(ingested_at)
PARTITION BY toYYYYMM(time)
ORDER BY (cluster, event_id);

-- The card the views apply now (its rules in order), and what it is.
CREATE OR REPLACE VIEW v_rate_card AS
SELECT * FROM rate_card
WHERE updated_at = (SELECT max(updated_at) FROM rate_card) AND cluster != '';

CREATE OR REPLACE VIEW v_rate_card_info AS
SELECT any(card_id) AS card_id, any(card_name) AS card_name, any(source) AS source,
    any(currency) AS currency, max(updated_at) AS loaded_at, countIf(cluster != '') AS rules,
    groupUniqArrayIf(cluster, cluster != '') AS clusters
FROM rate_card
WHERE updated_at = (SELECT max(updated_at) FROM rate_card);

-- Per hour, GPU and allocation (allocation_id '' = nobody held it): GPU-hours as the rollups
-- count them, energy from the minutes' measured power (power_dw deciwatts x milliseconds:
-- / 3.6e10 = kWh), and the card's rate for the GPU's node (the first rule whose pattern
-- matches). A MIG slice ('MIG-' UUID) gets its share of the parent's rate and of the power
-- reported for it (NVML and DCGM report the parent's, if anything). Where no rule matches
-- (or a MIG slice has no share) every cost and CO2 figure is NULL and rate_status says why:
-- never 0. Consumed energy is each minute's power x its consumed share of the minute; the gap
-- is the rest, as for GPU-hours. unmetered_gpu_h: GPU-hours without a power reading.
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
        if(matched, tupleElement(r.rules[idx], 3), '') AS gpu_model,
        if(matched, tupleElement(r.rules[idx], 4), '') AS environment,
        if(matched, tupleElement(r.rules[idx], 10), '') AS currency,
        tupleElement(r.rules[idx], 5) AS rule_rate,
        tupleElement(r.rules[idx], 6) AS rule_kwh_price,
        tupleElement(r.rules[idx], 7) AS rule_pue,
        if(matched, tupleElement(r.rules[idx], 8), NULL) AS rule_emission,
        if(mig, if(matched, tupleElement(r.rules[idx], 9), NULL), toNullable(1.0)) AS share,
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
            sum(toUInt64(power_dw) * unallocated_ms) / 3.6e10 AS raw_unallocated_kwh
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

-- Per day x cluster, scheduler, class, team, owner and allocation ('' = unallocated capacity).
-- A sum is NULL when any of its rows has no rate (or no emission factor, for CO2): a partial
-- sum would read as the whole. unrated_gpu_h says how many GPU-hours had no rate.
CREATE OR REPLACE VIEW v_cost_daily AS
SELECT
    toDate(c.hour) AS day, c.cluster AS cluster, c.scheduler AS scheduler,
    c.workload_class AS workload_class, c.team AS team, c.owner AS owner,
    c.allocation_id AS allocation_id,
    multiIf(countIf(c.rate_status != 'rated') = 0, 'rated',
        countIf(c.rate_status = 'rated') = 0, any(c.rate_status), 'partly rated') AS rate_status,
    anyIf(c.currency, c.currency != '') AS currency,
    sum(c.allocated_gpu_h) AS allocated_gpu_h, sum(c.measured_gpu_h) AS measured_gpu_h,
    sum(c.consumed_gpu_h) AS consumed_gpu_h, sum(c.gap_gpu_h) AS gap_gpu_h,
    sum(c.unmeasured_gpu_h) AS unmeasured_gpu_h, sum(c.unallocated_gpu_h) AS unallocated_gpu_h,
    sum(c.unmetered_gpu_h) AS unmetered_gpu_h,
    sumIf(c.allocated_gpu_h + c.unallocated_gpu_h, c.rate_status != 'rated') AS unrated_gpu_h,
    if(countIf(c.allocated_kwh IS NULL) > 0, NULL, sum(c.allocated_kwh)) AS allocated_kwh,
    if(countIf(c.consumed_kwh IS NULL) > 0, NULL, sum(c.consumed_kwh)) AS consumed_kwh,
    if(countIf(c.gap_kwh IS NULL) > 0, NULL, sum(c.gap_kwh)) AS gap_kwh,
    if(countIf(c.unallocated_kwh IS NULL) > 0, NULL, sum(c.unallocated_kwh)) AS unallocated_kwh,
    if(countIf(c.allocated_cost IS NULL) > 0, NULL, sum(c.allocated_cost)) AS allocated_cost,
    if(countIf(c.consumed_cost IS NULL) > 0, NULL, sum(c.consumed_cost)) AS consumed_cost,
    if(countIf(c.gap_cost IS NULL) > 0, NULL, sum(c.gap_cost)) AS gap_cost,
    if(countIf(c.unallocated_cost IS NULL) > 0, NULL, sum(c.unallocated_cost))
        AS unallocated_cost,
    if(countIf(c.allocated_co2_kg IS NULL) > 0, NULL, sum(c.allocated_co2_kg))
        AS allocated_co2_kg,
    if(countIf(c.consumed_co2_kg IS NULL) > 0, NULL, sum(c.consumed_co2_kg)) AS consumed_co2_kg,
    if(countIf(c.gap_co2_kg IS NULL) > 0, NULL, sum(c.gap_co2_kg)) AS gap_co2_kg,
    if(countIf(c.unallocated_co2_kg IS NULL) > 0, NULL, sum(c.unallocated_co2_kg))
        AS unallocated_co2_kg
FROM v_cost_hourly AS c
GROUP BY day, cluster, scheduler, workload_class, team, owner, allocation_id;

-- Per day and cluster, with the cluster's environment: allocated and unallocated together are
-- what the cluster cost that day.
CREATE OR REPLACE VIEW v_cost_cluster_daily AS
SELECT
    toDate(c.hour) AS day, c.cluster AS cluster,
    anyIf(c.environment, c.environment != '') AS environment,
    multiIf(countIf(c.rate_status != 'rated') = 0, 'rated',
        countIf(c.rate_status = 'rated') = 0, any(c.rate_status), 'partly rated') AS rate_status,
    anyIf(c.currency, c.currency != '') AS currency,
    sum(c.allocated_gpu_h) AS allocated_gpu_h, sum(c.consumed_gpu_h) AS consumed_gpu_h,
    sum(c.gap_gpu_h) AS gap_gpu_h, sum(c.unallocated_gpu_h) AS unallocated_gpu_h,
    sumIf(c.allocated_gpu_h + c.unallocated_gpu_h, c.rate_status != 'rated') AS unrated_gpu_h,
    if(countIf(c.allocated_kwh IS NULL OR c.unallocated_kwh IS NULL) > 0, NULL,
        sum(c.allocated_kwh + c.unallocated_kwh)) AS energy_kwh,
    if(countIf(c.allocated_cost IS NULL) > 0, NULL, sum(c.allocated_cost)) AS allocated_cost,
    if(countIf(c.consumed_cost IS NULL) > 0, NULL, sum(c.consumed_cost)) AS consumed_cost,
    if(countIf(c.gap_cost IS NULL) > 0, NULL, sum(c.gap_cost)) AS gap_cost,
    if(countIf(c.unallocated_cost IS NULL) > 0, NULL, sum(c.unallocated_cost))
        AS unallocated_cost,
    if(countIf(c.allocated_co2_kg IS NULL OR c.unallocated_co2_kg IS NULL) > 0, NULL,
        sum(c.allocated_co2_kg + c.unallocated_co2_kg)) AS co2_kg
FROM v_cost_hourly AS c
GROUP BY day, cluster;

-- Every transfer with its direction's per-GiB rate from the latest card ('no rate': NULL).
CREATE OR REPLACE VIEW v_transfers AS
SELECT
    t.event_id AS event_id, t.time AS time, toDate(t.time) AS day, t.cluster AS cluster,
    t.from_env AS from_env, t.to_env AS to_env, t.bytes AS bytes, t.bytes / 1073741824 AS gib,
    t.source AS source, t.node AS node, t.interface AS interface, t.team AS team,
    t.owner AS owner, t.allocation_id AS allocation_id, t.description AS description,
    t.billed_cost AS billed_cost, t.billed_currency AS billed_currency,
    r.rated = 1 AS rated,
    if(rated, 'rated', 'no rate') AS rate_status,
    if(rated, r.currency, '') AS currency,
    if(rated, r.per_gib, NULL) AS per_gib,
    if(rated, gib * r.per_gib, NULL) AS cost
FROM (SELECT * FROM transfers FINAL) AS t
LEFT JOIN (
    SELECT cluster, from_env, to_env, per_gib, currency, toUInt8(1) AS rated
    FROM transfer_rate
    WHERE updated_at = (SELECT max(updated_at) FROM rate_card)
) AS r ON r.cluster = t.cluster AND r.from_env = t.from_env AND r.to_env = t.to_env;

-- Bytes and cost across the boundary per day, cluster, direction, team and owner.
CREATE OR REPLACE VIEW v_transfers_daily AS
SELECT
    day, cluster, from_env, to_env, team, owner,
    multiIf(countIf(NOT rated) = 0, 'rated', countIf(rated) = 0, 'no rate', 'partly rated')
        AS rate_status,
    anyIf(currency, rated) AS currency,
    count() AS transfers, sum(bytes) AS bytes, sum(gib) AS gib,
    if(countIf(cost IS NULL) > 0, NULL, sum(cost)) AS cost,
    if(countIf(billed_cost IS NULL) > 0, NULL, sum(billed_cost)) AS billed_cost
FROM v_transfers
GROUP BY day, cluster, from_env, to_env, team, owner;
