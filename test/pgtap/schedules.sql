-- The schedules API as the contract fixes it: names, signatures, defaults,
-- privileges and row-level security, and the errors callers rely on.
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only on
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS fairshare;
RESET client_min_messages;

BEGIN;
SELECT plan(38);

-- Fixed names and signatures.
SELECT has_function('fs_schedule', ARRAY['text', 'text', 'text', 'jsonb', 'text', 'text', 'text', 'text']);
SELECT function_returns('fs_schedule', ARRAY['text', 'text', 'text', 'jsonb', 'text', 'text', 'text', 'text'], 'bigint');
SELECT has_function('fs_unschedule', ARRAY['text']);
SELECT function_returns('fs_unschedule', ARRAY['text'], 'boolean');
SELECT has_function('fs_next_run', ARRAY['text', 'text', 'timestamp with time zone']);
SELECT function_returns('fs_next_run', ARRAY['text', 'text', 'timestamp with time zone'], 'timestamp with time zone');
SELECT has_function('fs_next_runs', ARRAY['text', 'text', 'timestamp with time zone', 'integer']);
SELECT has_function('fs_claim_due_schedules', ARRAY['integer', 'timestamp with time zone']);
SELECT is(
  (SELECT pg_get_function_result('fs_claim_due_schedules(integer, timestamptz)'::regprocedure)),
  'TABLE(schedule_id bigint, name text, tenant text, queue text, scheduled_for timestamp with time zone, payload jsonb)',
  'fs_claim_due_schedules returns the contract''s columns');
SELECT is(
  (SELECT pg_get_function_arguments('fs_schedule(text, text, text, jsonb, text, text, text, text)'::regprocedure)),
  'name text, cron text, timezone text DEFAULT ''UTC''::text, payload jsonb DEFAULT ''{}''::jsonb, tenant text DEFAULT NULL::text, queue text DEFAULT ''default''::text, command text DEFAULT NULL::text, catchup text DEFAULT ''latest''::text',
  'fs_schedule has the contract''s defaults');
SELECT is(
  (SELECT pg_get_function_arguments('fs_claim_due_schedules(integer, timestamptz)'::regprocedure)),
  'max_runs integer DEFAULT 1000, as_of timestamp with time zone DEFAULT now()',
  'fs_claim_due_schedules has the contract''s defaults');
SELECT volatility_is('fs_next_run', ARRAY['text', 'text', 'timestamp with time zone'], 'immutable');
SELECT volatility_is('fs_claim_due_schedules', ARRAY['integer', 'timestamp with time zone'], 'volatile');
SELECT isnt_definer('fs_schedule', ARRAY['text', 'text', 'text', 'jsonb', 'text', 'text', 'text', 'text']);
SELECT isnt_definer('fs_claim_due_schedules', ARRAY['integer', 'timestamp with time zone']);

-- Tables and views.
SELECT has_table('fs_schedules');
SELECT has_table('fs_schedule_state');
SELECT has_table('fs_schedule_runs');
SELECT col_is_pk('fs_schedule_runs', ARRAY['schedule_id', 'scheduled_for'], 'the ledger''s key is (schedule_id, scheduled_for)');
SELECT has_view('fs_schedule_status');
SELECT has_view('fs_recent_runs');
SELECT has_view('fs_scheduler');
SELECT columns_are('fs_schedule_status', ARRAY['schedule_id', 'owner', 'name', 'cron', 'timezone',
  'tenant', 'queue', 'payload', 'command', 'catchup', 'next_run_at', 'last_run_for',
  'last_run_state', 'last_run_finished_at', 'last_error', 'last_error_at', 'not_run_reason']);

-- Privileges: read-only for everybody; row-level security decides what.
SELECT table_privs_are('fs_schedules', 'public', ARRAY['SELECT']);
SELECT table_privs_are('fs_schedule_state', 'public', ARRAY['SELECT']);
SELECT table_privs_are('fs_schedule_runs', 'public', ARRAY['SELECT']);
SELECT table_privs_are('fs_schedules', 'fairshare_admin', ARRAY['DELETE', 'SELECT']);
SELECT ok((SELECT bool_and(relrowsecurity) FROM pg_class
            WHERE oid IN ('fs_schedules'::regclass, 'fs_schedule_state'::regclass, 'fs_schedule_runs'::regclass)),
          'row-level security is on for every schedule table');
SELECT ok((SELECT bool_and(coalesce('security_invoker=true' = ANY (reloptions), false)) FROM pg_class
            WHERE oid IN ('fs_schedule_status'::regclass, 'fs_recent_runs'::regclass)),
          'the views apply row-level security as the caller');
SELECT has_role('fairshare_admin');

-- Behaviour callers rely on.
SELECT is(fs_next_run('0 9 * * 1-5', 'Europe/London', '2024-07-05 09:00+01'), '2024-07-08 09:00+01'::timestamptz,
          'the next weekday at 09:00 London time, strictly after');
SELECT is(fs_next_run('0 0 * * *', 'UTC', 'infinity'), NULL, 'NULL when it never runs again');
SELECT throws_ok($$SELECT fs_next_run('0 0 31 2 *', 'UTC', now())$$, '22023', NULL,
                 'an expression that can never run is rejected');
SELECT throws_ok($$SELECT fs_schedule('p_bad', '* * * *')$$, '22023', NULL, 'four fields are rejected');
SELECT throws_ok($$SELECT fs_schedule('p_bad', '* * * * *', 'Nowhere/Land')$$, '22023', NULL, 'unknown zones are rejected');
SELECT throws_ok($$SELECT fs_schedule(NULL, '* * * * *')$$, '22004', NULL, 'a NULL name is rejected');
SELECT lives_ok($$SELECT fs_schedule('p_ok', '@daily', 'Asia/Kathmandu')$$, 'a valid schedule is accepted');
SELECT ok(fs_unschedule('p_ok') AND NOT fs_unschedule('p_ok'), 'fs_unschedule says whether there was one');

SELECT * FROM finish();
ROLLBACK;
