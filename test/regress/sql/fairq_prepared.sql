--
-- Fair dequeue in prepared transactions (PREPARE TRANSACTION, as Citus
-- prepares each node's part of a transaction that wrote on several): a
-- transaction that only enqueues may be prepared; its rows are counted when
-- COMMIT PREPARED commits it, not before, and never if ROLLBACK PREPARED
-- ends it.  One that claims, takes or finishes rows is refused.
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

-- Refused: a claim, a ready row taken by the application's own statement,
-- a registration.  Each is rolled back as any failed PREPARE.
BEGIN;
SELECT count(*) AS claimed FROM fs_claim('pq', NULL::pq_jobs, 1);
PREPARE TRANSACTION 'pq_refused';
BEGIN;
DELETE FROM pq_jobs WHERE id = (SELECT min(id) FROM pq_jobs WHERE tenant = 'a');
PREPARE TRANSACTION 'pq_refused';
BEGIN;
SELECT fs_unregister_queue('pqs');
PREPARE TRANSACTION 'pq_refused';
SELECT count(*) AS prepared FROM pg_prepared_xacts;
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
