-- The latest state of an alert, with ties broken by the state's order: a merged alert's
-- RESOLVED record can carry the same time as the UPDATE before it, and argMax(state, time)
-- then answered either (v_alerts said 'update' for one alert_id while the unfiltered view
-- said 'resolved'; v_alerts_open listed resolved alerts). open < update < resolved.
CREATE OR REPLACE VIEW v_alerts AS
SELECT alert_id, argMax(kind, k) AS kind, argMax(state, k) AS state,
    min(opened_at) AS opened_at, max(resolved_at) AS resolved_at, max(time) AS updated_at,
    argMax(cluster, k) AS cluster, argMax(scheduler, k) AS scheduler,
    argMax(allocation_id, k) AS allocation_id, argMax(gang_id, k) AS gang_id,
    argMax(owner, k) AS owner, argMax(team, k) AS team,
    argMax(workload_class, k) AS workload_class, argMax(gpus, k) AS gpus,
    max(idle_gpu_hours) AS idle_gpu_hours, argMax(message, k) AS message
FROM (SELECT *, (time, indexOf(['open', 'update', 'resolved'], state)) AS k FROM alerts)
GROUP BY alert_id;

CREATE OR REPLACE VIEW v_alerts_open AS
SELECT * FROM v_alerts WHERE state != 'resolved';

CREATE OR REPLACE VIEW v_partial_gangs_now AS
SELECT
    alert_id, argMax(cluster, k) AS cluster, argMax(scheduler, k) AS scheduler,
    argMax(gang_id, k) AS gang_id, argMax(owner, k) AS owner, argMax(team, k) AS team,
    argMax(workload_class, k) AS workload_class,
    argMax(running_pods, k) AS running_pods, argMax(pending_pods, k) AS pending_pods,
    argMax(nodes, k) AS nodes, argMax(gpus, k) AS gpus,
    min(opened_at) AS opened_at, max(time) AS updated_at,
    max(idle_gpu_hours) AS idle_gpu_hours, argMax(message, k) AS message
FROM (SELECT *, (time, indexOf(['open', 'update', 'resolved'], state)) AS k FROM alerts)
WHERE kind = 'partial_gang'
GROUP BY alert_id
HAVING argMax(state, k) != 'resolved';
