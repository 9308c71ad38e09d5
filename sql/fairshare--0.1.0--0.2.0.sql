/* fairshare 0.1.0 -> 0.2.0: cron schedules */

\echo Use "ALTER EXTENSION fairshare UPDATE TO '0.2.0'" to load this file. \quit

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
