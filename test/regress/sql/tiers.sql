--
-- Greedy-tenant tiers: fs_route_enqueue() with sliding windows of fixed
-- sub-buckets, against an injected clock; and malformed rules.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS fairshare;
RESET client_min_messages;

-- 2030-01-01 12:30 UTC; t(s) moves the clock.
CREATE FUNCTION t(seconds float8) RETURNS void LANGUAGE sql AS
  $$ SELECT set_config('fairshare.debug_clock', (1893501000 + seconds)::text, false) $$;
-- Route n enqueues of (tenant, class) and say where each went.
CREATE FUNCTION route(n int, tenant text, job_class text, rules jsonb) RETURNS text LANGUAGE sql AS
  $$ SELECT string_agg(fs_route_enqueue(tenant, job_class, rules, 'tq'), ',' ORDER BY i)
       FROM generate_series(1, n) i $$;
SELECT t(0);

-- One rule: more than 3 per minute goes to "slow".
SELECT route(5, 'acme', 'Report', '[{"threshold": 3, "per": "1 minute", "queue": "slow"}]');
SELECT tenant, job_class, rule, per, enqueues FROM fs_tiers WHERE queue = 'tq' ORDER BY tenant, job_class, rule;
-- Job classes and tenants are counted apart.
SELECT route(2, 'acme', 'Email', '[{"threshold": 3, "per": "1 minute", "queue": "slow"}]');
SELECT route(2, 'beta', 'Report', '[{"threshold": 3, "per": "1 minute", "queue": "slow"}]');
-- The window slides.  At 61 s the 5 enqueues at 0 s still count 5/6: the
-- oldest sub-bucket (0..6 s) is taken as evenly spread, and 1/6 of it has
-- slid out (the documented error: at most one sub-bucket, a tenth of the
-- window).  By 200 s they are gone.
SELECT t(30);
SELECT route(1, 'acme', 'Report', '[{"threshold": 3, "per": "1 minute", "queue": "slow"}]');
SELECT t(61);
SELECT route(1, 'acme', 'Report', '[{"threshold": 3, "per": "1 minute", "queue": "slow"}]');
SELECT round(enqueues::numeric, 2) FROM fs_tiers WHERE queue = 'tq' AND tenant = 'acme' AND job_class = 'Report';
-- The oldest sub-bucket (6 s wide) counts for the part still inside the
-- window: beta's 2 enqueues at 0 s are worth 2 x (1 - 3/6) = 1 at 63 s.
SELECT t(63);
SELECT round(enqueues::numeric, 2) FROM fs_tiers WHERE queue = 'tq' AND tenant = 'beta';
SELECT t(200);
SELECT route(3, 'acme', 'Report', '[{"threshold": 3, "per": "1 minute", "queue": "slow"}]');

-- Two rules: the last one exceeded wins.
CREATE TEMP TABLE two_rules AS SELECT
  '[{"threshold": 5, "per": "1 hour", "queue": "default_throttled"},
    {"threshold": 2, "per": "1 minute", "queue": "default_superslow"}]'::jsonb AS rules;
SELECT t(1000);
SELECT route(3, 'gamma', 'Sync', rules) FROM two_rules;       -- 3rd > 2/min
SELECT t(1100);
SELECT route(3, 'gamma', 'Sync', rules) FROM two_rules;       -- 4th..6th: 6th > 5/h, 3rd > 2/min
SELECT t(1200);
SELECT route(1, 'gamma', 'Sync', rules) FROM two_rules;       -- 7 in the hour, 1 in the minute
SELECT rule, per, enqueues FROM fs_tiers WHERE queue = 'tq' AND tenant = 'gamma' ORDER BY rule;
SELECT t(1000 + 3700);
SELECT route(1, 'gamma', 'Sync', rules) FROM two_rules;       -- an hour later: back to default
-- No rules: always the original queue.
SELECT fs_route_enqueue('gamma', 'Sync', '[]', 'tq');
-- Threshold 0: the first enqueue already exceeds it.
SELECT route(1, 'delta', 'Any', '[{"threshold": 0, "per": "10 seconds", "queue": "q0"}]');

-- Malformed rules: clear errors.
\set VERBOSITY default
SELECT fs_route_enqueue('t', 'c', NULL);
SELECT fs_route_enqueue('t', 'c', '{"threshold": 1, "per": "1 minute", "queue": "x"}');
SELECT fs_route_enqueue('t', 'c', '"rules"');
SELECT fs_route_enqueue('t', 'c', '[1]');
SELECT fs_route_enqueue('t', 'c', '[{"threshold": 1, "per": "1 minute"}]');
SELECT fs_route_enqueue('t', 'c', '[{"threshold": 1, "per": "1 minute", "queue": "x", "extra": 1}]');
SELECT fs_route_enqueue('t', 'c', '[{"threshold": 1, "per": "1 minute", "qeueu": "x"}]');
SELECT fs_route_enqueue('t', 'c', '[{"threshold": "1", "per": "1 minute", "queue": "x"}]');
SELECT fs_route_enqueue('t', 'c', '[{"threshold": -1, "per": "1 minute", "queue": "x"}]');
SELECT fs_route_enqueue('t', 'c', '[{"threshold": 1.5, "per": "1 minute", "queue": "x"}]');
SELECT fs_route_enqueue('t', 'c', '[{"threshold": 1e12, "per": "1 minute", "queue": "x"}]');
SELECT fs_route_enqueue('t', 'c', '[{"threshold": 1, "per": 60, "queue": "x"}]');
SELECT fs_route_enqueue('t', 'c', '[{"threshold": 1, "per": "1 fortnight", "queue": "x"}]');
SELECT fs_route_enqueue('t', 'c', '[{"threshold": 1, "per": "0 seconds", "queue": "x"}]');
SELECT fs_route_enqueue('t', 'c', '[{"threshold": 1, "per": "367 days", "queue": "x"}]');
SELECT fs_route_enqueue('t', 'c', '[{"threshold": 1, "per": "1 minute", "queue": ""}]');
SELECT fs_route_enqueue('t', 'c', jsonb_build_array(jsonb_build_object('threshold', 1, 'per', '1 minute', 'queue', repeat('q', 64))));
SELECT fs_route_enqueue('t', 'c', (SELECT jsonb_agg(jsonb_build_object('threshold', i, 'per', '1 minute', 'queue', 'q')) FROM generate_series(1, 5) i));
SELECT fs_route_enqueue(NULL, 'c', '[]');
SELECT fs_route_enqueue('t', NULL, '[]');
SELECT fs_route_enqueue('t', repeat('c', 10240), '[]');
SELECT fs_route_enqueue('t', 'c', '[]', NULL);
SELECT count(*) AS counters_for_bad_input FROM fs_tiers WHERE tenant = 't';

RESET fairshare.debug_clock;
DROP FUNCTION route(int, text, text, jsonb);
DROP FUNCTION t(float8);
