-- bench/fairq: data and helpers (psql variables: rows, tenants).
--
-- Claims: Solid Queue's ready executions, :rows rows over :tenants tenants,
-- one tenant holding half; sq_ready is registered with fairshare, sq_fifo is
-- an identical unregistered copy for Solid Queue's own FIFO claim.
-- Fairness: fj (registered, with fj_running as its running table) and
-- fj_fifo (unregistered), worked by pgbench clients (worker_*.pgbench).
\set QUIET on
SET client_min_messages = warning;
CREATE EXTENSION fairshare;

CREATE TABLE sq_ready (
    id         bigserial PRIMARY KEY,
    job_id     bigint NOT NULL,
    queue_name character varying NOT NULL,
    priority   integer NOT NULL DEFAULT 0,
    created_at timestamp(6) without time zone NOT NULL
);
CREATE UNIQUE INDEX sq_ready_job_id ON sq_ready (job_id);
CREATE INDEX sq_ready_poll_all ON sq_ready (priority, job_id);
CREATE INDEX sq_ready_poll_by_queue ON sq_ready (queue_name, priority, job_id);
CREATE TABLE sq_fifo (LIKE sq_ready INCLUDING ALL);
CREATE SEQUENCE sq_job_ids;

-- tenant_0000 holds half; the rest spread evenly
CREATE FUNCTION sq_tenant(i bigint, tenants int) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN i % 2 = 0 THEN 'tenant_0000' ELSE 'tenant_' || lpad((i % (tenants - 1) + 1)::text, 4, '0') END $$;
CREATE FUNCTION sq_fill(tbl regclass, n bigint, tenants int) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('INSERT INTO %s (job_id, queue_name, priority, created_at)
                    SELECT j, sq_tenant(j, %s), 0, now() AT TIME ZONE ''UTC''
                      FROM (SELECT nextval(''sq_job_ids'') j FROM generate_series(1, %s)) s',
                   tbl, tenants, n);
END $$;
-- put back what a run consumed, tenant by tenant, so every round starts alike
CREATE TABLE sq_target (queue_name text PRIMARY KEY, rows bigint);
CREATE FUNCTION sq_refill(tbl regclass) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('INSERT INTO %1$s (job_id, queue_name, priority, created_at)
                    SELECT nextval(''sq_job_ids''), t.queue_name, 0, now() AT TIME ZONE ''UTC''
                      FROM sq_target t
                      LEFT JOIN (SELECT queue_name, count(*) n FROM %1$s GROUP BY 1) h USING (queue_name)
                     CROSS JOIN LATERAL generate_series(1, t.rows - coalesce(h.n, 0))', tbl);
END $$;

SELECT queue FROM fs_register_queue('sq', 'sq_ready', tenant => 'queue_name',
       order_by => 'priority, job_id', key => 'job_id');
SELECT fs_set_limit('*', 'sq', max_slots => 1000000);
SELECT sq_fill('sq_ready', :rows, :tenants);
INSERT INTO sq_fifo SELECT * FROM sq_ready;
INSERT INTO sq_target SELECT queue_name, count(*) FROM sq_ready GROUP BY 1;

-- Claim :n rows in a subtransaction that is rolled back, :reps times; the
-- median time of fs_claim and of the loose-index-scan fair pick.
CREATE FUNCTION claim_ms(n int, reps int, OUT fairshare float8, OUT loose_index_scan float8)
LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz;
    a float8[] := '{}';
    b float8[] := '{}';
    c int;
BEGIN
    FOR i IN 1..reps LOOP
        BEGIN
            t0 := clock_timestamp();
            SELECT count(*) INTO c FROM fs_claim('sq', NULL::sq_ready, n);
            a := a || extract(epoch FROM clock_timestamp() - t0) * 1000;
            RAISE EXCEPTION 'undo' USING ERRCODE = 'P0001';
        EXCEPTION WHEN SQLSTATE 'P0001' THEN NULL;
        END;
        -- The best plain-SQL fair pick: walk the distinct tenants with a
        -- loose index scan, take each one's head row, and lock the n oldest
        -- heads FOR UPDATE SKIP LOCKED (one row per tenant, the longest
        -- waiting tenants first).
        BEGIN
            t0 := clock_timestamp();
            WITH RECURSIVE tenants AS (
                (SELECT queue_name FROM sq_ready ORDER BY queue_name LIMIT 1)
                UNION ALL
                SELECT (SELECT r.queue_name FROM sq_ready r WHERE r.queue_name > t.queue_name
                         ORDER BY r.queue_name LIMIT 1)
                  FROM tenants t WHERE t.queue_name IS NOT NULL),
            heads AS (
                SELECT h.* FROM tenants t CROSS JOIN LATERAL (
                    SELECT r.id, r.priority, r.job_id FROM sq_ready r
                     WHERE r.queue_name = t.queue_name ORDER BY r.priority, r.job_id LIMIT 1) h
                 WHERE t.queue_name IS NOT NULL)
            SELECT count(*) INTO c
              FROM (SELECT * FROM heads ORDER BY priority, job_id LIMIT n) h
             CROSS JOIN LATERAL (SELECT r.id, r.job_id FROM sq_ready r WHERE r.id = h.id
                                   FOR UPDATE SKIP LOCKED) x;
            b := b || extract(epoch FROM clock_timestamp() - t0) * 1000;
            RAISE EXCEPTION 'undo' USING ERRCODE = 'P0001';
        EXCEPTION WHEN SQLSTATE 'P0001' THEN NULL;
        END;
    END LOOP;
    SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY x) INTO fairshare FROM unnest(a) x;
    SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY x) INTO loose_index_scan FROM unnest(b) x;
END $$;

-- Fairness scenario.
CREATE TABLE fj (id bigserial PRIMARY KEY, tenant text NOT NULL,
                 enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE fj_fifo (LIKE fj INCLUDING ALL);
CREATE TABLE fj_running (job_id bigint PRIMARY KEY, tenant text, enqueued_at timestamptz,
                         claimed_at timestamptz, client int);
CREATE TABLE fj_fifo_running (LIKE fj_running INCLUDING ALL);
CREATE TABLE fj_served (job_id bigint, tenant text, enqueued_at timestamptz, claimed_at timestamptz,
                        run text);
-- An arrival's job: when its INSERT began, and when its commit had returned.
CREATE TABLE fj_ack (job_id bigint, enqueued_at timestamptz, acked_at timestamptz, run text);
SELECT queue FROM fs_register_queue('fj', 'fj', 'tenant', 'id',
       running_table => 'fj_running', running_key => 'job_id');
-- The FIFO table has the same indexes: a queue table has its per-queue index
-- whether claims use it or not, as Solid Queue's ready executions have
-- index_solid_queue_poll_by_queue (queue_name, priority, job_id) beside
-- index_solid_queue_poll_all (priority, job_id).
CREATE INDEX fj_fifo_tenant ON fj_fifo (tenant, id);
SELECT fs_set_limit('*', 'fj', max_slots => 8);
CREATE FUNCTION fj_enqueue(tbl regclass, prefix text, tenants int, jobs int) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('INSERT INTO %s (tenant, enqueued_at)
                    SELECT %L || t, clock_timestamp() FROM generate_series(1, %s) j, generate_series(1, %s) t
                     ORDER BY j, t', tbl, prefix, jobs, tenants);
END $$;
-- A run repeated in rounds is named run.round; these figures pool its rounds.
-- p99 of an arrival run's enqueues (INSERT to its commit returned), and of
-- the small jobs' wait from then to their claim, in milliseconds
CREATE FUNCTION fj_p99_enqueue(r text) RETURNS float8 LANGUAGE sql AS $$
    SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM acked_at - enqueued_at) * 1000)
      FROM fj_ack WHERE split_part(run, '.', 1) = r $$;
CREATE FUNCTION fj_p99_after_commit(r text) RETURNS float8 LANGUAGE sql AS $$
    SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM s.claimed_at - a.acked_at) * 1000)
      FROM fj_served s JOIN fj_ack a USING (job_id) WHERE split_part(s.run, '.', 1) = r $$;
-- p99 wait of a run's small tenants, in milliseconds
CREATE FUNCTION fj_p99(r text) RETURNS float8 LANGUAGE sql AS $$
    SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM claimed_at - enqueued_at) * 1000)
      FROM fj_served WHERE split_part(run, '.', 1) = r AND tenant LIKE 'small%' $$;
-- Jain's index of the jobs each tenant got while all of them were
-- backlogged: from the first claim of a small tenant's job (their rows
-- become claimable together, when the enqueue commits) until the first
-- small tenant had all its jobs claimed.
CREATE FUNCTION fj_jain(r text) RETURNS float8 LANGUAGE sql AS $$
    WITH w AS (SELECT min(claimed_at) AS t0,
                      (SELECT min(last) FROM (SELECT max(claimed_at) AS last FROM fj_served
                                               WHERE run = r AND tenant LIKE 'small%' GROUP BY tenant) l) AS t1
                 FROM fj_served WHERE run = r AND tenant LIKE 'small%'),
         x AS (SELECT count(*)::float8 AS n FROM fj_served, w
                WHERE run = r AND claimed_at >= w.t0 AND claimed_at <= w.t1 GROUP BY tenant)
    SELECT sum(n) ^ 2 / (count(*) * sum(n ^ 2)) FROM x $$;
VACUUM ANALYZE;
CHECKPOINT;
