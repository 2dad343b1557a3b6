-- Each team's totals per day, without its allocations: what a user signed in to the page (or a
-- BI user scoped to one person) may read of the team beside their own jobs
-- (docs/security.md#who-sees-what). The embedded endpoint's row policies let a scoped reader see
-- gpu_days only for their own jobs and this table for their team: the totals are computed here,
-- by the sink, where every row is visible. Recomputed from gpu_days FINAL for every day the sink
-- rolls up (warehouse/rows.py TEAM_DAILY), replacing the row of the same key.
CREATE TABLE IF NOT EXISTS team_days
(
    day Date,
    cluster LowCardinality(String),
    team LowCardinality(String),
    scheduler LowCardinality(String),
    workload_class LowCardinality(String),
    allocations UInt32,
    owners UInt32,
    allocated_s Float64,
    unmeasured_s Float64,
    consumed_gpu_s Float64,
    idle_s Float64,
    version DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (day, cluster, team, scheduler, workload_class);

-- the days rolled up before this table: once, from gpu_days as it stands
INSERT INTO team_days (day, cluster, team, scheduler, workload_class, allocations, owners,
    allocated_s, unmeasured_s, consumed_gpu_s, idle_s, version)
SELECT day, cluster, team, scheduler, workload_class, uniqExact(allocation_id),
    uniqExact(owner), sum(allocated_s), sum(unmeasured_s), sum(consumed_gpu_s), sum(idle_s),
    now64(3)
FROM gpu_days FINAL
WHERE allocation_id != ''
GROUP BY day, cluster, team, scheduler, workload_class;

-- A team's days in GPU-hours: allocated, consumed, gap (allocated and measured, not used).
CREATE OR REPLACE VIEW v_team_daily AS
SELECT day, cluster, team, scheduler, workload_class,
    sum(allocations) AS allocations,
    sum(allocated_s) / 3600 AS allocated_gpu_h,
    sum(consumed_gpu_s) / 3600 AS consumed_gpu_h,
    sum(allocated_s - unmeasured_s - consumed_gpu_s) / 3600 AS gap_gpu_h,
    sum(idle_s) / 3600 AS idle_gpu_h
FROM team_days FINAL
GROUP BY day, cluster, team, scheduler, workload_class;
