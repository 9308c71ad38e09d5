--
-- fs_limits, fs_set_limit() and fs_effective_limits(): defaults, inheritance,
-- plain SQL edits, commit/rollback, and every validation error.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS fairshare;
RESET client_min_messages;

-- Out of the box: max_slots 1, min_slots 0, weight 1, no budget, no throttle.
SELECT * FROM fs_effective_limits('lim_unknown');
SELECT * FROM fs_effective_limits('lim_unknown', 'lim_q');

-- fs_set_limit: every parameter, and its defaults (queue 'default').
SELECT fs_set_limit('lim_a', max_slots => 5);
SELECT queue, tenant, max_slots, min_slots, weight, budget_ms_per_minute, throttle_pct
  FROM fs_limits WHERE tenant = 'lim_a';
SELECT fs_set_limit('lim_a', 'default', NULL, 2, 3.5, 6000, 50);
SELECT queue, tenant, max_slots, min_slots, weight, budget_ms_per_minute, throttle_pct
  FROM fs_limits WHERE tenant = 'lim_a';
-- NULL leaves a field as it is.
SELECT fs_set_limit('lim_a', weight => 1.5);
SELECT max_slots, min_slots, weight, budget_ms_per_minute, throttle_pct
  FROM fs_limits WHERE tenant = 'lim_a';
SELECT * FROM fs_effective_limits('lim_a');

-- Inheritance, field by field: (q,t) > ('*',t) > (q,'*') > ('*','*').
SELECT fs_set_limit('*', '*', max_slots => 7, weight => 2);
SELECT fs_set_limit('*', 'lim_q', max_slots => 4, budget_ms_per_minute => 1000);
SELECT fs_set_limit('lim_b', '*', min_slots => 1);
SELECT fs_set_limit('lim_b', 'lim_q', throttle_pct => 80);
SELECT * FROM fs_effective_limits('lim_b', 'lim_q');     -- 4, 1, 2, 1000, 80
SELECT * FROM fs_effective_limits('lim_other', 'lim_q'); -- 4, 0, 2, 1000, 100
SELECT * FROM fs_effective_limits('lim_b', 'lim_q2');    -- 7, 1, 2, NULL, 100
SELECT * FROM fs_effective_limits('lim_other', 'lim_q2');-- 7, 0, 2, NULL, 100
-- 'infinity' says "no budget" over an inherited one.
SELECT fs_set_limit('lim_c', 'lim_q', budget_ms_per_minute => 'infinity');
SELECT budget_ms_per_minute FROM fs_effective_limits('lim_c', 'lim_q');
-- An inherited min_slots above max_slots is capped at max_slots.
SELECT fs_set_limit('lim_d', 'lim_q', max_slots => 0);
SELECT fs_set_limit('lim_d', '*', min_slots => 3);
SELECT max_slots, min_slots FROM fs_effective_limits('lim_d', 'lim_q');

-- Plain SQL edits work the same way, and updated_at follows updates.
INSERT INTO fs_limits (queue, tenant, max_slots) VALUES ('lim_q', 'lim_e', 9);
SELECT max_slots FROM fs_effective_limits('lim_e', 'lim_q');
BEGIN;
UPDATE fs_limits SET max_slots = NULL WHERE tenant = 'lim_e';
SELECT max_slots FROM fs_effective_limits('lim_e', 'lim_q');
SELECT updated_at = now() AS updated_now FROM fs_limits WHERE tenant = 'lim_e';
COMMIT;
DELETE FROM fs_limits WHERE tenant = 'lim_e';
SELECT max_slots FROM fs_effective_limits('lim_e', 'lim_q');

-- Limits reach decisions at commit; a rolled-back change never applies.
TRUNCATE fs_limits;
SELECT fs_acquire_slot('lim_f', 'lim_rb') IS NOT NULL AS first;
SELECT fs_acquire_slot('lim_f', 'lim_rb') IS NULL AS second_denied;
BEGIN;
SELECT fs_set_limit('lim_f', 'lim_rb', max_slots => 2);
-- not even this transaction decides with it before it commits
SELECT fs_acquire_slot('lim_f', 'lim_rb') IS NULL AS not_yet_applied;
SELECT max_slots FROM fs_effective_limits('lim_f', 'lim_rb');
ROLLBACK;
SELECT max_slots FROM fs_effective_limits('lim_f', 'lim_rb');
SELECT fs_acquire_slot('lim_f', 'lim_rb') IS NULL AS still_denied;
SELECT slots_in_use, max_slots FROM fs_tenants WHERE queue = 'lim_rb';
SELECT fs_set_limit('lim_f', 'lim_rb', max_slots => 2);
SELECT fs_acquire_slot('lim_f', 'lim_rb') IS NOT NULL AS granted_after_commit;
SELECT slots_in_use, max_slots FROM fs_tenants WHERE queue = 'lim_rb';
TRUNCATE fs_limits;
SELECT max_slots FROM fs_effective_limits('lim_f', 'lim_rb');
SELECT fs_acquire_slot('lim_f', 'lim_rb') IS NULL AS denied_after_truncate;

-- A caller's search_path cannot change how limits are looked up: an
-- operator = (text, text) that says "always equal" is not used.
SELECT fs_set_limit('lim_big', 'lim_sp', max_slots => 500);
CREATE SCHEMA lim_evil;
CREATE FUNCTION lim_evil.always(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';
CREATE OPERATOR lim_evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = lim_evil.always);
SET search_path = lim_evil, pg_catalog, public;
SELECT fs_acquire_slot('lim_small', 'lim_sp') IS NOT NULL AS first;
SELECT fs_acquire_slot('lim_small', 'lim_sp') IS NULL AS second_denied;
RESET search_path;
SELECT max_slots FROM fs_tenants WHERE queue = 'lim_sp' AND tenant = 'lim_small';
DROP SCHEMA lim_evil CASCADE;

-- A prepared transaction's change of limits applies when COMMIT PREPARED
-- commits it (the cached limit loads again), not before; ROLLBACK PREPARED
-- applies nothing.
SELECT fs_set_limit('lim_p', 'lim_pq', max_slots => 1);
SELECT fs_acquire_slot('lim_p', 'lim_pq') IS NOT NULL AS first_granted;
SELECT fs_acquire_slot('lim_p', 'lim_pq') IS NOT NULL AS second_granted;
BEGIN;
SELECT fs_set_limit('lim_p', 'lim_pq', max_slots => 2);
PREPARE TRANSACTION 'fs_limits';
SELECT fs_acquire_slot('lim_p', 'lim_pq') IS NOT NULL AS granted_while_prepared;
COMMIT PREPARED 'fs_limits';
SELECT fs_acquire_slot('lim_p', 'lim_pq') IS NOT NULL AS granted_after_commit_prepared;
BEGIN;
SELECT fs_set_limit('lim_p', 'lim_pq', max_slots => 3);
PREPARE TRANSACTION 'fs_limits';
ROLLBACK PREPARED 'fs_limits';
SELECT fs_acquire_slot('lim_p', 'lim_pq') IS NOT NULL AS granted_after_rollback_prepared;
SELECT count(*) AS prepared FROM pg_prepared_xacts;
SELECT count(fs_release_slot(lease_id)) AS released FROM fs_leases WHERE queue = 'lim_pq';
DELETE FROM fs_limits WHERE queue = 'lim_pq';

-- When fs_limits cannot be read, decisions fail open (with a warning),
-- never fail the caller.
CREATE ROLE lim_reader IN ROLE fairshare_app;
REVOKE SELECT ON fs_limits FROM PUBLIC;
SET ROLE lim_reader;
SELECT fs_acquire_slot('lim_unreadable', 'lim_ro') IS NOT NULL AS granted;
SELECT fs_acquire_slot('lim_unreadable', 'lim_ro') IS NOT NULL AS granted_again;
RESET ROLE;
GRANT SELECT ON fs_limits TO PUBLIC;
DROP ROLE lim_reader;
SELECT count(*) AS entries FROM fs_tenants WHERE queue = 'lim_ro';
SELECT limits_unreadable >= 2 AS counted FROM fs_stats;

-- Errors: each says what is wrong and what to do.
\set VERBOSITY default
SELECT fs_set_limit(NULL);
SELECT fs_set_limit('');
SELECT fs_set_limit('lim_x', NULL);
SELECT fs_set_limit(repeat('t', 10240));
SELECT fs_set_limit('lim_x', queue => repeat('q', 64));
SELECT fs_set_limit('lim_x', max_slots => -1);
SELECT fs_set_limit('lim_x', min_slots => -1);
SELECT fs_set_limit('lim_x', max_slots => 2, min_slots => 3);
SELECT fs_set_limit('lim_x', max_slots => 2);
SELECT fs_set_limit('lim_x', min_slots => 3);   -- merged row would have min > max
SELECT fs_set_limit('lim_x', weight => 0);
SELECT fs_set_limit('lim_x', weight => -1);
SELECT fs_set_limit('lim_x', weight => 'NaN');
SELECT fs_set_limit('lim_x', weight => 'infinity');
SELECT fs_set_limit('lim_x', budget_ms_per_minute => -5);
SELECT fs_set_limit('lim_x', budget_ms_per_minute => 'NaN');
SELECT fs_set_limit('lim_x', throttle_pct => 101);
SELECT fs_set_limit('lim_x', throttle_pct => -1);
INSERT INTO fs_limits (queue, tenant, min_slots, max_slots) VALUES ('q', 't', 5, 1);
UPDATE fs_limits SET max_slots = -3 WHERE tenant = 'lim_x';
INSERT INTO fs_limits (queue, tenant) VALUES (NULL, 't');
SELECT * FROM fs_effective_limits(NULL);
SELECT * FROM fs_effective_limits('lim_x', NULL);
-- nothing of the above was stored
SELECT queue, tenant, max_slots, min_slots FROM fs_limits ORDER BY 1, 2;
TRUNCATE fs_limits;
SELECT fs_release_slot(lease_id) FROM fs_leases WHERE queue = 'lim_rb' AND state = 'live';
SELECT fs_release_slot(lease_id) FROM fs_leases WHERE queue = 'lim_sp' AND state = 'live';
