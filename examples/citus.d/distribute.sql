-- Solid Queue's claim path distributed by tenant on Citus: the ready and
-- claimed executions, by queue_name (the demo's tenant), colocated, so that
-- a tenant's waiting and running jobs live on one worker node, where
-- fairshare claims, counts and limits them.  The rest of Solid Queue's
-- tables (jobs, processes, pauses, ...) stay on the coordinator: Solid
-- Queue finds them by id, with no tenant in its queries.
--
-- What Citus needs of a distributed table, made here on Solid Queue's own
-- schema (queue_schema.rb, just loaded):
--   * no foreign key to a table on the coordinator: the two to
--     solid_queue_jobs are dropped;
--   * every unique key holds the distribution column: the primary keys
--     become unique indexes on (queue_name, id) (the models keep id as their
--     primary key: Fairshare::SolidQueue.enable!(citus: true)), and the
--     unique job_id indexes become (queue_name, job_id);
--   * the claimed executions get a queue_name, written by the integration
--     when it claims.
DO $$
DECLARE
    fk record;
BEGIN
    FOR fk IN SELECT conrelid::regclass AS rel, conname
                FROM pg_constraint
               WHERE contype = 'f'
                 AND conrelid IN ('solid_queue_ready_executions'::regclass,
                                  'solid_queue_claimed_executions'::regclass)
    LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', fk.rel, fk.conname);
    END LOOP;
END
$$;

ALTER TABLE solid_queue_claimed_executions ADD COLUMN queue_name varchar NOT NULL;

ALTER TABLE solid_queue_ready_executions DROP CONSTRAINT solid_queue_ready_executions_pkey;
CREATE UNIQUE INDEX solid_queue_ready_executions_queue_name_id
    ON solid_queue_ready_executions (queue_name, id);
DROP INDEX index_solid_queue_ready_executions_on_job_id;
CREATE UNIQUE INDEX index_solid_queue_ready_executions_on_job_id
    ON solid_queue_ready_executions (queue_name, job_id);

ALTER TABLE solid_queue_claimed_executions DROP CONSTRAINT solid_queue_claimed_executions_pkey;
CREATE UNIQUE INDEX solid_queue_claimed_executions_queue_name_id
    ON solid_queue_claimed_executions (queue_name, id);
DROP INDEX index_solid_queue_claimed_executions_on_job_id;
CREATE UNIQUE INDEX index_solid_queue_claimed_executions_on_job_id
    ON solid_queue_claimed_executions (queue_name, job_id);

SELECT create_distributed_table('solid_queue_ready_executions', 'queue_name');
SELECT create_distributed_table('solid_queue_claimed_executions', 'queue_name',
                                colocate_with => 'solid_queue_ready_executions');

-- fairshare's per-tenant calls delegated to the node that owns the tenant,
-- colocated with the ready executions.
SELECT fs_citus_setup('solid_queue_ready_executions');
