# Probe starts under real concurrency: 12 pgbench clients claim batches
# from a queue ordered by (priority, id), which uses probe starts, while
# others enqueue rows above and below every start, move rows to the front
# of their tenant's order, lock a tenant's first row for a moment outside
# fairshare, and roll claims back.  After each of three bursts, with
# nothing else running, one claim returns for each tenant exactly its first
# rows in order, and every tenant some (no start passed a ready row); no row was claimed twice;
# counts equal the table's; the queue drains.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $node = fs_node('probe_starts');
my $q = sub { $node->safe_psql('postgres', shift) };

$q->(q{
	CREATE TABLE pj (id bigint PRIMARY KEY, tenant text NOT NULL, priority int NOT NULL DEFAULT 0);
	CREATE TABLE claimed (job_id bigint PRIMARY KEY, tenant text NOT NULL);
	CREATE SEQUENCE high START 1000000;
	CREATE SEQUENCE low;
	SELECT queue FROM fs_register_queue('pq', 'pj', tenant => 'tenant', order_by => 'priority, id');
	INSERT INTO pj (id, tenant) SELECT i, 't' || (i % 3) FROM generate_series(1, 240000) i;
	SELECT fs_resync('pq');
});

# A batch, its rows deleted in its transaction; a batch rolled back.
my $batch = q{
\set n random(4, 12)
WITH c AS (SELECT lease_id, (j.job).id, j.tenant FROM fs_claim('pq', NULL::pj, :n) j),
     d AS (DELETE FROM pj USING c WHERE pj.id = c.id),
     l AS (INSERT INTO claimed SELECT id, tenant FROM c)
SELECT count(fs_release_slot(lease_id)) FROM c;
};
my $undo = q{
BEGIN;
WITH c AS (SELECT (j.job).id FROM fs_claim('pq', NULL::pj, 10) j)
DELETE FROM pj USING c WHERE pj.id = c.id;
ROLLBACK;
};
# Rows above and below every start; a row moved to the front of its
# tenant's order; a tenant's first row locked outside fairshare.
my $enqueue = q{
\set t random(0, 2)
\set u random(0, 2)
INSERT INTO pj (id, tenant) VALUES (nextval('high'), 't' || :t), (-nextval('low'), 't' || :u);
};
my $move = q{
\set t random(0, 2)
UPDATE pj SET priority = -1
 WHERE id = (SELECT id FROM pj WHERE tenant = 't' || :t AND priority = 0
              ORDER BY id DESC LIMIT 1 FOR UPDATE SKIP LOCKED);
};
my $lock = q{
\set t random(0, 2)
BEGIN;
SELECT id FROM pj WHERE tenant = 't' || :t ORDER BY priority, id LIMIT 1 FOR UPDATE SKIP LOCKED;
\sleep 2 ms
COMMIT;
};

# With nothing else running: a claim of 30 (rolled back) takes, of each
# tenant it serves, exactly the tenant's first rows.
my $check = q{
	BEGIN;
	CREATE TEMP TABLE got ON COMMIT DROP AS
	  SELECT j.tenant, (j.job).priority, (j.job).id FROM fs_claim('pq', NULL::pj, 30) j;
	SELECT count(*) || ' ' || (SELECT count(*) || '/' || count(DISTINCT tenant) FROM got) || ' '
	       || coalesce(string_agg(format('%s got %s, first %s', g.tenant, g.ids,
	                                     ARRAY(SELECT ROW(p.priority, p.id)::text FROM pj p
	                                            WHERE p.tenant = g.tenant
	                                            ORDER BY p.priority, p.id LIMIT g.k + 2)), '; '), '')
	  FROM (SELECT tenant, array_agg(id ORDER BY priority, id) AS ids, count(*) AS k
	          FROM got GROUP BY 1) g
	 WHERE g.ids <> ARRAY(SELECT id FROM pj WHERE tenant = g.tenant ORDER BY priority, id LIMIT g.k);
	ROLLBACK;
};

for my $burst (1 .. 3)
{
	$node->pgbench(
		'--no-vacuum --client=12 --jobs=4 --time=3 --max-tries=1',
		0,
		[qr{number of failed transactions: 0 \(0\.000%\)}],
		[qr{^$}],
		"burst $burst: 12 clients claim, roll back, enqueue low and high, move and lock rows",
		{
			"ps_batch_$burst\@8" => $batch,
			"ps_undo_$burst\@1" => $undo,
			"ps_enqueue_$burst\@2" => $enqueue,
			"ps_move_$burst\@1" => $move,
			"ps_lock_$burst\@1" => $lock,
		});
	# pgbench has exited, but a backend of its may still be ending an open
	# transaction and holding a row lock that the check's claim would skip.
	$node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type = 'client backend'"
		  . " AND pid <> pg_backend_pid()")
	  or die "pgbench's backends did not end";
	my ($wrong, $got, $detail) = split / /, $q->($check), 3;
	is($wrong, '0', "burst $burst: a claim took each tenant's first rows, in order")
	  or do
	{
		diag("the claim's rows of each tenant it served out of order, and the tenant's first rows"
			  . " (priority, id): $detail");
		diag("why each tenant's first row waits: "
			  . $q->("SELECT string_agg(f.tenant || ' ' || f.id || ': ' || x.reason || ' ' || x.detail, E'\\n')"
				  . " FROM (SELECT DISTINCT ON (tenant) tenant, id FROM pj ORDER BY tenant, priority, id) f,"
				  . " LATERAL fs_explain_wait('pq', f.id::text) x"));
		sleep 2;
		diag("the same claim 2 s later: " . $q->($check));
	};
	is($got, '30/3', "burst $burst: the claim got 30 rows, of all three tenants");
}

my $served = $q->("SELECT count(*) FROM claimed");
ok($served > 3000, "many rows were claimed concurrently ($served)");
is($q->("SELECT count(*) FROM claimed c JOIN pj ON pj.id = c.job_id"), '0',
	'no claimed row is still in the table');
fs_check_drains($node, 'pq', 'pj');

$node->stop;
done_testing();
