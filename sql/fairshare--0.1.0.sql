/* fairshare 0.1.0: shared-memory tenant state, limits and concurrency slots */

\echo Use "CREATE EXTENSION fairshare" to load this file. \quit

-- ---------------------------------------------------------------------------
-- Limits
-- ---------------------------------------------------------------------------

CREATE TABLE fs_limits (
    queue                text NOT NULL DEFAULT 'default',
    tenant               text NOT NULL,
    max_slots            integer,
    min_slots            integer,
    weight               double precision,
    budget_ms_per_minute double precision,
    throttle_pct         double precision,
    updated_at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, tenant)
);

COMMENT ON TABLE fs_limits IS
'Per-tenant limits, per queue.  ''*'' as tenant or queue is the default for any tenant or queue.  A NULL field inherits: (queue, tenant) > (''*'', tenant) > (queue, ''*'') > (''*'', ''*'') > built-in defaults.  Changes apply when the changing transaction commits.';
COMMENT ON COLUMN fs_limits.queue IS 'queue name, or ''*'' for every queue';
COMMENT ON COLUMN fs_limits.tenant IS 'tenant name, or ''*'' for every tenant';
COMMENT ON COLUMN fs_limits.max_slots IS 'most slots the tenant may hold at once (default 1; 0 stops the tenant)';
COMMENT ON COLUMN fs_limits.min_slots IS 'slots the global gate always leaves the tenant, up to max_slots (default 0)';
COMMENT ON COLUMN fs_limits.weight IS 'relative share in fair dequeue (default 1)';
COMMENT ON COLUMN fs_limits.budget_ms_per_minute IS 'token budget in milliseconds of worker time per minute; NULL inherits, ''infinity'' means no budget (the default)';
COMMENT ON COLUMN fs_limits.throttle_pct IS 'percentage of its global-gate share the tenant gets, 0..100 (default 100)';
COMMENT ON COLUMN fs_limits.updated_at IS 'when the row was last changed';

GRANT SELECT ON fs_limits TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('fs_limits', '');

CREATE FUNCTION fs_limits_validate() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'fs_limits_validate';
COMMENT ON FUNCTION fs_limits_validate() IS
'trigger: rejects invalid rows of fs_limits with an error that says what is wrong';

CREATE FUNCTION fs_limits_changed() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'fs_limits_changed';
COMMENT ON FUNCTION fs_limits_changed() IS
'trigger: makes changes to fs_limits reach shared memory when the transaction commits';

CREATE TRIGGER fs_limits_validate
    BEFORE INSERT OR UPDATE ON fs_limits
    FOR EACH ROW EXECUTE FUNCTION fs_limits_validate();
CREATE TRIGGER fs_limits_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON fs_limits
    FOR EACH STATEMENT EXECUTE FUNCTION fs_limits_changed();

CREATE FUNCTION fs_set_limit(
    tenant               text,
    queue                text DEFAULT 'default',
    max_slots            integer DEFAULT NULL,
    min_slots            integer DEFAULT NULL,
    weight               double precision DEFAULT NULL,
    budget_ms_per_minute double precision DEFAULT NULL,
    throttle_pct         double precision DEFAULT NULL)
RETURNS void
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
    INSERT INTO @extschema@.fs_limits AS l
           (queue, tenant, max_slots, min_slots, weight, budget_ms_per_minute, throttle_pct)
    VALUES ($2, $1, $3, $4, $5, $6, $7)
    ON CONFLICT (queue, tenant) DO UPDATE SET
        max_slots            = COALESCE(EXCLUDED.max_slots, l.max_slots),
        min_slots            = COALESCE(EXCLUDED.min_slots, l.min_slots),
        weight               = COALESCE(EXCLUDED.weight, l.weight),
        budget_ms_per_minute = COALESCE(EXCLUDED.budget_ms_per_minute, l.budget_ms_per_minute),
        throttle_pct         = COALESCE(EXCLUDED.throttle_pct, l.throttle_pct),
        updated_at           = now();
$$;
COMMENT ON FUNCTION fs_set_limit(text, text, integer, integer, double precision, double precision, double precision) IS
'sets limits of a tenant (''*'' for the queue default) in a queue (''*'' for every queue); NULL leaves a field as it is';

CREATE FUNCTION fs_effective_limits(
    tenant text,
    queue  text DEFAULT 'default',
    OUT max_slots integer,
    OUT min_slots integer,
    OUT weight double precision,
    OUT budget_ms_per_minute double precision,
    OUT throttle_pct double precision)
RETURNS record
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_effective_limits';
COMMENT ON FUNCTION fs_effective_limits(text, text) IS
'the limits a decision for this tenant and queue uses, after defaults (budget NULL: no budget)';

-- ---------------------------------------------------------------------------
-- Slots
-- ---------------------------------------------------------------------------

CREATE FUNCTION fs_acquire_slot(
    tenant text,
    queue  text DEFAULT 'default',
    lease  interval DEFAULT '5 minutes')
RETURNS bigint
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_acquire_slot';
COMMENT ON FUNCTION fs_acquire_slot(text, text, interval) IS
'takes a concurrency slot of the tenant in the queue: a lease id, or NULL when the tenant is at its limit';

CREATE FUNCTION fs_release_slot(lease_id bigint)
RETURNS boolean
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_release_slot';
COMMENT ON FUNCTION fs_release_slot(bigint) IS
'releases a lease: true if it was live, false if unknown, expired or already released';

CREATE FUNCTION fs_renew_slot(lease_id bigint, lease interval DEFAULT '5 minutes')
RETURNS boolean
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_renew_slot';
COMMENT ON FUNCTION fs_renew_slot(bigint, interval) IS
'extends a live lease to now + lease: true if renewed, false if unknown, expired or released';

-- ---------------------------------------------------------------------------
-- Telemetry
-- ---------------------------------------------------------------------------

CREATE FUNCTION fs_tenant_state(
    OUT queue text,
    OUT tenant text,
    OUT slots_in_use integer,
    OUT max_slots integer,
    OUT min_slots integer,
    OUT weight double precision,
    OUT budget_ms_per_minute double precision,
    OUT token_balance double precision,
    OUT throttle_pct double precision,
    OUT ready_rows bigint,
    OUT virtual_finish double precision,
    OUT granted bigint,
    OUT denied_tenant_limit bigint,
    OUT denied_global_gate bigint,
    OUT denied_throttled bigint,
    OUT denied_backpressure bigint,
    OUT denied_no_budget bigint,
    OUT leases_expired bigint,
    OUT failed_to_deliver bigint,
    OUT served_ms double precision,
    OUT last_decision_at timestamptz)
RETURNS SETOF record
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_tenant_state';
COMMENT ON FUNCTION fs_tenant_state() IS
'live state and counters of every (queue, tenant) entry of this database; see the fs_tenants view';

CREATE VIEW fs_tenants AS SELECT * FROM fs_tenant_state();
GRANT SELECT ON fs_tenants TO PUBLIC;
COMMENT ON VIEW fs_tenants IS
'live per-tenant state: slots in use, cached limits, token balance, backlog, and decisions by reason';

CREATE FUNCTION fs_lease_state(
    OUT lease_id bigint,
    OUT queue text,
    OUT tenant text,
    OUT state text,
    OUT acquired_at timestamptz,
    OUT expires_at timestamptz,
    OUT holder_pid integer)
RETURNS SETOF record
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_lease_state';
COMMENT ON FUNCTION fs_lease_state() IS
'every lease of this database''s queues; see the fs_leases view';

CREATE VIEW fs_leases AS SELECT * FROM fs_lease_state();
GRANT SELECT ON fs_leases TO PUBLIC;
COMMENT ON VIEW fs_leases IS
'leases: live, releasing (by an open transaction) or orphan (from before a crash, re-registered on renew)';

CREATE FUNCTION fs_server_state(
    OUT tenants bigint,
    OUT max_tenants integer,
    OUT tenant_entry_size integer,
    OUT tenant_bytes_per_entry integer,
    OUT leases bigint,
    OUT max_leases integer,
    OUT queues integer,
    OUT max_queues integer,
    OUT fail_open bigint,
    OUT evictions bigint,
    OUT tenant_table_full bigint,
    OUT queue_table_full bigint,
    OUT lease_table_full bigint,
    OUT leases_expired bigint,
    OUT leases_orphaned bigint,
    OUT leases_reregistered bigint,
    OUT start_kind text,
    OUT started_at timestamptz,
    OUT stats_reset timestamptz)
RETURNS record
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_server_state';
COMMENT ON FUNCTION fs_server_state() IS
'server-wide figures: table sizes and use, fail-open and eviction counters, how state began; see the fs_stats view';

CREATE VIEW fs_stats AS SELECT * FROM fs_server_state();
GRANT SELECT ON fs_stats TO PUBLIC;
COMMENT ON VIEW fs_stats IS
'server-wide fairshare figures (all databases): capacity, fail_open, evictions, leases expired and re-registered';

CREATE FUNCTION fs_save_state()
RETURNS boolean
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_save_state_now';
COMMENT ON FUNCTION fs_save_state() IS
'writes fairshare''s running state file now (queues and leases): after a crash these leases re-register on renew';
REVOKE ALL ON FUNCTION fs_save_state() FROM PUBLIC;

CREATE FUNCTION fs_reset()
RETURNS void
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_reset';
COMMENT ON FUNCTION fs_reset() IS
'zeroes every fairshare counter; live state (slots, leases, balances) is kept';
REVOKE ALL ON FUNCTION fs_reset() FROM PUBLIC;
