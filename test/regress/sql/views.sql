--
-- fs_tenants, fs_leases, fs_stats, fs_reset(); and the catalog rules every
-- object of the extension follows.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS fairshare;
RESET client_min_messages;

-- Counters from here on (earlier tests share the server).
SELECT fs_reset();

-- A scripted sequence and the counters it leaves.
SELECT fs_set_limit('t_a', 't_q', max_slots => 2, min_slots => 1, weight => 3);
SELECT fs_acquire_slot('t_a', 't_q') AS l1 \gset
SELECT fs_acquire_slot('t_a', 't_q') AS l2 \gset
SELECT fs_acquire_slot('t_a', 't_q') IS NULL AS denied;
SELECT fs_acquire_slot('t_a', 't_q') IS NULL AS denied;
SELECT queue, tenant, slots_in_use, max_slots, min_slots, weight,
       budget_ms_per_minute, token_balance, throttle_pct, ready_rows,
       granted, denied_tenant_limit, denied_global_gate, denied_throttled,
       denied_backpressure, denied_no_budget, leases_expired, failed_to_deliver,
       last_decision_at > now() - interval '1 minute' AS recent
  FROM fs_tenants WHERE queue = 't_q';
SELECT tenant, state, holder_pid = pg_backend_pid() AS mine,
       expires_at - acquired_at AS lease
  FROM fs_leases WHERE queue = 't_q' ORDER BY lease_id;
BEGIN;
SELECT fs_release_slot(:l1);
SELECT state FROM fs_leases WHERE lease_id = :l1;
COMMIT;
SELECT count(*) AS leases FROM fs_leases WHERE queue = 't_q';

-- Server-wide figures.  An entry takes at most 256 bytes, 272 with the hash
-- table's element header; its bucket pointers add less than 24 more.
SELECT tenants > 0 AS has_tenants, max_tenants, tenant_entry_size <= 256 AS entry_small,
       tenant_bytes_per_entry <= 288 AS under_288_bytes, max_leases, queues > 0 AS has_queues,
       fail_open, evictions, start_kind
  FROM fs_stats;

-- fs_reset zeroes counters, keeps live state.
SELECT fs_reset();
SELECT slots_in_use, granted, denied_tenant_limit FROM fs_tenants WHERE queue = 't_q';
SELECT count(*) AS leases FROM fs_leases WHERE queue = 't_q';
SELECT stats_reset > now() - interval '1 minute' AS reset_recently FROM fs_stats;

-- Only fairshare_admin may reset; fairshare_app may look and decide; a role
-- of neither may do none of it (see the test "roles" for every function).
CREATE ROLE fs_telemetry_user;
SET ROLE fs_telemetry_user;
SELECT count(*) >= 0 AS can_read FROM fs_tenants;
SELECT fs_acquire_slot('t_b', 't_q') IS NOT NULL AS can_decide;
RESET ROLE;
GRANT fairshare_app TO fs_telemetry_user;
SET ROLE fs_telemetry_user;
SELECT count(*) >= 0 AS can_read FROM fs_tenants;
SELECT fs_acquire_slot('t_b', 't_q') IS NOT NULL AS can_decide;
SELECT fs_reset();
SELECT fs_set_limit('t_b', 't_q', max_slots => 5);
RESET ROLE;
GRANT fairshare_admin TO fs_telemetry_user;
SET ROLE fs_telemetry_user;
SELECT fs_reset();
SELECT fs_set_limit('t_b', 't_q', max_slots => 5);
RESET ROLE;
DROP ROLE fs_telemetry_user;

-- Catalog rules: every object of the extension has a comment, and every
-- function is marked PARALLEL UNSAFE or SAFE on purpose (decisions are unsafe).
SELECT pg_describe_object(classid, objid, 0) AS object_without_comment
  FROM pg_depend d
 WHERE d.refclassid = 'pg_extension'::regclass
   AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'fairshare')
   AND d.deptype = 'e'
   AND obj_description(objid, classid::regclass::name) IS NULL
 ORDER BY 1;
SELECT p.proname AS parallel_unsafe_expected
  FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.classid = 'pg_proc'::regclass
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'fairshare')
   AND d.deptype = 'e' AND p.prokind = 'f' AND p.provolatile <> 'i'
   AND p.proparallel <> 'u' AND p.prorettype <> 'trigger'::regtype
 ORDER BY 1;

-- Leave nothing behind.
SELECT fs_release_slot(lease_id) FROM fs_leases WHERE queue = 't_q' AND state = 'live';
TRUNCATE fs_limits;
