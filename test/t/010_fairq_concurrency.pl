# Fair dequeue under real concurrency: 16 pgbench clients claim with
# fs_claim() (single rows watched by an independent probe, batches, claims
# rolled back whole or to a savepoint, two claims in one transaction) while
# others enqueue and recount the queue.  Afterwards, against the tables: no
# row was claimed twice (a primary key on the claim log would have failed the
# client), none was lost (every enqueued row was claimed once the queue is
# drained), no tenant held more slots than max_slots, and the counts in
# shared memory match the table with no lease left behind.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $node = fs_node('fairq_concurrency');
my $q = sub { $node->safe_psql('postgres', shift) };

$q->(q{
	CREATE TABLE cj (id bigserial PRIMARY KEY, tenant text NOT NULL, priority int NOT NULL DEFAULT 0);
	CREATE TABLE cj_running (job_id bigint PRIMARY KEY, tenant text NOT NULL, client int NOT NULL);
	CREATE TABLE enqueued (job_id bigint PRIMARY KEY);
	CREATE TABLE claimed (job_id bigint PRIMARY KEY, tenant text NOT NULL);
	CREATE TABLE probe (tenant text PRIMARY KEY, max_slots int, holders int NOT NULL DEFAULT 0,
	                    max_seen int NOT NULL DEFAULT 0);
	SELECT queue FROM fs_register_queue('cq', 'cj', tenant => 'tenant', order_by => 'priority, id',
	       running_table => 'cj_running', running_key => 'job_id');
	INSERT INTO probe (tenant, max_slots) SELECT 't' || i, 1 + i % 4 FROM generate_series(1, 20) i;
	SELECT fs_set_limit(tenant, 'cq', max_slots => max_slots) FROM probe;
	WITH j AS (INSERT INTO cj (tenant, priority)
	           SELECT 't' || (1 + (i * 7) % 20), i % 3 FROM generate_series(1, 6000) i RETURNING id)
	INSERT INTO enqueued SELECT id FROM j;
	SELECT fs_reset();
});

# One row, watched by the probe: incremented with the claim, decremented
# before the row stops running (which releases the lease at commit), so it
# never exceeds the true number of holders.
my $single = q{
\set hold_us random(0, 2000)
BEGIN;
WITH c AS (SELECT (j.job).id, j.tenant FROM fs_claim('cq', NULL::cj, 1) j),
     d AS (DELETE FROM cj USING c WHERE cj.id = c.id),
     r AS (INSERT INTO cj_running SELECT id, tenant, :client_id FROM c),
     l AS (INSERT INTO claimed SELECT id, tenant FROM c)
UPDATE probe p SET holders = holders + 1, max_seen = greatest(max_seen, holders + 1)
  FROM c WHERE p.tenant = c.tenant;
COMMIT;
\sleep :hold_us us
BEGIN;
UPDATE probe p SET holders = holders - 1 FROM cj_running r
 WHERE r.client = :client_id AND p.tenant = r.tenant;
DELETE FROM cj_running WHERE client = :client_id;
COMMIT;
};

# A batch, finished in its own transaction.
my $batch = q{
\set n random(1, 10)
BEGIN;
WITH c AS (SELECT (j.job).id, j.tenant FROM fs_claim('cq', NULL::cj, :n) j),
     d AS (DELETE FROM cj USING c WHERE cj.id = c.id),
     r AS (INSERT INTO cj_running SELECT id, tenant, :client_id FROM c)
INSERT INTO claimed SELECT id, tenant FROM c;
COMMIT;
DELETE FROM cj_running WHERE client = :client_id;
};

# Claims undone: whole, and to a savepoint with a claim kept after it; and
# a second claim in the same transaction.
my $undo = q{
\set n random(1, 10)
BEGIN;
SELECT count(*) FROM fs_claim('cq', NULL::cj, :n);
ROLLBACK;
BEGIN;
SAVEPOINT a;
SELECT count(*) FROM fs_claim('cq', NULL::cj, :n);
ROLLBACK TO a;
WITH c AS (SELECT (j.job).id, j.tenant FROM fs_claim('cq', NULL::cj, 2) j),
     d AS (DELETE FROM cj USING c WHERE cj.id = c.id),
     r AS (INSERT INTO cj_running SELECT id, tenant, :client_id FROM c)
INSERT INTO claimed SELECT id, tenant FROM c;
SELECT count(*) FROM fs_claim('cq', NULL::cj, 3);
WITH c AS (SELECT (j.job).id, j.tenant FROM fs_claim('cq', NULL::cj, 1) j),
     d AS (DELETE FROM cj USING c WHERE cj.id = c.id),
     r AS (INSERT INTO cj_running SELECT id, tenant, :client_id FROM c)
INSERT INTO claimed SELECT id, tenant FROM c;
COMMIT;
DELETE FROM cj_running WHERE client = :client_id;
};

# New rows arrive (some in transactions that roll back), and the queue is
# recounted now and then.
my $enqueue = q{
\set t random(1, 20)
\set k random(1, 5)
WITH j AS (INSERT INTO cj (tenant) SELECT 't' || :t FROM generate_series(1, :k) RETURNING id)
INSERT INTO enqueued SELECT id FROM j;
BEGIN;
INSERT INTO cj (tenant) SELECT 't' || :t FROM generate_series(1, :k);
ROLLBACK;
};
# Rows of tenants never seen before: their entries are created by commits
# racing each other for the tenant table's partition locks.
my $newcomers = q{
\set t random(1, 100000)
WITH j AS (INSERT INTO cj (tenant) VALUES ('n' || :t) RETURNING id)
INSERT INTO enqueued SELECT id FROM j;
};
my $recount = q{
SELECT count(*) FROM fs_resync('cq');
\sleep 20 ms
};

$node->pgbench(
	'--no-vacuum --client=16 --jobs=4 --time=8 --max-tries=1',
	0,
	[qr{number of failed transactions: 0 \(0\.000%\)}],
	[qr{^$}],
	'16 clients claim, undo, enqueue and recount concurrently',
	{
		'fq_single@8' => $single,
		'fq_batch@4' => $batch,
		'fq_undo@2' => $undo,
		'fq_enqueue@3' => $enqueue,
		'fq_newcomers@2' => $newcomers,
		'fq_recount@1' => $recount,
	});

ok($q->("SELECT count(*) FROM claimed") > 1000, 'many rows were claimed concurrently');
is($q->("SELECT count(*) FROM cj_running"), '0', 'every claimed row finished');
is($q->("SELECT string_agg(tenant || ' saw ' || max_seen || ' holders, max ' || max_slots, '; ')
           FROM probe WHERE max_seen > max_slots"), '', 'no tenant ever held more than max_slots');
is($q->("SELECT sum(holders) FROM probe"), '0', 'the probe ends at zero');

# What is left counts exactly, then drains: claimed and finished in one
# transaction, so slots are free again at once.
is($q->("SELECT coalesce(sum(ready_rows), 0) FROM fs_tenants WHERE queue = 'cq'"),
	$q->("SELECT count(*) FROM cj"), 'the backlog in shared memory matches the table');
$q->(q{
	DO $$
	BEGIN
	    LOOP
	        WITH c AS (SELECT (j.job).id, j.tenant FROM fs_claim('cq', NULL::cj, 100) j),
	             d AS (DELETE FROM cj USING c WHERE cj.id = c.id),
	             r AS (INSERT INTO cj_running SELECT id, tenant, 0 FROM c)
	        INSERT INTO claimed SELECT id, tenant FROM c;
	        EXIT WHEN NOT FOUND;
	        DELETE FROM cj_running;
	    END LOOP;
	END $$;
});
is($q->("SELECT count(*) FROM cj"), '0', 'the queue drains');
is($q->("SELECT count(*) FROM enqueued e LEFT JOIN claimed c USING (job_id) WHERE c.job_id IS NULL"),
	'0', 'no row was lost: every enqueued row was claimed');
is($q->("SELECT count(*) FROM claimed c LEFT JOIN enqueued e USING (job_id) WHERE e.job_id IS NULL"),
	'0', 'no row was claimed that was never committed');
is($q->("SELECT count(*) FROM fs_leases WHERE queue = 'cq'"), '0', 'no lease is left');
is($q->("SELECT coalesce(sum(slots_in_use), 0) || '/' || coalesce(sum(ready_rows), 0)
           FROM fs_tenants WHERE queue = 'cq'"), '0/0', 'no slot held, no row counted');
is($q->("SELECT fail_open FROM fs_stats"), '0', 'nothing failed open');
ok($q->("SELECT resyncs > 1 AND rows_released > 1000 FROM fs_fairness WHERE queue = 'cq'") eq 't',
	'recounts ran and leases were released by the running table meanwhile');

$node->stop;
done_testing();
