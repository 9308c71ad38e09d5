--
-- ALTER EXTENSION fairshare UPDATE from 0.1.0 gives the same objects as a
-- fresh install: compared in two scratch databases, object by object
-- (definitions, comments, privileges, columns, triggers, indexes).
--
\set QUIET on
SET client_min_messages = warning;
DROP DATABASE IF EXISTS fs_upgrade_fresh;
DROP DATABASE IF EXISTS fs_upgrade_updated;
CREATE DATABASE fs_upgrade_fresh;
CREATE DATABASE fs_upgrade_updated;
\c fs_upgrade_updated
CREATE EXTENSION fairshare VERSION '0.1.0';
ALTER EXTENSION fairshare UPDATE;
\set ECHO none
\i test/extension_objects.sql
\set ECHO all
SELECT extversion AS updated_to, count(*) >= 30 AS many_objects,
       string_agg(object || E'\t' || definition, E'\n' ORDER BY object) AS updated_objects
  FROM pg_temp.fs_objects(), pg_extension WHERE extname = 'fairshare' GROUP BY extversion \gset
\c fs_upgrade_fresh
CREATE EXTENSION fairshare;
\set ECHO none
\i test/extension_objects.sql
\set ECHO all
\set QUIET off
SELECT :'updated_to' AS updated_to, extversion AS fresh, :'many_objects' AS many_objects
  FROM pg_extension WHERE extname = 'fairshare';
-- Objects that differ (none):
WITH updated AS (
    SELECT split_part(line, E'\t', 1) AS object, substr(line, strpos(line, E'\t') + 1) AS definition
      FROM regexp_split_to_table(:'updated_objects', E'\n') line)
SELECT coalesce(f.object, u.object) AS differs,
       CASE WHEN f.object IS NULL THEN 'only after update' WHEN u.object IS NULL THEN 'only in a fresh install'
            ELSE 'definition' END AS how
  FROM pg_temp.fs_objects() f FULL JOIN updated u ON u.object = f.object
 WHERE f.definition IS DISTINCT FROM u.definition
 ORDER BY 1;
\c contrib_regression
\set QUIET on
DROP DATABASE fs_upgrade_fresh;
DROP DATABASE fs_upgrade_updated;
