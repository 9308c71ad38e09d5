--
-- fs_acquire_slot(), fs_release_slot(), fs_renew_slot(): limits, leases,
-- expiry, transactions, and every error.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS fairshare;
RESET client_min_messages;

-- Default max_slots is 1: the second acquire is denied (NULL).
SELECT fs_acquire_slot('s_a', 's_q') AS lease1 \gset
SELECT :lease1 > 0 AS got_lease;
SELECT fs_acquire_slot('s_a', 's_q') IS NULL AS denied;
-- Queues are independent; so are tenants.
SELECT fs_acquire_slot('s_a', 's_q2') IS NOT NULL AS other_queue;
SELECT fs_acquire_slot('s_b', 's_q') IS NOT NULL AS other_tenant;
-- The default queue is 'default' and the default lease 5 minutes.
SELECT fs_acquire_slot('s_a') AS lease_default \gset
SELECT queue, expires_at - acquired_at AS lease FROM fs_leases WHERE lease_id = :lease_default;
SELECT fs_release_slot(:lease_default);

-- Release: true once, then false; never below zero.
SELECT fs_release_slot(:lease1) AS released;
SELECT fs_release_slot(:lease1) AS released_again;
SELECT fs_release_slot(1) AS unknown;
SELECT slots_in_use FROM fs_tenants WHERE queue = 's_q' AND tenant = 's_a';

-- max_slots honoured; 0 stops a tenant.
SELECT fs_set_limit('s_c', 's_q', max_slots => 3);
SELECT count(fs_acquire_slot('s_c', 's_q')) AS granted_of_5 FROM generate_series(1, 5);
SELECT slots_in_use, denied_tenant_limit FROM fs_tenants WHERE queue = 's_q' AND tenant = 's_c';
SELECT fs_set_limit('s_d', 's_q', max_slots => 0);
SELECT fs_acquire_slot('s_d', 's_q') IS NULL AS stopped;

-- Renew: true while live; expiry frees the slot with no release (injected clock).
SELECT set_config('fairshare.debug_clock', '1893456000', false) IS NOT NULL AS clock_set; -- 2030-01-01
SELECT fs_acquire_slot('s_e', 's_q', '1 minute') AS lease_e \gset
SELECT fs_renew_slot(:lease_e, '2 minutes') AS renewed;
SELECT expires_at - acquired_at AS lease FROM fs_leases WHERE lease_id = :lease_e;
SELECT set_config('fairshare.debug_clock', '1893456100', false) IS NOT NULL AS plus_100s;
SELECT fs_acquire_slot('s_e', 's_q') IS NULL AS still_held;
SELECT set_config('fairshare.debug_clock', '1893456121', false) IS NOT NULL AS plus_121s;
SELECT fs_renew_slot(:lease_e) AS renew_after_expiry;
SELECT fs_release_slot(:lease_e) AS release_after_expiry;
SELECT slots_in_use, leases_expired FROM fs_tenants WHERE queue = 's_q' AND tenant = 's_e';
-- An expired lease is freed by the next acquire that needs its slot.
SELECT fs_acquire_slot('s_e', 's_q', '1 minute') AS lease_e2 \gset
SELECT set_config('fairshare.debug_clock', '1893456200', false) IS NOT NULL AS plus_200s;
SELECT fs_acquire_slot('s_e', 's_q', '1 minute') AS lease_e3 \gset
SELECT :lease_e3 IS NOT NULL AS slot_reused, :lease_e2 <> :lease_e3 AS new_id;
SELECT slots_in_use, leases_expired FROM fs_tenants WHERE queue = 's_q' AND tenant = 's_e';
SELECT fs_release_slot(:lease_e3);
RESET fairshare.debug_clock;

-- A lease taken in a transaction that rolls back is returned.
BEGIN;
SELECT fs_acquire_slot('s_f', 's_q') IS NOT NULL AS taken;
SELECT slots_in_use FROM fs_tenants WHERE queue = 's_q' AND tenant = 's_f';
ROLLBACK;
SELECT slots_in_use FROM fs_tenants WHERE queue = 's_q' AND tenant = 's_f';
-- ... and one taken in a subtransaction rolled back to its savepoint.
BEGIN;
SELECT fs_acquire_slot('s_f', 's_q') AS lease_f \gset
SAVEPOINT sp;
SELECT fs_acquire_slot('s_g', 's_q') IS NOT NULL AS taken_in_savepoint;
ROLLBACK TO SAVEPOINT sp;
COMMIT;
SELECT tenant, slots_in_use FROM fs_tenants WHERE queue = 's_q' AND tenant IN ('s_f', 's_g') ORDER BY 1;

-- A release inside a transaction takes effect at commit; rollback undoes it.
BEGIN;
SELECT fs_release_slot(:lease_f) AS released;
SELECT state FROM fs_leases WHERE lease_id = :lease_f;
SELECT fs_release_slot(:lease_f) AS released_twice;
SELECT fs_renew_slot(:lease_f) AS renew_while_releasing;
ROLLBACK;
SELECT state FROM fs_leases WHERE lease_id = :lease_f;
SELECT slots_in_use FROM fs_tenants WHERE queue = 's_q' AND tenant = 's_f';
-- Finish one and start the next in one transaction: the slot is handed over.
BEGIN;
SELECT fs_release_slot(:lease_f) AS released;
SELECT fs_acquire_slot('s_f', 's_q') AS lease_f2 \gset
SELECT :lease_f2 IS NOT NULL AS next_granted;
SELECT slots_in_use FROM fs_tenants WHERE queue = 's_q' AND tenant = 's_f';
COMMIT;
SELECT slots_in_use FROM fs_tenants WHERE queue = 's_q' AND tenant = 's_f';
SELECT count(*) AS leases_of_s_f FROM fs_leases WHERE queue = 's_q' AND tenant = 's_f';
-- Handed over, then rolled back: the old lease is live again, the new one gone.
BEGIN;
SELECT fs_release_slot(:lease_f2) AS released;
SELECT fs_acquire_slot('s_f', 's_q') IS NOT NULL AS next_granted;
ROLLBACK;
SELECT lease_id = :lease_f2 AS old_lease_back, state FROM fs_leases WHERE queue = 's_q' AND tenant = 's_f';
SELECT slots_in_use FROM fs_tenants WHERE queue = 's_q' AND tenant = 's_f';
-- A handed-over lease that expires (or is released) before the transaction
-- ends gives back its own slot; the released one is still counted after a
-- rollback, and freed after a commit.  Counts stay exact either way.
SELECT fs_set_limit('s_k', 's_q', max_slots => 1);
SELECT set_config('fairshare.debug_clock', '1893456000', false) IS NOT NULL AS clock_set;
SELECT fs_acquire_slot('s_k', 's_q', '1 hour') AS lease_k \gset
BEGIN;
SELECT fs_release_slot(:lease_k) AS released;
SELECT fs_acquire_slot('s_k', 's_q', '1 second') AS lease_k2 \gset
SELECT slots_in_use FROM fs_tenants WHERE queue = 's_q' AND tenant = 's_k';
SELECT set_config('fairshare.debug_clock', '1893456002', false) IS NOT NULL AS plus_2s;
SELECT fs_release_slot(:lease_k2) AS expired_one_released;
ROLLBACK;
SELECT state, slots_in_use FROM fs_leases JOIN fs_tenants USING (queue, tenant)
 WHERE queue = 's_q' AND tenant = 's_k';
SELECT fs_acquire_slot('s_k', 's_q') IS NULL AS still_at_the_limit;
BEGIN;
SELECT fs_release_slot(:lease_k) AS released;
SAVEPOINT sp;
SELECT fs_acquire_slot('s_k', 's_q', '1 second') IS NOT NULL AS taken_over;
SELECT set_config('fairshare.debug_clock', '1893456004', false) IS NOT NULL AS plus_4s;
SELECT fs_renew_slot(lease_id) AS renewed_expired FROM fs_leases WHERE queue = 's_q' AND tenant = 's_k' AND state = 'live';
ROLLBACK TO SAVEPOINT sp;
COMMIT;
SELECT count(*) AS leases, (SELECT slots_in_use FROM fs_tenants WHERE queue = 's_q' AND tenant = 's_k') AS slots_in_use
  FROM fs_leases WHERE queue = 's_q' AND tenant = 's_k';
RESET fairshare.debug_clock;

-- Acquired and released in the same transaction: freed at once.
BEGIN;
SELECT fs_release_slot(fs_acquire_slot('s_h', 's_q')) AS released;
SELECT slots_in_use FROM fs_tenants WHERE queue = 's_q' AND tenant = 's_h';
SELECT count(*) FILTER (WHERE fs_release_slot(fs_acquire_slot('s_h', 's_q'))) AS pairs
  FROM generate_series(1, 1000);
COMMIT;
SELECT slots_in_use, granted FROM fs_tenants WHERE queue = 's_q' AND tenant = 's_h';
SELECT fs_release_slot(:lease_f2);

-- Prepared transactions (as Citus prepares each node's part of a transaction
-- that wrote on several): a slot taken holds while prepared, and is kept by
-- COMMIT PREPARED, returned by ROLLBACK PREPARED.
SELECT fs_set_limit('s_i', 's_pq', max_slots => 2);
BEGIN;
SELECT fs_acquire_slot('s_i', 's_pq') AS lease_p1 \gset
PREPARE TRANSACTION 'fs_slots';
SELECT slots_in_use, (SELECT state FROM fs_leases WHERE lease_id = :lease_p1)
  FROM fs_tenants WHERE queue = 's_pq' AND tenant = 's_i';
ROLLBACK PREPARED 'fs_slots';
SELECT slots_in_use, (SELECT count(*) FROM fs_leases WHERE lease_id = :lease_p1) AS leases
  FROM fs_tenants WHERE queue = 's_pq' AND tenant = 's_i';
BEGIN;
SELECT fs_acquire_slot('s_i', 's_pq') AS lease_p2 \gset
PREPARE TRANSACTION 'fs_slots';
COMMIT PREPARED 'fs_slots';
SELECT slots_in_use, (SELECT state FROM fs_leases WHERE lease_id = :lease_p2)
  FROM fs_tenants WHERE queue = 's_pq' AND tenant = 's_i';
-- A slot released in a prepared transaction stays counted (and cannot be
-- released or renewed again) until it ends: ROLLBACK PREPARED makes the lease
-- live again, COMMIT PREPARED frees it.
BEGIN;
SELECT fs_release_slot(:lease_p2) AS released;
PREPARE TRANSACTION 'fs_slots';
SELECT slots_in_use, (SELECT state FROM fs_leases WHERE lease_id = :lease_p2)
  FROM fs_tenants WHERE queue = 's_pq' AND tenant = 's_i';
SELECT fs_release_slot(:lease_p2) AS released_twice, fs_renew_slot(:lease_p2) AS renewed;
ROLLBACK PREPARED 'fs_slots';
SELECT slots_in_use, (SELECT state FROM fs_leases WHERE lease_id = :lease_p2)
  FROM fs_tenants WHERE queue = 's_pq' AND tenant = 's_i';
-- "Finish one, take the next" in one prepared transaction: at the limit, the
-- new lease takes over the slot being released; both count until the end.
SELECT fs_acquire_slot('s_i', 's_pq') AS lease_p3 \gset
BEGIN;
SELECT fs_release_slot(:lease_p2) AS released;
SELECT fs_acquire_slot('s_i', 's_pq') AS lease_p4 \gset
SELECT :lease_p4 > 0 AS taken_over;
PREPARE TRANSACTION 'fs_slots';
SELECT slots_in_use FROM fs_tenants WHERE queue = 's_pq' AND tenant = 's_i';
COMMIT PREPARED 'fs_slots';
SELECT slots_in_use, string_agg(state, ',' ORDER BY lease_id) AS states,
       bool_and(lease_id IN (:lease_p3, :lease_p4)) AS kept
  FROM fs_tenants JOIN fs_leases USING (queue, tenant)
 WHERE queue = 's_pq' AND tenant = 's_i' GROUP BY slots_in_use;
-- A PREPARE that fails after its leases were parked (the name is taken)
-- returns them once, as any abort does.
SELECT fs_release_slot(:lease_p3) AND fs_release_slot(:lease_p4) AS released;
CREATE TABLE s_holder (x int);
BEGIN;
INSERT INTO s_holder VALUES (1);
PREPARE TRANSACTION 's_taken';
BEGIN;
SELECT fs_acquire_slot('s_i', 's_pq') AS lease_p5 \gset
PREPARE TRANSACTION 's_taken';
SELECT slots_in_use, (SELECT count(*) FROM fs_leases WHERE lease_id = :lease_p5) AS leases
  FROM fs_tenants WHERE queue = 's_pq' AND tenant = 's_i';
ROLLBACK PREPARED 's_taken';
DROP TABLE s_holder;
-- More than 64 leases in one prepared transaction cannot be kept: the
-- PREPARE fails, and its slots are returned as by any abort.
SELECT fs_set_limit('s_many', 's_pq', max_slots => 100);
BEGIN;
SELECT count(fs_acquire_slot('s_many', 's_pq')) FROM generate_series(1, 65);
PREPARE TRANSACTION 'fs_slots';
SELECT count(*) AS prepared FROM pg_prepared_xacts;
SELECT slots_in_use FROM fs_tenants WHERE queue = 's_pq' AND tenant = 's_many';
-- The 64 are leases and token balances together: 40 slots and 25 tenants'
-- tokens are refused, and both are given back.
SELECT fs_set_limit('*', 's_pq', budget_ms_per_minute => 1000);
BEGIN;
SELECT count(fs_acquire_slot('s_many', 's_pq')) FROM generate_series(1, 40);
SELECT sum(fs_spend_tokens('s_tok' || i, 1, 100, 's_pq')) FROM generate_series(1, 25) i;
PREPARE TRANSACTION 'fs_slots';
SELECT count(*) AS prepared FROM pg_prepared_xacts;
SELECT sum(slots_in_use) AS slots,
       count(*) FILTER (WHERE tenant LIKE 's_tok%' AND token_balance < 1000) AS still_spent
  FROM fs_tenants WHERE queue = 's_pq' AND (tenant = 's_many' OR tenant LIKE 's_tok%');
DELETE FROM fs_limits WHERE queue = 's_pq';

-- Errors: each says what is wrong and what to do; nothing is taken.
\set VERBOSITY default
SELECT fs_acquire_slot(NULL);
SELECT fs_acquire_slot('');
SELECT fs_acquire_slot(repeat('x', 10240));
SELECT fs_acquire_slot('*');
SELECT fs_acquire_slot('s_j', NULL);
SELECT fs_acquire_slot('s_j', '');
SELECT fs_acquire_slot('s_j', repeat('q', 64));
SELECT fs_acquire_slot('s_j', 's_q', NULL);
SELECT fs_acquire_slot('s_j', 's_q', '0 seconds');
SELECT fs_acquire_slot('s_j', 's_q', '-1 minute');
SELECT fs_acquire_slot('s_j', 's_q', '1 month -31 days');
SELECT fs_acquire_slot('s_j', 's_q', '367 days');
SELECT fs_release_slot(NULL) IS NULL AS null_in_null_out;
-- A denied acquire gives NULL; releasing it is harmless.
SELECT fs_acquire_slot('s_null', 's_qn') IS NOT NULL AS first;
SELECT fs_release_slot(fs_acquire_slot('s_null', 's_qn')) IS NULL AS denied_then_released;
SELECT fs_renew_slot(NULL) IS NULL AS null_in_null_out;
SELECT fs_renew_slot(1, NULL);
SELECT fs_renew_slot(1, '-5 seconds');
SELECT count(*) AS entries_for_bad_input FROM fs_tenants WHERE tenant = 's_j';
-- The longest name is fine.
SELECT fs_release_slot(fs_acquire_slot(repeat('x', 63), repeat('q', 63))) AS longest_name;

-- Leave nothing behind.
SELECT fs_release_slot(lease_id) FROM fs_leases WHERE queue LIKE 's\_q%' AND state = 'live' ORDER BY 1;
SELECT sum(slots_in_use) AS slots_left FROM fs_tenants WHERE queue LIKE 's\_q%';
TRUNCATE fs_limits;
