# The fair order's heaps growing and shrinking in several queues at once:
# thousands of backlogged tenants in one queue (its heap several directory
# levels deep), hundreds and tens in two others, each tenant's tag moved
# while it sits in its heap (rows claimed by the application itself), claims
# in strict fair order, concurrent claims draining all three, re-enqueues,
# and heaps drained to nothing.  Each tenant keeps its position in its heap;
# a wrong position would leave a moved tag out of the heap's order, which the
# claims in fair order see.  The debug build (test/run debug) also checks
# after every claim that every item's stored position is its own and that
# each heap's directory holds no more chunks than the pools are sized for.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $node = fs_node('fair_heap_churn', "fairshare.max_tenants = 10000");
my $q = sub { $node->safe_psql('postgres', shift) };

# Three queues: 4,200 tenants (more than 2,048, so the heap's directory is
# two levels deep), 700 and 40, two rows each.
my %tenants = (hq1 => 4200, hq2 => 700, hq3 => 40);
for my $name (sort keys %tenants)
{
	$q->(qq{
		CREATE TABLE $name (id bigserial PRIMARY KEY, tenant text NOT NULL);
		SELECT queue FROM fs_register_queue('$name', '$name', 'tenant', 'id');
		SELECT fs_set_limit('*', '$name', max_slots => 1000);
	});
}
my $enqueue = sub {
	my ($name, $from, $to, $rows) = @_;
	$q->(qq{INSERT INTO $name (tenant)
		SELECT '$name-' || lpad(i::text, 5, '0') FROM generate_series($from, $to) i,
		       generate_series(1, $rows) r ORDER BY random()});
};
$enqueue->($_, 1, $tenants{$_}, 2) for sort keys %tenants;

# Backlogs as the tables have them, and the fair order holding every
# backlogged tenant.
my $consistent = sub {
	my ($name, $what) = @_;
	is($q->(qq{SELECT count(*) || '/' || count(DISTINCT tenant) FROM $name}),
		$q->(qq{SELECT coalesce(sum(ready_rows), 0) || '/' || count(*) FROM fs_tenants
				WHERE queue = '$name' AND ready_rows > 0}),
		"$name: shared memory counts the table's rows and tenants ($what)");
	is($q->(qq{SELECT backlogged_tenants FROM fs_fairness WHERE queue = '$name'}),
		$q->(qq{SELECT count(DISTINCT tenant) FROM $name}),
		"$name: every backlogged tenant is in the fair order ($what)");
};
$consistent->($_, 'enqueued') for sort keys %tenants;

# Rows of every third tenant claimed by the application itself: each moves
# that tenant's tag while it is in its heap (found there by its position).
$q->(qq{DELETE FROM $_ WHERE id IN (SELECT min(id) FROM $_ GROUP BY tenant
		HAVING substr(tenant, 5)::int % 3 = 0)}) for sort keys %tenants;
$consistent->($_, 'tags moved') for sort keys %tenants;

# Claims one row at a time: each must go to the backlogged tenant with the
# smallest tag (then name), as the heap orders them.  Returns how many
# claims went elsewhere.
$q->(q{
	CREATE FUNCTION claim_in_order(queue text, rows int) RETURNS int
	LANGUAGE plpgsql AS $$
	DECLARE
		expected text;
		got text;
		lease bigint;
		job_id bigint;
		wrong int := 0;
	BEGIN
		FOR i IN 1 .. rows LOOP
			SELECT t.tenant INTO expected FROM fs_tenants t
			 WHERE t.queue = claim_in_order.queue AND t.ready_rows > 0
			 ORDER BY t.virtual_finish, t.tenant COLLATE "C" LIMIT 1;
			EXIT WHEN expected IS NULL;
			EXECUTE format('SELECT c.tenant, c.lease_id, (c.job).id FROM fs_claim(%L, NULL::%I, 1) c',
			               queue, queue) INTO got, lease, job_id;
			EXECUTE format('DELETE FROM %I WHERE id = $1', queue) USING job_id;
			PERFORM fs_release_slot(lease);
			IF got IS DISTINCT FROM expected THEN
				wrong := wrong + 1;
			END IF;
		END LOOP;
		RETURN wrong;
	END $$;
});
for my $name (sort keys %tenants)
{
	is($q->("SELECT claim_in_order('$name', 200)"), '0', "$name: 200 claims in fair order");
}
$consistent->($_, 'claimed in order') for sort keys %tenants;

# Concurrent claims in all three queues at once (batches; those of hq3 rolled
# back), while rows are added to tenants that left and to new ones.
my $claim = q{
\set n random(1, 20)
BEGIN;
WITH c AS (SELECT (j.job).id, j.lease_id FROM fs_claim('hq1', NULL::hq1, :n) j),
     d AS (DELETE FROM hq1 USING c WHERE hq1.id = c.id)
SELECT count(fs_release_slot(lease_id)) FROM c;
COMMIT;
};
my $claim_other = q{
\set n random(1, 40)
BEGIN;
WITH c AS (SELECT (j.job).id, j.lease_id FROM fs_claim('hq2', NULL::hq2, :n) j),
     d AS (DELETE FROM hq2 USING c WHERE hq2.id = c.id)
SELECT count(fs_release_slot(lease_id)) FROM c;
COMMIT;
BEGIN;
SELECT count(*) FROM fs_claim('hq3', NULL::hq3, :n);
ROLLBACK;
};
my $requeue = q{
\set t random(1, 5000)
INSERT INTO hq1 (tenant) SELECT 'hq1-' || lpad((:t + i)::text, 5, '0') FROM generate_series(0, 20) i;
INSERT INTO hq2 (tenant) SELECT 'hq2-' || lpad((:t % 800 + i)::text, 5, '0') FROM generate_series(0, 5) i;
};
$node->pgbench('--no-vacuum --client=4 --transactions=150', 0, [qr{processed: 600/600}], [qr{^$}],
	'concurrent claims and re-enqueues in three queues',
	{ 'heap_claim@4' => $claim, 'heap_claim_other@2' => $claim_other, 'heap_requeue@1' => $requeue });
$consistent->($_, 'after concurrent churn') for sort keys %tenants;
# A tenant whose claim came up short under the concurrent claims (its rows
# locked by another) is passed over for a second while others have rows:
# the order is checked once that has passed.
$q->('SELECT pg_sleep(1.2)');
is($q->("SELECT claim_in_order('hq1', 200) + claim_in_order('hq2', 200)"), '0',
	'claims in fair order after the churn');

# Drain everything in big batches: the heaps shrink down to nothing.
my $drain = sub {
	my ($name) = @_;
	my $left = 1;
	for (my $i = 0; $i < 200 && $left > 0; $i++)
	{
		$left = $q->(qq{
			WITH c AS (SELECT (j.job).id, j.lease_id FROM fs_claim('$name', NULL::$name, 500) j),
			     d AS (DELETE FROM $name USING c WHERE $name.id = c.id)
			SELECT count(fs_release_slot(lease_id)) FROM c});
	}
	is($q->("SELECT count(*) FROM $name"), '0', "$name: drained");
	is($q->("SELECT count(*) FROM fs_claim('$name', NULL::$name, 10)"), '0',
		"$name: a claim on the empty queue finds nothing");
	is($q->("SELECT backlogged_tenants FROM fs_fairness WHERE queue = '$name'"), '0',
		"$name: its fair order is empty");
};
$drain->($_) for sort keys %tenants;

# And they grow again from nothing, in all three, claims in fair order
# (hq3 to the end), and the rest drained.
$enqueue->('hq1', 3001, 7000, 1);
$enqueue->('hq2', 1, 300, 1);
$enqueue->('hq3', 1, 100, 1);
$consistent->($_, 'grown again') for sort keys %tenants;
is($q->("SELECT claim_in_order('hq1', 300) + claim_in_order('hq2', 150) + claim_in_order('hq3', 100)"),
	'0', 'claims in fair order in the heaps grown again');
$consistent->($_, 'grown again and claimed') for sort keys %tenants;
$drain->($_) for sort keys %tenants;
is($q->("SELECT count(*) FROM fs_leases"), '0', 'no lease is left');
unlike(slurp_file($node->logfile), qr/invariant|TRAP|terminated by signal/,
	'no invariant failed, no backend crashed');

$node->stop;
done_testing();
