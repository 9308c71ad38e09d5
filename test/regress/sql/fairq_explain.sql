--
-- fs_explain_wait(): why a ready row waits, one answer for each reason, the
-- figures behind it and the estimate; bad input and who may call it.  (A
-- row locked by another transaction: test/isolation/specs/fairq_explain.spec.)
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS fairshare;
RESET client_min_messages;
-- 2030-01-01 12:30 UTC, far from the top of the hour (no dampener); the
-- clock stands still, so leases never expire and served work never decays.
SET fairshare.debug_clock = 1893501000;

CREATE TABLE ex_jobs (id bigint PRIMARY KEY, account text, priority int NOT NULL DEFAULT 0,
                      state text NOT NULL DEFAULT 'ready',
                      run_at timestamptz NOT NULL DEFAULT '2000-01-01');
SELECT queue, ready_filter, claim_filter
  FROM fs_register_queue('ex', 'ex_jobs', tenant => 'account', order_by => 'priority DESC, id',
       filter => 'state = ''ready'' AND run_at <= now()');

-- The answer's figures, with the estimate in seconds from the clock.
CREATE FUNCTION why(job text)
RETURNS TABLE (reason text, tenant text, tenant_rows_ahead bigint, tenants_ahead integer,
               rows_ahead bigint, slots text, tokens text, backpressure text,
               claim_rate numeric, starts_in numeric)
LANGUAGE sql AS $$
  SELECT reason, tenant, tenant_rows_ahead, tenants_ahead, rows_ahead,
         slots_in_use || ' of ' || coalesce(max_slots::text, 'no limit') || ', ceiling ' ||
           coalesce(slot_ceiling::text, 'none') || ', ' || live_threads || ' threads, throttle ' ||
           throttle_pct || '%',
         coalesce(token_balance::text || ' ms, ' || tokens_per_row || ' a row, enough ' ||
           coalesce('in ' || extract(epoch FROM budget_ready_at - to_timestamp(1893501000))::numeric(8,1)
                    || ' s', 'never'), 'no budget'),
         backpressure, claim_rate::numeric(10,6),
         extract(epoch FROM estimated_start - to_timestamp(1893501000))::numeric(10,1)
    FROM fs_explain_wait('ex', job) $$;
-- Claim n rows and take them out of the ready state, keeping their leases
-- (no running table: the slots stay held).
CREATE FUNCTION claim(n int) RETURNS TABLE (tenant text, id bigint) LANGUAGE sql AS $$
  WITH c AS (SELECT * FROM fs_claim('ex', NULL::ex_jobs, n)),
       u AS (UPDATE ex_jobs j SET state = 'running' FROM c WHERE j.id = (c.job).id RETURNING j.id)
  SELECT c.tenant, (c.job).id FROM c JOIN u ON u.id = (c.job).id ORDER BY 2 $$;

-- not_found
SELECT reason, detail FROM fs_explain_wait('ex', '999');

INSERT INTO ex_jobs (id, account) VALUES (1, 'a'), (2, 'a'), (3, 'a'), (11, 'b'), (12, 'b'), (13, 'b');
INSERT INTO ex_jobs (id, account, state) VALUES (20, 'a', 'done');
INSERT INTO ex_jobs (id, account, run_at) VALUES (21, 'a', '2100-01-01');
INSERT INTO ex_jobs (id, account) VALUES (22, NULL), (23, '*');
SELECT queue_name, tenants, ready_rows FROM fs_resync('ex');

-- not_ready: the filter's ready part, then its claim-time part
SELECT reason, detail FROM fs_explain_wait('ex', '20');
SELECT reason, detail FROM fs_explain_wait('ex', '21');
-- no_tenant
SELECT reason, tenant, detail FROM fs_explain_wait('ex', '22');
SELECT reason, tenant, detail FROM fs_explain_wait('ex', '23');

-- Nothing claimed yet: a and b tie, a goes first by name.  claimable,
-- tenant_order, fair_order; no throughput measured, so no estimate but
-- for the row the next claim takes.
SELECT reason, detail FROM fs_explain_wait('ex', '1');
SELECT * FROM why('1');
SELECT reason, detail FROM fs_explain_wait('ex', '3');
SELECT * FROM why('3');
SELECT reason, detail FROM fs_explain_wait('ex', '11');
SELECT * FROM why('11');
-- a higher priority moves a row up its tenant's order
UPDATE ex_jobs SET priority = 5 WHERE id = 3;
SELECT reason, tenant_rows_ahead FROM fs_explain_wait('ex', '3');
SELECT reason, tenant_rows_ahead FROM fs_explain_wait('ex', '1');
UPDATE ex_jobs SET priority = 0 WHERE id = 3;

-- locked: a row this transaction claimed (another transaction's lock is in
-- the isolation spec); nothing is held after the rollback.
BEGIN;
SELECT tenant, (job).id FROM fs_claim('ex', NULL::ex_jobs, 1);
SELECT reason, detail FROM fs_explain_wait('ex', '1');
ROLLBACK;
SELECT reason FROM fs_explain_wait('ex', '1');

-- tenant_limit: a may run one job at a time.  One row claimed: throughput
-- is measured now (served work over its half-life, rows per second), and the
-- next rows of a wait for it.
SELECT fs_set_limit('a', 'ex', max_slots => 1);
SELECT * FROM claim(1);
SELECT reason, detail FROM fs_explain_wait('ex', '2');
SELECT * FROM why('2');
SELECT * FROM why('3');

-- global_gate: 8 live worker threads x fairshare.tenant_share 0.25 = 2 slots a tenant.
SELECT fs_worker_heartbeat('ex_w1', 8, 'ex');
SELECT * FROM claim(2);
SELECT reason, detail FROM fs_explain_wait('ex', '13');
SELECT * FROM why('13');

-- throttled: c at 50% gets ceil(2 x 0.5) = 1 slot.
SELECT fs_set_limit('c', 'ex', throttle_pct => 50);
INSERT INTO ex_jobs (id, account) VALUES (31, 'c'), (32, 'c');
SELECT * FROM claim(1);
SELECT reason, detail FROM fs_explain_wait('ex', '32');
SELECT * FROM why('32');

-- no_budget: d's bucket holds 150 ms and refills 150 ms a minute; a row takes
-- 100 ms, so after one claim the next row waits (100 - 50) / 150 minutes.
SELECT fs_set_limit('d', 'ex', budget_ms_per_minute => 150);
INSERT INTO ex_jobs (id, account) VALUES (41, 'd'), (42, 'd');
SELECT * FROM claim(1);
SELECT reason, detail FROM fs_explain_wait('ex', '42');
SELECT * FROM why('42');
-- 20 seconds later the bucket pays for it
SELECT set_config('fairshare.debug_clock', '1893501020', false) IS NOT NULL AS later;
SELECT reason, token_balance, budget_ready_at = to_timestamp(1893501020) AS ready_now
  FROM fs_explain_wait('ex', '42');
SELECT set_config('fairshare.debug_clock', '1893501000', false) IS NOT NULL AS back;
-- a budget smaller than a row never pays for it
SELECT fs_set_limit('d', 'ex', budget_ms_per_minute => 60);
SELECT reason, detail FROM fs_explain_wait('ex', '42');
SELECT reason, tokens, starts_in FROM why('42');
SELECT fs_set_limit('d', 'ex', budget_ms_per_minute => 'infinity');

-- fair_order with a measured rate: e and f are new, e goes first; f's row
-- after one more row, at the queue's rate.
INSERT INTO ex_jobs (id, account) VALUES (51, 'e'), (61, 'f');
SELECT * FROM why('51');
SELECT * FROM why('61');

-- backpressure: with 5 live threads all 5 slots are busy; no worker is free.
SELECT fs_worker_heartbeat('ex_w1', 5, 'ex');
SELECT free_threads, backpressure FROM fs_queues WHERE queue = 'ex';
SELECT reason, detail FROM fs_explain_wait('ex', '51');
SELECT * FROM why('51');
SELECT fs_worker_heartbeat('ex_w1', 8, 'ex');
SELECT reason FROM fs_explain_wait('ex', '51');

-- untracked: rows written while the triggers were off are not in the count
ALTER TABLE ex_jobs DISABLE TRIGGER USER;
INSERT INTO ex_jobs (id, account) VALUES (71, 'g');
ALTER TABLE ex_jobs ENABLE TRIGGER USER;
SELECT reason, detail FROM fs_explain_wait('ex', '71');
SELECT queue_name, ready_rows FROM fs_resync('ex');
SELECT reason FROM fs_explain_wait('ex', '71');

-- A key of another type: its text form.
CREATE TABLE ex_uuid (id uuid PRIMARY KEY, account text NOT NULL);
SELECT queue FROM fs_register_queue('ex_u', 'ex_uuid', tenant => 'account', order_by => 'id');
INSERT INTO ex_uuid VALUES ('00000000-0000-0000-0000-00000000000a', 'u');
SELECT reason, tenant FROM fs_explain_wait('ex_u', '00000000-0000-0000-0000-00000000000A');
SELECT reason FROM fs_explain_wait('ex_u', '00000000-0000-0000-0000-00000000000b');

-- Errors.
\set VERBOSITY default
SELECT * FROM fs_explain_wait(NULL, '1');
SELECT * FROM fs_explain_wait('', '1');
SELECT * FROM fs_explain_wait('no_such_queue', '1');
SELECT * FROM fs_explain_wait('ex', NULL);
SELECT * FROM fs_explain_wait('ex', 'one');
SELECT * FROM fs_explain_wait('ex_u', '42');

-- Who may call it: fairshare_app, with SELECT on the table, unrestricted by
-- row-level security.
CREATE ROLE ex_nobody;
CREATE ROLE ex_app IN ROLE fairshare_app;
SET ROLE ex_nobody;
SELECT reason FROM fs_explain_wait('ex', '1');
SET ROLE ex_app;
SELECT reason FROM fs_explain_wait('ex', '1');
RESET ROLE;
GRANT SELECT ON ex_jobs TO ex_app;
SET ROLE ex_app;
SELECT reason FROM fs_explain_wait('ex', '2');
RESET ROLE;
ALTER TABLE ex_jobs ENABLE ROW LEVEL SECURITY;
CREATE POLICY ex_mine ON ex_jobs USING (account = 'a');
SET ROLE ex_app;
SELECT reason FROM fs_explain_wait('ex', '2');
RESET ROLE;
\set VERBOSITY terse

-- It changes nothing: no lease, no token, no decision, no lock.
CREATE TEMP TABLE ex_before AS
  SELECT (SELECT count(*) FROM fs_leases WHERE queue = 'ex') AS leases,
         (SELECT count(*) FROM fs_decisions WHERE queue = 'ex') AS decisions,
         (SELECT string_agg(tenant || ':' || slots_in_use || ':' || coalesce(token_balance::text, '-'), ','
                            ORDER BY tenant) FROM fs_tenants WHERE queue = 'ex') AS tenants;
BEGIN;
SELECT count(*) AS answers FROM generate_series(1, 80) k, fs_explain_wait('ex', k::text);
SELECT count(*) AS locks FROM pg_locks
 WHERE pid = pg_backend_pid() AND locktype NOT IN ('relation', 'virtualxid');
COMMIT;
SELECT b.leases = (SELECT count(*) FROM fs_leases WHERE queue = 'ex') AS same_leases,
       b.decisions = (SELECT count(*) FROM fs_decisions WHERE queue = 'ex') AS same_decisions,
       b.tenants = (SELECT string_agg(tenant || ':' || slots_in_use || ':' ||
                                      coalesce(token_balance::text, '-'), ',' ORDER BY tenant)
                      FROM fs_tenants WHERE queue = 'ex') AS same_tenants
  FROM ex_before b;

-- Leave nothing behind.
SELECT fs_unregister_queue('ex'), fs_unregister_queue('ex_u');
SELECT count(*) FROM (SELECT fs_release_slot(lease_id) FROM fs_leases WHERE queue = 'ex') r;
SELECT fs_worker_heartbeat('ex_w1', 0, 'ex');
DROP TABLE ex_jobs, ex_uuid;
DROP FUNCTION why(text);
DROP FUNCTION claim(int);
DROP ROLE ex_nobody, ex_app;
DELETE FROM fs_limits WHERE queue = 'ex';
RESET fairshare.debug_clock;
