-- Fair dequeue for GoodJob (the table of schema.sql, from good_job 4.19.2,
-- workers using the skip-locked strategy).  Run as the owner of good_jobs,
-- with EXECUTE on fs_register_queue() granted by an administrator.
--
-- One tenant per concurrency_key (set it to the tenant with
-- good_job_control_concurrency_with(key: -> { "tenant-#{tenant_id}" })); a
-- job without one is not claimed by fs_claim(), so give every job a key or
-- use tenant => 'coalesce(concurrency_key, queue_name)'.  The filter is
-- GoodJob's own: its first two conditions decide which rows are counted and
-- indexed, the third (which moves with time) is checked at claim time.
-- fairshare adds an index on (concurrency_key, priority, created_at) for the
-- unfinished, unlocked rows, and triggers on good_jobs.
SELECT queue, tenant, order_by, ready_filter, claim_filter, ready_index
  FROM fs_register_queue('good_job', 'good_jobs',
       tenant         => 'concurrency_key',
       order_by       => 'priority ASC NULLS LAST, created_at',
       filter         => 'finished_at IS NULL AND locked_by_id IS NULL
                          AND scheduled_at <= (now() AT TIME ZONE ''UTC'')',
       running_table  => 'good_jobs',
       running_filter => 'finished_at IS NULL AND locked_by_id IS NOT NULL');

SELECT fs_set_limit('*', 'good_job', max_slots => 3);
