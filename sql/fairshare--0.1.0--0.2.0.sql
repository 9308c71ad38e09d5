/* fairshare 0.1.0 -> 0.2.0: token budgets, the global gate, backpressure,
   the decision log and greedy-tenant tiers */

\echo Use "ALTER EXTENSION fairshare UPDATE TO '0.2.0'" to load this file. \quit

-- ---------------------------------------------------------------------------
-- Budget
-- ---------------------------------------------------------------------------

CREATE FUNCTION fs_spend_tokens(
    tenant         text,
    requested_runs integer,
    cost_ms        integer DEFAULT 100,
    queue          text DEFAULT 'default')
RETURNS integer
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_spend_tokens';
COMMENT ON FUNCTION fs_spend_tokens(text, integer, integer, text) IS
'admits up to requested_runs runs of cost_ms tokens each from the tenant''s budget: returns the runs granted (0 under backpressure)';

CREATE FUNCTION fs_charge_tokens(
    tenant  text,
    used_ms double precision,
    queue   text DEFAULT 'default')
RETURNS double precision
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_charge_tokens';
COMMENT ON FUNCTION fs_charge_tokens(text, double precision, text) IS
'pays used_ms of worker time from the tenant''s budget (the balance may go below zero); returns the balance, NULL without a budget';

-- ---------------------------------------------------------------------------
-- Global gate and backpressure
-- ---------------------------------------------------------------------------

CREATE FUNCTION fs_worker_heartbeat(worker text, threads integer, queue text DEFAULT 'default')
RETURNS void
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_worker_heartbeat';
COMMENT ON FUNCTION fs_worker_heartbeat(text, integer, text) IS
'reports a live worker with this many threads serving the queue (0: it stops); live threads drive the global gate';

CREATE FUNCTION fs_report_latency(latency interval, queue text DEFAULT 'default')
RETURNS void
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_report_latency';
COMMENT ON FUNCTION fs_report_latency(interval, text) IS
'reports how long the queue''s oldest ready job has waited; over fairshare.backpressure_latency, admission grants nothing';

CREATE FUNCTION fs_worker_state(
    OUT queue text,
    OUT worker text,
    OUT threads integer,
    OUT last_heartbeat timestamptz,
    OUT live boolean)
RETURNS SETOF record
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_worker_state';
COMMENT ON FUNCTION fs_worker_state() IS
'the workers that reported heartbeats for this database''s queues; see the fs_workers view';

CREATE VIEW fs_workers AS SELECT * FROM fs_worker_state();
GRANT SELECT ON fs_workers TO PUBLIC;
COMMENT ON VIEW fs_workers IS
'workers and their last heartbeats; live ones count towards their queue''s live threads';

CREATE FUNCTION fs_queue_state(
    OUT queue text,
    OUT tenants bigint,
    OUT live_workers integer,
    OUT live_threads integer,
    OUT slots_in_use integer,
    OUT free_threads integer,
    OUT tenant_share_threads double precision,
    OUT dampener double precision,
    OUT latency_ms double precision,
    OUT latency_reported_at timestamptz,
    OUT backpressure text)
RETURNS SETOF record
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_queue_state';
COMMENT ON FUNCTION fs_queue_state() IS
'the global gate''s view of every queue of this database; see the fs_queues view';

CREATE VIEW fs_queues AS SELECT * FROM fs_queue_state();
GRANT SELECT ON fs_queues TO PUBLIC;
COMMENT ON VIEW fs_queues IS
'per queue: live workers and threads, slots in use, the share a tenant may hold now, the dampener, latency, and backpressure (none, latency, no_free_thread)';

-- ---------------------------------------------------------------------------
-- Decision log
-- ---------------------------------------------------------------------------

CREATE FUNCTION fs_decision_state(
    OUT decided_at timestamptz,
    OUT pid integer,
    OUT kind text,
    OUT queue text,
    OUT tenant text,
    OUT requested_runs integer,
    OUT runs_possible integer,
    OUT runs_granted integer,
    OUT tokens_before double precision,
    OUT tokens_consumed double precision,
    OUT balance_after double precision,
    OUT reason text,
    OUT seq bigint)
RETURNS SETOF record
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_decision_state';
COMMENT ON FUNCTION fs_decision_state() IS
'the most recent decisions of every backend (fairshare.decision_log_size each); see the fs_decisions view';

CREATE VIEW fs_decisions AS SELECT * FROM fs_decision_state();
GRANT SELECT ON fs_decisions TO PUBLIC;
COMMENT ON VIEW fs_decisions IS
'recent decisions (kind slot, spend or charge): tokens before, runs possible, runs granted, tokens consumed, balance after, and the reason; seq orders the decisions of one pid';

-- ---------------------------------------------------------------------------
-- Greedy-tenant tiers
-- ---------------------------------------------------------------------------

-- fs_stats shows the tier table too.
DROP VIEW fs_stats;
DROP FUNCTION fs_server_state();
CREATE FUNCTION fs_server_state(
    OUT tenants bigint,
    OUT max_tenants integer,
    OUT tenant_entry_size integer,
    OUT tenant_bytes_per_entry integer,
    OUT leases bigint,
    OUT max_leases integer,
    OUT queues integer,
    OUT max_queues integer,
    OUT fail_open bigint,
    OUT evictions bigint,
    OUT tenant_table_full bigint,
    OUT queue_table_full bigint,
    OUT lease_table_full bigint,
    OUT limits_unreadable bigint,
    OUT leases_expired bigint,
    OUT leases_orphaned bigint,
    OUT leases_reregistered bigint,
    OUT tier_keys bigint,
    OUT max_tier_keys integer,
    OUT tier_bytes_per_key integer,
    OUT tier_bytes_per_rule integer,
    OUT start_kind text,
    OUT started_at timestamptz,
    OUT stats_reset timestamptz)
RETURNS record
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_server_state';
COMMENT ON FUNCTION fs_server_state() IS
'server-wide figures: table sizes and use (tenants, leases, queues, tier counters), fail-open and eviction counters, how state began; see the fs_stats view';
CREATE VIEW fs_stats AS SELECT * FROM fs_server_state();
GRANT SELECT ON fs_stats TO PUBLIC;
COMMENT ON VIEW fs_stats IS
'server-wide fairshare figures (all databases): capacity, fail_open, evictions, leases expired and re-registered';

CREATE FUNCTION fs_route_enqueue(
    tenant    text,
    job_class text,
    rules     jsonb,
    queue     text DEFAULT 'default')
RETURNS text
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_route_enqueue';
COMMENT ON FUNCTION fs_route_enqueue(text, text, jsonb, text) IS
'records an enqueue of the tenant''s job class and returns the queue to use: the last rule whose threshold is exceeded in its sliding window, else queue';

CREATE FUNCTION fs_tier_state(
    OUT queue text,
    OUT tenant text,
    OUT job_class text,
    OUT rule integer,
    OUT per interval,
    OUT enqueues double precision,
    OUT last_enqueue_at timestamptz)
RETURNS SETOF record
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'fs_tier_state';
COMMENT ON FUNCTION fs_tier_state() IS
'the sliding-window counters of greedy-tenant tiers; see the fs_tiers view';

CREATE VIEW fs_tiers AS SELECT * FROM fs_tier_state();
GRANT SELECT ON fs_tiers TO PUBLIC;
COMMENT ON VIEW fs_tiers IS
'per (queue, tenant, job class) and rule: enqueues counted in the rule''s sliding window now';
