-- test/extension_objects.sql: pg_temp.fs_objects() lists every object of the
-- fairshare extension in the current database with what makes it what it is
-- (definition, comment, privileges, columns, triggers, indexes), one line
-- per object (white space folded).  Included (\i) by sql/fairqueue_upgrade.sql.
CREATE FUNCTION pg_temp.fs_objects() RETURNS TABLE (object text, definition text) LANGUAGE sql AS $$
    SELECT pg_describe_object(d.classid, d.objid, 0),
           regexp_replace(concat_ws(' | ',
               obj_description(d.objid, d.classid::regclass::name),
               CASE d.classid
                   WHEN 'pg_proc'::regclass THEN
                       (SELECT concat_ws(' ', pg_get_functiondef(p.oid), p.proacl::text, p.proparallel, p.provolatile)
                          FROM pg_proc p WHERE p.oid = d.objid)
                   WHEN 'pg_class'::regclass THEN
                       (SELECT concat_ws(' ', c.relkind, c.relacl::text,
                                         CASE WHEN c.relkind = 'v' THEN pg_get_viewdef(c.oid) END,
                                         (SELECT string_agg(concat_ws(' ', a.attname, format_type(a.atttypid, a.atttypmod),
                                                                      a.attnotnull, pg_get_expr(ad.adbin, ad.adrelid),
                                                                      col_description(c.oid, a.attnum)), ', ' ORDER BY a.attnum)
                                            FROM pg_attribute a
                                            LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
                                           WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
                                         (SELECT string_agg(pg_get_triggerdef(t.oid), ', ' ORDER BY t.tgname)
                                            FROM pg_trigger t WHERE t.tgrelid = c.oid AND NOT t.tgisinternal),
                                         (SELECT string_agg(pg_get_indexdef(i.indexrelid), ', ' ORDER BY i.indexrelid::regclass::text)
                                            FROM pg_index i WHERE i.indrelid = c.oid))
                          FROM pg_class c WHERE c.oid = d.objid)
                   WHEN 'pg_type'::regclass THEN format_type(d.objid, NULL)
               END), '\s+', ' ', 'g')
      FROM pg_depend d
     WHERE d.refclassid = 'pg_extension'::regclass
       AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'fairshare')
       AND d.deptype = 'e'
$$;
