--
-- Fair dequeue in two levels: fs_register_queue()'s subkey, the weights of
-- fs_subkey_weights, fs_fair_subkeys(), and the sub-keys' backlogs through
-- commits, rollbacks, updates and recounts.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS fairshare;
RESET client_min_messages;
SET fairshare.debug_clock = 1893456000;	-- 2030-01-01 00:00 UTC: no decay, no expiry

CREATE TABLE sk_jobs (id bigserial PRIMARY KEY, tenant text NOT NULL, sub text,
                      made timestamptz NOT NULL DEFAULT now());

-- The sub-key must be text-like, as a tenant is.
SELECT queue FROM fs_register_queue('sk', 'sk_jobs', 'tenant', 'id', subkey => 'made');
-- Registered with a subkey: the index serves (tenant, sub-key, order).
SELECT queue, tenant, subkey, ready_index
  FROM fs_register_queue('sk', 'sk_jobs', 'tenant', 'id', subkey => 'sub');
SELECT pg_get_indexdef('sk_jobs_fs_fair'::regclass);

-- Claim `n` rows at a time, `rounds` times, deleting what is claimed and
-- giving the slots back; what was served, per (tenant, sub-key).
CREATE TABLE sk_served (round int, tenant text, sub text);
CREATE FUNCTION sk_drain(rounds int, n int) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  r int;
BEGIN
  FOR r IN 1..rounds LOOP
    WITH c AS (SELECT * FROM fs_claim('sk', NULL::sk_jobs, n)),
         d AS (DELETE FROM sk_jobs j USING c WHERE j.id = (c.job).id RETURNING j.tenant, j.sub),
         s AS (INSERT INTO sk_served SELECT r, tenant, sub FROM d)
    SELECT count(fs_release_slot(lease_id)) INTO STRICT r FROM c;
  END LOOP;
END $$;

-- One tenant splits its rows over 1,000 sub-keys, another keeps one: each
-- gets one tenant's share, and inside the splitter the sub-keys share.
INSERT INTO sk_jobs (tenant, sub) SELECT 'splitter', 'key' || (g % 1000) FROM generate_series(1, 8000) g;
INSERT INTO sk_jobs (tenant, sub) SELECT 'single', 'only' FROM generate_series(1, 8000) g;
SELECT tenant, count(*) AS sub_keys, sum(ready_rows) AS ready_rows
  FROM fs_fair_subkeys('sk') GROUP BY 1 ORDER BY 1;
SELECT sk_drain(400, 10);
SELECT tenant, count(*) AS served FROM sk_served GROUP BY 1 ORDER BY 1;
-- Each of the splitter's sub-keys got its turn: 2,000 rows over 1,000 keys.
SELECT count(DISTINCT sub) AS sub_keys, min(c), max(c)
  FROM (SELECT sub, count(*) AS c FROM sk_served WHERE tenant = 'splitter' GROUP BY 1) s;
-- Counts follow the table.
SELECT tenant, sum(ready_rows) AS ready_rows FROM fs_fair_subkeys('sk') GROUP BY 1 ORDER BY 1;
TRUNCATE sk_jobs;
TRUNCATE sk_served;

-- Weights at both levels: tenant "big" weighs 2 (fs_limits), tenant "small"
-- 1; inside "big", sub-key "gold" weighs 3 and "iron" 1 (fs_subkey_weights);
-- inside "small" the default 1 each.  Shares: big 2/3 (gold 1/2, iron 1/6),
-- small 1/3 (1/6 each).
INSERT INTO fs_limits (queue, tenant, weight) VALUES ('sk', 'big', 2);
INSERT INTO fs_subkey_weights (queue, tenant, subkey, weight) VALUES ('sk', 'big', 'gold', 3);
-- A row for every queue and tenant loses to the more specific one.
INSERT INTO fs_subkey_weights (subkey, weight) VALUES ('gold', 100);
INSERT INTO sk_jobs (tenant, sub)
SELECT t, s FROM (VALUES ('big', 'gold'), ('big', 'iron'), ('small', 'a'), ('small', 'b')) v(t, s),
       generate_series(1, 6000);
SELECT sk_drain(600, 10);
SELECT tenant, sub, count(*) AS served,
       round(count(*)::numeric / sum(count(*)) OVER (), 4) AS share,
       abs(count(*)::numeric / sum(count(*)) OVER () /
           CASE WHEN tenant = 'small' OR sub = 'iron' THEN 1/6.0 ELSE 1/2.0 END - 1) < 0.05 AS within_5pct
  FROM sk_served GROUP BY 1, 2 ORDER BY 1, 2;
SELECT tenant, subkey, weight FROM fs_fair_subkeys('sk') ORDER BY 1, 2;
-- A change of a weight applies when it commits, for everyone; a claim in
-- the changing transaction still uses the committed one, and a change
-- rolled back applies nowhere.
BEGIN;
UPDATE fs_subkey_weights SET weight = 5 WHERE tenant = 'big' AND subkey = 'gold';
SELECT count(*) AS claimed FROM fs_claim('sk', NULL::sk_jobs, 4);
SELECT subkey, weight FROM fs_fair_subkeys('sk') WHERE tenant = 'big' ORDER BY 1;
ROLLBACK;
SELECT count(*) AS claimed FROM fs_claim('sk', NULL::sk_jobs, 4);
SELECT subkey, weight FROM fs_fair_subkeys('sk') WHERE tenant = 'big' ORDER BY 1;
UPDATE fs_subkey_weights SET weight = 1 WHERE tenant = 'big' AND subkey = 'gold';
SELECT count(*) AS claimed FROM fs_claim('sk', NULL::sk_jobs, 4);
SELECT subkey, weight FROM fs_fair_subkeys('sk') WHERE tenant = 'big' ORDER BY 1;
TRUNCATE sk_jobs;
TRUNCATE sk_served;
DELETE FROM fs_limits WHERE queue = 'sk';
DELETE FROM fs_subkey_weights;

-- A sub-key that drains and gets a row again at once keeps its tag: it
-- does not start ahead of the sub-key that waited.  "trickle" has one row
-- at a time (a new one comes after each of its rows is claimed), "flood"
-- many; they alternate.
INSERT INTO sk_jobs (tenant, sub) SELECT 'tq', 'flood' FROM generate_series(1, 50);
CREATE PROCEDURE sk_trickle() LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 1..20 LOOP
    IF NOT EXISTS (SELECT FROM sk_jobs WHERE tenant = 'tq' AND sub = 'trickle') THEN
      INSERT INTO sk_jobs (tenant, sub) VALUES ('tq', 'trickle');
    END IF;
    COMMIT;
    PERFORM sk_drain(1, 1);
    COMMIT;
  END LOOP;
END $$;
CALL sk_trickle();
SELECT sub, count(*) FROM sk_served GROUP BY 1 ORDER BY 1;
DROP PROCEDURE sk_trickle();
TRUNCATE sk_jobs;
TRUNCATE sk_served;

-- A NULL or invalid sub-key (empty, '*', over 63 bytes) is the leaf '*',
-- served like any other.
INSERT INTO sk_jobs (tenant, sub)
VALUES ('t1', NULL), ('t1', ''), ('t1', '*'), ('t1', repeat('x', 64)), ('t1', 'named');
SELECT subkey, ready_rows FROM fs_fair_subkeys('sk') ORDER BY 2 DESC, 1;
SELECT sk_drain(1, 10);
SELECT coalesce(sub, '(null)') AS sub FROM sk_served ORDER BY 1;
SELECT count(*) AS left_in_memory FROM fs_fair_subkeys('sk');
TRUNCATE sk_served;

-- A rolled-back claim gives its sub-keys their rows back; an update that
-- moves a row to another sub-key moves its count.
INSERT INTO sk_jobs (tenant, sub) SELECT 't2', 'k' || (g % 3) FROM generate_series(1, 9) g;
BEGIN;
SELECT count(*) AS claimed FROM fs_claim('sk', NULL::sk_jobs, 4);
SELECT subkey, ready_rows FROM fs_fair_subkeys('sk') ORDER BY 1;
ROLLBACK;
SELECT subkey, ready_rows FROM fs_fair_subkeys('sk') ORDER BY 1;
UPDATE sk_jobs SET sub = 'k9' WHERE sub = 'k0';
SELECT subkey, ready_rows FROM fs_fair_subkeys('sk') ORDER BY 1;
-- A recount finds the same.
SELECT tenants, ready_rows FROM fs_resync('sk');
SELECT subkey, ready_rows FROM fs_fair_subkeys('sk') ORDER BY 1;
-- A claimed row still ready at commit is given back to its sub-key.
BEGIN;
SELECT count(*) AS claimed FROM fs_claim('sk', NULL::sk_jobs, 2);
COMMIT;
SELECT subkey, ready_rows FROM fs_fair_subkeys('sk') ORDER BY 1;
SELECT short_probes FROM fs_fairness WHERE queue = 'sk';

-- fs_explain_wait() knows a row's sub-key: its tenant's order is its
-- sub-keys' (the last row of k9 waits for the rows of k9 before it, and for
-- those of the sub-keys whose turn comes first).
SELECT subkey, subkeys_ahead, tenant_rows_ahead, reason, detail
  FROM fs_explain_wait('sk', (SELECT max(id)::text FROM sk_jobs WHERE sub = 'k9'));
SELECT subkey, subkeys_ahead, tenant_rows_ahead
  FROM fs_explain_wait('sk', (SELECT min(id)::text FROM sk_jobs));
-- ... as a claim of all of them orders them.
BEGIN;
SELECT n - 1 AS rows_before_it
  FROM (SELECT (c.job).id, row_number() OVER () AS n FROM fs_claim('sk', NULL::sk_jobs, 9) c) c
 WHERE id = (SELECT max(id) FROM sk_jobs WHERE sub = 'k9');
ROLLBACK;

-- Who may read them: SELECT on the queue's table.
CREATE ROLE sk_stranger IN ROLE fairshare_app;
SET ROLE sk_stranger;
SELECT * FROM fs_fair_subkeys('sk');
RESET ROLE;
DROP ROLE sk_stranger;

-- Bad rows of fs_subkey_weights are refused.
\set VERBOSITY terse
INSERT INTO fs_subkey_weights (subkey, weight) VALUES ('x', 0);
INSERT INTO fs_subkey_weights (subkey, weight) VALUES ('', 1);
\set VERBOSITY default

SELECT fs_unregister_queue('sk');
DROP TABLE sk_jobs, sk_served;
DROP FUNCTION sk_drain(int, int);
