/* fairshare 0.2.0 -> 0.3.0: cron schedules and the background worker */

\echo Use "ALTER EXTENSION fairshare UPDATE TO '0.3.0'" to load this file. \quit

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
'the next n runs of a cron expression in a time zone strictly after a time, in order';

-- ---------------------------------------------------------------------------
-- Schedules
-- ---------------------------------------------------------------------------

-- Members of fairshare_admin see every role's schedules and runs and may
-- delete schedules.  Roles belong to the cluster, not to the extension: the
-- role is created once and left in place by DROP EXTENSION.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles
                    WHERE rolname OPERATOR(pg_catalog.=) 'fairshare_admin'::pg_catalog.name) THEN
        CREATE ROLE fairshare_admin NOLOGIN;
        COMMENT ON ROLE fairshare_admin IS
        'fairshare: members see every role''s schedules and runs, and may delete schedules';
    END IF;
END
$$;

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
'creates or changes the calling role''s schedule of that name; returns its id';

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
'claims the due runs of schedules without a command, each exactly once ever (the caller''s schedules; every role''s for superusers and fairshare_admin)';

CREATE VIEW fs_schedule_status WITH (security_invoker = true) AS
SELECT s.schedule_id, s.owner, s.name, st.cron, st.timezone, s.tenant, s.queue, s.payload,
       s.command, st.catchup, st.next_run_at, st.last_scheduled_for AS last_run_for,
       st.last_run_state, st.last_run_finished_at, st.last_error, st.last_error_at
  FROM @extschema@.fs_schedules s
  JOIN @extschema@.fs_schedule_state st ON st.schedule_id OPERATOR(pg_catalog.=) s.schedule_id;
COMMENT ON VIEW fs_schedule_status IS
'schedules with their next run, last run and last error (each role sees its own)';

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
