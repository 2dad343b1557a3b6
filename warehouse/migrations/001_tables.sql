-- One row per GPU per minute (per allocation where a minute is split). Values are stored as
-- scaled integers (milliseconds, basis points, deciwatts): exact to well under 0.01% of a
-- GPU-minute and about 10 bytes a row on disk. Re-delivered rows share the sorting key, so
-- ReplacingMergeTree keeps one; every view reads with FINAL, correct before merges too.
-- The hour leads the key so "the last N minutes" reads a few granules, not the table.
CREATE TABLE IF NOT EXISTS gpu_minutes
(
    cluster LowCardinality(String),
    node LowCardinality(String),
    gpu_uuid LowCardinality(String),
    minute DateTime('UTC') CODEC(DoubleDelta, ZSTD(1)),
    allocation_id String CODEC(ZSTD(1)),
    scheduler LowCardinality(String),
    workload_class LowCardinality(String),
    owner LowCardinality(String),
    team LowCardinality(String),
    gang_id String CODEC(ZSTD(1)),
    allocated_ms UInt16 CODEC(T64, ZSTD(1)),
    unallocated_ms UInt16 CODEC(T64, ZSTD(1)),
    consumed_ms UInt16 CODEC(ZSTD(1)),
    activity_max_bp UInt16 CODEC(ZSTD(1)),
    activity_metric LowCardinality(String),
    memory_used_mib UInt32 CODEC(T64, ZSTD(1)),
    power_dw UInt16 CODEC(ZSTD(1)),
    sample_count UInt8 CODEC(T64, ZSTD(1)),
    no_samples UInt8 CODEC(T64, ZSTD(1)),
    ingested_at DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1))
)
ENGINE = ReplacingMergeTree(ingested_at)
PARTITION BY toYYYYMM(minute)
ORDER BY (toStartOfHour(minute), cluster, node, gpu_uuid, minute, allocation_id);

-- Hourly rollup, recomputed from gpu_minutes FINAL for every hour the sink touched: a
-- recomputation replaces the row of the same key, so re-delivered minutes never count twice.
CREATE TABLE IF NOT EXISTS gpu_hours
(
    hour DateTime('UTC'),
    cluster LowCardinality(String),
    node LowCardinality(String),
    gpu_uuid LowCardinality(String),
    allocation_id String,
    scheduler LowCardinality(String),
    workload_class LowCardinality(String),
    owner LowCardinality(String),
    team LowCardinality(String),
    gang_id String,
    allocated_s Float64,
    unmeasured_s Float64,
    unallocated_s Float64,
    consumed_gpu_s Float64,
    minutes UInt16,
    idle_minutes UInt16,
    activity_max Float32,
    version DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(hour)
ORDER BY (hour, cluster, node, gpu_uuid, allocation_id);

-- Daily rollup per node and allocation, recomputed from gpu_hours FINAL for every day the
-- sink touched (same replace-on-recompute rule): what the report and "all time" questions
-- read, a few hundred rows a day instead of a row per GPU-hour.
CREATE TABLE IF NOT EXISTS gpu_days
(
    day Date,
    cluster LowCardinality(String),
    node LowCardinality(String),
    allocation_id String,
    scheduler LowCardinality(String),
    workload_class LowCardinality(String),
    owner LowCardinality(String),
    team LowCardinality(String),
    gang_id String,
    gpus UInt32,
    allocated_s Float64,
    unmeasured_s Float64,
    unallocated_s Float64,
    consumed_gpu_s Float64,
    idle_minutes UInt32,
    version DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (day, cluster, node, allocation_id);

-- Allocation metadata from Slurm job and Kubernetes pod events. Every column is an
-- idempotent aggregate (min/max/any), so duplicate and re-delivered events change nothing.
CREATE TABLE IF NOT EXISTS allocations
(
    cluster LowCardinality(String),
    allocation_id String,
    scheduler SimpleAggregateFunction(any, String),
    name SimpleAggregateFunction(any, String),
    owner SimpleAggregateFunction(any, String),
    team SimpleAggregateFunction(any, String),
    workload_class SimpleAggregateFunction(any, String),
    partition SimpleAggregateFunction(any, String),
    qos SimpleAggregateFunction(any, String),
    gang_id SimpleAggregateFunction(any, String),
    gang_size SimpleAggregateFunction(max, UInt32),
    gpus_requested SimpleAggregateFunction(max, UInt32),
    nodes SimpleAggregateFunction(groupUniqArrayArray, Array(String)),
    time_limit_s SimpleAggregateFunction(max, UInt64),
    submit_time SimpleAggregateFunction(min, Nullable(DateTime64(3, 'UTC'))),
    start_time SimpleAggregateFunction(min, Nullable(DateTime64(3, 'UTC'))),
    end_time SimpleAggregateFunction(max, Nullable(DateTime64(3, 'UTC'))),
    final_state SimpleAggregateFunction(any, Nullable(String)),
    exit_code SimpleAggregateFunction(any, Nullable(Int32)),
    interactive SimpleAggregateFunction(max, UInt8)
)
ENGINE = AggregatingMergeTree
ORDER BY (cluster, allocation_id);

CREATE TABLE IF NOT EXISTS alerts
(
    alert_id String,
    kind LowCardinality(String),
    state LowCardinality(String),
    time DateTime64(3, 'UTC'),
    opened_at DateTime64(3, 'UTC'),
    resolved_at Nullable(DateTime64(3, 'UTC')),
    cluster LowCardinality(String),
    scheduler LowCardinality(String),
    allocation_id String,
    gang_id String,
    owner LowCardinality(String),
    team LowCardinality(String),
    workload_class LowCardinality(String),
    nodes Array(String),
    gpus Array(String),
    idle_minutes UInt32,
    idle_gpu_hours Float64,
    pending_pods Nullable(UInt32),
    running_pods Nullable(UInt32),
    message String
)
ENGINE = ReplacingMergeTree
ORDER BY (alert_id, time, state);

CREATE TABLE IF NOT EXISTS dead_letters
(
    time DateTime64(3, 'UTC'),
    source_topic LowCardinality(String),
    partition Int32,
    offset Int64,
    key_b64 String,
    value_b64 String,
    kind LowCardinality(String),
    reason String,
    consumer LowCardinality(String)
)
ENGINE = ReplacingMergeTree
ORDER BY (source_topic, partition, offset, kind, cityHash64(value_b64));
