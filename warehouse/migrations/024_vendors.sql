-- Every accelerator a mixed estate has (docs/architecture.md#one-busy-scale): each minute says
-- its device's vendor (named by the identity's prefix: GPU-/MIG- NVIDIA, AMD- AMD, XPU- Intel;
-- rows from before are NVIDIA's, the only vendor then) and, for a GPU several allocations held
-- at once, how it was split between them: 'measured' (busy time by what each holder's
-- processes measured, the rest by holding), 'even', 'mixed', or '' (held alone, or nobody's).
ALTER TABLE gpu_minutes
    ADD COLUMN IF NOT EXISTS vendor LowCardinality(String) DEFAULT
        multiIf(startsWith(gpu_uuid, 'AMD-'), 'amd', startsWith(gpu_uuid, 'XPU-'), 'intel',
            'nvidia'),
    ADD COLUMN IF NOT EXISTS share_source LowCardinality(String) DEFAULT '';

-- Allocated, consumed and gap per day, cluster and vendor: the one busy scale side by side.
-- Hours keep no vendor column: the identity names it.
CREATE OR REPLACE VIEW v_vendor_daily AS
SELECT
    toDate(hour) AS day, cluster,
    multiIf(startsWith(gpu_uuid, 'AMD-'), 'amd', startsWith(gpu_uuid, 'XPU-'), 'intel',
        'nvidia') AS vendor,
    uniqExact(if(physical_uuid = '', gpu_uuid, physical_uuid)) AS gpus,
    sum(allocated_s) / 3600 AS allocated_gpu_h,
    sumIf(consumed_gpu_s, allocation_id != '') / 3600 AS consumed_gpu_h,
    (sum(allocated_s) - sumIf(consumed_gpu_s, allocation_id != '')) / 3600 AS gap_gpu_h,
    sum(unmeasured_s) / 3600 AS unmeasured_gpu_h,
    sum(unallocated_s) / 3600 AS unallocated_gpu_h,
    sumIf(consumed_gpu_s, allocation_id = '') / 3600 AS unattributed_gpu_h
FROM gpu_hours FINAL
GROUP BY day, cluster, vendor;

-- How the time of shared GPUs was split, per day, cluster and vendor: how much of it rests on
-- measures of each holder's own processes, and how much on the even split.
CREATE OR REPLACE VIEW v_share_sources AS
SELECT
    toDate(minute) AS day, cluster, vendor, share_source,
    uniqExact(allocation_id) AS allocations,
    sum(allocated_ms) / 3600000 AS allocated_gpu_h,
    sum(consumed_ms) / 3600000 AS consumed_gpu_h
FROM gpu_minutes FINAL
WHERE share_source != ''
GROUP BY day, cluster, vendor, share_source;
