/* fairshare 0.4.0 -> 0.5.0 */

\echo Use "ALTER EXTENSION fairshare UPDATE TO '0.5.0'" to load this file. \quit

-- ---------------------------------------------------------------------------
-- Fair dequeue: unique keys, the registrant's queue names, fs_ready_tenants()
-- and row-level security (the rules are in the C code; only comments change)
-- ---------------------------------------------------------------------------

COMMENT ON COLUMN fs_fair_queues.key IS 'expression identifying a ready row: a NOT NULL column or expression with a unique index on exactly it (by default the primary key)';
COMMENT ON COLUMN fs_fair_queues.registered_by IS 'role that registered the queue: once its ready table is dropped, only this role (or a role with its privileges) may register the name again or unregister it';
COMMENT ON FUNCTION fs_register_queue(text, regclass, text, text, text, text, regclass, text, text, text, boolean, boolean, text) IS
'registers (or re-registers) a ready table for fair dequeue: validates the SQL (the key must have a unique index and never be NULL), adds triggers and, if none serves, an index; max_slots is the queue''s default for tenants without one in fs_limits (NULL: no limit), lease the default lease of its claims (NULL: 5 minutes); the caller must own the tables (and, for a queue whose table was dropped, be the role that registered it)';
COMMENT ON FUNCTION fs_unregister_queue(text) IS
'removes a queue''s registration, its triggers and the index it created: true if it was registered; the caller must own its table, or, if the table was dropped, be the role that registered it';
COMMENT ON FUNCTION fs_ready_tenants(text, integer) IS
'tenants of a registered queue with ready rows and free slots, in fair order: for an application''s own LATERAL ... FOR UPDATE SKIP LOCKED claim; needs SELECT on the table and a role row-level security does not restrict on it';

-- ===========================================================================
-- Least privilege by default: the roles fairshare_app, fairshare_worker and
-- fairshare_admin; PUBLIC may no longer decide or configure; leases record
-- their owner (fs_leases.owner).
-- ===========================================================================

-- The roles, created when missing (as in a fresh install).
DO $$
DECLARE
    fs_role record;
BEGIN
    FOR fs_role IN SELECT * FROM (VALUES
        ('fairshare_app', 'fairshare: members may decide: take slots and renew or release their own leases, spend and charge tokens, claim fairly, route enqueues, and read the monitoring views'),
        ('fairshare_worker', 'fairshare: members may report worker heartbeats and queue latency (the global gate and backpressure), and read the monitoring views'),
        ('fairshare_admin', 'fairshare: members configure limits and queues, reset counters, save the state file, release or renew any lease, see every role''s schedules and runs and may delete schedules; a member of fairshare_app and fairshare_worker'))
        AS roles(name, comment)
    LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles
                        WHERE rolname OPERATOR(pg_catalog.=) fs_role.name::pg_catalog.name) THEN
            BEGIN
                EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', fs_role.name);
                EXECUTE pg_catalog.format('COMMENT ON ROLE %I IS %L', fs_role.name, fs_role.comment);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;
            END;
        END IF;
    END LOOP;
    -- fairshare_admin as versions before 0.5.0 described it: bring that
    -- comment up to date (a comment of the administrator's own is kept).
    IF pg_catalog.shobj_description((SELECT r.oid FROM pg_catalog.pg_roles r
                                      WHERE r.rolname OPERATOR(pg_catalog.=) 'fairshare_admin'::pg_catalog.name),
                                    'pg_authid'::pg_catalog.name) OPERATOR(pg_catalog.=)
       'fairshare: members see every role''s schedules and runs, and may delete schedules'::pg_catalog.text THEN
        COMMENT ON ROLE fairshare_admin IS
        'fairshare: members configure limits and queues, reset counters, save the state file, release or renew any lease, see every role''s schedules and runs and may delete schedules; a member of fairshare_app and fairshare_worker';
    END IF;
    IF NOT pg_catalog.pg_has_role('fairshare_admin'::pg_catalog.name, 'fairshare_app'::pg_catalog.name,
                                  'MEMBER'::pg_catalog.text) THEN
        GRANT fairshare_app TO fairshare_admin;
    END IF;
    IF NOT pg_catalog.pg_has_role('fairshare_admin'::pg_catalog.name, 'fairshare_worker'::pg_catalog.name,
                                  'MEMBER'::pg_catalog.text) THEN
        GRANT fairshare_worker TO fairshare_admin;
    END IF;
END
$$;

-- fairshare_admin changes the limits.
GRANT INSERT, UPDATE, DELETE, TRUNCATE ON fs_limits TO fairshare_admin;

-- fs_set_limit in PL/pgSQL (Citus crashes planning the SQL function's write
-- to fs_limits as a reference table).
CREATE OR REPLACE FUNCTION fs_set_limit(
    tenant               text,
    queue                text DEFAULT 'default',
    max_slots            integer DEFAULT NULL,
    min_slots            integer DEFAULT NULL,
    weight               double precision DEFAULT NULL,
    budget_ms_per_minute double precision DEFAULT NULL,
    throttle_pct         double precision DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
-- PL/pgSQL, not SQL: Citus 13 crashes planning a LANGUAGE sql function's
-- write to a reference table (fs_limits on a cluster, fs_citus_setup()).
#variable_conflict use_column
BEGIN
    -- updated_at from EXCLUDED: Citus evaluates now() in VALUES only.
    INSERT INTO @extschema@.fs_limits AS l
           (queue, tenant, max_slots, min_slots, weight, budget_ms_per_minute, throttle_pct, updated_at)
    VALUES ($2, $1, $3, $4, $5, $6, $7, now())
    ON CONFLICT (queue, tenant) DO UPDATE SET
        max_slots            = COALESCE(EXCLUDED.max_slots, l.max_slots),
        min_slots            = COALESCE(EXCLUDED.min_slots, l.min_slots),
        weight               = COALESCE(EXCLUDED.weight, l.weight),
        budget_ms_per_minute = COALESCE(EXCLUDED.budget_ms_per_minute, l.budget_ms_per_minute),
        throttle_pct         = COALESCE(EXCLUDED.throttle_pct, l.throttle_pct),
        updated_at           = EXCLUDED.updated_at;
END
$$;

-- Configuring: fairshare_admin.
REVOKE ALL ON FUNCTION fs_set_limit(text, text, integer, integer, double precision, double precision, double precision) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_set_limit(text, text, integer, integer, double precision, double precision, double precision) TO fairshare_admin;
GRANT EXECUTE ON FUNCTION fs_save_state() TO fairshare_admin;
GRANT EXECUTE ON FUNCTION fs_reset() TO fairshare_admin;
GRANT EXECUTE ON FUNCTION fs_register_queue(text, regclass, text, text, text, text, regclass, text, text, text, boolean, boolean, text) TO fairshare_admin;
GRANT EXECUTE ON FUNCTION fs_unregister_queue(text) TO fairshare_admin;
GRANT EXECUTE ON FUNCTION fs_resync(text) TO fairshare_admin;

-- Deciding: fairshare_app.
REVOKE ALL ON FUNCTION fs_effective_limits(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_effective_limits(text, text) TO fairshare_app;
REVOKE ALL ON FUNCTION fs_acquire_slot(text, text, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_acquire_slot(text, text, interval) TO fairshare_app;
REVOKE ALL ON FUNCTION fs_release_slot(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_release_slot(bigint) TO fairshare_app;
REVOKE ALL ON FUNCTION fs_renew_slot(bigint, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_renew_slot(bigint, interval) TO fairshare_app;
REVOKE ALL ON FUNCTION fs_spend_tokens(text, integer, integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_spend_tokens(text, integer, integer, text) TO fairshare_app;
REVOKE ALL ON FUNCTION fs_charge_tokens(text, double precision, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_charge_tokens(text, double precision, text) TO fairshare_app;
REVOKE ALL ON FUNCTION fs_route_enqueue(text, text, jsonb, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_route_enqueue(text, text, jsonb, text) TO fairshare_app;
REVOKE ALL ON FUNCTION fs_claim(text, anyelement, integer, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_claim(text, anyelement, integer, interval) TO fairshare_app;
REVOKE ALL ON FUNCTION fs_ready_tenants(text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_ready_tenants(text, integer) TO fairshare_app;

-- Reporting workers and latency: fairshare_worker.
REVOKE ALL ON FUNCTION fs_worker_heartbeat(text, integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_worker_heartbeat(text, integer, text) TO fairshare_worker;
REVOKE ALL ON FUNCTION fs_report_latency(interval, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_report_latency(interval, text) TO fairshare_worker;

-- Monitoring views that name tenants: pg_monitor and the fairshare roles.
REVOKE ALL ON FUNCTION fs_tenant_state() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_tenant_state() TO pg_monitor, fairshare_app, fairshare_worker;
REVOKE ALL ON FUNCTION fs_server_state() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_server_state() TO pg_monitor, fairshare_app, fairshare_worker;
REVOKE ALL ON FUNCTION fs_worker_state() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_worker_state() TO pg_monitor, fairshare_app, fairshare_worker;
REVOKE ALL ON FUNCTION fs_queue_state() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_queue_state() TO pg_monitor, fairshare_app, fairshare_worker;
REVOKE ALL ON FUNCTION fs_decision_state() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_decision_state() TO pg_monitor, fairshare_app, fairshare_worker;
REVOKE ALL ON FUNCTION fs_tier_state() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_tier_state() TO pg_monitor, fairshare_app, fairshare_worker;
REVOKE ALL ON FUNCTION fs_fairness_state() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_fairness_state() TO pg_monitor, fairshare_app, fairshare_worker;
REVOKE ALL ON FUNCTION fs_fair_share_state() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_fair_share_state() TO pg_monitor, fairshare_app, fairshare_worker;
REVOKE SELECT ON fs_tenants FROM PUBLIC;
GRANT SELECT ON fs_tenants TO pg_monitor, fairshare_app, fairshare_worker;
REVOKE SELECT ON fs_stats FROM PUBLIC;
GRANT SELECT ON fs_stats TO pg_monitor, fairshare_app, fairshare_worker;
REVOKE SELECT ON fs_workers FROM PUBLIC;
GRANT SELECT ON fs_workers TO pg_monitor, fairshare_app, fairshare_worker;
REVOKE SELECT ON fs_queues FROM PUBLIC;
GRANT SELECT ON fs_queues TO pg_monitor, fairshare_app, fairshare_worker;
REVOKE SELECT ON fs_decisions FROM PUBLIC;
GRANT SELECT ON fs_decisions TO pg_monitor, fairshare_app, fairshare_worker;
REVOKE SELECT ON fs_tiers FROM PUBLIC;
GRANT SELECT ON fs_tiers TO pg_monitor, fairshare_app, fairshare_worker;
REVOKE SELECT ON fs_fairness FROM PUBLIC;
GRANT SELECT ON fs_fairness TO pg_monitor, fairshare_app, fairshare_worker;
REVOKE SELECT ON fs_fair_shares FROM PUBLIC;
GRANT SELECT ON fs_fair_shares TO pg_monitor, fairshare_app, fairshare_worker;

-- A lease belongs to the role that took it: fs_leases shows it (owner).
DROP VIEW fs_leases;
DROP FUNCTION fs_lease_state();
CREATE FUNCTION fs_lease_state(
    OUT lease_id bigint,
    OUT queue text,
    OUT tenant text,
    OUT state text,
    OUT acquired_at timestamptz,
    OUT expires_at timestamptz,
    OUT holder_pid integer,
    OUT owner regrole)
RETURNS SETOF record
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_lease_state';
COMMENT ON FUNCTION fs_lease_state() IS
'every lease of this database''s queues; see the fs_leases view';
REVOKE ALL ON FUNCTION fs_lease_state() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_lease_state() TO pg_monitor, fairshare_app, fairshare_worker;

CREATE VIEW fs_leases AS SELECT * FROM fs_lease_state();
GRANT SELECT ON fs_leases TO pg_monitor, fairshare_app, fairshare_worker;
COMMENT ON VIEW fs_leases IS
'leases: live, releasing (by an open transaction) or orphan (from before a crash, re-registered on renew), and the role that took each (owner: only it, roles with its privileges and fairshare_admin may release or renew it)';

COMMENT ON FUNCTION fs_release_slot(bigint) IS
'releases a lease of the calling role''s (any lease for fairshare_admin): true if it was live, false if unknown, expired or already released';
COMMENT ON FUNCTION fs_renew_slot(bigint, interval) IS
'extends a live lease of the calling role''s (any lease for fairshare_admin) to now + lease: true if renewed, false if unknown, expired or released';

-- ===========================================================================
-- End of: least privilege by default
-- ===========================================================================

-- ---------------------------------------------------------------------------
-- Schedules: why a command does not run (fairshare.worker, fairshare.database)
-- ---------------------------------------------------------------------------

CREATE OR REPLACE VIEW fs_schedule_status WITH (security_invoker = true) AS
SELECT s.schedule_id, s.owner, s.name, st.cron, st.timezone, s.tenant, s.queue, s.payload,
       s.command, st.catchup, st.next_run_at, st.last_scheduled_for AS last_run_for,
       st.last_run_state, st.last_run_finished_at, st.last_error, st.last_error_at,
       CASE
         WHEN s.command IS NULL THEN NULL
         WHEN pg_catalog.current_setting('fairshare.worker', true) IS DISTINCT FROM 'on'
           THEN 'fairshare.worker is off: the background worker runs no command'
         WHEN pg_catalog.current_setting('fairshare.database', true)
              IS DISTINCT FROM pg_catalog.current_database()
           THEN pg_catalog.format('fairshare.database is %L, not this database: the background worker runs the commands of that database only',
                                  pg_catalog.current_setting('fairshare.database', true))
       END AS not_run_reason
  FROM @extschema@.fs_schedules s
  JOIN @extschema@.fs_schedule_state st ON st.schedule_id OPERATOR(pg_catalog.=) s.schedule_id;
COMMENT ON VIEW fs_schedule_status IS
'schedules with their next run, last run and last error, and why the worker does not run a command (each role sees its own)';
COMMENT ON COLUMN fs_schedule_status.not_run_reason IS
'why the background worker does not run the schedule''s command in this database (fairshare.worker off, fairshare.database another database); NULL: it does, or there is no command';
COMMENT ON FUNCTION fs_next_runs(text, text, timestamptz, integer) IS
'the next n runs (at most 10000) of a cron expression in a time zone strictly after a time, in order';
COMMENT ON FUNCTION fs_claim_due_schedules(integer, timestamptz) IS
'claims the due runs of schedules without a command, each exactly once ever (the caller''s schedules; every role''s for superusers and fairshare_admin); as_of at most a minute after now';
COMMENT ON FUNCTION fs_schedule(text, text, text, jsonb, text, text, text, text) IS
'creates or changes the calling role''s schedule of that name; returns its id.  Refuses commands that can never run (transaction control, COPY to or from the client, statements that cannot run in a transaction, SET ROLE)';

-- ---------------------------------------------------------------------------
-- Fair dequeue: a dropped ready or running table takes its registration
-- with it.  Registrations already left behind by a dropped table are
-- removed here (their triggers and index went with the table, and the
-- server forgets their counts at its next restart or recount).
-- ---------------------------------------------------------------------------

CREATE FUNCTION fs_fair_tables_dropped() RETURNS event_trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'fs_fair_tables_dropped';
COMMENT ON FUNCTION fs_fair_tables_dropped() IS
'event trigger ON sql_drop: removes the registration of a queue whose ready or running table was dropped (its row, the triggers and index on its other table, its counts), with a notice';
CREATE EVENT TRIGGER fs_fair_tables_dropped ON sql_drop
    EXECUTE FUNCTION fs_fair_tables_dropped();
COMMENT ON EVENT TRIGGER fs_fair_tables_dropped IS
'fair dequeue: a dropped ready or running table takes its registration with it';

DELETE FROM fs_fair_queues q
 WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) q.ready_table::pg_catalog.oid)
    OR (q.running_table IS NOT NULL AND
        NOT EXISTS (SELECT FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) q.running_table::pg_catalog.oid));

-- ---------------------------------------------------------------------------
-- Replication of the shared state through WAL (High availability).
-- ---------------------------------------------------------------------------

CREATE FUNCTION fs_replication_state(
    OUT role text,
    OUT wal_interval_ms integer,
    OUT writer_running boolean,
    OUT written_lsn pg_lsn,
    OUT written_at timestamptz,
    OUT records bigint,
    OUT bytes bigint,
    OUT snapshots bigint,
    OUT replayed_lsn pg_lsn,
    OUT replayed_primary_time timestamptz,
    OUT replayed_records bigint,
    OUT replay_dropped bigint,
    OUT replayed_snapshot boolean)
RETURNS record
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_replication_state';
COMMENT ON FUNCTION fs_replication_state() IS
'replication of fairshare''s state through WAL: what the WAL writer logged (primary) and what was replayed (standby, or this server''s crash recovery); see the fs_replication view';
REVOKE ALL ON FUNCTION fs_replication_state() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_replication_state() TO pg_monitor, fairshare_app, fairshare_worker;

CREATE VIEW fs_replication AS SELECT * FROM fs_replication_state();
GRANT SELECT ON fs_replication TO pg_monitor, fairshare_app, fairshare_worker;
COMMENT ON VIEW fs_replication IS
'fairshare''s state replicated through WAL: on a primary, the WAL writer''s records; on a standby, the replay and the primary''s time of the last record replayed (now() minus it is how far behind the views are)';

CREATE FUNCTION fs_wal_sync()
RETURNS pg_lsn
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_wal_sync';
COMMENT ON FUNCTION fs_wal_sync() IS
'waits until the WAL writer has logged every fairshare decision made before the call and returns the end of its last record: a standby that replayed up to it knows them (for tests and planned switchovers)';
REVOKE ALL ON FUNCTION fs_wal_sync() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_wal_sync() TO fairshare_admin;

-- 0.5.0: a claim may select rows (fs_register_queue's selector, fs_claim's
-- selector_in and selector_not_in).
ALTER TABLE fs_fair_queues ADD COLUMN selector text;
COMMENT ON COLUMN fs_fair_queues.selector IS 'expression over a ready row giving the text a claim may select rows by (fs_claim()''s selector_in and selector_not_in), such as queue_name; NULL: claims take no selection';

-- 0.5.0: a queue has its own default max_slots and lease.  A queue
-- registered by 0.4.0 keeps what its tenants had then: max_slots 1 where
-- fs_limits says nothing (a queue registered from now on without max_slots
-- lets a tenant hold any number of slots).
ALTER TABLE fs_fair_queues ADD COLUMN max_slots integer CHECK (max_slots >= 0),
                           ADD COLUMN lease interval
                               CHECK (lease > interval '0' AND lease <= interval '366 days');
UPDATE fs_fair_queues SET max_slots = 1;
COMMENT ON COLUMN fs_limits.max_slots IS 'most slots the tenant may hold at once (default: its fair-dequeue queue''s max_slots, else 1; 0 stops the tenant)';
COMMENT ON COLUMN fs_fair_queues.max_slots IS 'most slots a tenant of the queue may hold at once when no row of fs_limits sets its max_slots; NULL: no limit (a lone tenant may use every free worker)';
COMMENT ON COLUMN fs_fair_queues.lease IS 'the lease of a claim that passes none; NULL: 5 minutes';
COMMENT ON FUNCTION fs_limits_changed() IS
'trigger: makes changes to fs_limits (and to fs_fair_queues, whose max_slots is a default of its tenants) reach shared memory when the transaction commits';
CREATE TRIGGER fs_fair_queues_limits_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON fs_fair_queues
    FOR EACH STATEMENT EXECUTE FUNCTION fs_limits_changed();

DROP FUNCTION fs_register_queue(text, regclass, text, text, text, text, regclass, text, text, text, boolean, boolean, text);
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
    enqueued_at    text DEFAULT NULL,
    selector       text DEFAULT NULL,
    max_slots      integer DEFAULT NULL,
    lease          interval DEFAULT NULL)
RETURNS fs_fair_queues
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_register_queue';
COMMENT ON FUNCTION fs_register_queue(text, regclass, text, text, text, text, regclass, text, text, text, boolean, boolean, text, text, integer, interval) IS
'registers (or re-registers) a ready table for fair dequeue: validates the SQL (the key must have a unique index and never be NULL), adds triggers and, if none serves, an index; max_slots is the queue''s default for tenants without one in fs_limits (NULL: no limit), lease the default lease of its claims (NULL: 5 minutes); the caller must own the tables (and, for a queue whose table was dropped, be the role that registered it)';
REVOKE ALL ON FUNCTION fs_register_queue(text, regclass, text, text, text, text, regclass, text, text, text, boolean, boolean, text, text, integer, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_register_queue(text, regclass, text, text, text, text, regclass, text, text, text, boolean, boolean, text, text, integer, interval) TO fairshare_admin;

DROP FUNCTION fs_claim(text, anyelement, integer, interval);
CREATE FUNCTION fs_claim(
    queue    text,
    row_type anyelement,
    max_rows integer DEFAULT 1,
    lease    interval DEFAULT NULL,
    selector_in     text[] DEFAULT NULL,
    selector_not_in text[] DEFAULT NULL)
RETURNS TABLE (lease_id bigint, tenant text, job anyelement)
LANGUAGE c VOLATILE PARALLEL UNSAFE ROWS 10
AS 'MODULE_PATHNAME', 'fs_claim';
COMMENT ON FUNCTION fs_claim(text, anyelement, integer, interval, text[], text[]) IS
'claims up to max_rows ready rows of a registered queue in fair order, locked FOR UPDATE SKIP LOCKED in this transaction, each with a lease (NULL: the queue''s registered lease, or 5 minutes); pass NULL::<ready table> as row_type; selector_in and selector_not_in (names, * for any characters) select rows by the queue''s selector';
REVOKE ALL ON FUNCTION fs_claim(text, anyelement, integer, interval, text[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_claim(text, anyelement, integer, interval, text[], text[]) TO fairshare_app;

-- 0.5.0: a second level of fair order, sub-keys within a tenant.
ALTER TABLE fs_fair_queues ADD COLUMN subkey text;
COMMENT ON COLUMN fs_fair_queues.subkey IS 'expression over a ready row giving its sub-key within its tenant (text): the tenant''s share is split fairly among its sub-keys (fs_subkey_weights); NULL: one level of fair order';
DROP FUNCTION fs_register_queue(text, regclass, text, text, text, text, regclass, text, text, text, boolean, boolean, text, text, integer, interval);
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
    enqueued_at    text DEFAULT NULL,
    selector       text DEFAULT NULL,
    max_slots      integer DEFAULT NULL,
    lease          interval DEFAULT NULL,
    subkey         text DEFAULT NULL)
RETURNS fs_fair_queues
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_register_queue';
COMMENT ON FUNCTION fs_register_queue(text, regclass, text, text, text, text, regclass, text, text, text, boolean, boolean, text, text, integer, interval, text) IS
'registers (or re-registers) a ready table for fair dequeue: validates the SQL (the key must have a unique index and never be NULL), adds triggers and, if none serves, an index; max_slots is the queue''s default for tenants without one in fs_limits (NULL: no limit), lease the default lease of its claims (NULL: 5 minutes), subkey an expression giving a row''s sub-key within its tenant, shared fairly inside the tenant''s one share (NULL: one level); the caller must own the tables (and, for a queue whose table was dropped, be the role that registered it)';
REVOKE ALL ON FUNCTION fs_register_queue(text, regclass, text, text, text, text, regclass, text, text, text, boolean, boolean, text, text, integer, interval, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_register_queue(text, regclass, text, text, text, text, regclass, text, text, text, boolean, boolean, text, text, integer, interval, text) TO fairshare_admin;

-- ---------------------------------------------------------------------------
-- Sub-keys: the second level of fair order
-- ---------------------------------------------------------------------------

CREATE TABLE fs_subkey_weights (
    queue      text NOT NULL DEFAULT '*'
               CHECK (octet_length(queue) BETWEEN 1 AND 63),
    tenant     text NOT NULL DEFAULT '*'
               CHECK (octet_length(tenant) BETWEEN 1 AND 63),
    subkey     text NOT NULL
               CHECK (octet_length(subkey) BETWEEN 1 AND 63),
    weight     double precision NOT NULL
               CHECK (weight >= 0.000001 AND weight <= 1000000),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, tenant, subkey)
);
COMMENT ON TABLE fs_subkey_weights IS
'Weights of sub-keys within their tenant, for queues registered with a subkey.  ''*'' as queue or tenant is the default for any.  The most specific row wins: (queue, tenant) > (''*'', tenant) > (queue, ''*'') > (''*'', ''*''); a sub-key without a row weighs 1.  Changes apply when the changing transaction commits.';
COMMENT ON COLUMN fs_subkey_weights.queue IS 'queue name, or ''*'' for every queue';
COMMENT ON COLUMN fs_subkey_weights.tenant IS 'tenant name, or ''*'' for every tenant';
COMMENT ON COLUMN fs_subkey_weights.subkey IS 'the sub-key (the value of the queue''s subkey expression; ''*'' names the rows whose sub-key is NULL or no valid name)';
COMMENT ON COLUMN fs_subkey_weights.weight IS 'relative share of the sub-key within its tenant''s share (default 1)';
COMMENT ON COLUMN fs_subkey_weights.updated_at IS 'when the row was last changed';
GRANT SELECT ON fs_subkey_weights TO PUBLIC;
GRANT INSERT, UPDATE, DELETE, TRUNCATE ON fs_subkey_weights TO fairshare_admin;
SELECT pg_catalog.pg_extension_config_dump('fs_subkey_weights', '');
-- Claims read the weights again when fs_limits' generation moves.
CREATE TRIGGER fs_subkey_weights_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON fs_subkey_weights
    FOR EACH STATEMENT EXECUTE FUNCTION fs_limits_changed();

CREATE FUNCTION fs_fair_subkeys(queue text)
RETURNS TABLE (tenant text, subkey text, ready_rows bigint, virtual_start double precision,
               weight double precision, passed_over_until timestamptz)
LANGUAGE c VOLATILE STRICT PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_fair_subkeys';
COMMENT ON FUNCTION fs_fair_subkeys(text) IS
'the sub-keys of a queue registered with a subkey, with ready rows, as shared memory has them: each tenant''s rows go to its sub-key with the smallest virtual_start; weight is NULL until a claim has read it; passed_over_until is set while a sub-key that came back short is passed over; needs SELECT on the queue''s table';
REVOKE ALL ON FUNCTION fs_fair_subkeys(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_fair_subkeys(text) TO pg_monitor, fairshare_app, fairshare_worker, fairshare_admin;

-- Why a ready row waits.
CREATE FUNCTION fs_explain_wait(
    queue   text,
    job_key text,
    OUT tenant            text,
    OUT reason            text,
    OUT detail            text,
    OUT tenant_rows_ahead bigint,
    OUT tenants_ahead     integer,
    OUT rows_ahead        bigint,
    OUT slots_in_use      integer,
    OUT max_slots         integer,
    OUT slot_ceiling      integer,
    OUT live_threads      integer,
    OUT throttle_pct      double precision,
    OUT token_balance     double precision,
    OUT tokens_per_row    double precision,
    OUT budget_ready_at   timestamptz,
    OUT backpressure      text,
    OUT claim_rate        double precision,
    OUT estimated_start   timestamptz,
    OUT subkey            text,
    OUT subkeys_ahead     integer)
RETURNS record
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_explain_wait';
COMMENT ON FUNCTION fs_explain_wait(text, text) IS
'why the ready row of a registered queue with this key (its text form) waits right now: a reason (not_found, locked, not_ready, no_tenant, untracked, tenant_limit, global_gate, throttled, no_budget, backpressure, fair_order, tenant_order, claimable), a detail, the figures behind it and the expected start; reads only and never waits; needs SELECT on the table and a role row-level security does not restrict on it';
REVOKE ALL ON FUNCTION fs_explain_wait(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_explain_wait(text, text) TO fairshare_app;

-- ---------------------------------------------------------------------------
-- Citus clusters (Scaling past one server)
-- ---------------------------------------------------------------------------

-- The cluster's setting: the table fairshare's per-tenant functions are
-- colocated with.  One row or none; fs_citus_setup() makes it a reference
-- table, so that every node has it, and its trigger makes every node read
-- it again when a change commits.
CREATE TABLE fs_cluster (
    colocate_with regclass NOT NULL,
    set_up_at     timestamptz NOT NULL DEFAULT now(),
    one_row       boolean PRIMARY KEY DEFAULT true CHECK (one_row)
);
COMMENT ON TABLE fs_cluster IS
'the Citus cluster''s setting, written by fs_citus_setup(): no row on a single server';
COMMENT ON COLUMN fs_cluster.colocate_with IS 'the table, distributed by tenant, whose shards say which node decides for a tenant';
COMMENT ON COLUMN fs_cluster.set_up_at IS 'when fs_citus_setup() wrote the row';
COMMENT ON COLUMN fs_cluster.one_row IS 'always true: the table has at most one row';
REVOKE ALL ON fs_cluster FROM PUBLIC;
GRANT SELECT ON fs_cluster TO PUBLIC;
CREATE TRIGGER fs_cluster_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON fs_cluster
    FOR EACH STATEMENT EXECUTE FUNCTION fs_limits_changed();

-- Queues registered on Citus's distributed tables, as text (a table's OID
-- differs from node to node): fs_register_queue() on the coordinator writes
-- a row here, and fs_citus_setup() makes this a reference table, so that the
-- row reaches every node in the registering transaction, where the trigger
-- below writes (or removes) the node's own row of fs_fair_queues.
CREATE TABLE fs_cluster_queues (
    queue          text PRIMARY KEY,
    ready_table    text NOT NULL,
    tenant         text NOT NULL,
    order_by       text NOT NULL,
    ready_filter   text,
    claim_filter   text,
    key            text NOT NULL,
    key_type       text NOT NULL,
    running_table  text,
    running_filter text,
    running_key    text,
    cost           text,
    enqueued_at    text,
    charge_runtime boolean NOT NULL,
    ready_index    text,
    index_created  boolean NOT NULL,
    registered_by  text NOT NULL,
    selector       text,
    max_slots      integer,
    lease          interval,
    subkey         text
);
COMMENT ON TABLE fs_cluster_queues IS
'queues registered on tables Citus distributes, as the coordinator''s fs_register_queue() wrote them (names as qualified text); every node keeps its own row of fs_fair_queues from these';
COMMENT ON COLUMN fs_cluster_queues.queue IS 'the queue, as in fs_fair_queues';
COMMENT ON COLUMN fs_cluster_queues.ready_table IS 'the distributed ready table, schema-qualified';
COMMENT ON COLUMN fs_cluster_queues.tenant IS 'as in fs_fair_queues';
COMMENT ON COLUMN fs_cluster_queues.order_by IS 'as in fs_fair_queues';
COMMENT ON COLUMN fs_cluster_queues.ready_filter IS 'as in fs_fair_queues';
COMMENT ON COLUMN fs_cluster_queues.claim_filter IS 'as in fs_fair_queues';
COMMENT ON COLUMN fs_cluster_queues.key IS 'as in fs_fair_queues';
COMMENT ON COLUMN fs_cluster_queues.key_type IS 'the key''s type, by name';
COMMENT ON COLUMN fs_cluster_queues.running_table IS 'the distributed running table, schema-qualified; NULL: none';
COMMENT ON COLUMN fs_cluster_queues.running_filter IS 'as in fs_fair_queues';
COMMENT ON COLUMN fs_cluster_queues.running_key IS 'as in fs_fair_queues';
COMMENT ON COLUMN fs_cluster_queues.cost IS 'as in fs_fair_queues';
COMMENT ON COLUMN fs_cluster_queues.enqueued_at IS 'as in fs_fair_queues';
COMMENT ON COLUMN fs_cluster_queues.charge_runtime IS 'as in fs_fair_queues';
COMMENT ON COLUMN fs_cluster_queues.ready_index IS 'the index on the distributed table, schema-qualified (Citus gives each shard its own copy)';
COMMENT ON COLUMN fs_cluster_queues.index_created IS 'as in fs_fair_queues';
COMMENT ON COLUMN fs_cluster_queues.registered_by IS 'the registering role, by name';
COMMENT ON COLUMN fs_cluster_queues.selector IS 'as in fs_fair_queues';
COMMENT ON COLUMN fs_cluster_queues.max_slots IS 'as in fs_fair_queues';
COMMENT ON COLUMN fs_cluster_queues.lease IS 'as in fs_fair_queues';
COMMENT ON COLUMN fs_cluster_queues.subkey IS 'as in fs_fair_queues';
REVOKE ALL ON fs_cluster_queues FROM PUBLIC;
GRANT SELECT ON fs_cluster_queues TO PUBLIC;

-- Fired on each node's placement of fs_cluster_queues: the node's own row
-- of fs_fair_queues follows, with the names resolved on this node (the
-- extension's owner writes it, as fs_register_queue() does).
CREATE FUNCTION fs_cluster_queues_apply() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        DELETE FROM @extschema@.fs_fair_queues WHERE queue = OLD.queue;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        -- The coordinator's own row (fs_register_queue() stored it) too.
        DELETE FROM @extschema@.fs_fair_queues WHERE queue = NEW.queue;
        INSERT INTO @extschema@.fs_fair_queues AS q
               (queue, ready_table, tenant, order_by, ready_filter, claim_filter, key, key_type,
                running_table, running_filter, running_key, cost, enqueued_at, charge_runtime,
                ready_index, index_created, registered_by, selector, max_slots, lease, subkey)
        VALUES (NEW.queue, NEW.ready_table::regclass, NEW.tenant, NEW.order_by, NEW.ready_filter,
                NEW.claim_filter, NEW.key, NEW.key_type::regtype, NEW.running_table::regclass,
                NEW.running_filter, NEW.running_key, NEW.cost, NEW.enqueued_at, NEW.charge_runtime,
                to_regclass(NEW.ready_index), NEW.index_created, NEW.registered_by::regrole,
                NEW.selector, NEW.max_slots, NEW.lease, NEW.subkey);
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION fs_cluster_queues_apply() IS
'trigger on each node''s placement of fs_cluster_queues: writes (or removes) the node''s own row of fs_fair_queues';
REVOKE ALL ON FUNCTION fs_cluster_queues_apply() FROM PUBLIC;
CREATE TRIGGER fs_cluster_queues_apply
    AFTER INSERT OR UPDATE OR DELETE ON fs_cluster_queues
    FOR EACH ROW EXECUTE FUNCTION fs_cluster_queues_apply();

CREATE FUNCTION fs_release_slot_at(node_anchor text, lease_id bigint)
RETURNS boolean
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_release_slot_at';
COMMENT ON FUNCTION fs_release_slot_at(text, bigint) IS
'fs_release_slot() on the node that holds node_anchor''s shard (Citus delegates it there); what fs_release_slot() calls for another node''s lease';
REVOKE ALL ON FUNCTION fs_release_slot_at(text, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_release_slot_at(text, bigint) TO fairshare_app;

CREATE FUNCTION fs_renew_slot_at(node_anchor text, lease_id bigint, lease interval DEFAULT '5 minutes')
RETURNS boolean
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_renew_slot_at';
COMMENT ON FUNCTION fs_renew_slot_at(text, bigint, interval) IS
'fs_renew_slot() on the node that holds node_anchor''s shard (Citus delegates it there); what fs_renew_slot() calls for another node''s lease';
REVOKE ALL ON FUNCTION fs_renew_slot_at(text, bigint, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_renew_slot_at(text, bigint, interval) TO fairshare_app;

CREATE FUNCTION fs_worker_heartbeat_at(node_anchor text, worker text, threads integer, queue text DEFAULT 'default')
RETURNS void
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_worker_heartbeat_at';
COMMENT ON FUNCTION fs_worker_heartbeat_at(text, text, integer, text) IS
'fs_worker_heartbeat() on the node that holds node_anchor''s shard (Citus delegates it there); what fs_worker_heartbeat() on the coordinator calls for every node';
REVOKE ALL ON FUNCTION fs_worker_heartbeat_at(text, text, integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_worker_heartbeat_at(text, text, integer, text) TO fairshare_worker;

CREATE FUNCTION fs_report_latency_at(node_anchor text, latency interval, queue text DEFAULT 'default')
RETURNS void
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_report_latency_at';
COMMENT ON FUNCTION fs_report_latency_at(text, interval, text) IS
'fs_report_latency() on the node that holds node_anchor''s shard (Citus delegates it there); what fs_report_latency() on the coordinator calls for every node';
REVOKE ALL ON FUNCTION fs_report_latency_at(text, interval, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_report_latency_at(text, interval, text) TO fairshare_worker;

CREATE FUNCTION fs_claim_at(
    node_anchor     text,
    queue           text,
    row_type        anyelement,
    max_rows        integer DEFAULT 1,
    lease           interval DEFAULT NULL,
    selector_in     text[] DEFAULT NULL,
    selector_not_in text[] DEFAULT NULL)
RETURNS TABLE (lease_id bigint, tenant text, job anyelement)
LANGUAGE c VOLATILE PARALLEL UNSAFE ROWS 10
AS 'MODULE_PATHNAME', 'fs_claim_at';
COMMENT ON FUNCTION fs_claim_at(text, text, anyelement, integer, interval, text[], text[]) IS
'fs_claim() of the shards of the node that holds node_anchor''s shard (Citus delegates it there); what fs_claim() on the coordinator calls for the node it chose';
REVOKE ALL ON FUNCTION fs_claim_at(text, text, anyelement, integer, interval, text[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_claim_at(text, text, anyelement, integer, interval, text[], text[]) TO fairshare_app;

CREATE FUNCTION fs_claimable_weight_at(node_anchor text, queue text)
RETURNS double precision
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_claimable_weight_at';
COMMENT ON FUNCTION fs_claimable_weight_at(text, text) IS
'on the node that holds node_anchor''s shard (Citus delegates it there): the sum of the weights of the queue''s tenants there that a claim could serve now; how fs_claim() on the coordinator shares claims among the nodes';
REVOKE ALL ON FUNCTION fs_claimable_weight_at(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_claimable_weight_at(text, text) TO fairshare_app;

CREATE FUNCTION fs_lease_node(lease_id bigint)
RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN (lease_id >> 52) & 1023;
COMMENT ON FUNCTION fs_lease_node(bigint) IS
'the Citus node group that granted a lease (0: the coordinator, or a single server)';

CREATE FUNCTION fs_tenant_node(tenant text)
RETURNS integer
LANGUAGE c VOLATILE STRICT PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_tenant_node';
COMMENT ON FUNCTION fs_tenant_node(text) IS
'the Citus node group that decides for a tenant (holds its shard of the fs_cluster table), NULL on a single server';
REVOKE ALL ON FUNCTION fs_tenant_node(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_tenant_node(text) TO pg_monitor, fairshare_app, fairshare_worker, fairshare_admin;

CREATE FUNCTION fs_citus_setup(colocate_with regclass)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
-- Citus copies a reference table's triggers to its placements only so.
SET citus.enable_unsafe_triggers = on
SET search_path = pg_catalog, pg_temp
SET client_min_messages = warning
AS $$
#variable_conflict use_variable
DECLARE
    dist       record;
    column_type regtype;
    column_collation oid;
    t          regclass;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        RAISE EXCEPTION 'extension "citus" is not installed in this database'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Load Citus first (shared_preload_libraries = ''citus,fairshare'') and run CREATE EXTENSION citus.';
    END IF;
    IF (SELECT groupid FROM pg_catalog.pg_dist_local_group) <> 0 THEN
        RAISE EXCEPTION 'fs_citus_setup() must be called on the coordinator'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Connect to the coordinator (node group 0) and call it there.';
    END IF;
    SELECT p.partmethod, p.repmodel, p.partkey INTO dist
      FROM pg_catalog.pg_dist_partition p WHERE p.logicalrelid = colocate_with;
    IF NOT FOUND OR dist.partmethod <> 'h' THEN
        RAISE EXCEPTION 'table % is not distributed by hash', colocate_with
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = format('Distribute it by its tenant column first: SELECT create_distributed_table(%L, ''tenant'').', colocate_with);
    END IF;
    IF dist.repmodel <> 's' OR EXISTS (SELECT FROM pg_catalog.pg_dist_shard s
                                          JOIN pg_catalog.pg_dist_placement p USING (shardid)
                                         WHERE s.logicalrelid = colocate_with
                                         GROUP BY s.shardid HAVING count(*) > 1) THEN
        RAISE EXCEPTION 'table % has more than one placement of a shard', colocate_with
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'fairshare decides for a tenant on the one node that holds its shard: use citus.shard_replication_factor = 1.';
    END IF;
    SELECT a.atttypid, a.attcollation INTO column_type, column_collation
      FROM pg_catalog.pg_attribute a
     WHERE a.attrelid = colocate_with
       AND a.attname = pg_catalog.column_to_column_name(colocate_with, dist.partkey);
    IF column_type NOT IN ('pg_catalog.text'::regtype, 'pg_catalog.varchar'::regtype) THEN
        RAISE EXCEPTION 'the distribution column of % is of type %, not text', colocate_with, column_type
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Tenants are text: colocate with a table distributed by a text or varchar tenant column.';
    END IF;
    IF NOT (SELECT collisdeterministic FROM pg_catalog.pg_collation WHERE oid = column_collation) THEN
        RAISE EXCEPTION 'the distribution column of % has a nondeterministic collation', colocate_with
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Tenants are placed by their bytes: use a deterministic collation.';
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_dist_node WHERE groupid > 1023) THEN
        RAISE EXCEPTION 'node group % is above 1023',
                        (SELECT max(groupid) FROM pg_catalog.pg_dist_node)
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'Lease ids name node groups 0 to 1023: add that node again to give it a lower group id.';
    END IF;

    -- The settings are reference tables, with their triggers on every node:
    -- one place to configure, applied on every node when a change commits.
    FOREACH t IN ARRAY ARRAY['@extschema@.fs_limits', '@extschema@.fs_subkey_weights',
                             '@extschema@.fs_cluster', '@extschema@.fs_cluster_queues']::regclass[] LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition WHERE logicalrelid = t) THEN
            PERFORM create_reference_table(t);
            -- Its rows are in the placements now; none stays behind unseen.
            PERFORM truncate_local_data_after_distributing_table(t);
        END IF;
    END LOOP;
    DELETE FROM @extschema@.fs_cluster;
    INSERT INTO @extschema@.fs_cluster (colocate_with) VALUES (colocate_with);

    -- The per-tenant functions run on the node that owns the tenant, also
    -- inside transaction blocks; the lease functions on the lease's node.
    PERFORM create_distributed_function('@extschema@.fs_acquire_slot(text,text,interval)', 'tenant',
                                        colocate_with => colocate_with::text, force_delegation => true);
    PERFORM create_distributed_function('@extschema@.fs_spend_tokens(text,integer,integer,text)', 'tenant',
                                        colocate_with => colocate_with::text, force_delegation => true);
    PERFORM create_distributed_function('@extschema@.fs_charge_tokens(text,double precision,text)', 'tenant',
                                        colocate_with => colocate_with::text, force_delegation => true);
    PERFORM create_distributed_function('@extschema@.fs_release_slot_at(text,bigint)', 'node_anchor',
                                        colocate_with => colocate_with::text, force_delegation => true);
    PERFORM create_distributed_function('@extschema@.fs_renew_slot_at(text,bigint,interval)', 'node_anchor',
                                        colocate_with => colocate_with::text, force_delegation => true);
    -- A claim on the coordinator asks the nodes' weights and claims on one.
    PERFORM create_distributed_function('@extschema@.fs_claim_at(text,text,anyelement,integer,interval,text[],text[])', 'node_anchor',
                                        colocate_with => colocate_with::text, force_delegation => true);
    PERFORM create_distributed_function('@extschema@.fs_claimable_weight_at(text,text)', 'node_anchor',
                                        colocate_with => colocate_with::text, force_delegation => true);
    -- Heartbeats and latency reports sent to the coordinator reach every node.
    PERFORM create_distributed_function('@extschema@.fs_worker_heartbeat_at(text,text,integer,text)', 'node_anchor',
                                        colocate_with => colocate_with::text, force_delegation => true);
    PERFORM create_distributed_function('@extschema@.fs_report_latency_at(text,interval,text)', 'node_anchor',
                                        colocate_with => colocate_with::text, force_delegation => true);
END
$$;
COMMENT ON FUNCTION fs_citus_setup(regclass) IS
'on a Citus coordinator: makes fs_limits, fs_subkey_weights, fs_cluster and fs_cluster_queues reference tables and delegates the per-tenant functions to the node that holds the tenant''s shard of colocate_with (a table distributed by a text tenant column)';
REVOKE ALL ON FUNCTION fs_citus_setup(regclass) FROM PUBLIC;
