/* fairshare 0.4.0 -> 0.5.0: least privilege by default */

\echo Use "ALTER EXTENSION fairshare UPDATE TO '0.5.0'" to load this file. \quit

-- ---------------------------------------------------------------------------
-- Fair dequeue: unique keys, the registrant's queue names, fs_ready_tenants()
-- and row-level security (the rules are in the C code; only comments change)
-- ---------------------------------------------------------------------------

COMMENT ON COLUMN fs_fair_queues.key IS 'expression identifying a ready row: a NOT NULL column or expression with a unique index on exactly it (by default the primary key)';
COMMENT ON COLUMN fs_fair_queues.registered_by IS 'role that registered the queue: once its ready table is dropped, only this role (or a role with its privileges) may register the name again or unregister it';
COMMENT ON FUNCTION fs_register_queue(text, regclass, text, text, text, text, regclass, text, text, text, boolean, boolean, text) IS
'registers (or re-registers) a ready table for fair dequeue: validates the SQL (the key must have a unique index and never be NULL), adds triggers and, if none serves, an index; the caller must own the tables (and, for a queue whose table was dropped, be the role that registered it)';
COMMENT ON FUNCTION fs_unregister_queue(text) IS
'removes a queue''s registration, its triggers and the index it created: true if it was registered; the caller must own its table, or, if the table was dropped, be the role that registered it';
COMMENT ON FUNCTION fs_ready_tenants(text, integer) IS
'tenants of a registered queue with ready rows and free slots, in fair order: for an application''s own LATERAL ... FOR UPDATE SKIP LOCKED claim; needs SELECT on the table and a role row-level security does not restrict on it';
