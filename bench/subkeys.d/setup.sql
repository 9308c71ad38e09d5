-- bench/subkeys: tables and helpers.
--
-- Two queues over tables of the same rows: sk_one registered with one level
-- (tenant), sk_two with two (tenant, then sub-key).  SK_TENANTS tenants; the
-- first ("splitter") spreads its rows over SK_SPLIT sub-keys, the second
-- ("single") keeps one, the others have 10 each.
\set QUIET on
SET client_min_messages = warning;
CREATE EXTENSION fairshare;

CREATE TABLE sk_claim_ms (queue text, round int, ms float8);

-- Fill table `q` with `per_tenant` rows for each of `tenants` tenants, in
-- job order (a tenant's rows interleaved with the others').
CREATE PROCEDURE sk_fill(q text, tenants int, per_tenant int, split int) LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('INSERT INTO %I (tenant, sub)
        SELECT t, CASE t WHEN ''splitter'' THEN ''k'' || ((i / %s) %% %s)
                         WHEN ''single'' THEN ''only''
                         ELSE ''k'' || ((i / %s) %% 10) END
          FROM generate_series(0, %s - 1) i,
               LATERAL (SELECT CASE i %% %s WHEN 0 THEN ''splitter'' WHEN 1 THEN ''single''
                                    ELSE ''t'' || (i %% %s) END AS t) tt',
        q, tenants, split, tenants, tenants::bigint * per_tenant, tenants, tenants);
END $$;

-- Make table `q` and fill it.
CREATE PROCEDURE sk_make(q text, tenants int, per_tenant int, split int) LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('CREATE TABLE %I (id bigserial PRIMARY KEY, tenant text NOT NULL, sub text NOT NULL,
                    priority int NOT NULL DEFAULT 0)', q);
    CALL sk_fill(q, tenants, per_tenant, split);
END $$;

-- Refill `q`: every tenant and sub-key has its rows again.
CREATE PROCEDURE sk_refill(q text, tenants int, per_tenant int, split int) LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('TRUNCATE %I', q);
    CALL sk_fill(q, tenants, per_tenant, split);
END $$;

-- `n` claims of `batch` rows from `q`, each committed with its rows deleted:
-- the time of fs_claim() alone.
CREATE PROCEDURE sk_claims(q text, batch int, n int, round int) LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz;
    ids bigint[];
    leases bigint[];
BEGIN
    FOR i IN 1..n LOOP
        t0 := clock_timestamp();
        EXECUTE format('SELECT array_agg((j.job).id), array_agg(j.lease_id) FROM fs_claim(%L, NULL::%I, %s) j',
                       q, q, batch) INTO ids, leases;
        INSERT INTO sk_claim_ms VALUES (q, round, extract(epoch FROM clock_timestamp() - t0) * 1000);
        EXECUTE format('DELETE FROM %I WHERE id = ANY ($1)', q) USING ids;
        PERFORM fs_release_slot(l) FROM unnest(leases) l;
        COMMIT;
    END LOOP;
END $$;
