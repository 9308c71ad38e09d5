--
-- Fair dequeue: fs_register_queue(), fs_claim(), fs_ready_tenants(),
-- fs_resync(), the backlog triggers, automatic release, and the metrics.
-- Solid Queue's and GoodJob's tables come from examples/ (mirrored from
-- their migrations); a plain table covers the rest.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS fairshare;
\set QUIET on
\i examples/solid_queue/schema.sql
\i examples/good_job/schema.sql
\set QUIET off
RESET client_min_messages;
-- Decide at one fixed instant: leases never expire and served work does not
-- decay while the test runs.
SET fairshare.debug_clock = 1893456000;	-- 2030-01-01 00:00 UTC

-- ---------------------------------------------------------------------------
-- Registering the real shapes
-- ---------------------------------------------------------------------------

-- Solid Queue: one tenant per queue name; its own poll-by-queue index serves.
SELECT queue, ready_table, tenant, order_by, ready_filter, claim_filter, key, key_type,
       running_table, running_filter, running_key, cost, charge_runtime, ready_index, index_created
  FROM fs_register_queue('solid_queue', 'solid_queue_ready_executions',
       tenant => 'queue_name', order_by => 'priority, job_id', key => 'job_id',
       running_table => 'solid_queue_claimed_executions');

-- GoodJob: the filter is split, the row-only part is indexed and counted,
-- the now() part is checked at claim time; an index is created.
SELECT queue, tenant, order_by, ready_filter, claim_filter, key, key_type,
       running_table, running_filter, running_key, ready_index, index_created
  FROM fs_register_queue('good_job', 'good_jobs',
       tenant => 'concurrency_key', order_by => 'priority NULLS LAST, created_at',
       filter => 'finished_at IS NULL AND locked_by_id IS NULL AND scheduled_at <= (now() AT TIME ZONE ''UTC'')',
       running_table => 'good_jobs',
       running_filter => 'finished_at IS NULL AND locked_by_id IS NOT NULL');
SELECT indexrelid::regclass AS index, pg_get_indexdef(indexrelid) AS definition
  FROM pg_index WHERE indexrelid = 'good_jobs_fs_fair'::regclass;
SELECT tgrelid::regclass AS "table", tgname, pg_get_triggerdef(oid) AS definition
  FROM pg_trigger
 WHERE tgrelid IN ('good_jobs'::regclass, 'solid_queue_ready_executions'::regclass,
                   'solid_queue_claimed_executions'::regclass)
   AND tgname LIKE 'fs_fair%'
 ORDER BY 1, 2;

-- A plain table, with a cost per row; a tenant of type bigint becomes text.
CREATE TABLE fq_jobs (id bigserial PRIMARY KEY, account bigint, priority int NOT NULL DEFAULT 0,
                      state text NOT NULL DEFAULT 'ready', cost_ms int, note text);
SELECT queue, tenant, order_by, ready_filter, key, cost, ready_index
  FROM fs_register_queue('fq', 'fq_jobs', tenant => 'account', order_by => 'priority DESC, id',
       filter => 'state = ''ready''');
SELECT pg_get_indexdef('fq_jobs_fs_fair'::regclass) AS definition;

-- ---------------------------------------------------------------------------
-- What registration refuses, and says why
-- ---------------------------------------------------------------------------

SELECT fs_register_queue(NULL, 'fq_jobs', 'account', 'id');
SELECT fs_register_queue('', 'fq_jobs', 'account', 'id');
SELECT fs_register_queue('*', 'fq_jobs', 'account', 'id');
SELECT fs_register_queue('bad', NULL, 'account', 'id');
SELECT fs_register_queue('bad', 'no_such_table', 'account', 'id');
SELECT fs_register_queue('bad', 'fq_jobs', NULL, 'id');
SELECT fs_register_queue('bad', 'fq_jobs', '  ', 'id');
SELECT fs_register_queue('bad', 'fq_jobs', 'account', NULL);
-- unknown column, and one that is not in the running table
SELECT fs_register_queue('bad', 'fq_jobs', 'acount', 'id');
SELECT fs_register_queue('bad', 'fq_jobs', 'account', 'id', running_table => 'solid_queue_processes',
       running_key => 'job_id');
-- wrong types
SELECT fs_register_queue('bad', 'fq_jobs', 'state = ''x''', 'id');
SELECT fs_register_queue('bad', 'fq_jobs', 'account', 'id', filter => 'account');
SELECT fs_register_queue('bad', 'fq_jobs', 'account', 'id', cost => 'note');
SELECT fs_register_queue('bad', 'fq_jobs', 'account', 'id', key => 'state = ''x''');
SELECT fs_register_queue('bad', 'solid_queue_ready_executions', 'queue_name', 'id',
       key => 'job_id', running_table => 'good_jobs', running_key => 'id');
SELECT fs_register_queue('bad', 'fq_jobs', 'account', 'id', filter => 'state = 1');
SELECT fs_register_queue('bad', 'good_jobs', 'concurrency_key', 'point(priority, priority)');
-- a tenant that is not a function of the row, or not immutable
SELECT fs_register_queue('bad', 'fq_jobs', '''everyone''', 'id');
SELECT fs_register_queue('bad', 'fq_jobs', 'account::text || now()::text', 'id');
SELECT fs_register_queue('bad', 'fq_jobs', 'account', 'id', filter => 'random() < 0.5');
SELECT fs_register_queue('bad', 'fq_jobs', 'account', 'clock_timestamp() - now()');
-- a function of a temporary schema belongs to one session
CREATE FUNCTION pg_temp.fq_mine(t text) RETURNS text IMMUTABLE LANGUAGE sql AS 'SELECT t';
SELECT fs_register_queue('bad', 'fq_jobs', 'pg_temp.fq_mine(account::text)', 'id');
SELECT fs_register_queue('bad', 'fq_jobs', 'account', 'pg_temp.fq_mine(account::text)');
DROP FUNCTION pg_temp.fq_mine(text);
SELECT fs_register_queue('bad', 'fq_jobs', 'ctid::text', 'id');
-- anything but one expression
SELECT fs_register_queue('bad', 'fq_jobs', 'account; DROP TABLE fq_jobs', 'id');
SELECT fs_register_queue('bad', 'fq_jobs', 'account FROM pg_authid', 'id');
SELECT fs_register_queue('bad', 'fq_jobs', '(SELECT rolname FROM pg_authid LIMIT 1)', 'id');
SELECT fs_register_queue('bad', 'fq_jobs', 'account UNION SELECT 1', 'id');
SELECT fs_register_queue('bad', 'fq_jobs', 'account AS tenant', 'id');
SELECT fs_register_queue('bad', 'fq_jobs', '*', 'id');
SELECT fs_register_queue('bad', 'fq_jobs', 'account) --', 'id');
SELECT fs_register_queue('bad', 'fq_jobs', 'account', 'id LIMIT 1');
SELECT fs_register_queue('bad', 'fq_jobs', 'account', 'id FOR UPDATE');
SELECT fs_register_queue('bad', 'fq_jobs', 'account', 'id USING <');
SELECT fs_register_queue('bad', 'fq_jobs', 'count(*)', 'id');
SELECT fs_register_queue('bad', 'fq_jobs', 'generate_series(1, account)', 'id');
-- combinations that make no sense
SELECT fs_register_queue('bad', 'fq_jobs', 'account', 'id', running_filter => 'true');
SELECT fs_register_queue('bad', 'fq_jobs', 'account', 'id', charge_runtime => true);
SELECT fs_register_queue('bad', 'fq_jobs', 'account', 'id', charge_runtime => NULL);
CREATE TABLE fq_nokey (account int, id int);
SELECT fs_register_queue('bad', 'fq_nokey', 'account', 'id');
CREATE VIEW fq_view AS SELECT * FROM fq_jobs;
SELECT fs_register_queue('bad', 'fq_view', 'account', 'id');
CREATE TABLE fq_reserved (id int PRIMARY KEY, fairshare_row int);
SELECT fs_register_queue('bad', 'fq_reserved', 'id', 'id');
-- only the table's owner may register it; EXECUTE is not granted to PUBLIC
CREATE ROLE fq_stranger;
GRANT EXECUTE ON FUNCTION fs_register_queue(text, regclass, text, text, text, text, regclass,
      text, text, text, boolean, boolean, text, text, integer, interval, text) TO fq_stranger;
SET ROLE fq_stranger;
SELECT fs_register_queue('bad', 'fq_jobs', 'account', 'id');
SELECT fs_unregister_queue('fq');
RESET ROLE;
REVOKE ALL ON FUNCTION fs_register_queue(text, regclass, text, text, text, text, regclass,
       text, text, text, boolean, boolean, text, text, integer, interval, text) FROM fq_stranger;
-- nothing of the refused registrations was kept
SELECT queue FROM fs_fair_queues ORDER BY queue;

-- ---------------------------------------------------------------------------
-- Backlog: counted per tenant when the transaction commits
-- ---------------------------------------------------------------------------

SELECT fs_set_limit('*', 'fq', max_slots => 100);
CREATE VIEW fq_backlog AS
    SELECT tenant, ready_rows FROM fs_tenants WHERE queue = 'fq' AND ready_rows > 0 ORDER BY tenant;
INSERT INTO fq_jobs (account) VALUES (1), (1), (2);
SELECT * FROM fq_backlog;
BEGIN;
INSERT INTO fq_jobs (account) VALUES (3);
SELECT * FROM fq_backlog;		-- not before commit
COMMIT;
SELECT * FROM fq_backlog;
BEGIN;
INSERT INTO fq_jobs (account) VALUES (4), (4);
ROLLBACK;
SELECT * FROM fq_backlog;		-- a rolled-back insert never counts
BEGIN;
INSERT INTO fq_jobs (account) VALUES (5);
SAVEPOINT s1;
INSERT INTO fq_jobs (account) VALUES (5), (5);
ROLLBACK TO s1;
SAVEPOINT s2;
INSERT INTO fq_jobs (account) VALUES (6);
RELEASE s2;
COMMIT;
SELECT * FROM fq_backlog;
-- leaving the ready state, coming back, changing tenant, being deleted
UPDATE fq_jobs SET state = 'done' WHERE account = 5;
UPDATE fq_jobs SET note = 'not a column the trigger watches';
SELECT * FROM fq_backlog;
UPDATE fq_jobs SET state = 'ready' WHERE account = 5;
UPDATE fq_jobs SET account = 7 WHERE account = 6;
DELETE FROM fq_jobs WHERE account = 2;
SELECT * FROM fq_backlog;
-- A row without a tenant (NULL, empty, or not a valid name) is not counted
-- for any tenant and never claimed; fs_fairness counts it.
INSERT INTO fq_jobs (account) VALUES (NULL), (NULL);
SELECT * FROM fq_backlog;
SELECT rows_without_tenant FROM fs_fairness WHERE queue = 'fq';
SELECT count(*) AS claimed, count(*) FILTER (WHERE (job).account IS NULL) AS without_tenant
  FROM fs_claim('fq', NULL::fq_jobs, 100);
DELETE FROM fq_jobs WHERE account IS NULL;
SELECT rows_without_tenant FROM fs_fairness WHERE queue = 'fq';

-- ---------------------------------------------------------------------------
-- Fair order: start-time fair queueing with weights 1, 2, 4
-- ---------------------------------------------------------------------------

CREATE TABLE fw_jobs (id serial PRIMARY KEY, tenant text NOT NULL);
SELECT queue FROM fs_register_queue('fw', 'fw_jobs', 'tenant', 'id');
SELECT fs_set_limit(t, 'fw', max_slots => 100, weight => w)
  FROM (VALUES ('a', 1), ('b', 2), ('c', 4), ('d', 1)) v(t, w);
INSERT INTO fw_jobs (tenant) SELECT t FROM unnest(ARRAY['a', 'b', 'c']) t, generate_series(1, 30);
-- The order after a rollback is the order before it.
BEGIN;
SELECT string_agg(tenant, ' ') AS first_fourteen FROM fs_claim('fw', NULL::fw_jobs, 14);
ROLLBACK;
SELECT tenant, ready_rows, virtual_finish, slots_in_use FROM fs_tenants WHERE queue = 'fw' ORDER BY 1;
SELECT virtual_time FROM fs_fairness WHERE queue = 'fw';
-- One at a time, as a worker does (claim, take the row out, finish and
-- release): the same order, 1:2:4 in every window of seven.
CREATE TABLE fw_order (n serial, tenant text);
CREATE FUNCTION fw_take(k int) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR i IN 1..k LOOP
        SELECT c.tenant, c.lease_id, (c.job).id AS id INTO r FROM fs_claim('fw', NULL::fw_jobs, 1) c;
        EXIT WHEN r.id IS NULL;
        INSERT INTO fw_order (tenant) VALUES (r.tenant);
        DELETE FROM fw_jobs WHERE id = r.id;
        PERFORM fs_release_slot(r.lease_id);
    END LOOP;
    RETURN (SELECT string_agg(tenant, ' ' ORDER BY n) FROM (SELECT * FROM fw_order ORDER BY n DESC LIMIT k) o);
END $$;
SELECT fw_take(14) AS one_at_a_time;
SELECT tenant, ready_rows, virtual_finish, slots_in_use FROM fs_tenants WHERE queue = 'fw' ORDER BY 1;
-- A new tenant is served at once (it starts at the queue's virtual time, not
-- behind everyone's history); an idle tenant gets no banked credit: one row
-- now, then its weight's share.
INSERT INTO fw_jobs (tenant) VALUES ('d'), ('d'), ('d'), ('d');
SELECT fw_take(9) AS newcomer;

-- Work-conserving within limits: a tenant at max_slots is passed over, the
-- others get the rows; min_slots is a floor served before fair order.
SELECT fs_set_limit('e', 'fw', max_slots => 1), fs_set_limit('f', 'fw', max_slots => 10, min_slots => 2);
INSERT INTO fw_jobs (tenant) SELECT t FROM unnest(ARRAY['e', 'f']) t, generate_series(1, 5);
BEGIN;
SELECT tenant, count(*) FROM fs_claim('fw', NULL::fw_jobs, 4) GROUP BY 1 ORDER BY 1;
SELECT tenant, slots_in_use FROM fs_tenants WHERE queue = 'fw' AND slots_in_use > 0 ORDER BY 1;
ROLLBACK;
-- an update that keeps rows ready for the same tenant changes nothing
UPDATE fw_jobs SET tenant = tenant;
-- f's tag is not the smallest, yet its floor of two comes first
SELECT fs_set_limit('e', 'fw', max_slots => 0);
BEGIN;
SELECT string_agg(tenant, ' ') AS floor_first FROM fs_claim('fw', NULL::fw_jobs, 3);
ROLLBACK;
DELETE FROM fw_jobs WHERE tenant IN ('e', 'f');

-- ---------------------------------------------------------------------------
-- Transactions: what a claim does is undone by rollback
-- ---------------------------------------------------------------------------

CREATE VIEW fw_state AS
    SELECT tenant, ready_rows, round(virtual_finish::numeric, 4) AS tag, slots_in_use
      FROM fs_tenants WHERE queue = 'fw' AND tenant IN ('a', 'b', 'c', 'd') ORDER BY tenant;
CREATE TEMP TABLE before AS SELECT * FROM fw_state;
CREATE TEMP TABLE before_vt AS SELECT virtual_time FROM fs_fairness WHERE queue = 'fw';
BEGIN;
SELECT count(*) AS claimed FROM fs_claim('fw', NULL::fw_jobs, 5);
SELECT count(*) AS leases FROM fs_leases WHERE queue = 'fw';
ROLLBACK;
SELECT (SELECT string_agg(f::text, ' ' ORDER BY tenant) FROM fw_state f) =
       (SELECT string_agg(b::text, ' ' ORDER BY tenant) FROM before b) AS state_restored,
       (SELECT virtual_time FROM fs_fairness WHERE queue = 'fw') = (SELECT virtual_time FROM before_vt)
       AS virtual_time_restored,
       (SELECT count(*) FROM fs_leases WHERE queue = 'fw') AS leases;
-- ... by a rollback to a savepoint, keeping what came before it
BEGIN;
SELECT fw_take(1) IS NOT NULL AS took_one;
SAVEPOINT s;
SELECT count(*) AS claimed_in_savepoint FROM fs_claim('fw', NULL::fw_jobs, 3);
ROLLBACK TO s;
SELECT count(*) AS leases FROM fs_leases WHERE queue = 'fw';
COMMIT;
SELECT sum(ready_rows) = (SELECT count(*) FROM fw_jobs) AS counts_match_table FROM fs_tenants WHERE queue = 'fw';
-- A claimed row still ready at commit was not taken: its lease ends and it
-- is counted again.  Claiming twice in one transaction never returns a row
-- twice.
BEGIN;
CREATE TEMP TABLE twice AS SELECT (job).id FROM fs_claim('fw', NULL::fw_jobs, 3);
INSERT INTO twice SELECT (job).id FROM fs_claim('fw', NULL::fw_jobs, 3);
SELECT count(*) AS claimed, count(DISTINCT id) AS distinct_rows FROM twice;
COMMIT;
SELECT (SELECT count(*) FROM fs_leases WHERE queue = 'fw') AS leases,
       (SELECT sum(ready_rows) FROM fs_tenants WHERE queue = 'fw') = (SELECT count(*) FROM fw_jobs)
       AS counts_match_table;
-- ... and its tenant gets back the turn the claim charged, as a rollback
-- gives it back: the next claim takes the same tenant's row again.
CREATE TABLE rf_jobs (id bigserial PRIMARY KEY, tenant text NOT NULL);
SELECT queue FROM fs_register_queue('rf', 'rf_jobs', 'tenant', 'id');
INSERT INTO rf_jobs (tenant) VALUES ('a'), ('b'), ('a'), ('b');
BEGIN;
SELECT tenant AS claimed_not_taken FROM fs_claim('rf', NULL::rf_jobs, 1);
COMMIT;
SELECT tenant, ready_rows, virtual_finish, served_ms FROM fs_tenants WHERE queue = 'rf' ORDER BY 1;
BEGIN;
SELECT tenant AS next_claim FROM fs_claim('rf', NULL::rf_jobs, 1);
ROLLBACK;
SELECT fs_unregister_queue('rf');
DROP TABLE rf_jobs;

-- ---------------------------------------------------------------------------
-- Automatic release: Solid Queue
-- ---------------------------------------------------------------------------

SELECT fs_set_limit('*', 'solid_queue', max_slots => 2);
WITH j AS (
    INSERT INTO solid_queue_jobs (queue_name, class_name, arguments, priority, created_at, updated_at)
    SELECT 'tenant_' || (i % 2), 'ReportJob', '{}', 0, now(), now() FROM generate_series(1, 6) i
    RETURNING id, queue_name, priority)
INSERT INTO solid_queue_ready_executions (job_id, queue_name, priority, created_at)
SELECT id, queue_name, priority, now() FROM j;
INSERT INTO solid_queue_processes (kind, last_heartbeat_at, pid, hostname, created_at, name)
VALUES ('Worker', now(), 4242, 'host', now(), 'worker-1');
-- Solid Queue's claim transaction with fs_claim() as its candidate query
BEGIN;
CREATE TEMP TABLE sq_claimed AS
    SELECT (c.job).id, (c.job).job_id FROM fs_claim('solid_queue', NULL::solid_queue_ready_executions, 3) c;
INSERT INTO solid_queue_claimed_executions (job_id, process_id, created_at)
    SELECT job_id, (SELECT id FROM solid_queue_processes), now() FROM sq_claimed;
DELETE FROM solid_queue_ready_executions WHERE id IN (SELECT id FROM sq_claimed);
COMMIT;
SELECT j.queue_name, count(*) FROM sq_claimed c JOIN solid_queue_jobs j ON j.id = c.job_id GROUP BY 1 ORDER BY 1;
SELECT tenant, ready_rows, slots_in_use FROM fs_tenants WHERE queue = 'solid_queue' ORDER BY 1;
-- finishing a job deletes its claimed execution: its lease is released at
-- commit, not before, and not at all if that transaction rolls back
BEGIN;
UPDATE solid_queue_jobs SET finished_at = now() WHERE id = (SELECT min(job_id) FROM sq_claimed);
DELETE FROM solid_queue_claimed_executions WHERE job_id = (SELECT min(job_id) FROM sq_claimed);
SELECT state, count(*) FROM fs_leases WHERE queue = 'solid_queue' GROUP BY 1 ORDER BY 1;
ROLLBACK;
SELECT state, count(*) FROM fs_leases WHERE queue = 'solid_queue' GROUP BY 1 ORDER BY 1;
DELETE FROM solid_queue_claimed_executions WHERE job_id = (SELECT min(job_id) FROM sq_claimed);
SELECT state, count(*) FROM fs_leases WHERE queue = 'solid_queue' GROUP BY 1 ORDER BY 1;
SELECT tenant, ready_rows, slots_in_use FROM fs_tenants WHERE queue = 'solid_queue' ORDER BY 1;
-- a crashed worker's claims are released by Solid Queue (deleted, the job
-- dispatched again): the lease goes, the row counts again
WITH r AS (DELETE FROM solid_queue_claimed_executions RETURNING job_id)
INSERT INTO solid_queue_ready_executions (job_id, queue_name, priority, created_at)
SELECT j.id, j.queue_name, j.priority, now() FROM r JOIN solid_queue_jobs j ON j.id = r.job_id;
SELECT tenant, ready_rows, slots_in_use FROM fs_tenants WHERE queue = 'solid_queue' ORDER BY 1;
SELECT rows_claimed, rows_released FROM fs_fairness WHERE queue = 'solid_queue';

-- ---------------------------------------------------------------------------
-- Automatic release: GoodJob
-- ---------------------------------------------------------------------------

SELECT fs_set_limit('*', 'good_job', max_slots => 5);
INSERT INTO good_jobs (queue_name, priority, serialized_params, scheduled_at, created_at, updated_at,
                       active_job_id, concurrency_key, job_class)
SELECT 'default', 0, '{}', now() AT TIME ZONE 'UTC', now(), now(), gen_random_uuid(), 'acct_' || (i % 2), 'SyncJob'
  FROM generate_series(1, 4) i;
-- scheduled for later: counted, but not claimable yet
INSERT INTO good_jobs (queue_name, priority, serialized_params, scheduled_at, created_at, updated_at,
                       active_job_id, concurrency_key, job_class)
VALUES ('default', 0, '{}', (now() AT TIME ZONE 'UTC') + interval '1 hour', now(), now(),
        gen_random_uuid(), 'acct_later', 'SyncJob');
INSERT INTO good_job_processes (created_at, updated_at, state) VALUES (now(), now(), '{}');
SELECT tenant, ready_rows FROM fs_tenants WHERE queue = 'good_job' ORDER BY 1;
-- GoodJob's skip-locked claim with fs_claim() as its candidate query
CREATE FUNCTION gj_claim() RETURNS text LANGUAGE sql AS $$
    WITH candidate AS MATERIALIZED (
        SELECT (c.job).id FROM fs_claim('good_job', NULL::good_jobs, 1) c)
    UPDATE good_jobs
       SET locked_by_id = (SELECT id FROM good_job_processes), locked_at = now(), lock_type = 1
      FROM candidate
     WHERE good_jobs.id = candidate.id
    RETURNING good_jobs.concurrency_key $$;
SELECT gj_claim() AS first, gj_claim() AS second, gj_claim() AS third;
SELECT tenant, ready_rows, slots_in_use FROM fs_tenants WHERE queue = 'good_job' ORDER BY 1;
SELECT short_probes FROM fs_fairness WHERE queue = 'good_job';
-- finished: released; unlocked for a retry: released, and ready again
UPDATE good_jobs SET finished_at = now(), locked_by_id = NULL, locked_at = NULL, lock_type = NULL
 WHERE id = (SELECT id FROM good_jobs WHERE locked_by_id IS NOT NULL ORDER BY concurrency_key LIMIT 1);
UPDATE good_jobs SET locked_by_id = NULL, locked_at = NULL, lock_type = NULL
 WHERE id = (SELECT id FROM good_jobs WHERE locked_by_id IS NOT NULL ORDER BY concurrency_key LIMIT 1);
SELECT tenant, ready_rows, slots_in_use FROM fs_tenants WHERE queue = 'good_job' ORDER BY 1;
SELECT count(*) AS leases FROM fs_leases WHERE queue = 'good_job';
-- an update that keeps the job running releases nothing
UPDATE good_jobs SET performed_at = now(), executions_count = 1 WHERE locked_by_id IS NOT NULL;
SELECT count(*) AS leases FROM fs_leases WHERE queue = 'good_job';
-- a deleted running job is released too
DELETE FROM good_jobs WHERE locked_by_id IS NOT NULL;
SELECT count(*) AS leases FROM fs_leases WHERE queue = 'good_job';

-- ---------------------------------------------------------------------------
-- Recounting: counts corrupted on purpose (rows changed with triggers off)
-- ---------------------------------------------------------------------------

SET session_replication_role = replica;
INSERT INTO fw_jobs (tenant) SELECT 'g' FROM generate_series(1, 5);
DELETE FROM fw_jobs WHERE id IN (SELECT id FROM fw_jobs WHERE tenant = 'a' LIMIT 3);
RESET session_replication_role;
SELECT t.tenant, t.ready_rows AS counted, count(j.id) AS in_table
  FROM fs_tenants t LEFT JOIN fw_jobs j ON j.tenant = t.tenant
 WHERE t.queue = 'fw' AND t.tenant IN ('a', 'g') GROUP BY 1, 2 ORDER BY 1;
SELECT * FROM fs_resync('fw');
SELECT t.tenant, t.ready_rows AS counted, count(j.id) AS in_table
  FROM fs_tenants t LEFT JOIN fw_jobs j ON j.tenant = t.tenant
 WHERE t.queue = 'fw' AND t.tenant IN ('a', 'g') GROUP BY 1, 2 ORDER BY 1;
SELECT queue_name, ready_rows FROM fs_resync() ORDER BY 1;
SELECT resyncs > 0 AS recounted, last_resync_at IS NOT NULL AS has_time FROM fs_fairness WHERE queue = 'fw';
-- TRUNCATE: recounted at the queue's next use
TRUNCATE fq_jobs;
SELECT count(*) AS claimed FROM fs_claim('fq', NULL::fq_jobs, 10);
SELECT coalesce(sum(ready_rows), 0) AS ready FROM fs_tenants WHERE queue = 'fq';

-- ---------------------------------------------------------------------------
-- Charging run time at release
-- ---------------------------------------------------------------------------

CREATE TABLE rt_jobs (id bigint PRIMARY KEY, tenant text NOT NULL);
CREATE TABLE rt_running (job_id bigint PRIMARY KEY);
SELECT queue, charge_runtime FROM fs_register_queue('rt', 'rt_jobs', 'tenant', 'id',
       running_table => 'rt_running', running_key => 'job_id', charge_runtime => true);
INSERT INTO rt_jobs VALUES (1, 'slow'), (2, 'fast');
BEGIN;
WITH c AS (SELECT (job).id FROM fs_claim('rt', NULL::rt_jobs, 2))
INSERT INTO rt_running SELECT id FROM c;
DELETE FROM rt_jobs;
COMMIT;
SELECT tenant, virtual_finish FROM fs_tenants WHERE queue = 'rt' ORDER BY 1;
-- 0.2 s later the fast job ends, 3 s later the slow one
SET fairshare.debug_clock = 1893456000.2;
DELETE FROM rt_running WHERE job_id = 2;
SET fairshare.debug_clock = 1893456003;
DELETE FROM rt_running WHERE job_id = 1;
SET fairshare.debug_clock = 1893456000;
-- each is charged the milliseconds its lease was held
SELECT tenant, round(virtual_finish::numeric, 3) AS tag, round(served::numeric, 3) AS served
  FROM fs_fair_shares WHERE queue = 'rt' ORDER BY 1;

-- ---------------------------------------------------------------------------
-- fs_ready_tenants and the metrics
-- ---------------------------------------------------------------------------

SELECT tenant, ready_rows, free_slots, virtual_start, weight FROM fs_ready_tenants('fw');
-- fs_ready_tenants() as the first use of a queue recounts it first
SELECT queue FROM fs_register_queue('fw', 'fw_jobs', 'tenant', 'id');
SELECT count(*) AS tenants, sum(ready_rows) = (SELECT count(*) FROM fw_jobs) AS counted
  FROM fs_ready_tenants('fw');
SELECT tenant FROM fs_ready_tenants('fw', max_tenants => 2);
-- an application's own claim, with fs_ready_tenants() as its building block:
-- rows leaving the ready state advance the tenant's tag at commit as a claim
-- through fs_claim() would
BEGIN;
CREATE TEMP TABLE own AS
SELECT j.id, t.tenant
  FROM fs_ready_tenants('fw') t
 CROSS JOIN LATERAL (SELECT id FROM fw_jobs WHERE fw_jobs.tenant = t.tenant
                      ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) j;
DELETE FROM fw_jobs WHERE id IN (SELECT id FROM own);
SELECT count(*) AS tenants FROM own;
COMMIT;
SELECT tenant, round(virtual_finish::numeric, 4) AS tag FROM fs_tenants
 WHERE queue = 'fw' AND tenant IN (SELECT tenant FROM own) ORDER BY 1;
-- The per-tenant dequeue view: the next rows of each tenant with free
-- slots (two at most), tenants in fair order, locked FOR UPDATE SKIP LOCKED
-- as they are read; a lease per row is taken after the lock (in the target
-- list).
CREATE VIEW fw_next AS
SELECT j.*
  FROM fs_ready_tenants('fw') t
 CROSS JOIN LATERAL (SELECT * FROM fw_jobs WHERE fw_jobs.tenant = t.tenant
                      ORDER BY fw_jobs.id LIMIT least(t.free_slots, 2) FOR UPDATE SKIP LOCKED) j;
BEGIN;
CREATE TEMP TABLE from_view AS
    SELECT id, tenant, fs_acquire_slot(tenant, 'fw') AS lease_id FROM fw_next LIMIT 6;
SELECT string_agg(tenant, ' ' ORDER BY tenant) AS tenants, count(lease_id) AS leased FROM from_view;
ROLLBACK;
DROP VIEW fw_next;
SELECT queue, backlogged_tenants, ready_rows, active_tenants, round(jain_index::numeric, 4) AS jain,
       round(gini::numeric, 4) AS gini, claims > 0 AS claimed
  FROM fs_fairness ORDER BY queue;
SELECT tenant, weight, ready_rows, round(share::numeric, 4) AS share,
       round(fair_share::numeric, 4) AS fair_share, round(share_ratio::numeric, 2) AS ratio
  FROM fs_fair_shares WHERE queue = 'fw' AND ready_rows > 0 ORDER BY tenant;
-- fs_reset zeroes the counters, keeps the fair order
SELECT fs_reset();
SELECT claims, rows_claimed, short_probes, virtual_time > 0 AS kept FROM fs_fairness WHERE queue = 'fw';

-- ---------------------------------------------------------------------------
-- A tenant that holds nearly every row (and the statistics say so) does not
-- make the others' claims walk its rows: each probe reads only what it returns
-- ---------------------------------------------------------------------------

CREATE TABLE skew (id int PRIMARY KEY, tenant text NOT NULL);
SELECT queue FROM fs_register_queue('skew', 'skew', 'tenant', 'id');
INSERT INTO skew SELECT i, 'big' FROM generate_series(1, 20000) i;
ANALYZE skew;
INSERT INTO skew VALUES (20001, 'small');
SELECT count(*) AS backlogged FROM fs_ready_tenants('skew');
SELECT pg_stat_reset_single_table_counters('skew_pkey'::regclass),
       pg_stat_reset_single_table_counters('skew_fs_fair'::regclass);
BEGIN;
SELECT tenant, (job).id FROM fs_claim('skew', NULL::skew, 2);
ROLLBACK;
SELECT pg_stat_force_next_flush();
SELECT pg_stat_clear_snapshot();
SELECT indexrelname, idx_tup_read FROM pg_stat_user_indexes WHERE relname = 'skew' ORDER BY 1;
SELECT fs_unregister_queue('skew');
DROP TABLE skew;

-- ---------------------------------------------------------------------------
-- fs_claim and fs_ready_tenants refuse bad input
-- ---------------------------------------------------------------------------

SELECT * FROM fs_claim('nope', NULL::fw_jobs);
SELECT * FROM fs_claim(NULL, NULL::fw_jobs);
SELECT * FROM fs_claim('fw', NULL::fq_jobs);
SELECT * FROM fs_claim('fw', NULL::fw_jobs, 0);
SELECT * FROM fs_claim('fw', NULL::fw_jobs, -1);
SELECT * FROM fs_claim('fw', NULL::fw_jobs, NULL);
SELECT * FROM fs_claim('fw', NULL::fw_jobs, 1000000);
SELECT * FROM fs_claim('fw', NULL::fw_jobs, 1, '-1 second');
SELECT * FROM fs_ready_tenants('nope');
SELECT * FROM fs_ready_tenants('fw', 0);
SELECT * FROM fs_ready_tenants('fw', NULL);
CREATE ROLE fq_reader IN ROLE fairshare_app;
GRANT SELECT ON fw_jobs TO fq_reader;
SET ROLE fq_reader;
SELECT * FROM fs_claim('fw', NULL::fw_jobs);
SELECT count(*) >= 0 AS may_list FROM fs_ready_tenants('fw');
SELECT * FROM fs_resync('fw');
RESET ROLE;
REVOKE ALL ON fw_jobs FROM fq_reader;
DROP ROLE fq_reader;
DROP ROLE fq_stranger;

-- ---------------------------------------------------------------------------
-- enqueued_at: claims measure the queue's latency (the oldest ready row's
-- age, at most once a second) and backpressure follows it
-- ---------------------------------------------------------------------------

SET fairshare.debug_clock = 1893456000;	-- 2030-01-01 00:00 UTC
CREATE TABLE lat_jobs (id bigserial PRIMARY KEY, tenant text NOT NULL,
                       created_at timestamp NOT NULL);
SELECT queue, enqueued_at FROM fs_register_queue('lat', 'lat_jobs', 'tenant', 'id',
       enqueued_at => 'created_at');
-- a timestamp without time zone is taken as UTC; 10 s old is over 5 s
INSERT INTO lat_jobs (tenant, created_at) VALUES
    ('a', '2029-12-31 23:59:50'), ('a', '2029-12-31 23:59:59'), ('b', '2029-12-31 23:59:58');
SELECT tenant FROM fs_claim('lat', NULL::lat_jobs, 1);
SELECT latency_ms, backpressure FROM fs_queues WHERE queue = 'lat';
SELECT fs_spend_tokens('b', 1, 100, 'lat') AS granted_under_latency;
-- a second later, the next claim measures again: the 10 s row is gone
DELETE FROM lat_jobs WHERE created_at = '2029-12-31 23:59:50';
SET fairshare.debug_clock = 1893456000.5;
SELECT tenant FROM fs_claim('lat', NULL::lat_jobs, 1);
SELECT latency_ms AS not_measured_again_yet FROM fs_queues WHERE queue = 'lat';
SET fairshare.debug_clock = 1893456001;
SELECT tenant FROM fs_claim('lat', NULL::lat_jobs, 1);
SELECT latency_ms, backpressure FROM fs_queues WHERE queue = 'lat';
SELECT fs_spend_tokens('b', 1, 100, 'lat') AS granted_latency_ok;
-- bad input
SELECT fs_register_queue('lat', 'lat_jobs', 'tenant', 'id', enqueued_at => 'tenant');
SELECT fs_register_queue('lat', 'lat_jobs', 'tenant', 'id', enqueued_at => 'clock_timestamp()');
SELECT fs_unregister_queue('lat');
SELECT fs_release_slot(lease_id) FROM fs_leases WHERE queue = 'lat';
DROP TABLE lat_jobs;
RESET fairshare.debug_clock;

-- ---------------------------------------------------------------------------
-- A recount runs the registrant's expressions as the table's owner, whoever
-- asks for it (a superuser here, or the background worker), and one failing
-- queue does not stop the recount of the others
-- ---------------------------------------------------------------------------

CREATE ROLE fq_owner;
GRANT CREATE ON SCHEMA public TO fq_owner;
GRANT EXECUTE ON FUNCTION fs_register_queue(text, regclass, text, text, text, text, regclass, text, text, text, boolean, boolean, text, text, integer, interval, text) TO fq_owner;
SET ROLE fq_owner;
CREATE FUNCTION fq_owner_only(t text) RETURNS text IMMUTABLE LANGUAGE plpgsql AS $$
BEGIN
    IF current_user <> 'fq_owner' THEN
        RAISE EXCEPTION 'ran as %', current_user;
    END IF;
    RETURN t;
END $$;
CREATE TABLE fo_jobs (id bigserial PRIMARY KEY, tenant text NOT NULL);
SELECT queue FROM fs_register_queue('fo', 'fo_jobs', 'public.fq_owner_only(tenant)', 'id');
INSERT INTO fo_jobs (tenant) VALUES ('a'), ('a'), ('b');
RESET ROLE;
SELECT * FROM fs_resync('fo');
-- a queue whose table is gone is reported, and the rest are recounted
-- (a registration left behind: dropped while the event trigger that
-- removes it was disabled)
CREATE TABLE fo_gone (id bigserial PRIMARY KEY, tenant text NOT NULL);
SELECT queue FROM fs_register_queue('fo_gone', 'fo_gone', 'tenant', 'id');
ALTER EVENT TRIGGER fs_fair_tables_dropped DISABLE;
DROP TABLE fo_gone;
ALTER EVENT TRIGGER fs_fair_tables_dropped ENABLE;
SELECT * FROM fs_resync() WHERE queue_name LIKE 'fo%';
SELECT fs_unregister_queue('fo_gone');
SELECT fs_unregister_queue('fo');
DROP TABLE fo_jobs;
DROP FUNCTION fq_owner_only(text);
REVOKE CREATE ON SCHEMA public FROM fq_owner;
REVOKE EXECUTE ON FUNCTION fs_register_queue(text, regclass, text, text, text, text, regclass, text, text, text, boolean, boolean, text, text, integer, interval, text) FROM fq_owner;
DROP ROLE fq_owner;

-- ---------------------------------------------------------------------------
-- Security: the key must identify one row.  Leases are released by key: rows
-- sharing one, or with a NULL one, would keep theirs until they expire.
-- ---------------------------------------------------------------------------

CREATE TABLE fk_jobs (id int PRIMARY KEY, job_id int, code text NOT NULL, ext int NOT NULL,
                      tenant text NOT NULL);
CREATE INDEX fk_jobs_job_id_plain ON fk_jobs (job_id);
-- not unique
SELECT fs_register_queue('fk', 'fk_jobs', 'tenant', 'id', key => 'job_id');
-- unique, but NULL is allowed
CREATE UNIQUE INDEX fk_jobs_job_id ON fk_jobs (job_id);
SELECT fs_register_queue('fk', 'fk_jobs', 'tenant', 'id', key => 'job_id');
-- unique among some rows only, deferrable, or together with another column
CREATE UNIQUE INDEX fk_jobs_code_some ON fk_jobs (code) WHERE ext > 0;
SELECT fs_register_queue('fk', 'fk_jobs', 'tenant', 'id', key => 'code');
ALTER TABLE fk_jobs ADD CONSTRAINT fk_jobs_ext UNIQUE (ext) DEFERRABLE;
SELECT fs_register_queue('fk', 'fk_jobs', 'tenant', 'id', key => 'ext');
CREATE UNIQUE INDEX fk_jobs_ext_code ON fk_jobs (ext, code);
SELECT fs_register_queue('fk', 'fk_jobs', 'tenant', 'id', key => 'code');
-- an expression no index has, and one that can be NULL
CREATE UNIQUE INDEX fk_jobs_nullif ON fk_jobs (nullif(code, ''));
SELECT fs_register_queue('fk', 'fk_jobs', 'tenant', 'id', key => 'lower(code)');
SELECT fs_register_queue('fk', 'fk_jobs', 'tenant', 'id', key => 'nullif(code, '''')');
-- what is accepted: a NOT NULL column with a unique index, the same
-- expression as a unique index, the primary key
ALTER TABLE fk_jobs ALTER COLUMN job_id SET NOT NULL;
SELECT queue, key FROM fs_register_queue('fk', 'fk_jobs', 'tenant', 'id', key => 'job_id');
CREATE UNIQUE INDEX fk_jobs_lower ON fk_jobs (lower(code));
SELECT queue, key FROM fs_register_queue('fk', 'fk_jobs', 'tenant', 'id', key => 'lower(code)');
SELECT queue, key FROM fs_register_queue('fk', 'fk_jobs', 'tenant', 'id');
SELECT fs_unregister_queue('fk');
DROP TABLE fk_jobs;

-- ---------------------------------------------------------------------------
-- Security: roles that register, claim and list
-- ---------------------------------------------------------------------------

CREATE ROLE fq_alice IN ROLE fairshare_app;
CREATE ROLE fq_mallory IN ROLE fairshare_app;
GRANT CREATE ON SCHEMA public TO fq_alice, fq_mallory;
GRANT EXECUTE ON FUNCTION fs_register_queue(text, regclass, text, text, text, text, regclass, text, text, text, boolean, boolean, text, text, integer, interval, text) TO fq_alice, fq_mallory;
GRANT EXECUTE ON FUNCTION fs_unregister_queue(text) TO fq_alice, fq_mallory;

-- A registration left behind by a dropped table (the event trigger that
-- removes it disabled) still belongs to the role that registered it:
-- another may not take the name over (nor unregister it).
SET ROLE fq_alice;
CREATE TABLE fa_jobs (id int PRIMARY KEY, tenant text NOT NULL);
SELECT queue FROM fs_register_queue('fq_taken', 'fa_jobs', 'tenant', 'id');
RESET ROLE;
ALTER EVENT TRIGGER fs_fair_tables_dropped DISABLE;
SET ROLE fq_alice;
DROP TABLE fa_jobs;
RESET ROLE;
ALTER EVENT TRIGGER fs_fair_tables_dropped ENABLE;
SET ROLE fq_mallory;
CREATE TABLE fm_jobs (id int PRIMARY KEY, tenant text NOT NULL);
SELECT queue FROM fs_register_queue('fq_taken', 'fm_jobs', 'tenant', 'id');
SELECT fs_unregister_queue('fq_taken');
RESET ROLE;
SELECT queue, registered_by FROM fs_fair_queues WHERE queue = 'fq_taken';
-- the registrant, or a role with its privileges, may
GRANT fq_alice TO fq_mallory;
SET ROLE fq_mallory;
SELECT queue, ready_table, registered_by FROM fs_register_queue('fq_taken', 'fm_jobs', 'tenant', 'id');
SELECT fs_unregister_queue('fq_taken');
RESET ROLE;
REVOKE fq_alice FROM fq_mallory;
DROP TABLE fm_jobs;

-- fs_ready_tenants() counts every ready row: a role that row-level security
-- restricts may not list them (fs_claim() applies the policies).
SET ROLE fq_alice;
CREATE TABLE fr_jobs (id int PRIMARY KEY, tenant text NOT NULL);
SELECT queue FROM fs_register_queue('fr', 'fr_jobs', 'tenant', 'id');
INSERT INTO fr_jobs VALUES (1, 'visible'), (2, 'secret'), (3, 'secret');
ALTER TABLE fr_jobs ENABLE ROW LEVEL SECURITY;
CREATE POLICY fr_visible ON fr_jobs USING (tenant = 'visible');
GRANT SELECT, UPDATE ON fr_jobs TO fq_mallory;
RESET ROLE;
SELECT fs_set_limit('*', 'fr', max_slots => 10);
SET ROLE fq_alice;
SELECT tenant, ready_rows FROM fs_ready_tenants('fr') ORDER BY tenant;
SET ROLE fq_mallory;
SELECT tenant, ready_rows FROM fs_ready_tenants('fr') ORDER BY tenant;
SELECT tenant, (job).id FROM fs_claim('fr', NULL::fr_jobs, 10);
SET ROLE fq_alice;
SELECT fs_unregister_queue('fr');
DROP TABLE fr_jobs;
RESET ROLE;

-- Errors of the queries fairshare builds name the queue and the piece of the
-- registration, with a hint, and never show those queries.
CREATE SCHEMA fq_private AUTHORIZATION fq_alice;
SET ROLE fq_alice;
CREATE TABLE fq_private.fe_jobs (id int PRIMARY KEY, tenant text NOT NULL);
SELECT queue FROM fs_register_queue('fe', 'fq_private.fe_jobs', 'tenant', 'id');
INSERT INTO fq_private.fe_jobs VALUES (1, 'a'), (2, 'b');
GRANT SELECT, UPDATE ON fq_private.fe_jobs TO fq_mallory;
CREATE VIEW public.fe_row AS SELECT NULL::fq_private.fe_jobs AS r;
GRANT SELECT ON public.fe_row TO fq_mallory;
SET ROLE fq_mallory;
SELECT * FROM fs_claim('fe', (SELECT r FROM fe_row), 1);
SELECT * FROM fs_ready_tenants('fe');
SET ROLE fq_alice;
SELECT tenant FROM fs_claim('fe', NULL::fq_private.fe_jobs, 1);
SET ROLE fq_mallory;
SELECT * FROM fs_claim('fe', (SELECT r FROM fe_row), 1);
SET ROLE fq_alice;
ALTER TABLE fq_private.fe_jobs RENAME COLUMN tenant TO t2;
SELECT tenant FROM fs_claim('fe', NULL::fq_private.fe_jobs, 1);
SELECT queue, tenant FROM fs_register_queue('fe', 'fq_private.fe_jobs', 't2', 'id');
SELECT tenant FROM fs_claim('fe', NULL::fq_private.fe_jobs, 1);
-- a cost that fails on a row
SELECT queue, cost FROM fs_register_queue('fe', 'fq_private.fe_jobs', 't2', 'id', cost => '1 / (id - 1)');
SELECT tenant FROM fs_claim('fe', NULL::fq_private.fe_jobs, 2);
-- the triggers evaluate it too, when the row leaves the ready state
DELETE FROM fq_private.fe_jobs WHERE id = 1;
-- building the index evaluates the tenant on every row
SELECT fs_register_queue('fe', 'fq_private.fe_jobs', '1 / (id - 1)', 'id');
SELECT fs_unregister_queue('fe');
DROP VIEW public.fe_row;
DROP TABLE fq_private.fe_jobs;
RESET ROLE;
DROP SCHEMA fq_private;

-- Registration evaluates the table owner's code only as the owner: folding
-- constants of the expressions (to compare them with the table's indexes)
-- runs as the owner, as CREATE INDEX does, even when a superuser registers.
SET ROLE fq_alice;
CREATE FUNCTION fq_alice_probe(t text) RETURNS text IMMUTABLE LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'fq_alice_probe runs as its owner: %', current_user = 'fq_alice';
    RETURN t;
END $$;
CREATE TABLE fp_jobs (id int PRIMARY KEY, tenant text NOT NULL);
CREATE INDEX fp_jobs_tenant ON fp_jobs (tenant, id);
RESET ROLE;
SELECT queue FROM fs_register_queue('fp', 'fp_jobs', 'public.fq_alice_probe(''x'') || tenant', 'id',
       create_index => false);
SELECT fs_unregister_queue('fp');
DROP TABLE fp_jobs;
DROP FUNCTION fq_alice_probe(text);

-- A cancel (here a statement timeout) stops the recount of every queue: it is
-- not turned into a warning about one queue while the others go on.
CREATE FUNCTION fq_slow(t text) RETURNS text IMMUTABLE LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep(30);
    RETURN t;
END $$;
CREATE TABLE fs_slow_jobs (id int PRIMARY KEY, tenant text NOT NULL);
SELECT queue FROM fs_register_queue('a_slow', 'fs_slow_jobs', 'tenant', 'id');
INSERT INTO fs_slow_jobs VALUES (1, 'a');
SELECT queue FROM fs_register_queue('a_slow', 'fs_slow_jobs', 'public.fq_slow(tenant)', 'id', create_index => false);
SET statement_timeout = '1s';
SELECT * FROM fs_resync() WHERE queue_name = 'a_slow';
RESET statement_timeout;
SELECT fs_unregister_queue('a_slow');
DROP TABLE fs_slow_jobs;
DROP FUNCTION fq_slow(text);

REVOKE ALL ON FUNCTION fs_register_queue(text, regclass, text, text, text, text, regclass, text, text, text, boolean, boolean, text, text, integer, interval, text) FROM fq_alice, fq_mallory;
REVOKE ALL ON FUNCTION fs_unregister_queue(text) FROM fq_alice, fq_mallory;
REVOKE CREATE ON SCHEMA public FROM fq_alice, fq_mallory;
DROP ROLE fq_alice;
DROP ROLE fq_mallory;
-- Whole-row references (the table's own name) work in every query
-- ---------------------------------------------------------------------------

CREATE TABLE wr_jobs (id bigserial PRIMARY KEY, tenant text NOT NULL, prio int NOT NULL DEFAULT 0,
                      cost float8 NOT NULL DEFAULT 1);
CREATE FUNCTION wr_tenant(wr_jobs) RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT $1.tenant $$;
CREATE FUNCTION wr_ready(wr_jobs) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$ SELECT $1.prio >= 0 $$;
CREATE FUNCTION wr_cost(wr_jobs) RETURNS float8 LANGUAGE sql IMMUTABLE AS $$ SELECT $1.cost $$;
SELECT queue, tenant, ready_filter, cost
  FROM fs_register_queue('wr', 'wr_jobs', 'public.wr_tenant(wr_jobs)', 'prio, id',
       filter => 'public.wr_ready(wr_jobs)', cost => 'public.wr_cost(wr_jobs)', max_slots => 1);
INSERT INTO wr_jobs (tenant, prio) SELECT 't' || g % 2, CASE WHEN g = 5 THEN -1 ELSE 0 END
  FROM generate_series(1, 6) g;
SELECT * FROM fs_resync('wr');
SELECT tenant, ready_rows FROM fs_ready_tenants('wr') ORDER BY tenant;
BEGIN;
SELECT tenant, (job).id FROM fs_claim('wr', NULL::wr_jobs, 4) ORDER BY 2;
DELETE FROM wr_jobs WHERE id IN (1, 2);
COMMIT;
SELECT * FROM fs_resync('wr');
SELECT fs_release_slot(lease_id) IS NOT NULL AS released FROM fs_leases WHERE state = 'live' AND queue = 'wr';
SELECT fs_unregister_queue('wr');
DROP TABLE wr_jobs CASCADE;

-- ---------------------------------------------------------------------------
-- Keys are of the type their expression has now, not the registered one
-- ---------------------------------------------------------------------------

-- The key column changes type under a registration (a whole-row tenant
-- expression leaves no column dependency to stop ALTER TABLE): the triggers
-- say so and do not count, claims fail, and nothing crashes.
CREATE TABLE kt_jobs (id text PRIMARY KEY, tenant text NOT NULL, prio int NOT NULL DEFAULT 0);
CREATE FUNCTION kt_tenant(kt_jobs) RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT $1.tenant $$;
SELECT queue, key, key_type FROM fs_register_queue('kt', 'kt_jobs', 'public.kt_tenant(kt_jobs)', 'prio, id');
INSERT INTO kt_jobs VALUES ('1', 'a'), ('2', 'b');
ALTER TABLE kt_jobs ALTER COLUMN id TYPE bigint USING id::bigint;
BEGIN;
INSERT INTO kt_jobs VALUES (3, 'c');
DELETE FROM kt_jobs WHERE id = 1;
COMMIT;
SELECT count(*) AS claimed FROM fs_claim('kt', NULL::kt_jobs, 5);
-- registered again, it follows the table and is recounted
SELECT queue, key_type FROM fs_register_queue('kt', 'kt_jobs', 'public.kt_tenant(kt_jobs)', 'prio, id');
DELETE FROM kt_jobs WHERE id = 2;
SELECT tenant, ready_rows FROM fs_ready_tenants('kt') ORDER BY tenant;
SELECT tenant, (job).id FROM fs_claim('kt', NULL::kt_jobs, 5);
SELECT fs_unregister_queue('kt');
-- Registered again with a key of another type in the transaction that
-- claimed: the keys it holds cannot be left out, so claiming again fails
-- (and nothing mixes the two types).
TRUNCATE kt_jobs;
INSERT INTO kt_jobs SELECT g, 't' || g % 3 FROM generate_series(1, 10) g;
CREATE UNIQUE INDEX kt_jobs_id_text ON kt_jobs ((id::text));
SELECT queue FROM fs_register_queue('kt', 'kt_jobs', 'tenant', 'prio, id', key => 'id');
BEGIN;
SELECT count(*) AS claimed FROM fs_claim('kt', NULL::kt_jobs, 2);
SELECT queue, key_type FROM fs_register_queue('kt', 'kt_jobs', 'tenant', 'prio, id', key => 'id::text');
SELECT count(*) AS claimed FROM fs_claim('kt', NULL::kt_jobs, 2);
ROLLBACK;
-- the same with a key of the same type, but another expression
ALTER TABLE kt_jobs ADD COLUMN alt bigint UNIQUE;
UPDATE kt_jobs SET alt = id + 100;
ALTER TABLE kt_jobs ALTER COLUMN alt SET NOT NULL;
BEGIN;
SELECT count(*) AS claimed FROM fs_claim('kt', NULL::kt_jobs, 2);
SELECT queue, key, key_type FROM fs_register_queue('kt', 'kt_jobs', 'tenant', 'prio, id', key => 'alt');
SELECT count(*) AS claimed FROM fs_claim('kt', NULL::kt_jobs, 2);
ROLLBACK;
SELECT count(*) AS claimed FROM fs_claim('kt', NULL::kt_jobs, 2);
SELECT fs_unregister_queue('kt');
DROP TABLE kt_jobs CASCADE;

-- ---------------------------------------------------------------------------
-- Unregistering removes the triggers and the index it made
-- ---------------------------------------------------------------------------

SELECT fs_unregister_queue('fq');
SELECT fs_unregister_queue('fq');
SELECT count(*) AS triggers FROM pg_trigger WHERE tgrelid = 'fq_jobs'::regclass AND tgname LIKE 'fs_fair%';
SELECT count(*) AS indexes FROM pg_class WHERE relname = 'fq_jobs_fs_fair';
SELECT * FROM fs_claim('fq', NULL::fq_jobs);
-- a table used by two registrations keeps its triggers until both are gone
SELECT queue FROM fs_register_queue('fw2', 'fw_jobs', 'tenant', 'id', filter => 'tenant <> ''a''');
SELECT fs_unregister_queue('fw2');
SELECT tgname FROM pg_trigger WHERE tgrelid = 'fw_jobs'::regclass AND tgname LIKE 'fs_fair%' ORDER BY 1;
-- leave nothing behind
SELECT fs_unregister_queue(queue) FROM fs_fair_queues ORDER BY queue;
SELECT count(*) AS triggers_left FROM pg_trigger WHERE tgname LIKE 'fs_fair%' AND NOT tgisinternal
   AND tgrelid <> 'fs_fair_queues'::regclass;
SELECT fs_release_slot(lease_id) FROM fs_leases WHERE state = 'live' AND queue IN ('fw', 'solid_queue', 'good_job', 'rt');
DROP TABLE fq_jobs, fw_jobs, fw_order, rt_jobs, rt_running, fq_nokey, fq_reserved CASCADE;
DROP FUNCTION fw_take(int), gj_claim();
TRUNCATE fs_limits;
RESET fairshare.debug_clock;

-- ---------------------------------------------------------------------------
-- A dropped table takes its registration with it (event trigger on sql_drop)
-- ---------------------------------------------------------------------------

CREATE TABLE dq_jobs (id bigint PRIMARY KEY, tenant text NOT NULL);
CREATE TABLE dq_running (job_id bigint PRIMARY KEY);
SELECT queue FROM fs_register_queue('dq', 'dq_jobs', 'tenant', 'id',
       running_table => 'dq_running', running_key => 'job_id');
INSERT INTO dq_jobs SELECT g, 't' || g % 2 FROM generate_series(1, 4) g;
SELECT tenant, ready_rows FROM fs_tenants WHERE queue = 'dq' ORDER BY tenant;
-- the running table: the registration goes, with the triggers and index it
-- put on the ready table
DROP TABLE dq_running;
SELECT count(*) AS registrations FROM fs_fair_queues WHERE queue = 'dq';
SELECT count(*) AS triggers FROM pg_trigger WHERE tgrelid = 'dq_jobs'::regclass AND tgname LIKE 'fs_fair%';
SELECT count(*) AS indexes FROM pg_indexes WHERE tablename = 'dq_jobs' AND indexname LIKE '%fs_fair%';
SELECT count(*) AS counted FROM fs_tenants WHERE queue = 'dq' AND ready_rows > 0;
SELECT * FROM fs_claim('dq', NULL::dq_jobs, 1);
-- the ready table, in a transaction that rolls back: nothing changes
SELECT queue FROM fs_register_queue('dq', 'dq_jobs', 'tenant', 'id');
BEGIN;
DROP TABLE dq_jobs;
ROLLBACK;
SELECT count(*) AS registrations FROM fs_fair_queues WHERE queue = 'dq';
SELECT count(*) AS claimed FROM fs_claim('dq', NULL::dq_jobs, 1);
-- a whole schema
CREATE SCHEMA dq_schema;
CREATE TABLE dq_schema.jobs (id bigint PRIMARY KEY, tenant text NOT NULL);
SELECT queue FROM fs_register_queue('dq_s', 'dq_schema.jobs', 'tenant', 'id');
DROP SCHEMA dq_schema CASCADE;
SELECT queue FROM fs_fair_queues WHERE queue LIKE 'dq%' ORDER BY 1;
DROP TABLE dq_jobs;
SELECT count(*) AS registrations FROM fs_fair_queues WHERE queue LIKE 'dq%';

-- ---------------------------------------------------------------------------
-- Tokens are charged for the rows a claim returns, not for the rows it was
-- admitted to: rows excluded by the claim-time filter cost nothing.
-- ---------------------------------------------------------------------------

-- (fairshare's clock stands still meanwhile: nothing accrues between reads)
SELECT set_config('fairshare.debug_clock', round(extract(epoch FROM now()))::text, false) IS NOT NULL AS clock_fixed;
CREATE TABLE bq_jobs (id bigint PRIMARY KEY, tenant text NOT NULL, run_at timestamptz NOT NULL);
SELECT queue FROM fs_register_queue('bq', 'bq_jobs', 'tenant', 'id', filter => 'run_at <= now()');
SELECT fs_set_limit('bt', 'bq', max_slots => 10, budget_ms_per_minute => 1000);
INSERT INTO bq_jobs SELECT g, 'bt', now() + interval '1 hour' FROM generate_series(1, 5) g;
SELECT count(*) AS claimed FROM fs_claim('bq', NULL::bq_jobs, 5);
SELECT count(*) AS claimed FROM fs_claim('bq', NULL::bq_jobs, 5);
SELECT round(token_balance) AS balance, slots_in_use FROM fs_tenants WHERE queue = 'bq' AND tenant = 'bt';
-- two rows claimable now: two rows' tokens, kept at commit
UPDATE bq_jobs SET run_at = now() - interval '1 second' WHERE id <= 2;
SELECT count(*) AS claimed FROM fs_claim('bq', NULL::bq_jobs, 5);
SELECT round(token_balance) AS balance, slots_in_use FROM fs_tenants WHERE queue = 'bq' AND tenant = 'bt';
-- and given back when the claim rolls back
BEGIN;
UPDATE bq_jobs SET run_at = now() - interval '1 second' WHERE id = 3;
SELECT count(*) AS claimed FROM fs_claim('bq', NULL::bq_jobs, 5);
ROLLBACK;
SELECT round(token_balance) AS balance FROM fs_tenants WHERE queue = 'bq' AND tenant = 'bt';
SELECT fs_unregister_queue('bq');
DELETE FROM fs_limits WHERE queue = 'bq';
DROP TABLE bq_jobs;
RESET fairshare.debug_clock;

-- ---------------------------------------------------------------------------
-- One transaction may change more than 64 queues (up to fairshare.max_queues)
-- ---------------------------------------------------------------------------

DO $$
BEGIN
    FOR i IN 1..70 LOOP
        EXECUTE format('CREATE TABLE mq_%s (id bigint PRIMARY KEY, tenant text NOT NULL)', i);
        PERFORM fs_register_queue('mq_' || i, ('mq_' || i)::regclass, 'tenant', 'id');
    END LOOP;
END $$;
BEGIN;
DO $$
BEGIN
    FOR i IN 1..70 LOOP
        EXECUTE format('INSERT INTO mq_%s VALUES (1, ''t'')', i);
    END LOOP;
END $$;
COMMIT;
SELECT count(*) AS queues, sum(ready_rows) AS rows FROM fs_tenants WHERE queue LIKE 'mq\_%';
DO $$
BEGIN
    FOR i IN 1..70 LOOP
        EXECUTE format('DROP TABLE mq_%s', i);
    END LOOP;
END $$;
SELECT count(*) AS registrations FROM fs_fair_queues WHERE queue LIKE 'mq\_%';

-- A regclass of a table that no longer exists, or 0, is refused by name.
CREATE TABLE gone_jobs (id int PRIMARY KEY, tenant text NOT NULL);
SELECT 'gone_jobs'::regclass::oid AS gone_oid \gset
DROP TABLE gone_jobs;
\set VERBOSITY terse
SELECT fs_register_queue('gone_q', :gone_oid, 'tenant', 'id');
SELECT fs_register_queue('gone_q', 0, 'tenant', 'id');
CREATE TABLE here_jobs (id int PRIMARY KEY, tenant text NOT NULL);
SELECT fs_register_queue('gone_q', 'here_jobs', 'tenant', 'id', running_table => :gone_oid);
\set VERBOSITY default
DROP TABLE here_jobs;

-- Any role's DROP passes through the event trigger, also one that may not
-- use the extension's schema.
CREATE ROLE dq_nobody;
CREATE SCHEMA dq_own AUTHORIZATION dq_nobody;
REVOKE USAGE ON SCHEMA public FROM PUBLIC;
SET ROLE dq_nobody;
CREATE TABLE dq_own.t (x int);
DROP TABLE dq_own.t;
RESET ROLE;
GRANT USAGE ON SCHEMA public TO PUBLIC;
DROP SCHEMA dq_own;
DROP ROLE dq_nobody;

-- ---------------------------------------------------------------------------
-- A queue's own max_slots and lease
-- ---------------------------------------------------------------------------

CREATE TABLE qd_jobs (id int PRIMARY KEY, tenant text NOT NULL);
INSERT INTO qd_jobs SELECT g, CASE WHEN g <= 6 THEN 'lone' ELSE 'other' END FROM generate_series(1, 8) g;
-- Registered without max_slots: no limit, shown as NULL; a lone tenant
-- takes as many slots as it has rows.
SELECT queue, max_slots, lease FROM fs_register_queue('qd', 'qd_jobs', 'tenant', 'id');
SELECT max_slots FROM fs_effective_limits('lone', 'qd');
SELECT tenant, ready_rows, free_slots FROM fs_ready_tenants('qd');
BEGIN;
SELECT tenant, count(*) FROM fs_claim('qd', NULL::qd_jobs, 8) GROUP BY tenant ORDER BY tenant;
-- fs_claim's lease NULL (its default): the queue's, 5 minutes here.
SELECT count(*) AS five_minute_leases FROM fs_leases
 WHERE queue = 'qd' AND expires_at - clock_timestamp() BETWEEN '4 minutes 50 seconds' AND '5 minutes';
ROLLBACK;
-- fs_limits rows win over the queue's default, ('*', '*') included.
SELECT fs_set_limit('*', 'qd', max_slots => 2);
SELECT max_slots FROM fs_effective_limits('lone', 'qd');
DELETE FROM fs_limits WHERE queue = 'qd';
-- Registered with max_slots and a lease.
SELECT queue, max_slots, lease FROM fs_register_queue('qd', 'qd_jobs', 'tenant', 'id',
       max_slots => 3, lease => '1 hour');
SELECT max_slots FROM fs_effective_limits('lone', 'qd');
SELECT tenant, ready_rows, free_slots FROM fs_ready_tenants('qd');
BEGIN;
SELECT tenant, count(*) FROM fs_claim('qd', NULL::qd_jobs, 8) GROUP BY tenant ORDER BY tenant;
SELECT count(*) AS one_hour_leases FROM fs_leases
 WHERE queue = 'qd' AND expires_at - clock_timestamp() BETWEEN '59 minutes 50 seconds' AND '1 hour';
ROLLBACK;
BEGIN;
SELECT count(*) AS claimed FROM fs_claim('qd', NULL::qd_jobs, 1, '10 seconds');
SELECT count(*) AS ten_second_leases FROM fs_leases
 WHERE queue = 'qd' AND expires_at - clock_timestamp() <= '10 seconds';
ROLLBACK;
-- Registered in a transaction: its tenants get the new max_slots at commit.
BEGIN;
SELECT queue, max_slots FROM fs_register_queue('qd', 'qd_jobs', 'tenant', 'id', max_slots => 0);
SELECT max_slots FROM fs_effective_limits('lone', 'qd');
COMMIT;
SELECT max_slots FROM fs_effective_limits('lone', 'qd');
SELECT count(*) AS stopped FROM fs_claim('qd', NULL::qd_jobs, 8);
-- Bad values.
SELECT fs_register_queue('qd', 'qd_jobs', 'tenant', 'id', max_slots => -1);
SELECT fs_register_queue('qd', 'qd_jobs', 'tenant', 'id', lease => '0 seconds');
SELECT fs_register_queue('qd', 'qd_jobs', 'tenant', 'id', lease => '400 days');
SELECT fs_unregister_queue('qd');
DROP TABLE qd_jobs;

-- Unregistering a queue (or dropping its table) releases the leases of its
-- claimed rows at commit: no row of it can leave a running table any more.
CREATE TABLE ul_jobs (id int PRIMARY KEY, tenant text NOT NULL);
CREATE TABLE ul_running (id int PRIMARY KEY);
SELECT queue FROM fs_register_queue('ul', 'ul_jobs', 'tenant', 'id', running_table => 'ul_running');
INSERT INTO ul_jobs VALUES (1, 'a'), (2, 'b'), (3, 'a');
WITH c AS (SELECT (job).id FROM fs_claim('ul', NULL::ul_jobs, 2)),
     d AS (DELETE FROM ul_jobs USING c WHERE ul_jobs.id = c.id)
INSERT INTO ul_running SELECT id FROM c;
SELECT count(*) AS leases FROM fs_leases WHERE queue = 'ul';
BEGIN;
SELECT fs_unregister_queue('ul');
ROLLBACK;
SELECT count(*) AS leases_after_rollback FROM fs_leases WHERE queue = 'ul';
SELECT fs_unregister_queue('ul');
SELECT count(*) AS leases_after_unregister FROM fs_leases WHERE queue = 'ul';
SELECT queue FROM fs_register_queue('ul', 'ul_jobs', 'tenant', 'id', running_table => 'ul_running');
WITH c AS (SELECT (job).id FROM fs_claim('ul', NULL::ul_jobs, 1)),
     d AS (DELETE FROM ul_jobs USING c WHERE ul_jobs.id = c.id)
INSERT INTO ul_running SELECT id FROM c;
SELECT count(*) AS leases FROM fs_leases WHERE queue = 'ul';
DROP TABLE ul_running;
SELECT count(*) AS leases_after_drop FROM fs_leases WHERE queue = 'ul';
DROP TABLE ul_jobs;
