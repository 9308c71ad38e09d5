-- bench/flat: tables and helpers.
--
-- Each queue is a table of Solid Queue's ready executions' shape (its four
-- indexes), filled with rows spread evenly over its tenants in job order (a
-- tenant's rows lie all over the table, as jobs that arrived interleaved),
-- then registered: the triggers count nothing while it loads, and the queue
-- is recounted once before it is measured.
\set QUIET on
SET client_min_messages = warning;
CREATE EXTENSION fairshare;

-- Claim timings: one row per claim measured.
CREATE TABLE fl_claim_ms (queue text, round int, ms float8);
-- Rows per tenant of each queue, for refills between throughput runs.
CREATE TABLE fl_target (queue text, tenant text, rows bigint, PRIMARY KEY (queue, tenant));

-- A tenant's name: the same width at every size.
CREATE FUNCTION fl_tenant(j bigint, tenants int) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT 't' || lpad((j % tenants)::text, 6, '0') $$;

-- Make queue `q`: its table with `nrows` rows over `tenants` tenants, its
-- indexes, its registration (every tenant may hold a million slots), the
-- function that claims from it and its throughput script's claim.
CREATE PROCEDURE fl_make(q text, nrows bigint, tenants int) LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('CREATE TABLE %I (
        id         bigserial PRIMARY KEY,
        job_id     bigint NOT NULL,
        queue_name character varying NOT NULL,
        priority   integer NOT NULL DEFAULT 0,
        created_at timestamp(6) without time zone NOT NULL)', q);
    EXECUTE format('INSERT INTO %I (job_id, queue_name, priority, created_at)
                    SELECT j, fl_tenant(j, %s), 0, now() AT TIME ZONE ''UTC''
                      FROM generate_series(1, %s) j', q, tenants, nrows);
    COMMIT;
    EXECUTE format('CREATE UNIQUE INDEX %I ON %I (job_id)', q || '_job_id', q);
    EXECUTE format('CREATE INDEX %I ON %I (priority, job_id)', q || '_poll_all', q);
    EXECUTE format('CREATE INDEX %I ON %I (queue_name, priority, job_id)', q || '_poll_by_queue', q);
    PERFORM fs_register_queue(q, q::regclass, tenant => 'queue_name',
                              order_by => 'priority, job_id', key => 'job_id');
    PERFORM fs_set_limit('*', q, max_slots => 1000000);
    EXECUTE format('INSERT INTO fl_target SELECT %L, fl_tenant(j, %s), count(*)
                      FROM generate_series(1, %s) j GROUP BY 2', q, tenants, nrows);
    -- Claim n rows, the time of fs_claim() alone in *ms; the rows are
    -- deleted and their leases released after it.
    EXECUTE format($f$
        CREATE FUNCTION %1$I(n int, OUT ms float8) LANGUAGE plpgsql AS $b$
        DECLARE
            t0 timestamptz;
            ids bigint[];
            leases bigint[];
        BEGIN
            t0 := clock_timestamp();
            SELECT array_agg((j.job).id), array_agg(j.lease_id) INTO ids, leases
              FROM fs_claim(%2$L, NULL::%3$I, n) j;
            ms := extract(epoch FROM clock_timestamp() - t0) * 1000;
            DELETE FROM %3$I WHERE id = ANY (ids);
            PERFORM fs_release_slot(l) FROM unnest(leases) l;
        END $b$ $f$, q || '_claim', q, q);
    COMMIT;
END $$;

-- Claim `n` rows of queue q `reps` times, each claim committed with its rows
-- deleted (the backlog stays large: a claim takes 100 of millions), and
-- keep the times of all but the first `warmup`.
CREATE PROCEDURE fl_claims(q text, n int, reps int, warmup int, rnd int) LANGUAGE plpgsql AS $$
DECLARE
    ms float8;
    times float8[] := '{}';
BEGIN
    FOR i IN 1 .. warmup + reps LOOP
        EXECUTE format('SELECT ms FROM %I($1)', q || '_claim') INTO ms USING n;
        COMMIT;
        IF i > warmup THEN
            times := times || ms;
        END IF;
    END LOOP;
    INSERT INTO fl_claim_ms SELECT q, rnd, x FROM unnest(times) x;
    COMMIT;
END $$;

-- Put back what a throughput run consumed, tenant by tenant.
CREATE PROCEDURE fl_refill(q text) LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('INSERT INTO %1$I (job_id, queue_name, priority, created_at)
                    SELECT (SELECT coalesce(max(job_id), 0) FROM %1$I) + row_number() OVER (),
                           t.tenant, 0, now() AT TIME ZONE ''UTC''
                      FROM fl_target t
                      LEFT JOIN (SELECT queue_name, count(*) n FROM %1$I GROUP BY 1) h
                        ON h.queue_name = t.tenant
                     CROSS JOIN LATERAL generate_series(1, t.rows - coalesce(h.n, 0))
                     WHERE t.queue = %2$L', q, q);
END $$;
