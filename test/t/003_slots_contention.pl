# Slots under real concurrency: 64 pgbench clients acquire, hold for a random
# time, and release slots of four tenants with max_slots 1..4, some inside
# transactions that roll back.  An independent probe (a table the test
# controls) counts holders: it is incremented only after a grant and
# decremented before the release, so it can never be above the true number of
# holders; if it ever passes max_slots, fairshare granted too many.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $node = fs_node('contention');
my $q = sub { $node->safe_psql('postgres', shift) };

$q->(q{
	CREATE TABLE probe (tenant text PRIMARY KEY, max_slots int, holders int NOT NULL DEFAULT 0,
	                    max_seen int NOT NULL DEFAULT 0, grants int NOT NULL DEFAULT 0);
	INSERT INTO probe (tenant, max_slots) SELECT 'c' || i, i FROM generate_series(1, 4) i;
	SELECT fs_set_limit(tenant, 'contention', max_slots => max_slots) FROM probe;
	CREATE TABLE rolled_back (grants int NOT NULL);
	INSERT INTO rolled_back VALUES (0);
	SELECT fs_reset();
});

# Hold a slot for 0..3 ms, checked by the probe.
my $hold = q{
\set t random(1, 4)
\set hold_us random(0, 3000)
SELECT coalesce(fs_acquire_slot('c' || :t, 'contention', '1 minute'), 0) AS lease \gset
\if :lease > 0
UPDATE probe SET holders = holders + 1, max_seen = greatest(max_seen, holders + 1), grants = grants + 1 WHERE tenant = 'c' || :t;
\sleep :hold_us us
UPDATE probe SET holders = holders - 1 WHERE tenant = 'c' || :t;
SELECT fs_release_slot(:lease);
\endif
};

# Take a slot in a transaction that rolls back: it must come back.
my $rollback = q{
\set t random(1, 4)
BEGIN;
SELECT coalesce(fs_acquire_slot('c' || :t, 'contention', '1 minute'), 0) AS lease \gset
ROLLBACK;
\if :lease > 0
UPDATE rolled_back SET grants = grants + 1;
\endif
};

# Release and take the next one in the same transaction (a handover).
my $handover = q{
\set t random(1, 4)
SELECT coalesce(fs_acquire_slot('c' || :t, 'contention', '1 minute'), 0) AS lease \gset
\if :lease > 0
UPDATE probe SET holders = holders + 1, max_seen = greatest(max_seen, holders + 1), grants = grants + 1 WHERE tenant = 'c' || :t;
UPDATE probe SET holders = holders - 1 WHERE tenant = 'c' || :t;
BEGIN;
SELECT fs_release_slot(:lease);
SELECT coalesce(fs_acquire_slot('c' || :t, 'contention', '1 minute'), 0) AS next \gset
COMMIT;
\if :next > 0
UPDATE probe SET holders = holders + 1, max_seen = greatest(max_seen, holders + 1), grants = grants + 1 WHERE tenant = 'c' || :t;
UPDATE probe SET holders = holders - 1 WHERE tenant = 'c' || :t;
SELECT fs_release_slot(:next);
\endif
\endif
};

$node->pgbench(
	'--no-vacuum --client=64 --jobs=4 --transactions=250',
	0,
	[qr{processed: 16000/16000}],
	[qr{^$}],
	'64 clients acquire and release concurrently',
	{
		'fs_hold@6' => $hold,
		'fs_rollback@2' => $rollback,
		'fs_handover@2' => $handover,
	});

my $violations = $q->("SELECT string_agg(tenant || ' saw ' || max_seen || ' holders, max ' || max_slots, '; ') FROM probe WHERE max_seen > max_slots");
is($violations, '', 'holders never exceeded max_slots');
is($q->("SELECT string_agg(tenant, ',' ORDER BY tenant) FROM probe WHERE max_seen = max_slots"),
	'c1,c2,c3,c4', 'every tenant was driven to its limit');
is($q->("SELECT sum(holders) FROM probe"), '0', 'the probe ends at zero');
is($q->("SELECT coalesce(sum(slots_in_use), 0) FROM fs_tenants WHERE queue = 'contention'"), '0',
	'every slot is free at the end');
is($q->("SELECT count(*) FROM fs_leases WHERE queue = 'contention'"), '0', 'no lease is left');
is($q->("SELECT sum(granted) FROM fs_tenants WHERE queue = 'contention'"),
	$q->("SELECT (SELECT sum(grants) FROM probe) + (SELECT grants FROM rolled_back)"),
	'fairshare granted exactly what the clients saw granted');
ok($q->("SELECT sum(denied_tenant_limit) > 0 FROM fs_tenants WHERE queue = 'contention'") eq 't',
	'and denied the rest');
is($q->("SELECT fail_open FROM fs_stats"), '0', 'nothing failed open');

$node->stop;
done_testing();
