--
-- The global gate: ceilings from live worker threads, share, throttle, and
-- min/max slots; the top-of-hour dampener; heartbeats expiring; backpressure
-- on admission; and every error.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS fairshare;
RESET client_min_messages;

-- 2030-01-01 12:30 UTC, far from the top of the hour; t(s) moves the clock.
CREATE FUNCTION t(seconds float8) RETURNS void LANGUAGE sql AS
  $$ SELECT set_config('fairshare.debug_clock', (1893501000 + seconds)::text, false) $$;
-- How many slots a tenant gets when it asks for 50 (then gives them back).
CREATE FUNCTION slots_granted(tenant text, queue text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    n int := 0;
    l bigint;
    ids bigint[] := '{}';
    why text;
BEGIN
    FOR i IN 1 .. 50 LOOP
        l := fs_acquire_slot(tenant, queue);
        EXIT WHEN l IS NULL;
        ids := ids || l;
        n := n + 1;
    END LOOP;
    SELECT reason INTO why FROM fs_decisions
     WHERE fs_decisions.tenant = slots_granted.tenant AND fs_decisions.queue = slots_granted.queue
     ORDER BY seq DESC LIMIT 1;
    PERFORM fs_release_slot(x) FROM unnest(ids) x;
    RETURN n || ' (' || why || ')';
END $$;
SELECT t(0);
SHOW fairshare.tenant_share;
SELECT fs_set_limit('*', 'g_q', max_slots => 100);

-- No heartbeat: the gate is off, max_slots alone rules.
SELECT slots_granted('g_a', 'g_q');
SELECT live_workers, live_threads, free_threads, backpressure FROM fs_queues WHERE queue = 'g_q';

-- 8 live threads x share 0.25 = 2 slots per tenant.
SELECT fs_worker_heartbeat('w1', 8, 'g_q');
SELECT slots_granted('g_a', 'g_q');
-- more workers, more slots: 8 + 12 = 20 threads -> 5
SELECT fs_worker_heartbeat('w2', 12, 'g_q');
SELECT slots_granted('g_a', 'g_q');
SELECT queue, worker, threads, live FROM fs_workers WHERE queue = 'g_q' ORDER BY worker;
SELECT live_workers, live_threads, tenant_share_threads, dampener FROM fs_queues WHERE queue = 'g_q';
-- min_slots is a floor, max_slots a ceiling
SELECT fs_set_limit('g_min', 'g_q', min_slots => 7);
SELECT slots_granted('g_min', 'g_q');
SELECT fs_set_limit('g_max', 'g_q', max_slots => 3);
SELECT slots_granted('g_max', 'g_q');
-- throttle_pct 40: ceil(20 x 0.25 x 0.4) = 2, denied as throttled
SELECT fs_set_limit('g_thr', 'g_q', throttle_pct => 40);
SELECT slots_granted('g_thr', 'g_q');
-- a throttle below the floor of one slot still leaves one
SELECT fs_set_limit('g_thr', 'g_q', throttle_pct => 0);
SELECT slots_granted('g_thr', 'g_q');
-- throttled below min_slots: min_slots wins
SELECT fs_set_limit('g_thr', 'g_q', min_slots => 4);
SELECT slots_granted('g_thr', 'g_q');
-- the share is a GUC
SET fairshare.tenant_share = 0.5;
SELECT slots_granted('g_a', 'g_q');
SET fairshare.tenant_share = 0.01;
SELECT slots_granted('g_a', 'g_q');   -- ceil(0.2) = 1: at least one while workers live
RESET fairshare.tenant_share;

-- Heartbeats expire after fairshare.worker_ttl (30 s); renewing keeps them.
SELECT t(20);
SELECT fs_worker_heartbeat('w2', 12, 'g_q');
SELECT t(35);
SELECT worker, live FROM fs_workers WHERE queue = 'g_q' ORDER BY worker;
SELECT live_threads FROM fs_queues WHERE queue = 'g_q';
SELECT slots_granted('g_a', 'g_q');  -- 12 x 0.25
SELECT t(51);
SELECT live_threads FROM fs_queues WHERE queue = 'g_q';
SELECT slots_granted('g_a', 'g_q');  -- gate off again: max_slots
-- threads = 0 takes a worker out at once
SELECT fs_worker_heartbeat('w3', 4, 'g_q');
SELECT live_threads FROM fs_queues WHERE queue = 'g_q';
SELECT fs_worker_heartbeat('w3', 0, 'g_q');
SELECT live_threads, count(w.*) AS workers
  FROM fs_queues q LEFT JOIN fs_workers w USING (queue) WHERE q.queue = 'g_q' GROUP BY 1;

-- The dampener: down to 0.15 of the share at :00 UTC, smoothly, within 10 minutes.
-- 40 threads x 0.25 = 10 slots away from :00; at 13:00 only ceil(10 x 0.15) = 2.
CREATE FUNCTION around_13h(minutes int, OUT dampener numeric, OUT share numeric, OUT slots text)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM t(1800 + minutes * 60);
    PERFORM fs_worker_heartbeat('w4', 40, 'g_q');
    SELECT round(q.dampener::numeric, 4), q.tenant_share_threads::numeric(6,2)
      INTO dampener, share FROM fs_queues q WHERE q.queue = 'g_q';
    slots := slots_granted('g_a', 'g_q');
END $$;
SELECT minutes, d.* FROM (VALUES (-11), (-10), (-5), (0), (5), (10), (11)) m(minutes),
       LATERAL around_13h(minutes) d;
DROP FUNCTION around_13h(int);
-- 0 turns it off
SET fairshare.dampen_window = 0;
SELECT t(1780);
SELECT dampener FROM fs_queues WHERE queue = 'g_q';
RESET fairshare.dampen_window;

-- Backpressure: admission grants nothing while the reported latency is over
-- fairshare.backpressure_latency (5 s), or while no live thread is free;
-- starting admitted work (a slot) is not blocked.
SELECT t(3000);
SELECT fs_worker_heartbeat('w5', 2, 'g_bp');
SELECT fs_set_limit('*', 'g_bp', max_slots => 10, budget_ms_per_minute => 60000);
SELECT fs_spend_tokens('g_b', 3, 100, 'g_bp') AS granted;
SELECT fs_report_latency('6 seconds', 'g_bp');
SELECT fs_spend_tokens('g_b', 3, 100, 'g_bp') AS granted_under_latency;
SELECT latency_ms, backpressure FROM fs_queues WHERE queue = 'g_bp';
SELECT fs_acquire_slot('g_b', 'g_bp') IS NOT NULL AS slot_still_granted;
SELECT fs_report_latency('1.5 seconds', 'g_bp');
SELECT fs_spend_tokens('g_b', 3, 100, 'g_bp') AS granted_latency_ok;
SELECT fs_report_latency('1 minute', 'g_bp');
SELECT t(3031);   -- a latency report holds as long as a heartbeat
SELECT fs_worker_heartbeat('w5', 2, 'g_bp');
SELECT backpressure FROM fs_queues WHERE queue = 'g_bp';
-- both threads busy: no free thread
SELECT fs_acquire_slot('g_c', 'g_bp') AS busy \gset
SELECT free_threads, backpressure FROM fs_queues WHERE queue = 'g_bp';
SELECT fs_spend_tokens('g_b', 3, 100, 'g_bp') AS granted_no_free_thread;
SELECT fs_spend_tokens('g_d', 3, 100, 'g_bp') AS granted_no_free_thread;
-- g_d had budget and headroom but no worker was free: failed to deliver
SELECT tenant, denied_backpressure, failed_to_deliver FROM fs_tenants WHERE queue = 'g_bp' ORDER BY tenant;
SELECT fs_release_slot(:busy);
SELECT fs_spend_tokens('g_b', 3, 100, 'g_bp') AS granted_thread_free;
SELECT reason, count(*) FROM fs_decisions WHERE queue = 'g_bp' AND kind = 'spend' GROUP BY 1 ORDER BY 1;

-- Errors.
\set VERBOSITY default
SELECT fs_worker_heartbeat(NULL, 1);
SELECT fs_worker_heartbeat('', 1);
SELECT fs_worker_heartbeat('w', NULL);
SELECT fs_worker_heartbeat('w', -1);
SELECT fs_worker_heartbeat('w', 100001);
SELECT fs_worker_heartbeat('w', 1, NULL);
SELECT fs_report_latency(NULL);
SELECT fs_report_latency('-1 second');
SELECT fs_report_latency('1 second', '');
SET fairshare.tenant_share = 0;
SET fairshare.dampen_floor = 1.5;
SET fairshare.dampen_window = 31;

-- Leave nothing behind.
SELECT fs_release_slot(lease_id) FROM fs_leases WHERE queue LIKE 'g\_%' AND state = 'live';
SELECT fs_worker_heartbeat(worker, 0, queue) FROM fs_workers WHERE queue LIKE 'g\_%';
RESET fairshare.debug_clock;
DROP FUNCTION slots_granted(text, text);
DROP FUNCTION t(float8);
TRUNCATE fs_limits;
