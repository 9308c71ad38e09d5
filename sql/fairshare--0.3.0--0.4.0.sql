/* fairshare 0.3.0 -> 0.4.0: fair per-tenant dequeue */

\echo Use "ALTER EXTENSION fairshare UPDATE TO '0.4.0'" to load this file. \quit

-- ---------------------------------------------------------------------------
-- Registrations
-- ---------------------------------------------------------------------------

CREATE TABLE fs_fair_queues (
    queue          text PRIMARY KEY,
    ready_table    regclass NOT NULL,
    tenant         text NOT NULL,
    order_by       text NOT NULL,
    ready_filter   text,
    claim_filter   text,
    key            text NOT NULL,
    key_type       regtype NOT NULL,
    running_table  regclass,
    running_filter text,
    running_key    text,
    cost           text,
    enqueued_at    text,
    charge_runtime boolean NOT NULL DEFAULT false,
    ready_index    regclass,
    index_created  boolean NOT NULL DEFAULT false,
    registered_by  regrole NOT NULL,
    registered_at  timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE fs_fair_queues IS
'Queues registered for fair dequeue, one row per queue, written by fs_register_queue().  SQL is stored in canonical form: names outside pg_catalog schema-qualified.';
COMMENT ON COLUMN fs_fair_queues.queue IS 'the fairshare queue: its limits, slots and fair order';
COMMENT ON COLUMN fs_fair_queues.ready_table IS 'the table whose rows are the jobs to claim';
COMMENT ON COLUMN fs_fair_queues.tenant IS 'expression over a ready row giving its tenant (text)';
COMMENT ON COLUMN fs_fair_queues.order_by IS 'order of a tenant''s rows (ORDER BY list)';
COMMENT ON COLUMN fs_fair_queues.ready_filter IS 'the filter''s conjuncts that depend on the row alone: the backlog the triggers count, and the index predicate; NULL: every row';
COMMENT ON COLUMN fs_fair_queues.claim_filter IS 'the filter''s other conjuncts (such as scheduled_at <= now()), checked when claiming only';
COMMENT ON COLUMN fs_fair_queues.key IS 'expression identifying a ready row (by default its primary key)';
COMMENT ON COLUMN fs_fair_queues.key_type IS 'type of key and running_key';
COMMENT ON COLUMN fs_fair_queues.running_table IS 'table whose rows mark a claimed job as running: when the row leaves it, the lease is released; NULL: no automatic release';
COMMENT ON COLUMN fs_fair_queues.running_filter IS 'which rows of running_table are running (NULL: every row)';
COMMENT ON COLUMN fs_fair_queues.running_key IS 'expression over a running row giving the same value as key';
COMMENT ON COLUMN fs_fair_queues.cost IS 'expression giving a row''s cost in the fair order; NULL: 1 per row';
COMMENT ON COLUMN fs_fair_queues.charge_runtime IS 'charge the lease''s held time (ms) when the row leaves running_table';
COMMENT ON COLUMN fs_fair_queues.ready_index IS 'the index that serves claims (NULL: none was found or made)';
COMMENT ON COLUMN fs_fair_queues.enqueued_at IS 'expression over a ready row giving when it became ready (timestamptz): the queue''s latency, for backpressure, is the age of its oldest ready row; NULL: not measured';
COMMENT ON COLUMN fs_fair_queues.index_created IS 'fs_register_queue() created ready_index, and fs_unregister_queue() drops it';
COMMENT ON COLUMN fs_fair_queues.registered_by IS 'role that registered the queue';
COMMENT ON COLUMN fs_fair_queues.registered_at IS 'when the queue was last registered';

GRANT SELECT ON fs_fair_queues TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('fs_fair_queues', '');

CREATE FUNCTION fs_fair_queues_changed() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'fs_fair_queues_changed';
COMMENT ON FUNCTION fs_fair_queues_changed() IS
'trigger: makes every session reload fair-dequeue registrations when the changing transaction commits';

CREATE TRIGGER fs_fair_queues_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON fs_fair_queues
    FOR EACH STATEMENT EXECUTE FUNCTION fs_fair_queues_changed();

-- ---------------------------------------------------------------------------
-- Triggers fairshare puts on registered tables
-- ---------------------------------------------------------------------------

CREATE FUNCTION fs_fair_ready_trigger() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'fs_fair_ready_trigger';
COMMENT ON FUNCTION fs_fair_ready_trigger() IS
'trigger on a registered ready table: counts ready rows per tenant, applied at commit';

CREATE FUNCTION fs_fair_running_trigger() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'fs_fair_running_trigger';
COMMENT ON FUNCTION fs_fair_running_trigger() IS
'trigger on a registered running table: releases the lease of a claimed row that stops running';

CREATE FUNCTION fs_fair_truncate_trigger() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'fs_fair_truncate_trigger';
COMMENT ON FUNCTION fs_fair_truncate_trigger() IS
'trigger on TRUNCATE of a registered table: recounts the ready table, or releases the running table''s leases';

-- ---------------------------------------------------------------------------
-- Registration
-- ---------------------------------------------------------------------------

CREATE FUNCTION fs_register_queue(
    queue          text,
    ready_table    regclass,
    tenant         text,
    order_by       text,
    filter         text DEFAULT NULL,
    key            text DEFAULT NULL,
    running_table  regclass DEFAULT NULL,
    running_filter text DEFAULT NULL,
    running_key    text DEFAULT NULL,
    cost           text DEFAULT NULL,
    charge_runtime boolean DEFAULT false,
    create_index   boolean DEFAULT true,
    enqueued_at    text DEFAULT NULL)
RETURNS fs_fair_queues
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_register_queue';
COMMENT ON FUNCTION fs_register_queue(text, regclass, text, text, text, text, regclass, text, text, text, boolean, boolean, text) IS
'registers (or re-registers) a ready table for fair dequeue: validates the SQL, adds triggers and, if none serves, an index; the caller must own the tables';
REVOKE ALL ON FUNCTION fs_register_queue(text, regclass, text, text, text, text, regclass, text, text, text, boolean, boolean, text) FROM PUBLIC;

CREATE FUNCTION fs_unregister_queue(queue text)
RETURNS boolean
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_unregister_queue';
COMMENT ON FUNCTION fs_unregister_queue(text) IS
'removes a queue''s registration, its triggers and the index it created: true if it was registered';
REVOKE ALL ON FUNCTION fs_unregister_queue(text) FROM PUBLIC;

-- ---------------------------------------------------------------------------
-- Claiming
-- ---------------------------------------------------------------------------

CREATE FUNCTION fs_claim(
    queue    text,
    row_type anyelement,
    max_rows integer DEFAULT 1,
    lease    interval DEFAULT '5 minutes')
RETURNS TABLE (lease_id bigint, tenant text, job anyelement)
LANGUAGE c VOLATILE PARALLEL UNSAFE ROWS 10
AS 'MODULE_PATHNAME', 'fs_claim';
COMMENT ON FUNCTION fs_claim(text, anyelement, integer, interval) IS
'claims up to max_rows ready rows of a registered queue in fair order, locked FOR UPDATE SKIP LOCKED in this transaction, each with a lease; pass NULL::<ready table> as row_type';

CREATE FUNCTION fs_ready_tenants(
    queue       text,
    max_tenants integer DEFAULT 100)
RETURNS TABLE (tenant text, ready_rows bigint, free_slots integer,
               virtual_start double precision, weight double precision)
LANGUAGE c VOLATILE PARALLEL UNSAFE ROWS 100
AS 'MODULE_PATHNAME', 'fs_ready_tenants';
COMMENT ON FUNCTION fs_ready_tenants(text, integer) IS
'tenants of a registered queue with ready rows and free slots, in fair order: for an application''s own LATERAL ... FOR UPDATE SKIP LOCKED claim';

CREATE FUNCTION fs_resync(queue text DEFAULT NULL)
RETURNS TABLE (queue_name text, tenants integer, ready_rows bigint)
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_resync';
COMMENT ON FUNCTION fs_resync(text) IS
'recounts the ready rows of a registered queue (NULL: every registered queue of this database) from its table';
REVOKE ALL ON FUNCTION fs_resync(text) FROM PUBLIC;

-- ---------------------------------------------------------------------------
-- Fairness metrics
-- ---------------------------------------------------------------------------

CREATE FUNCTION fs_fairness_state(
    OUT queue text,
    OUT backlogged_tenants integer,
    OUT ready_rows bigint,
    OUT rows_without_tenant bigint,
    OUT rows_untracked bigint,
    OUT active_tenants integer,
    OUT jain_index double precision,
    OUT gini double precision,
    OUT served double precision,
    OUT virtual_time double precision,
    OUT claims bigint,
    OUT rows_claimed bigint,
    OUT rows_released bigint,
    OUT short_probes bigint,
    OUT fail_open bigint,
    OUT failed_to_deliver bigint,
    OUT resyncs bigint,
    OUT last_resync_at timestamptz)
RETURNS SETOF record
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_fairness_state';
COMMENT ON FUNCTION fs_fairness_state() IS
'fairness of every registered queue of this database; see the fs_fairness view';

CREATE VIEW fs_fairness AS SELECT * FROM fs_fairness_state();
GRANT SELECT ON fs_fairness TO PUBLIC;
COMMENT ON VIEW fs_fairness IS
'per registered queue: backlogged tenants, ready rows (rows_without_tenant: never claimed; rows_untracked: tenants shared memory has no room for, claimed without fair order), Jain''s index and Gini of served work per weight over active tenants (served work decays with fairshare.fairness_half_life), claims and counters';

CREATE FUNCTION fs_fair_share_state(
    OUT queue text,
    OUT tenant text,
    OUT weight double precision,
    OUT min_slots integer,
    OUT slots_in_use integer,
    OUT ready_rows bigint,
    OUT served double precision,
    OUT share double precision,
    OUT fair_share double precision,
    OUT share_ratio double precision,
    OUT virtual_finish double precision,
    OUT lag double precision)
RETURNS SETOF record
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_fair_share_state';
COMMENT ON FUNCTION fs_fair_share_state() IS
'each tenant''s share of served work against its weight; see the fs_fair_shares view';

CREATE VIEW fs_fair_shares AS SELECT * FROM fs_fair_share_state();
GRANT SELECT ON fs_fair_shares TO PUBLIC;
COMMENT ON VIEW fs_fair_shares IS
'per tenant of a registered queue that is active or was served recently: served work (decayed), its share, its fair share by weight, their ratio, and its virtual finish tag and lag behind the queue''s virtual time';
