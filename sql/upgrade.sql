--
-- Upgrading: ALTER EXTENSION fairshare UPDATE from 0.1.0 gives exactly the
-- objects of a fresh install, and keeps the limits table's rows.
--
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS fairshare;
CREATE SCHEMA upgrade_check;

-- Every object of the extension, described the same way for both installs.
CREATE FUNCTION upgrade_check.objects() RETURNS SETOF text LANGUAGE sql AS $$
    SELECT pg_describe_object(classid, objid, 0) || coalesce(' -> ' || (
               SELECT pg_get_function_identity_arguments(objid) || ' returns ' ||
                      pg_get_function_result(objid) || ' ' || p.provolatile::text || p.proparallel::text
                 FROM pg_proc p WHERE p.oid = objid AND classid = 'pg_proc'::regclass), '') ||
           coalesce(' : ' || obj_description(objid, classid::regclass::name), ' : (no comment)')
      FROM pg_depend
     WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
       AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'fairshare')
$$;
CREATE FUNCTION upgrade_check.columns() RETURNS SETOF text LANGUAGE sql AS $$
    SELECT c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
      FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
     WHERE c.relnamespace = 'public'::regnamespace AND c.relname LIKE 'fs\_%'
       AND a.attnum > 0 AND NOT a.attisdropped
$$;

CREATE EXTENSION fairshare;
SELECT extversion AS fresh_version FROM pg_extension WHERE extname = 'fairshare';
CREATE TABLE upgrade_check.fresh AS
    SELECT upgrade_check.objects() AS o UNION ALL SELECT upgrade_check.columns();
DROP EXTENSION fairshare;

CREATE EXTENSION fairshare VERSION '0.1.0';
SELECT fs_set_limit('kept', max_slots => 3);
ALTER EXTENSION fairshare UPDATE;
SELECT extversion AS updated_version FROM pg_extension WHERE extname = 'fairshare';
CREATE TABLE upgrade_check.updated AS
    SELECT upgrade_check.objects() AS o UNION ALL SELECT upgrade_check.columns();

SELECT 'only in fresh install' AS side, o FROM (SELECT o FROM upgrade_check.fresh EXCEPT ALL SELECT o FROM upgrade_check.updated) x
UNION ALL
SELECT 'only after update', o FROM (SELECT o FROM upgrade_check.updated EXCEPT ALL SELECT o FROM upgrade_check.fresh) y
ORDER BY 1, 2;
SELECT count(*) > 20 AS compared_many_objects FROM upgrade_check.fresh;
SELECT tenant, max_slots FROM fs_limits;
TRUNCATE fs_limits;
DROP SCHEMA upgrade_check CASCADE;
RESET client_min_messages;
