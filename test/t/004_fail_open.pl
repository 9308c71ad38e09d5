# Shared memory full: idle tenants are evicted; when nothing can be evicted,
# decisions fail open (granted, counted, never an error).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $node = fs_node('fail_open',
	"fairshare.max_tenants = 32\nfairshare.max_leases = 40\nfairshare.max_queues = 2");
my $q = sub { $node->safe_psql('postgres', shift) };

# Fill the tenant table with tenants that hold a slot: none is idle.
$q->("SELECT fs_acquire_slot('busy' || i, 'fo', '1 hour') FROM generate_series(1, 32) i");
is($q->("SELECT count(*) FROM fs_tenants"), '32', 'tenant table full');
my $lease = $q->("SELECT fs_acquire_slot('newcomer', 'fo', '1 hour')");
ok($lease > 0, 'a new tenant is granted anyway (fail open)');
is($q->("SELECT fail_open || '/' || tenant_table_full || '/' || evictions FROM fs_stats"), '1/1/0',
	'counted as fail_open; nothing evicted');
is($q->("SELECT fs_renew_slot($lease) || '/' || fs_release_slot($lease)"), 'false/false',
	'a fail-open lease is not tracked');
is($q->("SELECT count(*) FROM fs_tenants WHERE tenant = 'newcomer'"), '0', 'no entry was made');

is($q->("SELECT fs_spend_tokens('newcomer', 7, 100, 'fo')"), '7', 'a spend for it is granted in full');
is($q->("SELECT fail_open FROM fs_stats"), '2', 'and counted as fail_open');
is($q->("SELECT reason || '/' || runs_granted FROM fs_decisions WHERE tenant = 'newcomer' AND kind = 'spend'"),
	'fail_open/7', 'with its reason in the decision log');
is($q->("SELECT fs_charge_tokens('newcomer', 5, 'fo') IS NULL"), 't', 'a charge fails open too');

# Release some: those tenants become idle.  A tenant dropping its last slot
# ends the back-off after the fruitless eviction pass above, so the next
# newcomer is tracked at once by evicting an idle entry.
$q->("SELECT fs_release_slot(lease_id) FROM fs_leases WHERE tenant IN ('busy1', 'busy2')");
is($q->("SELECT fs_acquire_slot('newcomer', 'fo', '1 hour') IS NOT NULL"), 't', 'granted');
is($q->("SELECT fail_open || '/' || evictions FROM fs_stats"), '3/1',
	'by evicting an idle entry at once, not by failing open');
is($q->("SELECT count(*) FROM fs_tenants WHERE tenant IN ('busy1', 'busy2')"), '1',
	'the least recently used idle entry went first');
is($q->("SELECT slots_in_use FROM fs_tenants WHERE tenant = 'newcomer'"), '1', 'the newcomer is tracked');

# Lease table full (40 leases; 31 held): expired leases are swept first, then
# the rest fail open.
$q->("SELECT fs_set_limit('*', 'fo', max_slots => 100)");
$q->("SELECT fs_acquire_slot('busy3', 'fo', '1 hour') FROM generate_series(1, 20)");
is($q->("SELECT leases FROM fs_stats"), '40', 'lease table full');
ok($q->("SELECT lease_table_full > 0 AND fail_open > 4 FROM fs_stats") eq 't', 'overflowing leases fail open');
is($q->("SELECT slots_in_use FROM fs_tenants WHERE tenant = 'busy3'"), '10',
	'untracked grants do not count as held slots');

# Queue table full (2 queues: 'fo' and the next one).
is($q->("SELECT fs_acquire_slot('x', 'fo2') IS NOT NULL"), 't', 'second queue is fine');
is($q->("SELECT fs_acquire_slot('x', 'fo3') IS NOT NULL"), 't', 'third queue fails open');
is($q->("SELECT queue_table_full FROM fs_stats"), '1', 'counted');

# Tier counters full (32): idle ones are evicted, else the job stays put.
$node->append_conf('postgresql.conf', 'fairshare.max_tier_keys = 32');
$node->restart;
my $rules = q{'[{"threshold": 1000, "per": "1 hour", "queue": "slow"}]'};
$q->("SELECT fs_route_enqueue('t' || i, 'Job', $rules, 'fo') FROM generate_series(1, 32) i");
my $before = $q->("SELECT fail_open FROM fs_stats");
is($q->("SELECT fs_route_enqueue('t33', 'Job', $rules, 'fo')"), 'fo', 'a full tier table keeps the job in its queue');
is($q->("SELECT fail_open - $before FROM fs_stats"), '1', 'counted as fail_open');

$node->stop;
done_testing();
