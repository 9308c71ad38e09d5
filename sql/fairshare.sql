/*
 * fairshare: the install script of the current version.
 *
 * This is the source of truth for a fresh install; the build turns it into
 * fairshare--<version>.sql.  Every change here also goes into an upgrade
 * script fairshare--<old>--<new>.sql, and the regression test "upgrade"
 * checks that both ways give the same objects.
 */

\echo Use "CREATE EXTENSION fairshare" to load this file. \quit


-- ---------------------------------------------------------------------------
-- Roles
-- ---------------------------------------------------------------------------

-- Least privilege by default: PUBLIC may not decide or configure.  Three
-- NOLOGIN roles carry the privileges, granted by the objects below:
--   fairshare_app     decides: slots (its own leases), tokens, claims, tiers
--   fairshare_worker  reports worker heartbeats and queue latency
--   fairshare_admin   configures (limits, queues, counters, the state file),
--                     releases or renews any lease, sees every schedule; it
--                     is a member of the two others
-- Roles belong to the cluster, not to the extension: each is created when
-- missing (the extension may already be installed in another database, or
-- a concurrent CREATE EXTENSION may create it first) and left in place by
-- DROP EXTENSION.
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
COMMENT ON COLUMN fs_limits.max_slots IS 'most slots the tenant may hold at once (default: its fair-dequeue queue''s max_slots, else 1; 0 stops the tenant)';
COMMENT ON COLUMN fs_limits.min_slots IS 'slots the global gate always leaves the tenant, up to max_slots (default 0)';
COMMENT ON COLUMN fs_limits.weight IS 'relative share in fair dequeue (default 1)';
COMMENT ON COLUMN fs_limits.budget_ms_per_minute IS 'token budget in milliseconds of worker time per minute; NULL inherits, ''infinity'' means no budget (the default)';
COMMENT ON COLUMN fs_limits.throttle_pct IS 'percentage of its global-gate share the tenant gets, 0..100 (default 100)';
COMMENT ON COLUMN fs_limits.updated_at IS 'when the row was last changed';

-- Everyone may read the limits (decisions read them as the caller, and
-- pg_dump dumps them); fairshare_admin may change them.
GRANT SELECT ON fs_limits TO PUBLIC;
GRANT INSERT, UPDATE, DELETE, TRUNCATE ON fs_limits TO fairshare_admin;
SELECT pg_catalog.pg_extension_config_dump('fs_limits', '');

CREATE FUNCTION fs_limits_validate() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'fs_limits_validate';
COMMENT ON FUNCTION fs_limits_validate() IS
'trigger: rejects invalid rows of fs_limits with an error that says what is wrong';

CREATE FUNCTION fs_limits_changed() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'fs_limits_changed';
COMMENT ON FUNCTION fs_limits_changed() IS
'trigger: makes changes to fs_limits (and to fs_fair_queues, whose max_slots is a default of its tenants) reach shared memory when the transaction commits';

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
COMMENT ON FUNCTION fs_set_limit(text, text, integer, integer, double precision, double precision, double precision) IS
'sets limits of a tenant (''*'' for the queue default) in a queue (''*'' for every queue); NULL leaves a field as it is';
REVOKE ALL ON FUNCTION fs_set_limit(text, text, integer, integer, double precision, double precision, double precision) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_set_limit(text, text, integer, integer, double precision, double precision, double precision) TO fairshare_admin;

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
REVOKE ALL ON FUNCTION fs_effective_limits(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_effective_limits(text, text) TO fairshare_app;

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
REVOKE ALL ON FUNCTION fs_acquire_slot(text, text, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_acquire_slot(text, text, interval) TO fairshare_app;

CREATE FUNCTION fs_release_slot(lease_id bigint)
RETURNS boolean
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_release_slot';
COMMENT ON FUNCTION fs_release_slot(bigint) IS
'releases a lease of the calling role''s (any lease for fairshare_admin): true if it was live, false if unknown, expired or already released';
REVOKE ALL ON FUNCTION fs_release_slot(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_release_slot(bigint) TO fairshare_app;

CREATE FUNCTION fs_renew_slot(lease_id bigint, lease interval DEFAULT '5 minutes')
RETURNS boolean
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_renew_slot';
COMMENT ON FUNCTION fs_renew_slot(bigint, interval) IS
'extends a live lease of the calling role''s (any lease for fairshare_admin) to now + lease: true if renewed, false if unknown, expired or released';
REVOKE ALL ON FUNCTION fs_renew_slot(bigint, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_renew_slot(bigint, interval) TO fairshare_app;

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
REVOKE ALL ON FUNCTION fs_tenant_state() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_tenant_state() TO pg_monitor, fairshare_app, fairshare_worker;

CREATE VIEW fs_tenants AS SELECT * FROM fs_tenant_state();
GRANT SELECT ON fs_tenants TO pg_monitor, fairshare_app, fairshare_worker;
COMMENT ON VIEW fs_tenants IS
'live per-tenant state: slots in use, cached limits, token balance, backlog, and decisions by reason';

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
    OUT limits_unreadable bigint,
    OUT leases_expired bigint,
    OUT leases_orphaned bigint,
    OUT leases_reregistered bigint,
    OUT tier_keys bigint,
    OUT max_tier_keys integer,
    OUT tier_bytes_per_key integer,
    OUT tier_bytes_per_rule integer,
    OUT start_kind text,
    OUT started_at timestamptz,
    OUT stats_reset timestamptz)
RETURNS record
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_server_state';
COMMENT ON FUNCTION fs_server_state() IS
'server-wide figures: table sizes and use (tenants, leases, queues, tier counters), fail-open and eviction counters, how state began; see the fs_stats view';
REVOKE ALL ON FUNCTION fs_server_state() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_server_state() TO pg_monitor, fairshare_app, fairshare_worker;

CREATE VIEW fs_stats AS SELECT * FROM fs_server_state();
GRANT SELECT ON fs_stats TO pg_monitor, fairshare_app, fairshare_worker;
COMMENT ON VIEW fs_stats IS
'server-wide fairshare figures (all databases): capacity, fail_open, evictions, leases expired and re-registered';

CREATE FUNCTION fs_save_state()
RETURNS boolean
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_save_state_now';
COMMENT ON FUNCTION fs_save_state() IS
'writes fairshare''s running state file now (queues and leases): after a crash these leases re-register on renew';
REVOKE ALL ON FUNCTION fs_save_state() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_save_state() TO fairshare_admin;

CREATE FUNCTION fs_reset()
RETURNS void
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_reset';
COMMENT ON FUNCTION fs_reset() IS
'zeroes every fairshare counter; live state (slots, leases, balances) is kept';
REVOKE ALL ON FUNCTION fs_reset() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_reset() TO fairshare_admin;

-- ---------------------------------------------------------------------------
-- Budget
-- ---------------------------------------------------------------------------

CREATE FUNCTION fs_spend_tokens(
    tenant         text,
    requested_runs integer,
    cost_ms        integer DEFAULT 100,
    queue          text DEFAULT 'default')
RETURNS integer
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_spend_tokens';
COMMENT ON FUNCTION fs_spend_tokens(text, integer, integer, text) IS
'admits up to requested_runs runs of cost_ms tokens each from the tenant''s budget: returns the runs granted (0 under backpressure)';
REVOKE ALL ON FUNCTION fs_spend_tokens(text, integer, integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_spend_tokens(text, integer, integer, text) TO fairshare_app;

CREATE FUNCTION fs_charge_tokens(
    tenant  text,
    used_ms double precision,
    queue   text DEFAULT 'default')
RETURNS double precision
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_charge_tokens';
COMMENT ON FUNCTION fs_charge_tokens(text, double precision, text) IS
'pays used_ms of worker time from the tenant''s budget (the balance may go below zero); returns the balance, NULL without a budget';
REVOKE ALL ON FUNCTION fs_charge_tokens(text, double precision, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_charge_tokens(text, double precision, text) TO fairshare_app;

-- ---------------------------------------------------------------------------
-- Global gate and backpressure
-- ---------------------------------------------------------------------------

CREATE FUNCTION fs_worker_heartbeat(worker text, threads integer, queue text DEFAULT 'default')
RETURNS void
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_worker_heartbeat';
COMMENT ON FUNCTION fs_worker_heartbeat(text, integer, text) IS
'reports a live worker with this many threads serving the queue (0: it stops); live threads drive the global gate';
REVOKE ALL ON FUNCTION fs_worker_heartbeat(text, integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_worker_heartbeat(text, integer, text) TO fairshare_worker;

CREATE FUNCTION fs_report_latency(latency interval, queue text DEFAULT 'default')
RETURNS void
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_report_latency';
COMMENT ON FUNCTION fs_report_latency(interval, text) IS
'reports how long the queue''s oldest ready job has waited; over fairshare.backpressure_latency, admission grants nothing';
REVOKE ALL ON FUNCTION fs_report_latency(interval, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_report_latency(interval, text) TO fairshare_worker;

CREATE FUNCTION fs_worker_state(
    OUT queue text,
    OUT worker text,
    OUT threads integer,
    OUT last_heartbeat timestamptz,
    OUT live boolean)
RETURNS SETOF record
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_worker_state';
COMMENT ON FUNCTION fs_worker_state() IS
'the workers that reported heartbeats for this database''s queues; see the fs_workers view';
REVOKE ALL ON FUNCTION fs_worker_state() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_worker_state() TO pg_monitor, fairshare_app, fairshare_worker;

CREATE VIEW fs_workers AS SELECT * FROM fs_worker_state();
GRANT SELECT ON fs_workers TO pg_monitor, fairshare_app, fairshare_worker;
COMMENT ON VIEW fs_workers IS
'workers and their last heartbeats; live ones count towards their queue''s live threads';

CREATE FUNCTION fs_queue_state(
    OUT queue text,
    OUT tenants bigint,
    OUT live_workers integer,
    OUT live_threads integer,
    OUT slots_in_use integer,
    OUT free_threads integer,
    OUT tenant_share_threads double precision,
    OUT dampener double precision,
    OUT latency_ms double precision,
    OUT latency_reported_at timestamptz,
    OUT backpressure text)
RETURNS SETOF record
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_queue_state';
COMMENT ON FUNCTION fs_queue_state() IS
'the global gate''s view of every queue of this database; see the fs_queues view';
REVOKE ALL ON FUNCTION fs_queue_state() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_queue_state() TO pg_monitor, fairshare_app, fairshare_worker;

CREATE VIEW fs_queues AS SELECT * FROM fs_queue_state();
GRANT SELECT ON fs_queues TO pg_monitor, fairshare_app, fairshare_worker;
COMMENT ON VIEW fs_queues IS
'per queue: live workers and threads, slots in use, the share a tenant may hold now, the dampener, latency, and backpressure (none, latency, no_free_thread)';

-- ---------------------------------------------------------------------------
-- Decision log
-- ---------------------------------------------------------------------------

CREATE FUNCTION fs_decision_state(
    OUT decided_at timestamptz,
    OUT pid integer,
    OUT kind text,
    OUT queue text,
    OUT tenant text,
    OUT requested_runs integer,
    OUT runs_possible integer,
    OUT runs_granted integer,
    OUT tokens_before double precision,
    OUT tokens_consumed double precision,
    OUT balance_after double precision,
    OUT reason text,
    OUT seq bigint)
RETURNS SETOF record
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_decision_state';
COMMENT ON FUNCTION fs_decision_state() IS
'the most recent decisions of every backend (fairshare.decision_log_size each); see the fs_decisions view';
REVOKE ALL ON FUNCTION fs_decision_state() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_decision_state() TO pg_monitor, fairshare_app, fairshare_worker;

CREATE VIEW fs_decisions AS SELECT * FROM fs_decision_state();
GRANT SELECT ON fs_decisions TO pg_monitor, fairshare_app, fairshare_worker;
COMMENT ON VIEW fs_decisions IS
'recent decisions (kind slot, spend or charge): tokens before, runs possible, runs granted, tokens consumed, balance after, and the reason; seq orders the decisions of one pid';

-- ---------------------------------------------------------------------------
-- Greedy-tenant tiers
-- ---------------------------------------------------------------------------

CREATE FUNCTION fs_route_enqueue(
    tenant    text,
    job_class text,
    rules     jsonb,
    queue     text DEFAULT 'default')
RETURNS text
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_route_enqueue';
COMMENT ON FUNCTION fs_route_enqueue(text, text, jsonb, text) IS
'records an enqueue of the tenant''s job class and returns the queue to use: the last rule whose threshold is exceeded in its sliding window, else queue';
REVOKE ALL ON FUNCTION fs_route_enqueue(text, text, jsonb, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_route_enqueue(text, text, jsonb, text) TO fairshare_app;

CREATE FUNCTION fs_tier_state(
    OUT queue text,
    OUT tenant text,
    OUT job_class text,
    OUT rule integer,
    OUT per interval,
    OUT enqueues double precision,
    OUT last_enqueue_at timestamptz)
RETURNS SETOF record
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_tier_state';
COMMENT ON FUNCTION fs_tier_state() IS
'the sliding-window counters of greedy-tenant tiers; see the fs_tiers view';
REVOKE ALL ON FUNCTION fs_tier_state() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_tier_state() TO pg_monitor, fairshare_app, fairshare_worker;

CREATE VIEW fs_tiers AS SELECT * FROM fs_tier_state();
GRANT SELECT ON fs_tiers TO pg_monitor, fairshare_app, fairshare_worker;
COMMENT ON VIEW fs_tiers IS
'per (queue, tenant, job class) and rule: enqueues counted in the rule''s sliding window now';

-- ---------------------------------------------------------------------------
-- Cron expressions
-- ---------------------------------------------------------------------------

CREATE FUNCTION fs_next_run(cron text, timezone text, after timestamptz)
RETURNS timestamptz
LANGUAGE c IMMUTABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'fs_next_run';
COMMENT ON FUNCTION fs_next_run(text, text, timestamptz) IS
'the first run of a cron expression in a time zone strictly after a time; NULL if it never runs again';

CREATE FUNCTION fs_next_runs(cron text, timezone text, after timestamptz, n integer)
RETURNS SETOF timestamptz
LANGUAGE c IMMUTABLE PARALLEL SAFE ROWS 10
AS 'MODULE_PATHNAME', 'fs_next_runs';
COMMENT ON FUNCTION fs_next_runs(text, text, timestamptz, integer) IS
'the next n runs (at most 10000) of a cron expression in a time zone strictly after a time, in order';

-- ---------------------------------------------------------------------------
-- Schedules
-- ---------------------------------------------------------------------------

-- Members of fairshare_admin (created at the top of this script) see every
-- role's schedules and runs and may delete schedules.

CREATE TABLE fs_schedules (
    schedule_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner_oid   oid NOT NULL,
    owner       name NOT NULL,
    name        text NOT NULL,
    payload     jsonb NOT NULL,
    tenant      text,
    queue       text NOT NULL,
    command     text,
    created_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    updated_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    UNIQUE (owner_oid, name)
);

COMMENT ON TABLE fs_schedules IS
'Cron schedules, one per (owner role, name): what runs; fs_schedule_state says when.  Change them with fs_schedule() and fs_unschedule(); read them in fs_schedule_status.  Each role sees its own; members of fairshare_admin see all.';
COMMENT ON COLUMN fs_schedules.schedule_id IS 'identifies the schedule';
COMMENT ON COLUMN fs_schedules.owner_oid IS 'the role that created the schedule (its OID): its command runs as this role, and only this role sees the schedule and its runs (besides fairshare_admin)';
COMMENT ON COLUMN fs_schedules.owner IS 'the owner''s name when it last called fs_schedule() for the schedule; the command does not run while the role has another name';
COMMENT ON COLUMN fs_schedules.name IS 'name, unique per owner';
COMMENT ON COLUMN fs_schedules.payload IS 'handed to each run';
COMMENT ON COLUMN fs_schedules.tenant IS 'tenant of the runs, or NULL';
COMMENT ON COLUMN fs_schedules.queue IS 'queue of the runs';
COMMENT ON COLUMN fs_schedules.command IS 'SQL the background worker runs as the owner at each run; NULL: the application claims the runs with fs_claim_due_schedules()';
COMMENT ON COLUMN fs_schedules.created_at IS 'when the schedule was created';
COMMENT ON COLUMN fs_schedules.updated_at IS 'when fs_schedule() last changed it';

-- When a schedule runs, and how far it got.  Kept apart from fs_schedules so
-- that advancing it after each run writes a narrow row with two index entries.
CREATE TABLE fs_schedule_state (
    schedule_id          bigint PRIMARY KEY REFERENCES fs_schedules ON DELETE CASCADE,
    cron                 text NOT NULL,
    timezone             text NOT NULL,
    catchup              text NOT NULL
                         CHECK (catchup OPERATOR(pg_catalog.=) ANY (ARRAY['latest'::pg_catalog.text,
                                'all'::pg_catalog.text, 'skip'::pg_catalog.text])),
    has_command          boolean NOT NULL,
    next_run_at          timestamptz,
    last_scheduled_for   timestamptz,
    last_run_state       text,
    last_run_finished_at timestamptz,
    last_error           text,
    last_error_at        timestamptz
);
CREATE INDEX fs_schedule_state_app_due ON fs_schedule_state (next_run_at) WHERE NOT has_command;
CREATE INDEX fs_schedule_state_worker_due ON fs_schedule_state (next_run_at) WHERE has_command;

COMMENT ON TABLE fs_schedule_state IS
'When each schedule runs and how far it got; written only by fairshare.  Read it through fs_schedule_status.';
COMMENT ON COLUMN fs_schedule_state.schedule_id IS 'the schedule';
COMMENT ON COLUMN fs_schedule_state.cron IS 'five-field cron expression or @shorthand';
COMMENT ON COLUMN fs_schedule_state.timezone IS 'time zone the expression is read in (PostgreSQL''s tz database)';
COMMENT ON COLUMN fs_schedule_state.catchup IS 'after missed runs: latest (run the most recent once), all (run each, at most 100), skip (run none)';
COMMENT ON COLUMN fs_schedule_state.has_command IS 'the schedule has a command: the background worker claims its runs';
COMMENT ON COLUMN fs_schedule_state.next_run_at IS 'the next scheduled instant not yet claimed; NULL: never again';
COMMENT ON COLUMN fs_schedule_state.last_scheduled_for IS 'the last scheduled instant claimed (or skipped): next_run_at follows from it';
COMMENT ON COLUMN fs_schedule_state.last_run_state IS 'state of the last run: claimed, succeeded, failed or skipped';
COMMENT ON COLUMN fs_schedule_state.last_run_finished_at IS 'when the worker finished the last run';
COMMENT ON COLUMN fs_schedule_state.last_error IS 'the error of the last failed run, or why the schedule stopped';
COMMENT ON COLUMN fs_schedule_state.last_error_at IS 'when that error happened';

CREATE TABLE fs_schedule_runs (
    schedule_id   bigint NOT NULL,
    scheduled_for timestamptz NOT NULL,
    owner_oid     oid NOT NULL,
    owner         text NOT NULL,
    name          text NOT NULL,
    state         text NOT NULL
                  CHECK (state OPERATOR(pg_catalog.=) ANY (ARRAY['claimed'::pg_catalog.text,
                         'succeeded'::pg_catalog.text, 'failed'::pg_catalog.text,
                         'skipped'::pg_catalog.text])),
    claimed_at    timestamptz NOT NULL,
    finished_at   timestamptz,
    error         text,
    missed_since  timestamptz,
    PRIMARY KEY (schedule_id, scheduled_for)
);
CREATE INDEX fs_schedule_runs_claimed_at ON fs_schedule_runs USING brin (claimed_at);

COMMENT ON TABLE fs_schedule_runs IS
'The ledger of runs: one row per (schedule, scheduled instant), claimed exactly once.  Rows older than fairshare.run_retention are deleted by the worker.';
COMMENT ON COLUMN fs_schedule_runs.schedule_id IS 'the schedule (it may have been removed since)';
COMMENT ON COLUMN fs_schedule_runs.scheduled_for IS 'the scheduled instant this run is for';
COMMENT ON COLUMN fs_schedule_runs.owner_oid IS 'the role that owns the schedule (its OID)';
COMMENT ON COLUMN fs_schedule_runs.owner IS 'name of the owner when the run was claimed';
COMMENT ON COLUMN fs_schedule_runs.name IS 'name of the schedule';
COMMENT ON COLUMN fs_schedule_runs.state IS 'claimed (handed to the application, or being run), succeeded, failed, or skipped (catchup ''skip'')';
COMMENT ON COLUMN fs_schedule_runs.claimed_at IS 'when the run was claimed';
COMMENT ON COLUMN fs_schedule_runs.finished_at IS 'when the worker finished the command';
COMMENT ON COLUMN fs_schedule_runs.error IS 'the error the command raised';
COMMENT ON COLUMN fs_schedule_runs.missed_since IS 'scheduled instants from this one up to scheduled_for (excluded) were not run, by the catch-up policy';

-- Every name in the expressions of the policies, views, defaults and checks
-- is schema-qualified and every literal typed: they are resolved when this
-- script runs, with the extension's schema on search_path, where a role
-- allowed to create objects there could have put a better match for an
-- untyped call (say public.pg_has_role(text, text)).
ALTER TABLE fs_schedules ENABLE ROW LEVEL SECURITY;
-- Owners are roles, not names: a role created with the name of a dropped
-- owner does not see its schedules.
CREATE POLICY fs_schedules_read ON fs_schedules FOR SELECT
    USING (owner_oid OPERATOR(pg_catalog.=)
               (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER)
           OR pg_catalog.pg_has_role('fairshare_admin'::pg_catalog.name, 'MEMBER'::pg_catalog.text));
CREATE POLICY fs_schedules_admin_delete ON fs_schedules FOR DELETE
    USING (pg_catalog.pg_has_role('fairshare_admin'::pg_catalog.name, 'MEMBER'::pg_catalog.text));
-- A state row is visible with its schedule (the subquery is subject to the
-- policies above).
ALTER TABLE fs_schedule_state ENABLE ROW LEVEL SECURITY;
CREATE POLICY fs_schedule_state_read ON fs_schedule_state FOR SELECT
    USING (EXISTS (SELECT FROM @extschema@.fs_schedules s
                    WHERE s.schedule_id OPERATOR(pg_catalog.=) fs_schedule_state.schedule_id));
ALTER TABLE fs_schedule_runs ENABLE ROW LEVEL SECURITY;
CREATE POLICY fs_schedule_runs_read ON fs_schedule_runs FOR SELECT
    USING (owner_oid OPERATOR(pg_catalog.=)
               (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER)
           OR pg_catalog.pg_has_role('fairshare_admin'::pg_catalog.name, 'MEMBER'::pg_catalog.text));
GRANT SELECT ON fs_schedules, fs_schedule_state, fs_schedule_runs TO PUBLIC;
GRANT DELETE ON fs_schedules TO fairshare_admin;

-- Schedules are configuration: pg_dump dumps them (and the sequence, which
-- it reads, so everyone may).  The ledger is history: it is not dumped.
SELECT pg_catalog.pg_extension_config_dump('fs_schedules', '');
COMMENT ON SEQUENCE fs_schedules_schedule_id_seq IS 'numbers schedules';
GRANT SELECT ON SEQUENCE fs_schedules_schedule_id_seq TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('fs_schedules_schedule_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('fs_schedule_state', '');

CREATE FUNCTION fs_schedule(
    name     text,
    cron     text,
    timezone text DEFAULT 'UTC',
    payload  jsonb DEFAULT '{}',
    tenant   text DEFAULT NULL,
    queue    text DEFAULT 'default',
    command  text DEFAULT NULL,
    catchup  text DEFAULT 'latest')
RETURNS bigint
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_schedule';
COMMENT ON FUNCTION fs_schedule(text, text, text, jsonb, text, text, text, text) IS
'creates or changes the calling role''s schedule of that name; returns its id.  Refuses commands that can never run (transaction control, COPY to or from the client, statements that cannot run in a transaction, SET ROLE)';

CREATE FUNCTION fs_unschedule(name text)
RETURNS boolean
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_unschedule';
COMMENT ON FUNCTION fs_unschedule(text) IS
'removes the calling role''s schedule of that name: true if there was one';

CREATE FUNCTION fs_claim_due_schedules(max_runs integer DEFAULT 1000, as_of timestamptz DEFAULT pg_catalog.now())
RETURNS TABLE(schedule_id bigint, name text, tenant text, queue text, scheduled_for timestamptz, payload jsonb)
LANGUAGE c VOLATILE PARALLEL UNSAFE ROWS 100
AS 'MODULE_PATHNAME', 'fs_claim_due_schedules';
COMMENT ON FUNCTION fs_claim_due_schedules(integer, timestamptz) IS
'claims the due runs of schedules without a command, each exactly once ever (the caller''s schedules; every role''s for superusers and fairshare_admin); as_of at most a minute after now';

CREATE VIEW fs_schedule_status WITH (security_invoker = true) AS
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

CREATE VIEW fs_recent_runs WITH (security_invoker = true) AS
SELECT schedule_id, owner, name, scheduled_for, state, claimed_at, finished_at,
       finished_at OPERATOR(pg_catalog.-) claimed_at AS duration, error, missed_since
  FROM @extschema@.fs_schedule_runs;
COMMENT ON VIEW fs_recent_runs IS
'runs of the last fairshare.run_retention (each role sees its own): state, duration, error, and runs missed before each';
GRANT SELECT ON fs_schedule_status, fs_recent_runs TO PUBLIC;

-- ---------------------------------------------------------------------------
-- The background worker
-- ---------------------------------------------------------------------------

CREATE FUNCTION fs_current_run(
    OUT schedule_id bigint,
    OUT name text,
    OUT tenant text,
    OUT queue text,
    OUT scheduled_for timestamptz,
    OUT payload jsonb)
RETURNS record
LANGUAGE c STABLE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_current_run';
COMMENT ON FUNCTION fs_current_run() IS
'inside a schedule''s command run by the background worker: the run (schedule, scheduled time, payload, tenant, queue); NULLs elsewhere';

CREATE FUNCTION fs_scheduler_state(
    OUT launcher_pid integer,
    OUT scheduler_pid integer,
    OUT database text,
    OUT state text,
    OUT last_pass_at timestamptz,
    OUT last_pass_ms double precision,
    OUT last_pass_runs bigint,
    OUT runs_succeeded bigint,
    OUT runs_failed bigint,
    OUT runs_pruned bigint,
    OUT last_sweep_at timestamptz,
    OUT leases_swept bigint,
    OUT last_state_save_at timestamptz,
    OUT enabled boolean)
RETURNS record
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_scheduler_state';
COMMENT ON FUNCTION fs_scheduler_state() IS
'the background worker''s processes and what they did; see the fs_scheduler view';

CREATE VIEW fs_scheduler AS SELECT * FROM @extschema@.fs_scheduler_state();
GRANT SELECT ON fs_scheduler TO PUBLIC;
COMMENT ON VIEW fs_scheduler IS
'fairshare''s background worker (whole server): launcher and scheduler, its state, the last minute''s pass, runs and sweeps';

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
    registered_at  timestamptz NOT NULL DEFAULT now(),
    selector       text,
    max_slots      integer CHECK (max_slots >= 0),
    lease          interval CHECK (lease > interval '0' AND lease <= interval '366 days'),
    subkey         text
);

COMMENT ON TABLE fs_fair_queues IS
'Queues registered for fair dequeue, one row per queue, written by fs_register_queue().  SQL is stored in canonical form: names outside pg_catalog schema-qualified.';
COMMENT ON COLUMN fs_fair_queues.queue IS 'the fairshare queue: its limits, slots and fair order';
COMMENT ON COLUMN fs_fair_queues.ready_table IS 'the table whose rows are the jobs to claim';
COMMENT ON COLUMN fs_fair_queues.tenant IS 'expression over a ready row giving its tenant (text)';
COMMENT ON COLUMN fs_fair_queues.order_by IS 'order of a tenant''s rows (ORDER BY list)';
COMMENT ON COLUMN fs_fair_queues.ready_filter IS 'the filter''s conjuncts that depend on the row alone: the backlog the triggers count, and the index predicate; NULL: every row';
COMMENT ON COLUMN fs_fair_queues.claim_filter IS 'the filter''s other conjuncts (such as scheduled_at <= now()), checked when claiming only';
COMMENT ON COLUMN fs_fair_queues.key IS 'expression identifying a ready row: a NOT NULL column or expression with a unique index on exactly it (by default the primary key)';
COMMENT ON COLUMN fs_fair_queues.key_type IS 'type of key and running_key';
COMMENT ON COLUMN fs_fair_queues.running_table IS 'table whose rows mark a claimed job as running: when the row leaves it, the lease is released; NULL: no automatic release';
COMMENT ON COLUMN fs_fair_queues.running_filter IS 'which rows of running_table are running (NULL: every row)';
COMMENT ON COLUMN fs_fair_queues.running_key IS 'expression over a running row giving the same value as key';
COMMENT ON COLUMN fs_fair_queues.cost IS 'expression giving a row''s cost in the fair order; NULL: 1 per row';
COMMENT ON COLUMN fs_fair_queues.charge_runtime IS 'charge the lease''s held time (ms) when the row leaves running_table';
COMMENT ON COLUMN fs_fair_queues.ready_index IS 'the index that serves claims (NULL: none was found or made)';
COMMENT ON COLUMN fs_fair_queues.enqueued_at IS 'expression over a ready row giving when it became ready (timestamptz): the queue''s latency, for backpressure, is the age of its oldest ready row; NULL: not measured';
COMMENT ON COLUMN fs_fair_queues.index_created IS 'fs_register_queue() created ready_index, and fs_unregister_queue() drops it';
COMMENT ON COLUMN fs_fair_queues.registered_by IS 'role that registered the queue: once its ready table is dropped, only this role (or a role with its privileges) may register the name again or unregister it';
COMMENT ON COLUMN fs_fair_queues.registered_at IS 'when the queue was last registered';
COMMENT ON COLUMN fs_fair_queues.max_slots IS 'most slots a tenant of the queue may hold at once when no row of fs_limits sets its max_slots; NULL: no limit (a lone tenant may use every free worker)';
COMMENT ON COLUMN fs_fair_queues.lease IS 'the lease of a claim that passes none; NULL: 5 minutes';
COMMENT ON COLUMN fs_fair_queues.subkey IS 'expression over a ready row giving its sub-key within its tenant (text): the tenant''s share is split fairly among its sub-keys (fs_subkey_weights); NULL: one level of fair order';
COMMENT ON COLUMN fs_fair_queues.selector IS 'expression over a ready row giving the text a claim may select rows by (fs_claim()''s selector_in and selector_not_in), such as queue_name; NULL: claims take no selection';

GRANT SELECT ON fs_fair_queues TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('fs_fair_queues', '');

CREATE FUNCTION fs_fair_queues_changed() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'fs_fair_queues_changed';
COMMENT ON FUNCTION fs_fair_queues_changed() IS
'trigger: makes every session reload fair-dequeue registrations when the changing transaction commits';

CREATE TRIGGER fs_fair_queues_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON fs_fair_queues
    FOR EACH STATEMENT EXECUTE FUNCTION fs_fair_queues_changed();
-- A queue's max_slots is a limit of its tenants: it reaches them at commit
-- as a change to fs_limits does.
CREATE TRIGGER fs_fair_queues_limits_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON fs_fair_queues
    FOR EACH STATEMENT EXECUTE FUNCTION fs_limits_changed();

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

CREATE FUNCTION fs_fair_tables_dropped() RETURNS event_trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'fs_fair_tables_dropped';
COMMENT ON FUNCTION fs_fair_tables_dropped() IS
'event trigger ON sql_drop: removes the registration of a queue whose ready or running table was dropped (its row, the triggers and index on its other table, its counts), with a notice';
CREATE EVENT TRIGGER fs_fair_tables_dropped ON sql_drop
    EXECUTE FUNCTION fs_fair_tables_dropped();
COMMENT ON EVENT TRIGGER fs_fair_tables_dropped IS
'fair dequeue: a dropped ready or running table takes its registration with it';

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

CREATE FUNCTION fs_unregister_queue(queue text)
RETURNS boolean
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_unregister_queue';
COMMENT ON FUNCTION fs_unregister_queue(text) IS
'removes a queue''s registration, its triggers and the index it created: true if it was registered; the caller must own its table, or, if the table was dropped, be the role that registered it';
REVOKE ALL ON FUNCTION fs_unregister_queue(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_unregister_queue(text) TO fairshare_admin;

-- ---------------------------------------------------------------------------
-- Claiming
-- ---------------------------------------------------------------------------

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

CREATE FUNCTION fs_ready_tenants(
    queue       text,
    max_tenants integer DEFAULT 100)
RETURNS TABLE (tenant text, ready_rows bigint, free_slots integer,
               virtual_start double precision, weight double precision)
LANGUAGE c VOLATILE PARALLEL UNSAFE ROWS 100
AS 'MODULE_PATHNAME', 'fs_ready_tenants';
COMMENT ON FUNCTION fs_ready_tenants(text, integer) IS
'tenants of a registered queue with ready rows and free slots, in fair order: for an application''s own LATERAL ... FOR UPDATE SKIP LOCKED claim; needs SELECT on the table and a role row-level security does not restrict on it';
REVOKE ALL ON FUNCTION fs_ready_tenants(text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_ready_tenants(text, integer) TO fairshare_app;

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

CREATE FUNCTION fs_resync(queue text DEFAULT NULL)
RETURNS TABLE (queue_name text, tenants integer, ready_rows bigint)
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_resync';
COMMENT ON FUNCTION fs_resync(text) IS
'recounts the ready rows of a registered queue (NULL: every registered queue of this database) from its table';
REVOKE ALL ON FUNCTION fs_resync(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_resync(text) TO fairshare_admin;

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
REVOKE ALL ON FUNCTION fs_fairness_state() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_fairness_state() TO pg_monitor, fairshare_app, fairshare_worker;

CREATE VIEW fs_fairness AS SELECT * FROM fs_fairness_state();
GRANT SELECT ON fs_fairness TO pg_monitor, fairshare_app, fairshare_worker;
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
REVOKE ALL ON FUNCTION fs_fair_share_state() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fs_fair_share_state() TO pg_monitor, fairshare_app, fairshare_worker;

CREATE VIEW fs_fair_shares AS SELECT * FROM fs_fair_share_state();
GRANT SELECT ON fs_fair_shares TO pg_monitor, fairshare_app, fairshare_worker;
COMMENT ON VIEW fs_fair_shares IS
'per tenant of a registered queue that is active or was served recently: served work (decayed), its share, its fair share by weight, their ratio, and its virtual finish tag and lag behind the queue''s virtual time';

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
