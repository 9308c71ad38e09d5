# Fair dequeue when shared memory is full: it fails open, never errors, and
# keeps serving.  Tenants that find no room in the tenant table are counted
# as untracked and claimed in the queue's own order once the fair order has
# nothing left to give; a queue that finds no room in the queue table is
# claimed in its own order altogether.  Eviction spares tenants whose fair
# order matters: those with backlog, and those still ahead of the queue's
# virtual time (forgetting them would give their debt back) until the queue
# goes idle.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $node = fs_node('fairq_fail_open', "fairshare.max_tenants = 32\nfairshare.max_queues = 2");
my $q = sub { $node->safe_psql('postgres', shift) };

$q->(q{
	CREATE TABLE fo (id serial PRIMARY KEY, tenant text NOT NULL);
	SELECT queue FROM fs_register_queue('fo', 'fo', 'tenant', 'id');
	SELECT fs_set_limit('*', 'fo', max_slots => 100);
});

# A tenant served once stays ahead of the virtual time: it must survive a
# full table of newcomers.
$q->("INSERT INTO fo (tenant) VALUES ('ahead')");
my $take = q{
	WITH c AS (SELECT lease_id, (job).id FROM fs_claim('fo', NULL::fo, %d)),
	     d AS (DELETE FROM fo USING c WHERE fo.id = c.id)
	SELECT count(fs_release_slot(lease_id)) FROM c};
$q->(sprintf($take, 1));
is($q->("SELECT ready_rows || '/' || slots_in_use || '/' || (virtual_finish > 0) FROM fs_tenants WHERE tenant = 'ahead'"),
	'0/0/true', 'a tenant served once, idle, ahead of the virtual time');

# 40 tenants with 2 rows each, in one table of 32 entries.
$q->("INSERT INTO fo (tenant) SELECT 't' || i FROM generate_series(1, 40) i, generate_series(1, 2)");
is($q->("SELECT count(*) FROM fs_tenants WHERE tenant = 'ahead'"), '1', 'it was not evicted');
my ($tracked, $untracked) = split /\|/,
	$q->("SELECT sum(ready_rows), (SELECT rows_untracked FROM fs_fairness WHERE queue = 'fo') FROM fs_tenants WHERE queue = 'fo'");
is($tracked + $untracked, 80, "every row is counted: $tracked in the fair order, $untracked untracked");
ok($untracked > 0, 'some tenants found no room');

# Claim everything, finishing as we go: nothing errors, nothing is left.
my $rounds = 0;
$rounds++ while $rounds < 100 && $q->(sprintf($take, 10)) > 0;
is($q->("SELECT count(*) FROM fo"), '0', 'every row was claimed, tracked or not');
ok($q->("SELECT fail_open > 0 FROM fs_fairness WHERE queue = 'fo'") eq 't', 'claims without fair order were counted');
# Once the fair order had nothing left to give, the queue was idle: V moved
# past every tag, the drained tenants became evictable, and the slots of the
# untracked rows found room.
ok($q->("SELECT evictions > 0 FROM fs_stats") eq 't',
	'an idle queue lets its drained tenants be evicted for the rest');

# A queue the queue table has no room for (two queues: 'fo' and 'full2').
$q->(q{
	CREATE TABLE full2 (id serial PRIMARY KEY, tenant text NOT NULL);
	CREATE TABLE full3 (id serial PRIMARY KEY, tenant text NOT NULL);
	SELECT queue FROM fs_register_queue('full2', 'full2', 'tenant', 'id', max_slots => 1);
	SELECT queue FROM fs_register_queue('full3', 'full3', 'tenant', 'id');
	INSERT INTO full2 (tenant) SELECT 'x' FROM generate_series(1, 3);
	INSERT INTO full3 (tenant) SELECT 'y' FROM generate_series(1, 3);
});
is($q->("SELECT count(*) FROM fs_claim('full2', NULL::full2, 10)"), '1', 'the second queue is tracked (max_slots 1)');
is($q->("SELECT queue_table_full > 0 FROM fs_stats"), 't', 'the third found the queue table full');
is($q->("SELECT count(*) FROM fs_claim('full3', NULL::full3, 10)"), '3',
	'and is claimed in its own order, without limits it cannot keep');
is($q->("SELECT count(*) FROM fs_ready_tenants('full3')"), '0', 'it has no fair order to show');

$node->stop;
done_testing();
