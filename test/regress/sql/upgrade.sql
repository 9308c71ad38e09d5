--
-- ALTER EXTENSION fairshare UPDATE from every earlier version gives exactly
-- the objects of a fresh install of the current version.
--
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS fairshare CASCADE;
RESET client_min_messages;

-- Every object of the extension, described with its definition, comment
-- and privileges, so that two installs can be compared as sets of rows.
CREATE TEMP VIEW fairshare_objects AS
WITH members AS (
  SELECT d.classid, d.objid, d.objsubid
    FROM pg_depend d
   WHERE d.refclassid = 'pg_extension'::regclass
     AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'fairshare')
     AND d.deptype = 'e')
SELECT pg_describe_object(classid, objid, 0) AS object,
       coalesce(obj_description(objid, classid::regclass::name), '') AS comment,
       CASE classid
         WHEN 'pg_proc'::regclass THEN pg_get_functiondef(objid) || ' acl ' ||
              coalesce((SELECT proacl::text FROM pg_proc WHERE oid = objid), '')
         WHEN 'pg_class'::regclass THEN
              (SELECT relkind::text || ' ' || coalesce(relacl::text, '') || ' ' ||
                      coalesce(array_to_string(reloptions, ','), '') || ' rls ' ||
                      relrowsecurity::text || ' ' ||
                      coalesce(pg_get_viewdef(c.oid), '') FROM pg_class c WHERE c.oid = objid)
         ELSE ''
       END AS definition
  FROM members
UNION ALL
-- Columns, constraints, indexes, policies and triggers of member tables.
SELECT 'column ' || a.attrelid::regclass || '.' || a.attname,
       coalesce(col_description(a.attrelid, a.attnum), ''),
       format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull || ' ' || a.attidentity::text ||
       ' ' || coalesce(pg_get_expr(ad.adbin, ad.adrelid), '') || ' #' || a.attnum
  FROM pg_attribute a JOIN members m ON m.classid = 'pg_class'::regclass AND m.objid = a.attrelid
  LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
 WHERE a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'constraint ' || conrelid::regclass || '.' || conname, '', pg_get_constraintdef(c.oid)
  FROM pg_constraint c JOIN members m ON m.classid = 'pg_class'::regclass AND m.objid = c.conrelid
UNION ALL
SELECT 'index ' || i.indexrelid::regclass, '', pg_get_indexdef(i.indexrelid)
  FROM pg_index i JOIN members m ON m.classid = 'pg_class'::regclass AND m.objid = i.indrelid
UNION ALL
SELECT 'policy ' || schemaname || '.' || tablename || '.' || policyname, '',
       cmd || ' ' || roles::text || ' ' || coalesce(qual, '') || ' ' || coalesce(with_check, '')
  FROM pg_policies WHERE tablename LIKE 'fs\_%'
UNION ALL
SELECT 'trigger ' || tgrelid::regclass || '.' || tgname, '', pg_get_triggerdef(t.oid)
  FROM pg_trigger t JOIN members m ON m.classid = 'pg_class'::regclass AND m.objid = t.tgrelid
 WHERE NOT t.tgisinternal
UNION ALL
SELECT 'extension', '', extversion || ' ' || extrelocatable || ' ' ||
       coalesce(array_to_string(extcondition, ','), '')
  FROM pg_extension WHERE extname = 'fairshare';

-- Update from 0.1.0, step by step, to the default version.
CREATE EXTENSION fairshare VERSION '0.1.0';
SELECT extversion FROM pg_extension WHERE extname = 'fairshare';
ALTER EXTENSION fairshare UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'fairshare';
CREATE TEMP TABLE updated AS SELECT * FROM fairshare_objects;

-- A fresh install of the default version.
DROP EXTENSION fairshare;
CREATE EXTENSION fairshare;
CREATE TEMP TABLE fresh AS SELECT * FROM fairshare_objects;

SELECT count(*) > 100 AS many_objects_compared FROM fresh;
-- Differences (none).
(SELECT 'only after update' AS side, * FROM updated EXCEPT SELECT 'only after update', * FROM fresh)
UNION ALL
(SELECT 'only in fresh install', * FROM fresh EXCEPT SELECT 'only in fresh install', * FROM updated)
ORDER BY 1, 2;

-- An update keeps what users configured.
DROP EXTENSION fairshare;
CREATE EXTENSION fairshare VERSION '0.1.0';
SELECT fs_set_limit('kept', max_slots => 3);
ALTER EXTENSION fairshare UPDATE;
SELECT tenant, max_slots FROM fs_limits;
TRUNCATE fs_limits;

-- A queue registered by 0.4.0 keeps max_slots 1, what its tenants had then
-- (registered from 0.5.0 on without max_slots, a queue sets no limit).
-- Until the update, this library refuses to register through 0.4.0's SQL;
-- the row is stored as 0.4.0 stored it.
DROP EXTENSION fairshare;
CREATE EXTENSION fairshare VERSION '0.4.0';
CREATE TABLE up_jobs (id int PRIMARY KEY, tenant text NOT NULL);
SELECT queue FROM fs_register_queue('up', 'up_jobs', 'tenant', 'id');
INSERT INTO fs_fair_queues (queue, ready_table, tenant, order_by, key, key_type, registered_by)
VALUES ('up', 'up_jobs', 'tenant', 'id', 'id', 'integer', current_user::regrole);
SELECT max_slots FROM fs_effective_limits('t', 'up');
ALTER EXTENSION fairshare UPDATE;
SELECT queue, max_slots, lease FROM fs_fair_queues;
SELECT max_slots FROM fs_effective_limits('t', 'up');
SELECT queue, max_slots FROM fs_register_queue('up', 'up_jobs', 'tenant', 'id');
SELECT max_slots FROM fs_effective_limits('t', 'up');
SELECT fs_unregister_queue('up');
DROP TABLE up_jobs;

-- Functions that a role allowed to create objects in the extension's
-- schema could put there before CREATE EXTENSION or ALTER EXTENSION
-- UPDATE, to capture calls in the policies, views, defaults and checks:
-- none of the extension's objects uses them, installed either way.
DROP EXTENSION fairshare;
CREATE SCHEMA fs_decoy;
CREATE FUNCTION fs_decoy.pg_has_role(text, text) RETURNS boolean
    LANGUAGE sql AS 'SELECT true';
CREATE FUNCTION fs_decoy.now() RETURNS timestamptz
    LANGUAGE sql AS $$SELECT timestamptz 'epoch'$$;
CREATE TEMP VIEW decoy_uses AS
SELECT pg_describe_object(d.classid, d.objid, d.objsubid) AS object,
       pg_describe_object(d.refclassid, d.refobjid, 0) AS uses
  FROM pg_depend d JOIN pg_proc p ON d.refclassid = 'pg_proc'::regclass AND p.oid = d.refobjid
 WHERE p.pronamespace = 'fs_decoy'::regnamespace
   AND NOT EXISTS (SELECT FROM pg_depend e
                    WHERE e.classid = 'pg_proc'::regclass AND e.objid = p.oid AND e.deptype = 'e');
CREATE EXTENSION fairshare SCHEMA fs_decoy VERSION '0.1.0';
ALTER EXTENSION fairshare UPDATE;
SELECT * FROM decoy_uses;
-- The policies call pg_catalog's pg_has_role(name, text).
SELECT policyname, qual FROM pg_policies WHERE schemaname = 'fs_decoy' ORDER BY 1;
DROP EXTENSION fairshare;
CREATE EXTENSION fairshare SCHEMA fs_decoy;
SELECT * FROM decoy_uses;
SET client_min_messages = warning;
DROP EXTENSION fairshare;
DROP SCHEMA fs_decoy CASCADE;
RESET client_min_messages;
CREATE EXTENSION fairshare;

-- The roles belong to the cluster.  Installing or updating brings the
-- comment that versions before 0.5.0 gave fairshare_admin up to date, and
-- keeps a comment of the administrator's own.
CREATE TEMP VIEW admin_comment AS
SELECT shobj_description(oid, 'pg_authid') AS comment FROM pg_roles WHERE rolname = 'fairshare_admin';
CREATE TEMP TABLE current_comment AS SELECT * FROM admin_comment;
DROP EXTENSION fairshare;
COMMENT ON ROLE fairshare_admin IS
'fairshare: members see every role''s schedules and runs, and may delete schedules';
CREATE EXTENSION fairshare VERSION '0.4.0';
ALTER EXTENSION fairshare UPDATE;
SELECT comment = (SELECT comment FROM current_comment) AS brought_up_to_date FROM admin_comment;
DROP EXTENSION fairshare;
COMMENT ON ROLE fairshare_admin IS 'our job scheduling administrators';
CREATE EXTENSION fairshare;
SELECT comment AS kept FROM admin_comment;
SELECT format('COMMENT ON ROLE fairshare_admin IS %L', comment) FROM current_comment \gexec
-- Installing again (as into a second database) finds the roles and keeps
-- their memberships.
SELECT pg_has_role('fairshare_admin', 'fairshare_app', 'MEMBER') AND
       pg_has_role('fairshare_admin', 'fairshare_worker', 'MEMBER') AS memberships;
