-- gpugap on a real ClickHouse server: BI users of one team, and of one person, who see only
-- what warehouse/embedded/scopes.py lets such a reader see on the embedded endpoint
-- (docs/security.md#row-policies-on-a-clickhouse-server). The server enforces it: row policies
-- on every table of gpugap's database, held by roles, each user holding one role.
--
-- A template for one team and one person of that team. Fill in the placeholders, then run it
-- as a user with access management (run it again for each team and person; every statement
-- may be run again):
--   {team}           the team's name as the records hold it (the `team` column; the page shows it)
--   {user}           the person's name as the records hold it (the `owner` column: the Slurm
--                    user or the pod owner), a member of {team}
--   {team_password}  the password of the team's BI user `{team}-bi`
--   {user_password}  the password of the person's BI user `{user}-bi`
-- for example, with passwords of hex digits (safe in sed), piped so no filled copy is written:
--   team_pw=$(openssl rand -hex 24); user_pw=$(openssl rand -hex 24)
--   sed -e 's/{team}/vision/g' -e 's/{user}/alice/g' -e "s/{team_password}/$team_pw/" \
--       -e "s/{user_password}/$user_pw/" deploy/clickhouse/row-policies.sql \
--     | clickhouse-client --multiquery
-- then hand each password to its user. A filled copy holds the passwords: keep it 0600 and
-- delete it after (or write `IDENTIFIED WITH sha256_hash BY '<hex>' SALT '<salt>'`). In a
-- name, escape ' and ` as \' and \`. Leave out the team's or the person's part to create
-- only the other. The database is `gpugap`: for another, replace `gpugap.` everywhere.
--
-- Run the whole file again after an upgrade whose migrations add a table: a table with no
-- row policy at all is readable in full by every user granted SELECT on the database.
-- tests/deploy/test_row_policies.py checks that every table the endpoint protects is here.

-- ---------------------------------------------------------------------------------------
-- Once per server: everyone who is not scoped sees every row.
--
-- A table with any row policy shows a user no policy covers no rows at all, on servers where
-- access_control_improvements.users_without_row_policies_can_read_rows is false. So every
-- table gets a `USING 1` policy for every user except those holding `gpugap_scoped`: the
-- sink and gpugap's admin user, the unscoped `reader`, your own accounts read as before.
-- `gpugap_scoped` has no privilege of its own; it is granted to each scoped role (below),
-- never to a user, so a scoped user cannot switch it off without switching off the role that
-- gives it SELECT. Never grant it, or a team's role, to the sink's user: the sink computes
-- team_days from every team's rows.
CREATE ROLE IF NOT EXISTS gpugap_scoped;

CREATE ROW POLICY OR REPLACE gpugap_all_rows ON
    gpugap.gpu_minutes, gpugap.gpu_hours, gpugap.gpu_days, gpugap.allocations, gpugap.alerts,
    gpugap.alert_deliveries, gpugap.transfers, gpugap.team_days, gpugap.recommendations,
    gpugap.recommendation_decisions, gpugap.idle_policy, gpugap.rate_card, gpugap.transfer_rate,
    gpugap.schema_migrations, gpugap.node_capacity, gpugap.queue_quotas, gpugap.dead_letters,
    gpugap.scheduler_gpu_counts, gpugap.report_sends
    FOR SELECT USING 1 TO ALL EXCEPT gpugap_scoped;

-- ---------------------------------------------------------------------------------------
-- A team: its lead and its BI tools see the team's allocations, people and recommendations.
CREATE ROLE IF NOT EXISTS `gpugap_team_{team}`;
GRANT gpugap_scoped TO `gpugap_team_{team}`;
-- SELECT only: no write, no CREATE TEMPORARY TABLE (so no table function: merge(), loop(),
-- url(), remote() are refused), no other database.
GRANT SELECT ON gpugap.* TO `gpugap_team_{team}`;

-- per-allocation rows: the team's
CREATE ROW POLICY OR REPLACE `gpugap_team_{team}` ON
    gpugap.gpu_minutes, gpugap.gpu_hours, gpugap.gpu_days, gpugap.allocations, gpugap.alerts,
    gpugap.alert_deliveries, gpugap.transfers
    FOR SELECT USING team = '{team}' TO `gpugap_team_{team}`;
-- the team's totals per day
CREATE ROW POLICY OR REPLACE `gpugap_team_{team}` ON gpugap.team_days
    FOR SELECT USING team = '{team}' TO `gpugap_team_{team}`;
-- a recommendation names a Slurm user and account or a Kubernetes namespace, not a team: the
-- team's are those about its account or namespace, or about a person with an allocation of it
CREATE ROW POLICY OR REPLACE `gpugap_team_{team}` ON gpugap.recommendations
    FOR SELECT USING account = '{team}' OR namespace = '{team}'
        OR user IN (SELECT owner FROM gpugap.allocations WHERE team = '{team}')
    TO `gpugap_team_{team}`;
-- the decisions on the team's recommendations (spelled out, so the policy does not depend on
-- the recommendations' own policy applying inside it)
CREATE ROW POLICY OR REPLACE `gpugap_team_{team}` ON gpugap.recommendation_decisions
    FOR SELECT USING id IN (SELECT id FROM gpugap.recommendations WHERE account = '{team}'
        OR namespace = '{team}'
        OR user IN (SELECT owner FROM gpugap.allocations WHERE team = '{team}'))
    TO `gpugap_team_{team}`;
-- the estate's configuration: the same for everyone
CREATE ROW POLICY OR REPLACE `gpugap_team_{team}` ON
    gpugap.idle_policy, gpugap.rate_card, gpugap.transfer_rate, gpugap.schema_migrations
    FOR SELECT USING 1 TO `gpugap_team_{team}`;
-- other teams' allocations by node, raw records, the scheduler's own counts, every queue's
-- quotas, who was sent which report: the operators'
CREATE ROW POLICY OR REPLACE `gpugap_team_{team}` ON
    gpugap.node_capacity, gpugap.queue_quotas, gpugap.dead_letters, gpugap.scheduler_gpu_counts,
    gpugap.report_sends
    FOR SELECT USING 0 TO `gpugap_team_{team}`;

-- the team's BI user (and the lead's, for a BI tool); SELECT comes with the role alone
CREATE USER IF NOT EXISTS `{team}-bi` IDENTIFIED WITH sha256_password BY '{team_password}'
    DEFAULT DATABASE gpugap;
GRANT `gpugap_team_{team}` TO `{team}-bi`;
SET DEFAULT ROLE `gpugap_team_{team}` TO `{team}-bi`;

-- ---------------------------------------------------------------------------------------
-- A person of the team: their own allocations and recommendations, and the team's totals.
CREATE ROLE IF NOT EXISTS `gpugap_person_{user}`;
GRANT gpugap_scoped TO `gpugap_person_{user}`;
GRANT SELECT ON gpugap.* TO `gpugap_person_{user}`;

CREATE ROW POLICY OR REPLACE `gpugap_person_{user}` ON
    gpugap.gpu_minutes, gpugap.gpu_hours, gpugap.gpu_days, gpugap.allocations, gpugap.alerts,
    gpugap.alert_deliveries, gpugap.transfers
    FOR SELECT USING owner = '{user}' AND team = '{team}' TO `gpugap_person_{user}`;
CREATE ROW POLICY OR REPLACE `gpugap_person_{user}` ON gpugap.team_days
    FOR SELECT USING team = '{team}' TO `gpugap_person_{user}`;
CREATE ROW POLICY OR REPLACE `gpugap_person_{user}` ON gpugap.recommendations
    FOR SELECT USING user = '{user}' TO `gpugap_person_{user}`;
CREATE ROW POLICY OR REPLACE `gpugap_person_{user}` ON gpugap.recommendation_decisions
    FOR SELECT USING id IN (SELECT id FROM gpugap.recommendations WHERE user = '{user}')
    TO `gpugap_person_{user}`;
CREATE ROW POLICY OR REPLACE `gpugap_person_{user}` ON
    gpugap.idle_policy, gpugap.rate_card, gpugap.transfer_rate, gpugap.schema_migrations
    FOR SELECT USING 1 TO `gpugap_person_{user}`;
CREATE ROW POLICY OR REPLACE `gpugap_person_{user}` ON
    gpugap.node_capacity, gpugap.queue_quotas, gpugap.dead_letters, gpugap.scheduler_gpu_counts,
    gpugap.report_sends
    FOR SELECT USING 0 TO `gpugap_person_{user}`;

CREATE USER IF NOT EXISTS `{user}-bi` IDENTIFIED WITH sha256_password BY '{user_password}'
    DEFAULT DATABASE gpugap;
GRANT `gpugap_person_{user}` TO `{user}-bi`;
SET DEFAULT ROLE `gpugap_person_{user}` TO `{user}-bi`;

-- Check, as each BI user: `SELECT DISTINCT team FROM gpugap.gpu_days` names the team only,
-- and `SELECT count() FROM gpugap.dead_letters` is 0. gpugap's views are created without SQL
-- SECURITY, so they read as the one who asks (the server's default_normal_view_sql_security,
-- INVOKER unless a profile changes it) and the policies above hold through them.
