-- pgTAP: the fair-dequeue API (names, argument names and defaults, return
-- types, privileges) and the SQLSTATE of every error it raises.
\set ON_ERROR_STOP 1
\set QUIET 1
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS fairshare;
BEGIN;
SELECT plan(70);

SELECT has_function('fs_register_queue', ARRAY['text', 'regclass', 'text', 'text', 'text', 'text',
       'regclass', 'text', 'text', 'text', 'boolean', 'boolean', 'text', 'text', 'integer', 'interval', 'text']);
SELECT is(pg_get_function_arguments('fs_register_queue(text, regclass, text, text, text, text, regclass, text, text, text, boolean, boolean, text, text, integer, interval, text)'::regprocedure),
          'queue text, ready_table regclass, tenant text, order_by text, filter text DEFAULT NULL::text, '
          'key text DEFAULT NULL::text, running_table regclass DEFAULT NULL::regclass, '
          'running_filter text DEFAULT NULL::text, running_key text DEFAULT NULL::text, '
          'cost text DEFAULT NULL::text, charge_runtime boolean DEFAULT false, create_index boolean DEFAULT true, '
          'enqueued_at text DEFAULT NULL::text, selector text DEFAULT NULL::text, '
          'max_slots integer DEFAULT NULL::integer, lease interval DEFAULT NULL::interval, subkey text DEFAULT NULL::text',
          'fs_register_queue argument names and defaults');
SELECT function_returns('fs_register_queue', ARRAY['text', 'regclass', 'text', 'text', 'text', 'text',
       'regclass', 'text', 'text', 'text', 'boolean', 'boolean', 'text', 'text', 'integer', 'interval', 'text'], 'fs_fair_queues');
SELECT has_function('fs_unregister_queue', ARRAY['text']);
SELECT function_returns('fs_unregister_queue', ARRAY['text'], 'boolean');
SELECT has_function('fs_claim', ARRAY['text', 'anyelement', 'integer', 'interval', 'text[]', 'text[]']);
SELECT is(pg_get_function_arguments('fs_claim(text, anyelement, integer, interval, text[], text[])'::regprocedure),
          'queue text, row_type anyelement, max_rows integer DEFAULT 1, lease interval DEFAULT NULL::interval, '
          'selector_in text[] DEFAULT NULL::text[], selector_not_in text[] DEFAULT NULL::text[]',
          'fs_claim argument names and defaults');
SELECT is(pg_get_function_result('fs_claim(text, anyelement, integer, interval, text[], text[])'::regprocedure),
          'TABLE(lease_id bigint, tenant text, job anyelement)', 'fs_claim returns leases, tenants and rows');
SELECT has_function('fs_ready_tenants', ARRAY['text', 'integer']);
SELECT is(pg_get_function_result('fs_ready_tenants(text, integer)'::regprocedure),
          'TABLE(tenant text, ready_rows bigint, free_slots integer, virtual_start double precision, weight double precision)',
          'fs_ready_tenants columns');
SELECT is(pg_get_function_arguments('fs_ready_tenants(text, integer)'::regprocedure),
          'queue text, max_tenants integer DEFAULT 100', 'fs_ready_tenants argument names and defaults');
SELECT has_function('fs_explain_wait', ARRAY['text', 'text']);
SELECT is(pg_get_function_result('fs_explain_wait(text, text)'::regprocedure), 'record',
          'fs_explain_wait returns one row');
SELECT is(pg_get_function_arguments('fs_explain_wait(text, text)'::regprocedure),
          'queue text, job_key text, OUT tenant text, OUT reason text, OUT detail text, '
          'OUT tenant_rows_ahead bigint, OUT tenants_ahead integer, OUT rows_ahead bigint, '
          'OUT slots_in_use integer, OUT max_slots integer, OUT slot_ceiling integer, '
          'OUT live_threads integer, OUT throttle_pct double precision, '
          'OUT token_balance double precision, OUT tokens_per_row double precision, '
          'OUT budget_ready_at timestamp with time zone, OUT backpressure text, '
          'OUT claim_rate double precision, OUT estimated_start timestamp with time zone, OUT subkey text, OUT subkeys_ahead integer',
          'fs_explain_wait arguments and columns');
SELECT function_privs_are('fs_explain_wait', ARRAY['text', 'text'], 'public', ARRAY[]::text[]);
SELECT function_privs_are('fs_explain_wait', ARRAY['text', 'text'], 'fairshare_app', ARRAY['EXECUTE']);
SELECT has_function('fs_resync', ARRAY['text']);
SELECT is(pg_get_function_result('fs_resync(text)'::regprocedure),
          'TABLE(queue_name text, tenants integer, ready_rows bigint)', 'fs_resync columns');
SELECT has_table('fs_fair_queues');
SELECT col_is_pk('fs_fair_queues', 'queue');
SELECT has_trigger('fs_fair_queues', 'fs_fair_queues_changed');
SELECT has_view('fs_fairness');
SELECT has_view('fs_fair_shares');
SELECT columns_are('fs_fairness', ARRAY['queue', 'backlogged_tenants', 'ready_rows', 'rows_without_tenant',
       'rows_untracked', 'active_tenants', 'jain_index', 'gini', 'served', 'virtual_time', 'claims',
       'rows_claimed', 'rows_released', 'short_probes', 'fail_open', 'failed_to_deliver', 'resyncs',
       'last_resync_at']);
SELECT columns_are('fs_fair_shares', ARRAY['queue', 'tenant', 'weight', 'min_slots', 'slots_in_use',
       'ready_rows', 'served', 'share', 'fair_share', 'share_ratio', 'virtual_finish', 'lag']);
-- Registration is fairshare_admin's (the table's owner's, too); claiming is
-- fairshare_app's (and the table's own privileges decide); PUBLIC may do
-- neither.
SELECT function_privs_are('fs_register_queue', ARRAY['text', 'regclass', 'text', 'text', 'text', 'text',
       'regclass', 'text', 'text', 'text', 'boolean', 'boolean', 'text', 'text', 'integer', 'interval', 'text'], 'public', ARRAY[]::text[]);
SELECT function_privs_are('fs_unregister_queue', ARRAY['text'], 'public', ARRAY[]::text[]);
SELECT function_privs_are('fs_resync', ARRAY['text'], 'public', ARRAY[]::text[]);
SELECT function_privs_are('fs_claim', ARRAY['text', 'anyelement', 'integer', 'interval', 'text[]', 'text[]'], 'public', ARRAY[]::text[]);
SELECT function_privs_are('fs_ready_tenants', ARRAY['text', 'integer'], 'public', ARRAY[]::text[]);
SELECT function_privs_are('fs_register_queue', ARRAY['text', 'regclass', 'text', 'text', 'text', 'text',
       'regclass', 'text', 'text', 'text', 'boolean', 'boolean', 'text', 'text', 'integer', 'interval', 'text'], 'fairshare_admin', ARRAY['EXECUTE']);
SELECT function_privs_are('fs_unregister_queue', ARRAY['text'], 'fairshare_admin', ARRAY['EXECUTE']);
SELECT function_privs_are('fs_resync', ARRAY['text'], 'fairshare_admin', ARRAY['EXECUTE']);
SELECT function_privs_are('fs_claim', ARRAY['text', 'anyelement', 'integer', 'interval', 'text[]', 'text[]'], 'fairshare_app', ARRAY['EXECUTE']);
SELECT function_privs_are('fs_ready_tenants', ARRAY['text', 'integer'], 'fairshare_app', ARRAY['EXECUTE']);
SELECT table_privs_are('fs_fair_queues', 'public', ARRAY['SELECT']);

-- Every error has its SQLSTATE.
CREATE TABLE tap_jobs (id int PRIMARY KEY, tenant text, n int, flag bool);
SELECT throws_ok($$SELECT fs_register_queue(NULL, 'tap_jobs', 'tenant', 'id')$$, '22004');
SELECT throws_ok($$SELECT fs_register_queue('', 'tap_jobs', 'tenant', 'id')$$, '22023');
SELECT throws_ok($$SELECT fs_register_queue(repeat('q', 64), 'tap_jobs', 'tenant', 'id')$$, '42622');
SELECT throws_ok($$SELECT fs_register_queue('tq', NULL, 'tenant', 'id')$$, '22004');
SELECT throws_ok($$SELECT fs_register_queue('tq', 'tap_jobs', NULL, 'id')$$, '22004');
SELECT throws_ok($$SELECT fs_register_queue('tq', 'tap_jobs', 'tenant', NULL)$$, '22004');
SELECT throws_ok($$SELECT fs_register_queue('tq', 'tap_jobs', 'tenant', 'id', charge_runtime => NULL)$$, '22004');
SELECT throws_ok($$SELECT fs_register_queue('tq', 'tap_jobs', 'tennant', 'id')$$, '42703');
SELECT throws_ok($$SELECT fs_register_queue('tq', 'tap_jobs', 'flag', 'id')$$, '42804');
SELECT throws_ok($$SELECT fs_register_queue('tq', 'tap_jobs', 'tenant', 'id', filter => 'n')$$, '42804');
SELECT throws_ok($$SELECT fs_register_queue('tq', 'tap_jobs', 'tenant', 'id', cost => 'tenant')$$, '42804');
SELECT throws_ok($$SELECT fs_register_queue('tq', 'tap_jobs', 'tenant; SELECT 1', 'id')$$, '42601');
SELECT throws_ok($$SELECT fs_register_queue('tq', 'tap_jobs', 'tenant', 'id', filter => 'random() > 0')$$, '22023');
SELECT throws_ok($$SELECT fs_register_queue('tq', 'tap_jobs', 'tenant || now()', 'id')$$, '22023');
SELECT throws_ok($$SELECT fs_register_queue('tq', 'tap_jobs', 'xmin::text', 'id')$$, '42P10');
SELECT throws_ok($$SELECT fs_register_queue('tq', 'tap_jobs', 'tenant', 'id', running_key => 'id')$$, '22023');
SELECT throws_ok($$SELECT fs_register_queue('tq', 'tap_jobs', 'tenant', 'id', key => 'n')$$, '22023');
SELECT throws_ok($$SELECT fs_register_queue('tq', 'tap_jobs', 'tenant', 'id', key => 'tenant')$$, '22023');
SELECT lives_ok($$SELECT fs_register_queue('tq', 'tap_jobs', 'tenant', 'id')$$, 'a valid registration');
SELECT throws_ok($$SELECT * FROM fs_claim('nope', NULL::tap_jobs)$$, '42704');
SELECT throws_ok($$SELECT * FROM fs_claim('tq', NULL::fs_limits)$$, '42804');
SELECT throws_ok($$SELECT * FROM fs_claim('tq', NULL::tap_jobs, 0)$$, '22023');
SELECT throws_ok($$SELECT * FROM fs_claim('tq', NULL::tap_jobs, NULL)$$, '22004');
SELECT throws_ok($$SELECT * FROM fs_claim('tq', NULL::tap_jobs, 10001)$$, '54000');
SELECT throws_ok($$SELECT * FROM fs_claim('tq', NULL::tap_jobs, 1, '0')$$, '22023');
SELECT throws_ok($$SELECT * FROM fs_ready_tenants('tq', -5)$$, '22023');
SELECT throws_ok($$SELECT * FROM fs_explain_wait(NULL, '1')$$, '22004');
SELECT throws_ok($$SELECT * FROM fs_explain_wait('nope', '1')$$, '42704');
SELECT throws_ok($$SELECT * FROM fs_explain_wait('tq', NULL)$$, '22004');
SELECT throws_ok($$SELECT * FROM fs_explain_wait('tq', 'x')$$, '22P02');
SELECT is((SELECT reason FROM fs_explain_wait('tq', '1')), 'not_found', 'an unknown key is not_found');
SELECT lives_ok($$SELECT * FROM fs_claim('tq', NULL::tap_jobs, 10000)$$, 'the largest batch');
SELECT is(fs_unregister_queue('tq'), true, 'unregistered');
SELECT is(fs_unregister_queue('tq'), false, 'unregistering twice is no error');

SELECT * FROM finish();
ROLLBACK;
