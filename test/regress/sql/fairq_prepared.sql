--
-- Fair dequeue in prepared transactions (PREPARE TRANSACTION, as Citus
-- prepares each node's part of a transaction that wrote on several): a
-- transaction that only enqueues may be prepared; its rows are counted when
-- COMMIT PREPARED commits it, not before, and never if ROLLBACK PREPARED
-- ends it.  One that claims or takes rows is refused; one that finishes
-- jobs (a running row leaves) ends their claims when it commits.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS fairshare;
RESET client_min_messages;
CREATE TABLE pq_jobs (id bigserial PRIMARY KEY, tenant text NOT NULL,
                      state text NOT NULL DEFAULT 'ready', made text NOT NULL DEFAULT 'a');
SELECT queue FROM fs_register_queue('pq', 'pq_jobs', 'tenant', 'id', filter => $$state = 'ready'$$);
CREATE TABLE pq_sub (id bigserial PRIMARY KEY, tenant text NOT NULL, made text NOT NULL);
SELECT queue FROM fs_register_queue('pqs', 'pq_sub', 'tenant', 'id', subkey => 'made');
SELECT fs_set_limit('*', 'pq', max_slots => 100);
SELECT fs_set_limit('*', 'pqs', max_slots => 100);
CREATE VIEW pq_backlog AS
    SELECT queue, tenant, ready_rows FROM fs_tenants
     WHERE queue IN ('pq', 'pqs') AND ready_rows > 0 ORDER BY queue, tenant;

-- Enqueued in a prepared transaction: counted at COMMIT PREPARED.
INSERT INTO pq_jobs (tenant) VALUES ('a');
BEGIN;
INSERT INTO pq_jobs (tenant) SELECT 't' || (i % 3) FROM generate_series(1, 6) i;
INSERT INTO pq_jobs (tenant) VALUES ('a');
INSERT INTO pq_sub (tenant, made) VALUES ('s', 'x'), ('s', 'y'), ('s', 'y');
PREPARE TRANSACTION 'pq_enqueue';
SELECT * FROM pq_backlog;		-- not while prepared
BEGIN;
SELECT count(*) AS claimed FROM fs_claim('pq', NULL::pq_jobs, 10);
ROLLBACK;
COMMIT PREPARED 'pq_enqueue';
SELECT * FROM pq_backlog;
SELECT tenant, subkey, ready_rows FROM fs_fair_subkeys('pqs') ORDER BY 1, 2;

-- Claimed in fair order once committed: one of each tenant first.
BEGIN;
SELECT c.tenant FROM fs_claim('pq', NULL::pq_jobs, 4) c ORDER BY 1;
ROLLBACK;

-- Rolled back: nothing is counted.
BEGIN;
INSERT INTO pq_jobs (tenant) VALUES ('b'), ('b');
PREPARE TRANSACTION 'pq_enqueue';
ROLLBACK PREPARED 'pq_enqueue';
SELECT * FROM pq_backlog;

-- Rows made ready by an update, and rows updated in place, are prepared too.
INSERT INTO pq_jobs (tenant, state) VALUES ('c', 'scheduled'), ('c', 'scheduled');
BEGIN;
UPDATE pq_jobs SET state = 'ready' WHERE tenant = 'c';
UPDATE pq_jobs SET made = 'b' WHERE tenant = 'a';
PREPARE TRANSACTION 'pq_ready';
COMMIT PREPARED 'pq_ready';
SELECT * FROM pq_backlog;

-- The counts are the table's: a recount changes nothing.
SELECT * FROM fs_resync('pq');
SELECT * FROM pq_backlog;

-- Refused: a claim, a ready row taken by the application's own statement.
-- Each is rolled back as any failed PREPARE.
BEGIN;
SELECT count(*) AS claimed FROM fs_claim('pq', NULL::pq_jobs, 1);
PREPARE TRANSACTION 'pq_refused';
BEGIN;
DELETE FROM pq_jobs WHERE id = (SELECT min(id) FROM pq_jobs WHERE tenant = 'a');
PREPARE TRANSACTION 'pq_refused';
SELECT count(*) AS prepared FROM pg_prepared_xacts;
SELECT * FROM pq_backlog;

-- A registration changed in a prepared transaction (as a DROP TABLE of a
-- distributed queue's table is, on each Citus node): nothing changes until
-- it commits, and a rollback leaves the queue as it was.
BEGIN;
SELECT fs_unregister_queue('pqs');
PREPARE TRANSACTION 'pq_unregister';
SELECT count(*) AS still_registered FROM fs_fair_queues WHERE queue = 'pqs';
ROLLBACK PREPARED 'pq_unregister';
SELECT count(*) AS registered FROM fs_fair_queues WHERE queue = 'pqs';
SELECT * FROM pq_backlog;

-- More than 64 tenants cannot be kept: refused, nothing counted.
BEGIN;
INSERT INTO pq_jobs (tenant) SELECT 'many' || i FROM generate_series(1, 65) i;
PREPARE TRANSACTION 'pq_refused';
SELECT count(*) AS counted FROM fs_tenants WHERE queue = 'pq' AND tenant LIKE 'many%' AND ready_rows > 0;

-- A limit changed in the same prepared transaction applies when it commits.
BEGIN;
SELECT fs_set_limit('a', 'pq', max_slots => 7);
INSERT INTO pq_jobs (tenant) VALUES ('a');
PREPARE TRANSACTION 'pq_both';
SELECT max_slots FROM fs_tenants WHERE queue = 'pq' AND tenant = 'a';
COMMIT PREPARED 'pq_both';
SELECT fs_release_slot(fs_acquire_slot('a', 'pq')) AS decided;
SELECT max_slots, ready_rows FROM fs_tenants WHERE queue = 'pq' AND tenant = 'a';

-- Ready rows updated in place alone change no count: no recount follows.
SELECT resyncs AS resyncs_before FROM fs_fairness WHERE queue = 'pq' \gset
BEGIN;
UPDATE pq_jobs SET made = 'c' WHERE tenant = 'a';
PREPARE TRANSACTION 'pq_in_place';
COMMIT PREPARED 'pq_in_place';
BEGIN;
SELECT count(*) > 0 AS claimed FROM fs_claim('pq', NULL::pq_jobs, 1);
ROLLBACK;
SELECT resyncs - :resyncs_before AS recounts FROM fs_fairness WHERE queue = 'pq';

-- COMMIT PREPARED of a transaction that is not prepared, or twice: the
-- error is PostgreSQL's, and nothing is counted twice.
COMMIT PREPARED 'pq_none';
SELECT sum(ready_rows) = (SELECT count(*) FROM pq_jobs WHERE state = 'ready') AS counts_match
  FROM fs_tenants WHERE queue = 'pq';

-- A job finished in a prepared transaction (its running row deleted, as
-- Citus prepares each node's part of a transaction that deletes running
-- rows on several): its lease is releasing while prepared, freed and its
-- run time charged at COMMIT PREPARED, live again after ROLLBACK PREPARED
-- (and released by the next finish).
CREATE TABLE pq_ready (id bigint PRIMARY KEY, tenant text NOT NULL);
CREATE TABLE pq_running (id bigint PRIMARY KEY, tenant text NOT NULL);
SELECT queue FROM fs_register_queue('pqr', 'pq_ready', 'tenant', 'id', running_table => 'pq_running',
                                    running_key => 'id', charge_runtime => true);
SELECT fs_set_limit('*', 'pqr', max_slots => 2);
INSERT INTO pq_ready SELECT i, 'r' FROM generate_series(1, 4) i;
BEGIN;
CREATE TEMP TABLE pq_claimed ON COMMIT DROP AS
    SELECT (c.job).id FROM fs_claim('pqr', NULL::pq_ready, 4) c;
SELECT count(*) AS claimed FROM pq_claimed;
INSERT INTO pq_running SELECT id, 'r' FROM pq_claimed;
DELETE FROM pq_ready WHERE id IN (SELECT id FROM pq_claimed);
COMMIT;
SELECT state, count(*) FROM fs_leases WHERE queue = 'pqr' GROUP BY 1;
SELECT rows_released AS released_before FROM fs_fairness WHERE queue = 'pqr' \gset
BEGIN;
DELETE FROM pq_running WHERE id = (SELECT min(id) FROM pq_running);
PREPARE TRANSACTION 'pq_finish';
SELECT state, count(*) FROM fs_leases WHERE queue = 'pqr' GROUP BY 1 ORDER BY 1;
BEGIN;
SELECT count(*) AS claimed_meanwhile FROM fs_claim('pqr', NULL::pq_ready, 1);
ROLLBACK;
ROLLBACK PREPARED 'pq_finish';
SELECT state, count(*) FROM fs_leases WHERE queue = 'pqr' GROUP BY 1;
BEGIN;
DELETE FROM pq_running WHERE id = (SELECT min(id) FROM pq_running);
PREPARE TRANSACTION 'pq_finish';
COMMIT PREPARED 'pq_finish';
SELECT state, count(*) FROM fs_leases WHERE queue = 'pqr' GROUP BY 1;
SELECT rows_released - :released_before AS released FROM fs_fairness WHERE queue = 'pqr';
-- The other job finishes in an ordinary transaction: its lease goes too.
DELETE FROM pq_running;
SELECT count(*) AS leases FROM fs_leases WHERE queue = 'pqr';
SELECT rows_released - :released_before AS released FROM fs_fairness WHERE queue = 'pqr';
BEGIN;
SELECT count(*) AS claimed FROM fs_claim('pqr', NULL::pq_ready, 4);
ROLLBACK;
SELECT count(*) AS prepared FROM pg_prepared_xacts;

-- Unregistered in a prepared transaction, then committed: gone, with its
-- counts.
BEGIN;
SELECT fs_unregister_queue('pqs');
PREPARE TRANSACTION 'pq_unregister';
COMMIT PREPARED 'pq_unregister';
SELECT count(*) AS registered FROM fs_fair_queues WHERE queue = 'pqs';
SELECT * FROM pq_backlog WHERE queue = 'pqs';
SELECT count(*) AS prepared FROM pg_prepared_xacts;
