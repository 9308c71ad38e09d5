-- pgTAP: the budget, gate and tier API as the contract fixes it, the
-- SQLSTATE of every error, and a randomised walk of spends, charges and
-- clock moves checked step by step against an independent model of the
-- token bucket written here in PL/pgSQL.
\set ON_ERROR_STOP 1
\set QUIET 1
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS fairshare;
-- Limits apply when committed: set them before the test's transaction.
SELECT fs_set_limit(tenant, 'walk_b', budget_ms_per_minute => cap)
  FROM (VALUES ('m1', 600), ('m2', 6000), ('m3', 60000)) v(tenant, cap);
BEGIN;
SELECT plan(25);

SELECT has_function('fs_spend_tokens', ARRAY['text', 'integer', 'integer', 'text']);
SELECT function_returns('fs_spend_tokens', ARRAY['text', 'integer', 'integer', 'text'], 'integer');
SELECT is(pg_get_function_arguments('fs_spend_tokens(text, integer, integer, text)'::regprocedure),
          'tenant text, requested_runs integer, cost_ms integer DEFAULT 100, queue text DEFAULT ''default''::text',
          'fs_spend_tokens argument names and defaults');
SELECT has_function('fs_charge_tokens', ARRAY['text', 'double precision', 'text']);
SELECT function_returns('fs_charge_tokens', ARRAY['text', 'double precision', 'text'], 'double precision');
SELECT is(pg_get_function_arguments('fs_charge_tokens(text, double precision, text)'::regprocedure),
          'tenant text, used_ms double precision, queue text DEFAULT ''default''::text',
          'fs_charge_tokens argument names and defaults');
SELECT has_function('fs_worker_heartbeat', ARRAY['text', 'integer', 'text']);
SELECT function_returns('fs_worker_heartbeat', ARRAY['text', 'integer', 'text'], 'void');
SELECT is(pg_get_function_arguments('fs_worker_heartbeat(text, integer, text)'::regprocedure),
          'worker text, threads integer, queue text DEFAULT ''default''::text',
          'fs_worker_heartbeat argument names and defaults');
SELECT has_view('fs_decisions');
SELECT has_view('fs_queues');
SELECT has_view('fs_workers');
SELECT has_view('fs_tiers');

SELECT throws_ok($$SELECT fs_spend_tokens(NULL, 1)$$, '22004');
SELECT throws_ok($$SELECT fs_spend_tokens('a', -1)$$, '22023');
SELECT throws_ok($$SELECT fs_spend_tokens('a', 1, 0)$$, '22023');
SELECT throws_ok($$SELECT fs_charge_tokens('a', 'NaN')$$, '22023');
SELECT throws_ok($$SELECT fs_charge_tokens('a', 'Infinity')$$, '22023');
SELECT throws_ok($$SELECT fs_worker_heartbeat('w', -1)$$, '22023');
SELECT throws_ok($$SELECT fs_route_enqueue('a', 'c', '{}')$$, '22023');
SELECT throws_ok($$SELECT fs_route_enqueue('a', 'c', '[{"threshold": 1, "per": "soon", "queue": "q"}]')$$, '22007');
SELECT throws_ok($$SELECT fs_route_enqueue('a', 'c', '[{},{},{},{},{}]')$$, '54000');

-- The walk: 3 tenants with budgets of 600, 6,000 and 60,000 ms per minute;
-- 3,000 steps of clock moves (0..20 s), spends (0..20 runs of 1..500 ms) and
-- charges (0..3,000 ms).  The model: balance(t) = min(cap, balance + dt x
-- cap / 60 s); granted = min(requested, floor(balance / cost)); a charge
-- subtracts, even below zero.
CREATE TEMP TABLE model (tenant text PRIMARY KEY, cap float8, balance float8);
CREATE TEMP TABLE walk_errors (step int, what text);
INSERT INTO model VALUES ('m1', 600, 600), ('m2', 6000, 6000), ('m3', 60000, 60000);
DO $$
DECLARE
    -- 2030-01-01 12:30 UTC, kept in whole milliseconds and written out
    -- exactly: a float8 sum would drift by microseconds over the walk.
    clock_ms bigint := 1893501000000;
    step int;
    m record;
    dt float8;
    requested int;
    cost int;
    used float8;
    want int;
    got int;
    real float8;
BEGIN
    PERFORM setseed(0.7);
    PERFORM set_config('fairshare.debug_clock', (clock_ms / 1000) || '.' || lpad((clock_ms % 1000)::text, 3, '0'), true);
    -- first sight: the buckets start full
    PERFORM fs_spend_tokens(tenant, 0, 1, 'walk_b') FROM model;
    FOR step IN 1 .. 3000 LOOP
        SELECT * INTO m FROM model ORDER BY random() LIMIT 1;
        IF random() < 0.3 THEN
            dt := floor(random() * 20000) / 1000.0;
            clock_ms := clock_ms + (dt * 1000)::bigint;
            PERFORM set_config('fairshare.debug_clock', (clock_ms / 1000) || '.' || lpad((clock_ms % 1000)::text, 3, '0'), true);
            UPDATE model SET balance = least(cap, balance + dt * cap / 60.0);
        ELSIF random() < 0.8 THEN
            requested := floor(random() * 21)::int;
            cost := 1 + floor(random() * 500)::int;
            want := least(requested, greatest(floor(m.balance / cost), 0)::int);
            got := fs_spend_tokens(m.tenant, requested, cost, 'walk_b');
            IF got <> want THEN
                INSERT INTO walk_errors VALUES (step, format('%s: spend %s x %s granted %s, model %s (balance %s)',
                                                             m.tenant, requested, cost, got, want, m.balance));
            END IF;
            UPDATE model SET balance = balance - want * cost WHERE tenant = m.tenant;
        ELSE
            used := floor(random() * 3000);
            real := fs_charge_tokens(m.tenant, used, 'walk_b');
            UPDATE model SET balance = balance - used WHERE tenant = m.tenant;
            IF abs(real - (m.balance - used)) > 1e-6 THEN
                INSERT INTO walk_errors VALUES (step, format('%s: charge returned %s, model %s',
                                                             m.tenant, real, m.balance - used));
            END IF;
        END IF;
        INSERT INTO walk_errors
        SELECT step, format('%s: balance %s, model %s', f.tenant, f.token_balance, mo.balance)
          FROM fs_tenants f JOIN model mo USING (tenant)
         WHERE f.queue = 'walk_b' AND abs(f.token_balance - mo.balance) > 1e-6;
    END LOOP;
END $$;
SELECT is_empty($$SELECT * FROM walk_errors ORDER BY step LIMIT 5$$,
                'every spend, charge and balance matched the model');
SELECT ok((SELECT count(*) FROM fs_decisions WHERE queue = 'walk_b' AND reason = 'no_budget') > 0,
          'the walk ran buckets dry');
SELECT ok((SELECT min(token_balance) FROM fs_tenants WHERE queue = 'walk_b') < 0,
          'and into debt');

SELECT * FROM finish();
ROLLBACK;
DELETE FROM fs_limits WHERE queue = 'walk_b';
