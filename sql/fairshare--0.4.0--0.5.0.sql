/* fairshare 0.4.0 -> 0.5.0: least privilege by default */

\echo Use "ALTER EXTENSION fairshare UPDATE TO '0.5.0'" to load this file. \quit

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
