--
-- Token budgets: fs_spend_tokens() and fs_charge_tokens() against an injected
-- clock: a full bucket at first sight, exact continuous accrual, the cap,
-- debt and its repayment, clamping to affordable runs, refunds on rollback,
-- the decision log, and every error.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS fairshare;
RESET client_min_messages;

-- 2030-01-01 12:30 UTC, far from the top of the hour; t(s) moves the clock.
CREATE FUNCTION t(seconds float8) RETURNS void LANGUAGE sql AS
  $$ SELECT set_config('fairshare.debug_clock', (1893501000 + seconds)::text, false) $$;
SELECT t(0);

-- 6,000 ms per minute = 100 ms per second.
SELECT fs_set_limit('b_a', 'b_q', budget_ms_per_minute => 6000);
-- A tenant seen for the first time starts with a full bucket.
SELECT fs_spend_tokens('b_a', 100, 100, 'b_q') AS granted;          -- 60 of 100
SELECT token_balance FROM fs_tenants WHERE queue = 'b_q' AND tenant = 'b_a';
SELECT fs_spend_tokens('b_a', 1, 100, 'b_q') AS granted_when_empty;  -- 0
-- Accrual is continuous: 2.5 s later there are exactly 250 tokens.
SELECT t(2.5);
SELECT token_balance FROM fs_tenants WHERE queue = 'b_q' AND tenant = 'b_a';
SELECT fs_spend_tokens('b_a', 5, 100, 'b_q') AS granted;             -- 2 (floor(250/100))
SELECT token_balance FROM fs_tenants WHERE queue = 'b_q' AND tenant = 'b_a';
SELECT fs_spend_tokens('b_a', 1, 60, 'b_q') AS granted_cheaper;      -- 0: 50 < 60
SELECT fs_spend_tokens('b_a', 1, 50, 'b_q') AS granted_exactly;      -- 1: 50 = 50
-- A paused tenant accrues up to the cap, no further.
SELECT t(602.5);
SELECT token_balance FROM fs_tenants WHERE queue = 'b_q' AND tenant = 'b_a';
SELECT fs_spend_tokens('b_a', 1000, 1, 'b_q') AS granted;            -- 1000 of 6000
SELECT fs_spend_tokens('b_a', 0, 1, 'b_q') AS asked_nothing;
-- Charges: pay as you go, into debt; accrual repays it.
SELECT fs_charge_tokens('b_a', 8000, 'b_q') AS balance;              -- 5000 - 8000
SELECT fs_spend_tokens('b_a', 1, 1, 'b_q') AS granted_in_debt;
SELECT t(632.5);
SELECT fs_charge_tokens('b_a', 0, 'b_q') AS balance;                 -- -3000 + 3000
SELECT t(633.5);
SELECT fs_spend_tokens('b_a', 1, 100, 'b_q') AS granted_debt_repaid;
SELECT fs_charge_tokens('b_a', 0.5, 'b_q') AS balance_fractional;
-- Lowering the cap clamps the balance; budget 0 admits nothing.
SELECT t(700);
SELECT fs_set_limit('b_a', 'b_q', budget_ms_per_minute => 600);
SELECT fs_spend_tokens('b_a', 1, 1, 'b_q'),
       (SELECT token_balance FROM fs_tenants WHERE queue = 'b_q' AND tenant = 'b_a');
SELECT fs_set_limit('b_z', 'b_q', budget_ms_per_minute => 0);
SELECT fs_spend_tokens('b_z', 1, 1, 'b_q') AS zero_budget;

-- Debt is bounded to a day of budget; one charge to a day of work.
SELECT fs_set_limit('b_d', 'b_q', budget_ms_per_minute => 10);
SELECT fs_charge_tokens('b_d', 86400000, 'b_q') AS balance;   -- 10 - 86,400,000, kept at -14,400
SELECT fs_charge_tokens('b_d', 86400000, 'b_q') AS balance;   -- stays at the bound
SELECT t(700 + 86400);
SELECT fs_spend_tokens('b_d', 1, 10, 'b_q') AS repaid_to_zero_after_a_day;
SELECT t(700 + 86460);
SELECT fs_spend_tokens('b_d', 1, 10, 'b_q') AS a_minute_later;
SELECT t(700);

-- No budget: everything is granted, nothing is counted down.
SELECT fs_spend_tokens('b_free', 1000000, 1000, 'b_q') AS unlimited;
SELECT fs_charge_tokens('b_free', 123, 'b_q') AS no_balance;
SELECT budget_ms_per_minute, token_balance FROM fs_tenants WHERE queue = 'b_q' AND tenant = 'b_free';

-- Rollback refunds what was spent and charged; savepoints too.
SELECT fs_set_limit('b_r', 'b_q', budget_ms_per_minute => 1000);
BEGIN;
SELECT fs_spend_tokens('b_r', 3, 100, 'b_q') AS spent;
SELECT fs_charge_tokens('b_r', 500, 'b_q') AS charged;
ROLLBACK;
SELECT token_balance FROM fs_tenants WHERE queue = 'b_q' AND tenant = 'b_r';
BEGIN;
SELECT fs_spend_tokens('b_r', 2, 100, 'b_q') AS kept;
SAVEPOINT s;
SELECT fs_spend_tokens('b_r', 5, 100, 'b_q') AS undone;
ROLLBACK TO SAVEPOINT s;
SAVEPOINT s2;
SELECT fs_spend_tokens('b_r', 1, 100, 'b_q') AS kept_too;
RELEASE SAVEPOINT s2;
COMMIT;
SELECT token_balance FROM fs_tenants WHERE queue = 'b_q' AND tenant = 'b_r';  -- 1000 - 300
-- a refund never takes the bucket past its cap
BEGIN;
SELECT fs_spend_tokens('b_r', 7, 100, 'b_q') AS spent_all;
SELECT t(760);
ROLLBACK;
SELECT token_balance FROM fs_tenants WHERE queue = 'b_q' AND tenant = 'b_r';  -- capped at 1000
-- A prepared transaction's spend stays taken while it is prepared; ROLLBACK
-- PREPARED gives it back, COMMIT PREPARED keeps it spent.
BEGIN;
SELECT fs_spend_tokens('b_r', 1, 100, 'b_q') AS spent;
SELECT fs_charge_tokens('b_r', 50, 'b_q') IS NOT NULL AS charged;
PREPARE TRANSACTION 'fs_budget';
SELECT token_balance FROM fs_tenants WHERE queue = 'b_q' AND tenant = 'b_r';  -- 1000 - 150
ROLLBACK PREPARED 'fs_budget';
SELECT token_balance FROM fs_tenants WHERE queue = 'b_q' AND tenant = 'b_r';  -- 1000 again
BEGIN;
SELECT fs_spend_tokens('b_r', 2, 100, 'b_q') AS spent;
PREPARE TRANSACTION 'fs_budget';
COMMIT PREPARED 'fs_budget';
SELECT token_balance FROM fs_tenants WHERE queue = 'b_q' AND tenant = 'b_r';  -- 1000 - 200
-- A PREPARE that fails after its refunds were parked (the name is taken)
-- gives them back once: from 800 (below the cap) to 800 again, not 900.
CREATE TABLE b_holder (x int);
BEGIN;
INSERT INTO b_holder VALUES (1);
PREPARE TRANSACTION 'b_taken';
BEGIN;
SELECT fs_spend_tokens('b_r', 1, 100, 'b_q') AS spent;
PREPARE TRANSACTION 'b_taken';
SELECT token_balance FROM fs_tenants WHERE queue = 'b_q' AND tenant = 'b_r';  -- 800
ROLLBACK PREPARED 'b_taken';
SELECT token_balance FROM fs_tenants WHERE queue = 'b_q' AND tenant = 'b_r';  -- 800
DROP TABLE b_holder;

-- The decision log: tokens before, runs possible, granted, consumed, after.
SELECT decided_at - '2030-01-01 12:30:00+00' AS at, kind, requested_runs, runs_possible,
       runs_granted, tokens_before, tokens_consumed, balance_after, reason
  FROM fs_decisions WHERE queue = 'b_q' AND tenant = 'b_a'
 ORDER BY seq;
-- Counters by reason.
SELECT tenant, granted, denied_no_budget, denied_backpressure
  FROM fs_tenants WHERE queue = 'b_q' ORDER BY tenant;

-- Refunds of more than 64 tenants cannot be parked: the PREPARE fails, and
-- its spends are given back as by any abort.
SELECT fs_set_limit('*', 'b_pq', budget_ms_per_minute => 1000);
BEGIN;
SELECT count(fs_spend_tokens('b_many' || i, 1, 100, 'b_pq')) FROM generate_series(1, 65) i;
PREPARE TRANSACTION 'fs_budget';
SELECT count(*) AS prepared FROM pg_prepared_xacts;
SELECT count(*) AS tenants, count(*) FILTER (WHERE token_balance < 1000) AS still_spent
  FROM fs_tenants WHERE queue = 'b_pq' AND tenant LIKE 'b_many%';
DELETE FROM fs_limits WHERE queue = 'b_pq';

-- Errors: each says what is wrong and what to do.
\set VERBOSITY default
SELECT fs_spend_tokens(NULL, 1);
SELECT fs_spend_tokens('b_x', NULL);
SELECT fs_spend_tokens('b_x', -1);
SELECT fs_spend_tokens('b_x', 1, 0);
SELECT fs_spend_tokens('b_x', 1, -100);
SELECT fs_spend_tokens('b_x', 1, NULL);
SELECT fs_spend_tokens('b_x', 1, 100, NULL);
SELECT fs_charge_tokens(NULL, 1);
SELECT fs_charge_tokens('b_x', NULL);
SELECT fs_charge_tokens('b_x', 'NaN');
SELECT fs_charge_tokens('b_x', 'Infinity');
SELECT fs_charge_tokens('b_x', '-Infinity');
SELECT fs_charge_tokens('b_x', -1);
SELECT fs_charge_tokens('b_x', 86400001);
SELECT count(*) AS entries_for_bad_input FROM fs_tenants WHERE tenant = 'b_x';

RESET fairshare.debug_clock;
DROP FUNCTION t(float8);
TRUNCATE fs_limits;
