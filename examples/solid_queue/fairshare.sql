-- Fair dequeue for Solid Queue (the tables of schema.sql, from solid_queue
-- 1.5.0).  Run as the owner of the tables, with EXECUTE on
-- fs_register_queue() granted by an administrator.
--
-- One tenant per queue name ("tenant_42"); with one tenant spread over
-- several queues ("tenant_42.mailers", "tenant_42.reports") use
--   tenant => 'split_part(queue_name, ''.'', 1)'
-- Solid Queue's index_solid_queue_poll_by_queue (queue_name, priority,
-- job_id) serves the claim, so fairshare adds no index; it adds triggers
-- on solid_queue_ready_executions (the backlog) and on
-- solid_queue_claimed_executions (releasing a job's lease when it finishes).
SELECT queue, tenant, order_by, ready_index
  FROM fs_register_queue('solid_queue', 'solid_queue_ready_executions',
       tenant        => 'queue_name',
       order_by      => 'priority, job_id',
       key           => 'job_id',
       running_table => 'solid_queue_claimed_executions',
       enqueued_at   => 'created_at');

-- Claims measure the queue's latency (for fs_spend_tokens' backpressure) as
-- min(created_at) over the ready rows, once a second: this index makes that
-- a lookup.
CREATE INDEX solid_queue_ready_executions_created_at ON solid_queue_ready_executions (created_at);

-- Every tenant may run 3 jobs at once; heavier weights get more turns.
SELECT fs_set_limit('*', 'solid_queue', max_slots => 3);
