--
-- Least privilege: the roles fairshare_app, fairshare_worker and
-- fairshare_admin; PUBLIC may neither decide nor configure; a lease belongs
-- to the role that took it.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS fairshare;
RESET client_min_messages;

-- Runs a statement and says how it went, with lease ids (and other long
-- numbers) masked: they differ from run to run.
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    detail text;
    hint text;
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
    RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, '[0-9]{6,}', 'N', 'g') ||
           coalesce(' / ' || nullif(detail, ''), '') || coalesce(' / ' || nullif(hint, ''), '');
END
$$;

-- ---------------------------------------------------------------------------
-- The roles and the privileges
-- ---------------------------------------------------------------------------

-- The extension created the roles: no login, a comment each, and
-- fairshare_admin is a member of the two others.
SELECT rolname, rolcanlogin, shobj_description(oid, 'pg_authid') IS NOT NULL AS commented
  FROM pg_roles WHERE rolname LIKE 'fairshare\_%' ORDER BY 1;
SELECT pg_has_role('fairshare_admin', 'fairshare_app', 'USAGE') AS admin_is_app,
       pg_has_role('fairshare_admin', 'fairshare_worker', 'USAGE') AS admin_is_worker,
       pg_has_role('fairshare_app', 'fairshare_admin', 'MEMBER') AS app_is_admin,
       pg_has_role('fairshare_worker', 'fairshare_app', 'MEMBER') AS worker_is_app;

-- Who may execute each function of the extension.  PUBLIC keeps only the
-- pure cron helpers, the per-owner schedule functions, the scheduler's
-- status, and the trigger functions (which only run as triggers).
SELECT p.oid::regprocedure AS function,
       has_function_privilege('public', p.oid, 'EXECUTE') AS public,
       has_function_privilege('fairshare_app', p.oid, 'EXECUTE') AS app,
       has_function_privilege('fairshare_worker', p.oid, 'EXECUTE') AS worker,
       has_function_privilege('fairshare_admin', p.oid, 'EXECUTE') AS admin,
       has_function_privilege('pg_monitor', p.oid, 'EXECUTE') AS monitor
  FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid
 WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
   AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'fairshare')
 ORDER BY p.proname;

-- Who may read each table and view, and who may change the limits.
SELECT c.relname AS relation,
       has_table_privilege('public', c.oid, 'SELECT') AS public,
       has_table_privilege('fairshare_app', c.oid, 'SELECT') AS app,
       has_table_privilege('fairshare_worker', c.oid, 'SELECT') AS worker,
       has_table_privilege('fairshare_admin', c.oid, 'SELECT') AS admin,
       has_table_privilege('pg_monitor', c.oid, 'SELECT') AS monitor,
       has_table_privilege('fairshare_admin', c.oid, 'INSERT') AND
       has_table_privilege('fairshare_admin', c.oid, 'UPDATE') AND
       has_table_privilege('fairshare_admin', c.oid, 'DELETE') AS admin_writes,
       has_table_privilege('fairshare_app', c.oid, 'INSERT') OR
       has_table_privilege('fairshare_app', c.oid, 'UPDATE') OR
       has_table_privilege('fairshare_app', c.oid, 'DELETE') AS app_writes
  FROM pg_class c JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid
 WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
   AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'fairshare')
   AND c.relkind IN ('r', 'v')
 ORDER BY 1;

-- ---------------------------------------------------------------------------
-- A role with no fairshare role can call none of the functions that decide
-- or configure, and read none of the views that name tenants
-- ---------------------------------------------------------------------------

CREATE ROLE fs_r_nobody;
SET ROLE fs_r_nobody;
SELECT q, pg_temp.try(q) FROM (VALUES
    ('SELECT fs_acquire_slot(''r_t'', ''r_q'')'),
    ('SELECT fs_release_slot(1)'),
    ('SELECT fs_renew_slot(1)'),
    ('SELECT fs_spend_tokens(''victim'', 1)'),
    ('SELECT fs_charge_tokens(''victim'', 86400000)'),
    ('SELECT fs_effective_limits(''r_t'')'),
    ('SELECT fs_route_enqueue(''r_t'', ''job'', ''[]'')'),
    ('SELECT fs_claim(''r_rq'', NULL::int)'),
    ('SELECT fs_ready_tenants(''r_rq'')'),
    ('SELECT fs_worker_heartbeat(''w'', 4)'),
    ('SELECT fs_report_latency(''1 day'')'),
    ('SELECT fs_set_limit(''r_t'', max_slots => 100)'),
    ('INSERT INTO fs_limits (tenant, max_slots) VALUES (''r_t'', 100)'),
    ('SELECT fs_reset()'),
    ('SELECT fs_save_state()'),
    ('SELECT fs_register_queue(''r_rq'', ''pg_class'', ''relname'', ''oid'')'),
    ('SELECT fs_unregister_queue(''r_rq'')'),
    ('SELECT fs_resync()'),
    ('SELECT FROM fs_tenants'),
    ('SELECT FROM fs_leases'),
    ('SELECT FROM fs_decisions'),
    ('SELECT FROM fs_fairness'),
    ('SELECT FROM fs_fair_shares'),
    ('SELECT FROM fs_queues'),
    ('SELECT FROM fs_workers'),
    ('SELECT FROM fs_stats'),
    ('SELECT FROM fs_tiers'),
    -- still everyone's
    ('SELECT fs_next_run(''0 * * * *'', ''UTC'', now())'),
    ('SELECT FROM fs_limits'),
    ('SELECT FROM fs_schedule_status'),
    ('SELECT FROM fs_scheduler')) AS t(q);
RESET ROLE;

-- pg_monitor reads the monitoring views, and decides nothing.
CREATE ROLE fs_r_monitor IN ROLE pg_monitor;
SET ROLE fs_r_monitor;
SELECT q, pg_temp.try(q) FROM (VALUES
    ('SELECT FROM fs_tenants, fs_leases, fs_decisions, fs_fairness, fs_fair_shares, fs_queues, fs_workers, fs_stats, fs_tiers'),
    ('SELECT fs_acquire_slot(''r_t'', ''r_q'')'),
    ('SELECT fs_report_latency(''1 day'')')) AS t(q);
RESET ROLE;

-- ---------------------------------------------------------------------------
-- Each role does its part, and only that
-- ---------------------------------------------------------------------------

CREATE ROLE fs_r_app IN ROLE fairshare_app;
CREATE ROLE fs_r_worker IN ROLE fairshare_worker;
CREATE ROLE fs_r_admin IN ROLE fairshare_admin;

SET ROLE fs_r_app;
SELECT q, pg_temp.try(q) FROM (VALUES
    ('SELECT fs_release_slot(fs_acquire_slot(''r_app'', ''r_q''))'),
    ('SELECT fs_spend_tokens(''r_app'', 1, 100, ''r_q'')'),
    ('SELECT fs_charge_tokens(''r_app'', 10, ''r_q'')'),
    ('SELECT fs_effective_limits(''r_app'', ''r_q'')'),
    ('SELECT fs_route_enqueue(''r_app'', ''job'', ''[]'', ''r_q'')'),
    ('SELECT FROM fs_tenants, fs_leases, fs_decisions, fs_fairness, fs_fair_shares, fs_queues, fs_workers, fs_stats, fs_tiers'),
    ('SELECT fs_worker_heartbeat(''w'', 4, ''r_q'')'),
    ('SELECT fs_report_latency(''1 day'', ''r_q'')'),
    ('SELECT fs_set_limit(''r_app'', ''r_q'', max_slots => 100)'),
    ('UPDATE fs_limits SET max_slots = 100'),
    ('SELECT fs_reset()')) AS t(q);
RESET ROLE;

SET ROLE fs_r_worker;
SELECT q, pg_temp.try(q) FROM (VALUES
    ('SELECT fs_worker_heartbeat(''w'', 4, ''r_q'')'),
    ('SELECT fs_report_latency(''1 second'', ''r_q'')'),
    ('SELECT FROM fs_tenants, fs_leases, fs_decisions, fs_fairness, fs_fair_shares, fs_queues, fs_workers, fs_stats, fs_tiers'),
    ('SELECT fs_acquire_slot(''r_worker'', ''r_q'')'),
    ('SELECT fs_spend_tokens(''r_worker'', 1, 100, ''r_q'')'),
    ('SELECT fs_set_limit(''r_worker'', ''r_q'', max_slots => 100)')) AS t(q);
RESET ROLE;

SET ROLE fs_r_admin;
SELECT q, pg_temp.try(q) FROM (VALUES
    ('SELECT fs_set_limit(''r_admin'', ''r_q'', max_slots => 2)'),
    ('UPDATE fs_limits SET weight = 2 WHERE queue = ''r_q'' AND tenant = ''r_admin'''),
    ('SELECT fs_reset()'),
    ('SELECT fs_resync()'),
    -- a member of fairshare_app and fairshare_worker as well
    ('SELECT fs_release_slot(fs_acquire_slot(''r_admin'', ''r_q''))'),
    ('SELECT fs_worker_heartbeat(''w'', 0, ''r_q'')'),
    -- registering still takes owning the table
    ('SELECT fs_register_queue(''r_rq'', ''pg_class'', ''relname'', ''oid'')')) AS t(q);
RESET ROLE;
SELECT tenant, max_slots, weight FROM fs_limits WHERE queue = 'r_q';
-- the limits changed by fairshare_admin apply
SELECT max_slots, weight FROM fs_effective_limits('r_admin', 'r_q');
DELETE FROM fs_limits WHERE queue = 'r_q';

-- ---------------------------------------------------------------------------
-- A lease is released or renewed by the role that took it, a role with its
-- privileges, fairshare_admin or a superuser; nobody else
-- ---------------------------------------------------------------------------

CREATE ROLE fs_r_other IN ROLE fairshare_app;
CREATE ROLE fs_r_boss;
GRANT fs_r_app TO fs_r_boss;

SET ROLE fs_r_app;
SELECT fs_acquire_slot('r_own', 'r_q') AS lease \gset
SELECT owner, state FROM fs_leases WHERE lease_id = :lease;
SET ROLE fs_r_other;
SELECT pg_temp.try('SELECT fs_release_slot(' || :lease || ')') AS release_by_other;
SELECT pg_temp.try('SELECT fs_renew_slot(' || :lease || ')') AS renew_by_other;
-- the refusals left it as it was
SELECT owner, state FROM fs_leases WHERE lease_id = :lease;
-- an unknown lease is false, for anyone
SELECT fs_release_slot(1) AS unknown_release, fs_renew_slot(1) AS unknown_renew;
-- a role with the owner's privileges may
SET ROLE fs_r_boss;
SELECT fs_renew_slot(:lease) AS renewed_by_boss;
-- fairshare_admin may
SET ROLE fs_r_admin;
SELECT fs_renew_slot(:lease) AS renewed_by_admin;
SELECT fs_release_slot(:lease) AS released_by_admin;
-- the owner itself may
SET ROLE fs_r_app;
SELECT fs_acquire_slot('r_own', 'r_q') AS lease \gset
SELECT fs_renew_slot(:lease) AS renewed_by_owner;
SELECT fs_release_slot(:lease) AS released_by_owner;
SELECT fs_release_slot(:lease) AS released_again;
-- and a superuser may
SELECT fs_acquire_slot('r_own', 'r_q') AS lease \gset
RESET ROLE;
SELECT fs_release_slot(:lease) AS released_by_superuser;
SELECT count(*) AS leases_left FROM fs_leases WHERE queue = 'r_q';

-- A refusal inside a transaction takes nothing else back with it.
SET ROLE fs_r_app;
SELECT fs_acquire_slot('r_tx', 'r_q') AS lease \gset
SET ROLE fs_r_other;
BEGIN;
SELECT fs_acquire_slot('r_tx2', 'r_q') IS NOT NULL AS took_one;
SAVEPOINT s;
SELECT pg_temp.try('SELECT fs_release_slot(' || :lease || ')') AS release_by_other;
ROLLBACK TO s;
COMMIT;
RESET ROLE;
SELECT tenant, owner, state FROM fs_leases WHERE queue = 'r_q' ORDER BY tenant;
SELECT fs_release_slot(lease_id) FROM fs_leases WHERE queue = 'r_q';

-- ---------------------------------------------------------------------------
-- fs_claim(): the claimer owns the lease, and the running table's trigger
-- releases it whichever role writes the running table
-- ---------------------------------------------------------------------------

CREATE TABLE r_jobs (id bigint PRIMARY KEY, tenant text NOT NULL);
CREATE TABLE r_running (job_id bigint PRIMARY KEY);
SELECT queue FROM fs_register_queue('r_rq', 'r_jobs', 'tenant', 'id',
       running_table => 'r_running', running_key => 'job_id');
INSERT INTO r_jobs VALUES (1, 'a'), (2, 'b');
GRANT SELECT, UPDATE, DELETE ON r_jobs TO fs_r_app;
GRANT SELECT, INSERT ON r_running TO fs_r_app;
-- a role that is no member of any fairshare role ends the runs
CREATE ROLE fs_r_janitor;
GRANT SELECT, DELETE, TRUNCATE ON r_running TO fs_r_janitor;

SET ROLE fs_r_app;
BEGIN;
WITH c AS (SELECT (job).id FROM fs_claim('r_rq', NULL::r_jobs, 2))
INSERT INTO r_running SELECT id FROM c;
DELETE FROM r_jobs;
COMMIT;
SELECT tenant, owner, state FROM fs_leases WHERE queue = 'r_rq' ORDER BY tenant;
-- another fairshare_app role may not release the claimer's lease by id
SET ROLE fs_r_other;
SELECT pg_temp.try('SELECT fs_release_slot(' || lease_id || ')') AS release_by_other
  FROM fs_leases WHERE queue = 'r_rq' AND tenant = 'a';
SET ROLE fs_r_janitor;
DELETE FROM r_running WHERE job_id = 1;
RESET ROLE;
SELECT tenant, owner, state FROM fs_leases WHERE queue = 'r_rq' ORDER BY tenant;
-- TRUNCATE of the running table ends every run of the queue
SET ROLE fs_r_janitor;
TRUNCATE r_running;
RESET ROLE;
SELECT count(*) AS leases_left FROM fs_leases WHERE queue = 'r_rq';
SELECT fs_unregister_queue('r_rq');
DROP TABLE r_jobs, r_running;

-- ---------------------------------------------------------------------------
-- The two-line setup: an application's role gets both roles
-- ---------------------------------------------------------------------------

CREATE ROLE fs_r_service;
GRANT fairshare_app TO fs_r_service;
GRANT fairshare_worker TO fs_r_service;
SET ROLE fs_r_service;
SELECT fs_worker_heartbeat('svc-1', 4, 'r_q');
SELECT fs_report_latency('100 ms', 'r_q');
SELECT fs_spend_tokens('r_svc', 2, 100, 'r_q') AS granted;
SELECT fs_acquire_slot('r_svc', 'r_q') AS lease \gset
SELECT fs_renew_slot(:lease) AS renewed, fs_release_slot(:lease) AS released;
SELECT live_threads, backpressure FROM fs_queues WHERE queue = 'r_q';
SELECT pg_temp.try('SELECT fs_set_limit(''r_svc'', ''r_q'', max_slots => 9)') AS set_limit;
SELECT fs_worker_heartbeat('svc-1', 0, 'r_q');
RESET ROLE;

DROP OWNED BY fs_r_app, fs_r_janitor;
DROP ROLE fs_r_nobody, fs_r_monitor, fs_r_app, fs_r_worker, fs_r_admin, fs_r_other, fs_r_boss, fs_r_janitor,
          fs_r_service;
