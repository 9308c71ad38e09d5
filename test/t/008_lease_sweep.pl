# Leases against tenant entries that are evicted and reused, and the sweep a
# denied acquire runs.
#
# 1. A transaction releases a lease (it is releasing until commit) that
#    another transaction acquired and then rolls back: the slot goes, the
#    tenant's entry is idle, and a full tenant table evicts it and gives it
#    to another tenant.  The releasing transaction's later acquires must not
#    take that tenant's slots for the released lease's (a slot handed over
#    only within one tenant), and its commit or rollback frees nothing twice.
# 2. A denied acquire whose tenant holds an expired lease frees expired
#    leases and looks again, but a bounded number per call: not the whole
#    table, which the background sweeper (turned off here) is for.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $node = fs_node('lease_sweep', qq{
fairshare.max_tenants = 32
fairshare.max_leases = 16384
fairshare.sweep_interval = '1h'
});
my $q = sub { $node->safe_psql('postgres', shift) };

# ------------------------------------------------------------------
# 1. A releasing lease whose tenant entry is reused
# ------------------------------------------------------------------
$q->("SELECT fs_set_limit('*', 'rq', max_slots => 1)");

for my $end ('COMMIT', 'ROLLBACK')
{
	my $acquirer = $node->background_psql('postgres');
	my $releaser = $node->background_psql('postgres');
	my $victim = "victim_" . lc($end);

	$acquirer->query_safe('BEGIN');
	my $lease = $acquirer->query_safe("SELECT fs_acquire_slot('$victim', 'rq', '1 hour')");
	$releaser->query_safe('BEGIN');
	is($releaser->query_safe("SELECT fs_release_slot($lease)"), 't',
		"$end: another transaction releases the lease, at its commit");
	$acquirer->query_safe('ROLLBACK');
	is($q->("SELECT slots_in_use FROM fs_tenants WHERE queue = 'rq' AND tenant = '$victim'"), '0',
		"$end: the acquirer's rollback gave the slot back");

	# Fill the tenant table with tenants that hold their one slot, until
	# the idle victim is evicted (after any idle entries older than it) and
	# its entry reused.
	my $filled = 0;
	for my $i (1 .. 64)
	{
		$q->("SELECT fs_acquire_slot('${end}_$i', 'rq', '1 hour')");
		$filled = $i;
		last
		  if $q->("SELECT count(*) FROM fs_tenants WHERE queue = 'rq' AND tenant = '$victim'") eq '0';
	}
	is($q->("SELECT count(*) FROM fs_tenants WHERE queue = 'rq' AND tenant = '$victim'"), '0',
		"$end: the victim's entry was evicted ($filled tenants made)");

	# Every tenant with an entry holds its one slot: the releasing
	# transaction may take none of them, whichever reuses the victim's entry.
	my $grants = 0;
	for my $tenant (split /\n/,
		$q->("SELECT tenant FROM fs_tenants WHERE queue = 'rq' AND slots_in_use = 1"))
	{
		$grants++
		  if $releaser->query_safe("SELECT fs_acquire_slot('$tenant', 'rq') IS NOT NULL") eq 't';
	}
	is($grants, 0, "$end: no tenant at its ceiling is granted a released lease's slot");
	$releaser->query_safe($end);
	is($q->("SELECT count(*) FROM fs_tenants WHERE queue = 'rq' AND slots_in_use <> 1"), '0',
		"$end: after the releasing transaction ends every tenant still holds its one slot");
	is($q->("SELECT count(*) FROM fs_tenants t JOIN fs_leases l USING (queue, tenant)
			 WHERE t.queue = 'rq'"),
		$q->("SELECT count(*) FROM fs_tenants WHERE queue = 'rq'"),
		"$end: and exactly one lease each");

	$acquirer->quit;
	$releaser->quit;
	$q->("SELECT fs_release_slot(lease_id) FROM fs_leases WHERE queue = 'rq'");
}

# ------------------------------------------------------------------
# 2. The sweep of a denied acquire is bounded
# ------------------------------------------------------------------
$q->(q{
	SELECT fs_set_limit('*', 'sq', max_slots => 10000);
	SELECT fs_set_limit('s', 'sq', max_slots => 1);
	SELECT fs_reset();
});
$q->("SELECT count(fs_acquire_slot('live', 'sq', '1 hour')) FROM generate_series(1, 10)");
$q->("SELECT count(fs_acquire_slot('many', 'sq', '1 millisecond')) FROM generate_series(1, 6000)");
$q->("SELECT fs_acquire_slot('s', 'sq', '1 millisecond')");
$q->("SELECT pg_sleep(0.1)");

my $expired_before = $q->("SELECT count(*) FROM fs_leases WHERE queue = 'sq'");
is($expired_before, '6011', 'the leases are all there, 6001 of them expired');

my $granted = 0;
my $calls = 0;
my $left = $expired_before;
while (!$granted && $calls < 3)
{
	$calls++;
	$granted = $q->("SELECT fs_acquire_slot('s', 'sq', '1 hour') IS NOT NULL") eq 't';
	my $now_left = $q->("SELECT count(*) FROM fs_leases WHERE queue = 'sq'");
	cmp_ok($left - $now_left, '<=', 4096 + ($granted ? 1 : 0),
		"call $calls freed at most 4096 expired leases");
	cmp_ok($now_left, '>', 11 + 1, 'the first call left expired leases to the sweeper')
	  if $calls == 1;
	$left = $now_left;
}
ok($granted, "the tenant's expired lease was freed and its slot granted ($calls calls)");
is($q->("SELECT count(*) FROM fs_leases WHERE queue = 'sq' AND tenant = 'live'"), '10',
	'live leases are left alone');
is($q->("SELECT leases_expired FROM fs_tenants WHERE queue = 'sq' AND tenant = 's'"), '1',
	"the tenant's expired lease is counted once");
is($q->("SELECT slots_in_use FROM fs_tenants WHERE queue = 'sq' AND tenant = 's'"), '1',
	'and it holds one slot, the new one');
is($q->("SELECT (SELECT leases_expired FROM fs_tenants WHERE queue = 'sq' AND tenant = 'many')
				+ (SELECT count(*) FROM fs_leases WHERE queue = 'sq' AND tenant = 'many')"),
	'6000', 'every lease of the other tenant is either expired and counted, or still there');
is($q->("SELECT slots_in_use = (SELECT count(*) FROM fs_leases WHERE queue = 'sq' AND tenant = 'many')
		 FROM fs_tenants WHERE queue = 'sq' AND tenant = 'many'"), 't',
	"and its slots are its leases'");

# The sweeper frees the rest (a reload makes it sweep at once).
$q->("ALTER SYSTEM SET fairshare.sweep_interval = '10ms'; SELECT pg_reload_conf()");
$node->poll_query_until('postgres',
	"SELECT count(*) = 11 FROM fs_leases WHERE queue = 'sq'")
  or die 'the sweeper did not free the expired leases';
is($q->("SELECT slots_in_use FROM fs_tenants WHERE queue = 'sq' AND tenant = 'many'"), '0',
	'the sweeper frees the rest, each slot once');
is($q->("SELECT leases_expired FROM fs_stats"), '6001', 'every expired lease counted once');

$node->stop;
done_testing();
