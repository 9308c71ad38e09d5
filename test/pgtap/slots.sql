-- pgTAP: the slots and limits API as the contract fixes it (names, argument
-- types, defaults, return types), the SQLSTATE of every error, and a
-- randomised walk that checks the slot invariants after every step.
\set ON_ERROR_STOP 1
\set QUIET 1
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS fairshare;
BEGIN;
SELECT plan(43);

-- The fixed API.
SELECT has_function('fs_set_limit', ARRAY['text', 'text', 'integer', 'integer',
       'double precision', 'double precision', 'double precision']);
SELECT function_returns('fs_set_limit', ARRAY['text', 'text', 'integer', 'integer',
       'double precision', 'double precision', 'double precision'], 'void');
SELECT has_function('fs_acquire_slot', ARRAY['text', 'text', 'interval']);
SELECT function_returns('fs_acquire_slot', ARRAY['text', 'text', 'interval'], 'bigint');
SELECT has_function('fs_release_slot', ARRAY['bigint']);
SELECT function_returns('fs_release_slot', ARRAY['bigint'], 'boolean');
SELECT has_function('fs_renew_slot', ARRAY['bigint', 'interval']);
SELECT function_returns('fs_renew_slot', ARRAY['bigint', 'interval'], 'boolean');
SELECT is(pg_get_function_arguments('fs_acquire_slot(text, text, interval)'::regprocedure),
          'tenant text, queue text DEFAULT ''default''::text, lease interval DEFAULT ''00:05:00''::interval',
          'fs_acquire_slot argument names and defaults');
SELECT is(pg_get_function_arguments('fs_renew_slot(bigint, interval)'::regprocedure),
          'lease_id bigint, lease interval DEFAULT ''00:05:00''::interval',
          'fs_renew_slot argument names and defaults');
SELECT is(pg_get_function_arguments('fs_set_limit(text, text, integer, integer, double precision, double precision, double precision)'::regprocedure),
          'tenant text, queue text DEFAULT ''default''::text, max_slots integer DEFAULT NULL::integer, '
          'min_slots integer DEFAULT NULL::integer, weight double precision DEFAULT NULL::double precision, '
          'budget_ms_per_minute double precision DEFAULT NULL::double precision, '
          'throttle_pct double precision DEFAULT NULL::double precision',
          'fs_set_limit argument names and defaults');

-- The limits table.
SELECT has_table('fs_limits');
SELECT col_is_pk('fs_limits', ARRAY['queue', 'tenant']);
SELECT has_trigger('fs_limits', 'fs_limits_validate');
SELECT has_trigger('fs_limits', 'fs_limits_changed');
SELECT has_view('fs_tenants');
SELECT has_view('fs_leases');
SELECT has_view('fs_stats');

-- Every error has its SQLSTATE.
SELECT throws_ok($$SELECT fs_acquire_slot(NULL)$$, '22004', 'tenant must not be null');
SELECT throws_ok($$SELECT fs_acquire_slot('')$$, '22023', 'tenant must not be empty');
SELECT throws_ok($$SELECT fs_acquire_slot(repeat('a', 10240))$$, '42622');
SELECT throws_ok($$SELECT fs_acquire_slot('*')$$, '22023');
SELECT throws_ok($$SELECT fs_acquire_slot('a', NULL)$$, '22004', 'queue must not be null');
SELECT throws_ok($$SELECT fs_acquire_slot('a', 'q', NULL)$$, '22004', 'lease must not be null');
SELECT throws_ok($$SELECT fs_acquire_slot('a', 'q', '0')$$, '22023');
SELECT throws_ok($$SELECT fs_acquire_slot('a', 'q', '-1 hour')$$, '22023');
SELECT throws_ok($$SELECT fs_acquire_slot('a', 'q', '400 days')$$, '22023');
SELECT is(fs_release_slot(NULL), NULL, 'fs_release_slot(NULL) is NULL, as a strict function gives');
SELECT is(fs_renew_slot(NULL), NULL, 'fs_renew_slot(NULL) is NULL');
SELECT throws_ok($$SELECT fs_set_limit(NULL)$$, '23502', 'tenant in fs_limits must not be null');
SELECT throws_ok($$SELECT fs_set_limit('a', max_slots => -1)$$, '22023');
SELECT throws_ok($$SELECT fs_set_limit('a', max_slots => 1, min_slots => 2)$$, '22023');
SELECT throws_ok($$SELECT fs_set_limit('a', weight => 0)$$, '22023');
SELECT throws_ok($$SELECT fs_set_limit('a', budget_ms_per_minute => -1)$$, '22023');
SELECT throws_ok($$SELECT fs_set_limit('a', throttle_pct => 100.5)$$, '22023');
SELECT throws_ok($$SELECT fs_set_limit(repeat('a', 64))$$, '42622');
SELECT lives_ok($$SELECT fs_release_slot(-1)$$, 'a negative lease id is just unknown');
SELECT is(fs_release_slot(-1), false, 'and releases nothing');
SELECT is(fs_renew_slot(9223372036854775807), false, 'the largest id is unknown too');

-- A randomised walk: 2,000 steps of acquire / release / renew / savepoint
-- rollback over 5 tenants with limits 0..3; after every step the counts in
-- fs_tenants must equal this session's own ledger and never pass max_slots.
SAVEPOINT walk;
CREATE TEMP TABLE walk_leases (lease_id bigint PRIMARY KEY, tenant text);
CREATE TEMP TABLE walk_violations (step int, what text);
SELECT fs_set_limit('w' || i, 'walk', max_slots => i % 4) FROM generate_series(0, 4) i;
DO $$
DECLARE
    step int;
    t text;
    l bigint;
    r float8;
BEGIN
    PERFORM setseed(0.42);
    FOR step IN 1 .. 2000 LOOP
        t := 'w' || floor(random() * 5)::int;
        r := random();
        IF r < 0.45 THEN
            l := fs_acquire_slot(t, 'walk', '1 hour');
            IF l IS NOT NULL THEN
                INSERT INTO walk_leases VALUES (l, t);
            END IF;
        ELSIF r < 0.85 THEN
            SELECT lease_id INTO l FROM walk_leases WHERE tenant = t LIMIT 1;
            IF l IS NOT NULL THEN
                IF NOT fs_release_slot(l) THEN
                    INSERT INTO walk_violations VALUES (step, 'release of a held lease returned false');
                END IF;
                DELETE FROM walk_leases WHERE lease_id = l;
            END IF;
        ELSIF r < 0.95 THEN
            SELECT lease_id INTO l FROM walk_leases WHERE tenant = t LIMIT 1;
            IF l IS NOT NULL AND NOT fs_renew_slot(l, '1 hour') THEN
                INSERT INTO walk_violations VALUES (step, 'renew of a held lease returned false');
            END IF;
        ELSE
            BEGIN   -- a subtransaction that takes a slot and rolls back
                l := fs_acquire_slot(t, 'walk', '1 hour');
                RAISE EXCEPTION 'roll back';
            EXCEPTION WHEN raise_exception THEN NULL;
            END;
        END IF;
        INSERT INTO walk_violations
        SELECT step, format('%s: %s in use, ledger %s, max %s', f.tenant, f.slots_in_use,
                            coalesce(w.n, 0), f.max_slots)
          FROM fs_tenants f
          LEFT JOIN (SELECT tenant, count(*) n FROM walk_leases GROUP BY tenant) w USING (tenant)
         WHERE f.queue = 'walk'
           AND (f.slots_in_use <> coalesce(w.n, 0) OR f.slots_in_use > f.max_slots);
    END LOOP;
END $$;
SELECT is_empty($$SELECT * FROM walk_violations$$, 'the walk never broke an invariant');
SELECT ok((SELECT count(*) FROM walk_leases) > 0, 'the walk held slots at the end');
SELECT is((SELECT sum(slots_in_use)::int FROM fs_tenants WHERE queue = 'walk'),
          (SELECT count(*)::int FROM walk_leases), 'counts equal the ledger at the end');
-- Rolling the walk back returns every slot it still held.
ROLLBACK TO SAVEPOINT walk;
SELECT is((SELECT coalesce(sum(slots_in_use), 0)::int FROM fs_tenants WHERE queue = 'walk'), 0,
          'rolling back the walk returned every slot');

SELECT * FROM finish();
ROLLBACK;
