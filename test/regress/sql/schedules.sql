--
-- Schedules: fs_schedule(), fs_unschedule(), fs_claim_due_schedules(), the
-- views, catch-up, exactly-once claims, ownership and row-level security.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS fairshare;
RESET client_min_messages;
SET timezone = 'UTC';
SET datestyle = 'ISO, YMD';
-- Schedules are created "now": pin now to Monday 2024-01-01 00:00 UTC.
SELECT extract(epoch FROM timestamptz '2024-01-01 00:00+00') AS t0 \gset
SET fairshare.debug_clock = :t0;

-- Create: the id comes back; the next run follows from now, in the zone.
SELECT fs_schedule('s_every5', '*/5 * * * *') AS every5 \gset
SELECT fs_schedule('s_daily', '30 2 * * *', 'america/new_york', '{"report": "daily"}',
                   'acme', 's_q') AS daily \gset
SELECT name, cron, timezone, tenant, queue, payload, command, catchup, next_run_at,
       last_run_for, last_run_state, last_error
  FROM fs_schedule_status WHERE name LIKE 's\_%' ORDER BY name;

-- Upsert by name: the same id; a new payload keeps the pending next run, a
-- new expression or zone computes it again from now.
SELECT fs_schedule('s_daily', '30 2 * * *', 'America/New_York', '{"report": "v2"}',
                   'acme', 's_q') = :daily AS same_id;
SELECT payload, next_run_at FROM fs_schedule_status WHERE name = 's_daily';
SELECT fs_schedule('s_daily', '30 2 * * *', 'Europe/London', '{"report": "v2"}', 'acme', 's_q') = :daily AS same_id;
SELECT timezone, next_run_at FROM fs_schedule_status WHERE name = 's_daily';

-- Argument errors.
\set VERBOSITY default
SELECT fs_schedule(NULL, '* * * * *');
SELECT fs_schedule('', '* * * * *');
SELECT fs_schedule(repeat('n', 201), '* * * * *');
SELECT fs_schedule('s_bad', NULL);
SELECT fs_schedule('s_bad', '61 * * * *');
SELECT fs_schedule('s_bad', '0 0 30 2 *');
SELECT fs_schedule('s_bad', '* * * * *', 'Europe/Atlantis');
SELECT fs_schedule('s_bad', '* * * * *', '<+03>-3');
SELECT fs_schedule('s_bad', '* * * * *', NULL);
SELECT fs_schedule('s_bad', '* * * * *', payload => NULL);
SELECT fs_schedule('s_bad', '* * * * *', tenant => '');
SELECT fs_schedule('s_bad', '* * * * *', tenant => '*');
SELECT fs_schedule('s_bad', '* * * * *', tenant => repeat('t', 64));
SELECT fs_schedule('s_bad', '* * * * *', queue => NULL);
SELECT fs_schedule('s_bad', '* * * * *', command => 'SELEC 1');
SELECT fs_schedule('s_bad', '* * * * *', command => ' ; -- nothing');
-- Commands that could never run are refused, with the error the run would
-- have failed with: transaction control, COPY to or from the client,
-- statements that cannot run in a transaction, and what a
-- security-restricted operation refuses.
SELECT fs_schedule('s_bad', '* * * * *', command => 'COMMIT');
SELECT fs_schedule('s_bad', '* * * * *', command => 'SELECT 1; ROLLBACK');
SELECT fs_schedule('s_bad', '* * * * *', command => 'BEGIN; SELECT 1; END');
SELECT fs_schedule('s_bad', '* * * * *', command => 'SAVEPOINT a');
SELECT fs_schedule('s_bad', '* * * * *', command => 'RELEASE SAVEPOINT a');
SELECT fs_schedule('s_bad', '* * * * *', command => $$PREPARE TRANSACTION 'x'$$);
SELECT fs_schedule('s_bad', '* * * * *', command => 'COPY t FROM STDIN');
SELECT fs_schedule('s_bad', '* * * * *', command => 'COPY (SELECT 1) TO STDOUT');
SELECT fs_schedule('s_bad', '* * * * *', command => 'VACUUM t');
SELECT fs_schedule('s_bad', '* * * * *', command => 'CREATE INDEX CONCURRENTLY ON t (a)');
SELECT fs_schedule('s_bad', '* * * * *', command => 'REINDEX (CONCURRENTLY) TABLE t');
SELECT fs_schedule('s_bad', '* * * * *', command => 'CREATE DATABASE d');
SELECT fs_schedule('s_bad', '* * * * *', command => 'ALTER SYSTEM SET work_mem = 1');
SELECT fs_schedule('s_bad', '* * * * *', command => 'SET ROLE postgres');
SELECT fs_schedule('s_bad', '* * * * *', command => 'RESET ROLE');
SELECT fs_schedule('s_bad', '* * * * *', command => 'SET SESSION AUTHORIZATION postgres');
SELECT fs_schedule('s_bad', '* * * * *', command => 'CREATE TEMP TABLE t (a int)');
SELECT fs_schedule('s_bad', '* * * * *', command => 'SELECT 1 INTO TEMP t');
SELECT fs_schedule('s_bad', '* * * * *', command => 'DISCARD ALL');
SELECT fs_schedule('s_bad', '* * * * *', command => 'LISTEN x');
SELECT fs_schedule('s_bad', '* * * * *', command => 'PREPARE p AS SELECT 1');
SELECT fs_schedule('s_bad', '* * * * *', command => 'DECLARE c CURSOR WITH HOLD FOR SELECT 1');
SELECT fs_schedule('s_bad', '* * * * *', catchup => 'sometimes');
SELECT fs_schedule('s_bad', '* * * * *', catchup => NULL);
SELECT fs_unschedule(NULL);
SELECT * FROM fs_claim_due_schedules(NULL);
SELECT * FROM fs_claim_due_schedules(-1);
SELECT * FROM fs_claim_due_schedules(10, NULL);
SELECT * FROM fs_claim_due_schedules(10, 'infinity');
\set VERBOSITY terse
SELECT count(*) AS nothing_created FROM fs_schedules WHERE name = 's_bad';
-- as_of may be at most a minute after now (the later of the server clock
-- and fairshare.debug_clock): no claim reaches into the future.
SELECT * FROM fs_claim_due_schedules(as_of => '9999-01-01');
\set VERBOSITY sqlstate
SELECT * FROM fs_claim_due_schedules(as_of => pg_catalog.clock_timestamp() + interval '2 minutes');
\set VERBOSITY terse
BEGIN;
SELECT count(*) >= 0 AS within_a_minute
  FROM fs_claim_due_schedules(as_of => pg_catalog.clock_timestamp() + interval '30 seconds');
ROLLBACK;

-- Claims: each run once.  Nothing is due before its time.
SELECT * FROM fs_claim_due_schedules(as_of => '2024-01-01 00:04:59');
SELECT schedule_id = :every5 AS every5, name, tenant, queue, scheduled_for, payload
  FROM fs_claim_due_schedules(as_of => '2024-01-01 00:05:00');
SELECT count(*) AS claimed_again FROM fs_claim_due_schedules(as_of => '2024-01-01 00:05:00');
-- The next run follows from the last scheduled instant, not from as_of.
SELECT next_run_at, last_run_for, last_run_state FROM fs_schedule_status WHERE name = 's_every5';
-- A claim that rolls back is not a claim: the run is handed out again.
BEGIN;
SELECT name, scheduled_for FROM fs_claim_due_schedules(as_of => '2024-01-01 00:10:00');
ROLLBACK;
SELECT name, scheduled_for FROM fs_claim_due_schedules(as_of => '2024-01-01 00:10:00');

-- Catch-up after missed runs (as_of long after next_run_at).
SELECT fs_unschedule('s_daily');
SELECT fs_unschedule('s_daily') AS again;
SELECT fs_schedule('s_latest', '*/10 * * * *', catchup => 'latest') AS latest \gset
SELECT fs_schedule('s_all', '*/10 * * * *', catchup => 'all') AS all_ \gset
SELECT fs_schedule('s_skip', '*/10 * * * *', catchup => 'skip') AS skip \gset
SELECT fs_unschedule('s_every5');
-- 00:10 .. 00:50 are due at 00:50:30: latest runs 00:50 once, all runs
-- each, skip runs 00:50 (on time: within fairshare.catchup_tolerance).
SELECT name, scheduled_for FROM fs_claim_due_schedules(as_of => '2024-01-01 00:50:30')
 ORDER BY name, scheduled_for;
-- 01:00 .. 01:30 are due at 01:32: skip drops them all (01:30 is 2 minutes late).
SELECT name, scheduled_for FROM fs_claim_due_schedules(as_of => '2024-01-01 01:32:00')
 ORDER BY name, scheduled_for;
SELECT name, scheduled_for, state, missed_since FROM fs_recent_runs
 WHERE name IN ('s_latest', 's_all', 's_skip') ORDER BY name, scheduled_for;
SELECT name, next_run_at, last_run_for, last_run_state
  FROM fs_schedule_status WHERE name IN ('s_latest', 's_all', 's_skip') ORDER BY name;

-- 'all' runs at most 100 missed runs: the last 100, and the runs before
-- them are recorded as missed.
SELECT fs_schedule('s_all_minutely', '* * * * *', catchup => 'all') AS all_minutely \gset
SELECT count(*), min(scheduled_for), max(scheduled_for)
  FROM fs_claim_due_schedules(1000, '2024-01-01 03:00:00') WHERE name = 's_all_minutely';
SELECT scheduled_for, missed_since FROM fs_recent_runs
 WHERE name = 's_all_minutely' AND missed_since IS NOT NULL;

-- max_runs bounds a claim; the rest stay due for the next one, in order.
SELECT fs_unschedule(n) FROM unnest(ARRAY['s_latest', 's_all', 's_skip', 's_all_minutely']) n;
SELECT fs_schedule('s_m' || i, '0 * * * *', catchup => 'all') FROM generate_series(1, 3) i;
SELECT count(*) AS first FROM fs_claim_due_schedules(2, '2024-01-01 04:30:00');
SELECT count(*) AS second FROM fs_claim_due_schedules(2, '2024-01-01 04:30:00');
SELECT name, count(*), max(scheduled_for) FROM fs_recent_runs
 WHERE name LIKE 's\_m%' GROUP BY name ORDER BY name;
-- Several missed runs of one 'all' schedule split across claims, none lost.
SELECT fs_unschedule('s_m' || i) FROM generate_series(1, 3) i;
SELECT fs_schedule('s_split', '*/15 * * * *', catchup => 'all') AS split \gset
SELECT array_agg(scheduled_for ORDER BY scheduled_for) FROM fs_claim_due_schedules(3, '2024-01-01 05:40:00');
SELECT array_agg(scheduled_for ORDER BY scheduled_for) FROM fs_claim_due_schedules(3, '2024-01-01 05:40:00');
SELECT array_agg(scheduled_for ORDER BY scheduled_for) FROM fs_claim_due_schedules(3, '2024-01-01 05:40:00');
SELECT fs_unschedule('s_split');

-- Schedules that give no run do not count against max_runs: at 01:30 the
-- 01:00 runs of the 'skip' schedules are too late and dropped, and the
-- claim still returns the run of s_on_time, due after them.
SELECT count(fs_schedule('s_late' || i, '0 * * * *', catchup => 'skip')) FROM generate_series(1, 3) i;
SELECT fs_schedule('s_on_time', '30 1 * * *') IS NOT NULL AS created;
SELECT name, scheduled_for FROM fs_claim_due_schedules(1, '2024-01-01 01:30:00');
SELECT name, scheduled_for, state FROM fs_recent_runs
 WHERE name ~ '^s_late[0-9]$' OR name = 's_on_time' ORDER BY name;
SELECT count(fs_unschedule(n)) FROM unnest(ARRAY['s_late1', 's_late2', 's_late3', 's_on_time']) n;

-- A changed expression starts from the last claimed instant if that is
-- later than now, so no claimed instant is ever handed out again.
SELECT fs_schedule('s_change', '0 * * * *') AS change \gset
SELECT scheduled_for FROM fs_claim_due_schedules(as_of => '2024-01-01 06:00:00') WHERE name = 's_change';
SELECT fs_schedule('s_change', '0,30 * * * *') = :change AS same_id;
SELECT next_run_at FROM fs_schedule_status WHERE name = 's_change';
-- Even if next_run_at is moved back by hand, the ledger refuses a second claim.
UPDATE fs_schedule_state SET next_run_at = '2024-01-01 06:00:00' WHERE schedule_id = :change;
SELECT count(*) AS reclaimed FROM fs_claim_due_schedules(as_of => '2024-01-01 06:00:00') WHERE name = 's_change';
SELECT next_run_at FROM fs_schedule_status WHERE name = 's_change';
-- A zone that disappears from the tz database stops its schedule, loudly.
UPDATE fs_schedule_state SET timezone = 'Gone/Away', next_run_at = '2024-01-01 06:30:00' WHERE schedule_id = :change;
SELECT count(*) FROM fs_claim_due_schedules(as_of => '2024-01-01 07:00:00') WHERE name = 's_change';
SELECT next_run_at, last_error FROM fs_schedule_status WHERE name = 's_change';
SELECT fs_unschedule('s_change');

-- A schedule whose runs were claimed as of a far future (possible before
-- as_of was bounded) goes on from now when fs_schedule() is called again,
-- even with the same expression.
SELECT fs_schedule('s_future', '0 * * * *') AS future \gset
UPDATE fs_schedule_state SET last_scheduled_for = '9999-01-01', next_run_at = '9999-01-01 01:00'
 WHERE schedule_id = :future;
SELECT fs_schedule('s_future', '0 * * * *') = :future AS same_id;
SELECT next_run_at, last_run_for FROM fs_schedule_status WHERE name = 's_future';
SELECT fs_unschedule('s_future');

-- Schedules with a command belong to the background worker, not to claims.
SELECT fs_schedule('s_cmd', '* * * * *', command => 'SELECT 1') AS cmd \gset
SELECT count(*) AS worker_runs_not_claimed FROM fs_claim_due_schedules(as_of => '2024-01-01 08:00:00') WHERE name = 's_cmd';
SELECT command, next_run_at FROM fs_schedule_status WHERE name = 's_cmd';
-- The worker runs the commands of fairshare.database only (here it is
-- another database): fs_schedule() warns, and the status says why.
SELECT not_run_reason FROM fs_schedule_status WHERE name = 's_cmd';
SELECT count(*) AS without_command_no_reason FROM fs_schedule_status
 WHERE command IS NULL AND not_run_reason IS NOT NULL;
SELECT fs_unschedule('s_cmd');
-- What else a command may hold runs in a transaction, as its owner, and is
-- accepted: ANALYZE, several statements, COPY to or from a server file.
SELECT fs_schedule('s_ok', '* * * * *', command => 'ANALYZE; SELECT 1; SELECT 2') IS NOT NULL AS accepted;
SELECT fs_schedule('s_ok', '* * * * *', command => $$COPY (SELECT 1) TO '/dev/null'$$) IS NOT NULL AS accepted;
SELECT fs_unschedule('s_ok');
-- Past runs stay after a schedule is removed.
SELECT count(*) > 0 AS history_kept FROM fs_recent_runs WHERE name = 's_change';

--
-- Ownership and row-level security.
--
CREATE ROLE fs_alice;
CREATE ROLE fs_bob;
CREATE ROLE fs_carol;
GRANT fairshare_admin TO fs_carol;
SET ROLE fs_alice;
SELECT fs_schedule('shared_name', '0 * * * *', payload => '{"who": "alice"}') IS NOT NULL AS alice_created;
SELECT fs_schedule('alice_only', '0 * * * *', command => 'SELECT 1') IS NOT NULL AS alice_created;
SET ROLE fs_bob;
SELECT fs_schedule('shared_name', '0 * * * *', payload => '{"who": "bob"}') IS NOT NULL AS bob_created;
-- bob sees his own schedules only, and cannot touch alice's.
SELECT owner, name, payload FROM fs_schedule_status ORDER BY owner, name;
SELECT owner, name FROM fs_schedules ORDER BY owner, name;
SELECT count(*) AS state_rows FROM fs_schedule_state;
SELECT fs_unschedule('alice_only') AS removed_alices;
-- No direct writes, so no schedule as another role and no command change.
INSERT INTO fs_schedules (owner, name, payload, queue, command)
VALUES ('fs_alice', 'evil', '{}', 'default', 'SELECT 1');
UPDATE fs_schedules SET command = 'DROP TABLE x' WHERE name = 'alice_only';
UPDATE fs_schedule_state SET next_run_at = now();
DELETE FROM fs_schedules;
INSERT INTO fs_schedule_runs (schedule_id, scheduled_for, owner_oid, owner, name, state, claimed_at)
VALUES (1, now(), 'fs_bob'::regrole, 'fs_bob', 'x', 'claimed', now());
-- bob claims only his own runs.
SELECT name, payload FROM fs_claim_due_schedules(as_of => '2024-01-01 09:00:00');
SELECT owner, name, scheduled_for FROM fs_recent_runs;
-- carol (fairshare_admin) sees everybody's and may delete them, not change them.
SET ROLE fs_carol;
SELECT owner, name FROM fs_schedule_status ORDER BY owner, name;
UPDATE fs_schedules SET command = 'DROP TABLE x' WHERE name = 'alice_only';
SELECT name, payload FROM fs_claim_due_schedules(as_of => '2024-01-01 10:00:00') ORDER BY payload::text;
SELECT owner, name, scheduled_for FROM fs_recent_runs WHERE scheduled_for >= '2024-01-01 09:00' ORDER BY 1, 3;
DELETE FROM fs_schedules WHERE owner = 'fs_bob';
SELECT owner, count(*) FROM fs_schedule_status GROUP BY owner ORDER BY owner;
SET ROLE fs_alice;
SELECT owner, name FROM fs_schedule_status ORDER BY name;
SELECT owner, name, scheduled_for FROM fs_recent_runs ORDER BY 3;
SELECT fs_unschedule('shared_name'), fs_unschedule('alice_only');
RESET ROLE;
SELECT count(*) AS left_over FROM fs_schedules WHERE owner IN ('fs_alice', 'fs_bob');

-- Owners are roles, not names.  A role created with the name of a dropped
-- owner does not see, change, remove or claim its schedules, and gets a
-- schedule of its own under the same name.
SET ROLE fs_alice;
SELECT fs_schedule('alice_kept', '0 * * * *', payload => '{"v": 1}') AS old_alice_kept \gset
RESET ROLE;
DROP ROLE fs_alice;
CREATE ROLE fs_alice;
SET ROLE fs_alice;
SELECT count(*) AS sees FROM fs_schedule_status;
SELECT fs_unschedule('alice_kept') AS removed;
SELECT count(*) AS claims FROM fs_claim_due_schedules(as_of => '2024-01-01 11:00:00');
SELECT count(*) AS sees_runs FROM fs_recent_runs;
SELECT fs_schedule('alice_kept', '0 * * * *', payload => '{"v": 2}') <> :old_alice_kept AS new_schedule;
SELECT name, payload FROM fs_schedule_status;
RESET ROLE;
SELECT owner, name, payload, owner_oid = 'fs_alice'::regrole AS current_role
  FROM fs_schedules WHERE name = 'alice_kept' ORDER BY payload::text;
-- A renamed owner keeps its schedules; fs_schedule() records its new name.
ALTER ROLE fs_alice RENAME TO fs_alice_2;
SET ROLE fs_alice_2;
SELECT owner, name FROM fs_schedule_status;
SELECT fs_schedule('alice_kept', '0 * * * *', payload => '{"v": 3}') IS NOT NULL AS changed;
SELECT owner, name, payload FROM fs_schedule_status;
RESET ROLE;
DELETE FROM fs_schedules WHERE name = 'alice_kept';
DROP ROLE fs_alice_2;
DROP ROLE fs_bob;
DROP ROLE fs_carol;

-- Leave nothing behind.
RESET fairshare.debug_clock;
TRUNCATE fs_schedules CASCADE;
TRUNCATE fs_schedule_runs;
