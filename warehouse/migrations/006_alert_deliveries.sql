-- The notifiers' audit trail: every alert state sent to a target (Alertmanager, Slack, a
-- webhook, email) with the outcome and the target's answer, from alerts.deliveries.v1.
-- A reminder (GPUGAP_IDLE_REMIND_MINUTES) is an update row with its reminder_minutes.
-- A re-delivered Kafka record repeats its row exactly: ReplacingMergeTree keeps one.
CREATE TABLE IF NOT EXISTS alert_deliveries
(
    alert_id String,
    state LowCardinality(String),
    target LowCardinality(String),
    time DateTime64(3, 'UTC'),
    outcome LowCardinality(String),
    code Nullable(UInt16),
    detail String,
    attempts UInt32,
    reminder_minutes Nullable(UInt32),
    kind LowCardinality(String),
    cluster LowCardinality(String),
    allocation_id String,
    owner LowCardinality(String),
    team LowCardinality(String)
)
ENGINE = ReplacingMergeTree
ORDER BY (alert_id, target, state, time);

-- Per alert and target: when each state was delivered (or refused), and how long after the
-- alert opened the target was told.
CREATE OR REPLACE VIEW v_alert_deliveries AS
SELECT
    alert_id, target,
    any(kind) AS kind, any(cluster) AS cluster, any(allocation_id) AS allocation_id,
    any(owner) AS owner, any(team) AS team,
    minIf(time, state = 'open' AND outcome = 'delivered') AS open_delivered_at,
    minIf(time, state = 'resolved' AND outcome = 'delivered') AS resolve_delivered_at,
    countIf(outcome = 'refused') AS refused,
    countIf(state = 'update' AND outcome = 'delivered') AS reminders,
    argMax(outcome, time) AS last_outcome, argMax(code, time) AS last_code,
    argMax(detail, time) AS last_detail, max(time) AS updated_at
FROM alert_deliveries FINAL
GROUP BY alert_id, target;
