-- Recommendations a person reviews (gpugap recommend; docs/recommendations.md). gpugap never
-- changes a scheduler: these are records, and every decision on one is kept.

-- The pod's owner (Deployment, Notebook, PyTorchJob...) names the Kubernetes workload a
-- recommendation targets. max: events of a pod all carry the same owner, and '' (Slurm jobs,
-- rows stored before) never wins over a name.
ALTER TABLE allocations
    ADD COLUMN IF NOT EXISTS owner_kind SimpleAggregateFunction(max, String) DEFAULT '',
    ADD COLUMN IF NOT EXISTS owner_name SimpleAggregateFunction(max, String) DEFAULT '';

-- v_allocations with the same columns, and the owner's kind and name at the end.
CREATE OR REPLACE VIEW v_allocations AS
SELECT
    cluster, allocation_id, scheduler, name, owner, team, workload_class, partition, qos,
    gang_id, gang_size, gpus_requested, nodes, time_limit_s, submit_time, start_time, end_time,
    final_state, exit_code, interactive,
    if(end_time IS NULL, NULL, dateDiff('millisecond', start_time, end_time) / 1000) AS elapsed_s,
    owner_kind, owner_name
FROM allocations FINAL;

-- One row per recommendation id (a hash of its kind, target and change): recomputing
-- replaces the row of the same id with the newer numbers (ReplacingMergeTree by computed_at),
-- never adds one. `record` is the whole recommendations.v1 record as JSON.
CREATE TABLE IF NOT EXISTS recommendations
(
    id String,
    kind LowCardinality(String),
    scheduler LowCardinality(String),
    cluster LowCardinality(String),
    target_kind LowCardinality(String),
    target String,
    user String,
    account String,
    job_name String,
    partition String,
    namespace String,
    owner_kind String,
    owner_name String,
    workload_class LowCardinality(String),
    parameter LowCardinality(String),
    from_value String,
    to_value String,
    saved_gpu_h_per_week Float64,
    confidence Float64,
    history_days Float64,
    allocations UInt32,
    samples UInt32,
    sample_hours Float64,
    sample_gpu_h Float64,
    spread Float64,
    since DateTime64(3, 'UTC'),
    until DateTime64(3, 'UTC'),
    evidence_query String,
    rationale String,
    apply String,
    record String,
    computed_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(computed_at)
ORDER BY id;

-- The audit trail: every accept / reject / defer, who, when and why. Append-only (a plain
-- MergeTree: nothing replaces or collapses a row); the latest decision on an id is its state.
CREATE TABLE IF NOT EXISTS recommendation_decisions
(
    id String,
    decision LowCardinality(String),
    decided_by String,
    reason String,
    decided_at DateTime64(3, 'UTC'),
    kind LowCardinality(String),
    target String,
    parameter LowCardinality(String),
    from_value String,
    to_value String,
    saved_gpu_h_per_week Float64,
    confidence Float64
)
ENGINE = MergeTree
ORDER BY (id, decided_at);

-- Every recommendation with its latest decision ('' = none yet); `current` marks those the
-- latest `gpugap recommend compute` produced (older ones no longer hold on today's data).
CREATE OR REPLACE VIEW v_recommendations AS
SELECT
    r.id AS id, r.kind AS kind, r.scheduler AS scheduler, r.cluster AS cluster,
    r.target_kind AS target_kind, r.target AS target, r.workload_class AS workload_class,
    r.parameter AS parameter, r.from_value AS from_value, r.to_value AS to_value,
    r.saved_gpu_h_per_week AS saved_gpu_h_per_week, r.confidence AS confidence,
    r.history_days AS history_days, r.allocations AS allocations, r.samples AS samples,
    r.sample_gpu_h AS sample_gpu_h, r.since AS since, r.until AS until,
    r.computed_at AS computed_at,
    r.computed_at = (SELECT max(computed_at) FROM recommendations) AS current,
    d.last_decision AS decision, d.last_by AS decided_by, d.last_at AS decided_at,
    d.last_reason AS reason
FROM (SELECT * FROM recommendations FINAL) AS r
LEFT JOIN (
    SELECT id, argMax(decision, decided_at) AS last_decision,
        argMax(decided_by, decided_at) AS last_by, max(decided_at) AS last_at,
        argMax(reason, decided_at) AS last_reason
    FROM recommendation_decisions
    GROUP BY id
) AS d ON d.id = r.id;

-- What still waits for a person: current, and not decided (or deferred).
CREATE OR REPLACE VIEW v_recommendations_open AS
SELECT * FROM v_recommendations
WHERE current AND decision IN ('', 'defer')
ORDER BY saved_gpu_h_per_week DESC;

-- The audit trail, newest first.
CREATE OR REPLACE VIEW v_recommendation_decisions AS
SELECT id, decision, decided_by, decided_at, reason, kind, target, parameter, from_value,
    to_value, saved_gpu_h_per_week, confidence
FROM recommendation_decisions
ORDER BY decided_at DESC, id;
