# Claims with old snapshots under real concurrency: 12 pgbench clients,
# while new tenants' rows arrive one transaction each (each tenant new when
# it arrives, as a small tenant's job is) and old tenants' rows keep coming,
# claim in READ COMMITTED and in REPEATABLE READ transactions whose snapshot
# was taken a moment before their claim (so that many claims do not see the
# commits that listed the newest tenants), some rolled back.  After each of
# three bursts, with nothing else running, a claim takes as many rows as it
# asks for, and the newest tenants' rows among them (no tenant is left out
# for good); counts equal the table's; no row was claimed twice; the queue
# drains and no lease is left.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $node = fs_node('listing_old_snapshots');
my $q = sub { $node->safe_psql('postgres', shift) };

$q->(q{
	CREATE TABLE lj (id bigserial PRIMARY KEY, tenant text NOT NULL);
	CREATE TABLE claimed (job_id bigint PRIMARY KEY, tenant text NOT NULL);
	CREATE SEQUENCE new_tenant;
	SELECT queue FROM fs_register_queue('lq', 'lj', tenant => 'tenant', order_by => 'id');
	INSERT INTO lj (tenant) SELECT 'old' || (i % 4) FROM generate_series(1, 200000) i;
	SELECT fs_resync('lq');
});

# A new tenant's row; an old tenant's rows.
my $arrive = q{
INSERT INTO lj (tenant) VALUES ('new' || nextval('new_tenant'));
};
my $more = q{
\set t random(0, 3)
INSERT INTO lj (tenant) SELECT 'old' || :t FROM generate_series(1, 5);
};
# A claim in READ COMMITTED, its rows deleted; one in REPEATABLE READ,
# after its snapshot was taken, deleted or rolled back.
my $claim = q{
\set n random(1, 10)
WITH c AS (SELECT lease_id, (j.job).id, j.tenant FROM fs_claim('lq', NULL::lj, :n) j),
     d AS (DELETE FROM lj USING c WHERE lj.id = c.id),
     l AS (INSERT INTO claimed SELECT id, tenant FROM c)
SELECT count(fs_release_slot(lease_id)) FROM c;
};
my $claim_rr = q{
\set n random(1, 10)
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT 1;
\sleep 1 ms
WITH c AS (SELECT lease_id, (j.job).id, j.tenant FROM fs_claim('lq', NULL::lj, :n) j),
     d AS (DELETE FROM lj USING c WHERE lj.id = c.id),
     l AS (INSERT INTO claimed SELECT id, tenant FROM c)
SELECT count(fs_release_slot(lease_id)) FROM c;
COMMIT;
};
my $undo_rr = q{
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT 1;
\sleep 1 ms
SELECT count(*) FROM fs_claim('lq', NULL::lj, 5);
ROLLBACK;
};

# With nothing else running: a claim of 50 (rolled back) gets 50 rows, and
# every tenant that came last is among those it serves first.
my $check = q{
	BEGIN;
	CREATE TEMP TABLE got ON COMMIT DROP AS
	  SELECT j.tenant FROM fs_claim('lq', NULL::lj, 50) j;
	SELECT (SELECT count(*) FROM got) || ' ' || (SELECT least(count(*), 50) FROM lj) || ' ' ||
	       (SELECT count(*) FROM (SELECT DISTINCT tenant FROM lj WHERE tenant LIKE 'new%') n
	         WHERE n.tenant NOT IN (SELECT tenant FROM got));
	ROLLBACK;
};

my $served_before = 0;
for my $burst (1 .. 3)
{
	# Repeatable-read claims may meet rows deleted since their snapshot
	# (a serialization failure): they are tried again.
	$node->pgbench(
		'--no-vacuum --client=12 --jobs=4 --time=3 --max-tries=20',
		0,
		[qr{number of transactions actually processed: [1-9]}],
		[qr{^$}],
		"burst $burst: 12 clients enqueue new and old tenants, claim in read committed and repeatable read",
		{
			"ls_arrive_$burst\@3" => $arrive,
			"ls_more_$burst\@1" => $more,
			"ls_claim_$burst\@4" => $claim,
			"ls_claim_rr_$burst\@3" => $claim_rr,
			"ls_undo_rr_$burst\@1" => $undo_rr,
		});
	my $new_waiting = $q->("SELECT count(DISTINCT tenant) FROM lj WHERE tenant LIKE 'new%'");
	my ($got, $ready, $missed) = split / /, $q->($check);
	is($ready, '50', "burst $burst: 50 rows or more are ready");
	is($got, '50', "burst $burst: a claim of 50 got 50 rows");
	ok($new_waiting <= 49, "burst $burst: fewer new tenants waiting than the claim's rows ($new_waiting)");
	is($missed, '0', "burst $burst: the claim served every new tenant with a row waiting");
	my $served = $q->("SELECT count(*) FROM claimed");
	ok($served > $served_before + 100, "burst $burst: many rows were claimed ($served)");
	$served_before = $served;
}

is($q->("SELECT count(*) FROM claimed c JOIN lj ON lj.id = c.job_id"), '0',
	'no claimed row is still in the table');
fs_check_drains($node, 'lq', 'lj');

$node->stop;
done_testing();
