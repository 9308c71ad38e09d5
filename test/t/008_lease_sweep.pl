# Leases whose acquire is rolled back while another transaction releases
# them, and the sweep a denied acquire runs.
#
# 1. A transaction releases a lease (it is releasing until commit) that
#    another transaction acquired and then rolls back: the lease is doomed,
#    not dropped, so it keeps its slot (and its tenant's entry) until the
#    releasing transaction ends, and then goes whichever way that ends.
#    Meanwhile the releasing transaction may take the slot over for the same
#    tenant, and nobody else gets it; its acquires for other tenants at
#    their ceiling are denied; its commit or rollback frees nothing twice,
#    and a full tenant table evicts nothing that a lease still holds.
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
# 1. A releasing lease whose acquire is rolled back
# ------------------------------------------------------------------
$q->("SELECT fs_set_limit('*', 'rq', max_slots => 1)");

for my $end ('COMMIT', 'ROLLBACK')
{
	my $acquirer = $node->background_psql('postgres');
	my $releaser = $node->background_psql('postgres');
	my $victim = "victim_" . lc($end);
	my $victim_state = sub {
		$q->("SELECT t.slots_in_use || '/' || coalesce(string_agg(l.state, ',' ORDER BY l.lease_id), '')"
			  . " FROM fs_tenants t LEFT JOIN fs_leases l USING (queue, tenant)"
			  . " WHERE t.queue = 'rq' AND t.tenant = '$victim' GROUP BY t.slots_in_use");
	};

	$acquirer->query_safe('BEGIN');
	my $lease = $acquirer->query_safe("SELECT fs_acquire_slot('$victim', 'rq', '1 hour')");
	$releaser->query_safe('BEGIN');
	is($releaser->query_safe("SELECT fs_release_slot($lease)"), 't',
		"$end: another transaction releases the lease, at its commit");
	$acquirer->query_safe('ROLLBACK');
	is($victim_state->(), '1/releasing',
		"$end: after the acquirer's rollback the lease keeps its slot while it is being released");
	is($q->("SELECT fs_acquire_slot('$victim', 'rq') IS NULL"), 't',
		"$end: nobody else gets the slot meanwhile");

	# Fill the tenant table with tenants that hold their one slot: the
	# victim's entry, held by the lease, is never evicted.
	for my $i (1 .. 64)
	{
		$q->("SELECT fs_acquire_slot('${end}_$i', 'rq', '1 hour')");
	}
	is($q->("SELECT count(*) FROM fs_tenants WHERE queue = 'rq' AND tenant = '$victim'"), '1',
		"$end: the victim's entry is kept while its lease is");

	# Every other tenant with an entry holds its one slot: the releasing
	# transaction may take none of them.
	my $grants = 0;
	for my $tenant (split /\n/,
		$q->("SELECT tenant FROM fs_tenants WHERE queue = 'rq' AND slots_in_use = 1 AND tenant <> '$victim'"))
	{
		$grants++
		  if $releaser->query_safe("SELECT fs_acquire_slot('$tenant', 'rq') IS NOT NULL") eq 't';
	}
	is($grants, 0, "$end: no other tenant at its ceiling is granted a released lease's slot");
	is($releaser->query_safe("SELECT fs_acquire_slot('$victim', 'rq') IS NOT NULL"), 't',
		"$end: the releasing transaction takes the slot over for the same tenant");
	$releaser->query_safe($end);
	is($victim_state->(), $end eq 'COMMIT' ? '1/live' : '0/',
		"$end: then the doomed lease is gone, and the slot taken over "
		  . ($end eq 'COMMIT' ? 'holds' : 'too'));
	is($q->("SELECT count(*) FROM fs_tenants WHERE queue = 'rq' AND slots_in_use > 1"), '0',
		"$end: no tenant is above its limit");
	is($q->("SELECT count(*) FROM fs_tenants t JOIN fs_leases l USING (queue, tenant)
			 WHERE t.queue = 'rq'"),
		$q->("SELECT coalesce(sum(slots_in_use), 0) FROM fs_tenants WHERE queue = 'rq'"),
		"$end: and exactly one lease per slot counted");

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
