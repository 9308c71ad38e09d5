# A client killed with kill -9: leases it took in committed transactions stay
# until they expire (then the slot frees with nobody calling release); leases
# of its open transaction are returned when the server notices it is gone.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $node = fs_node('client_kill');
my $q = sub { $node->safe_psql('postgres', shift) };
$q->("SELECT fs_set_limit('acme', 'ck', max_slots => 2)");

# Committed leases of a client that dies.
my $client = $node->background_psql('postgres');
$client->query_safe("SELECT fs_acquire_slot('acme', 'ck', '3 seconds')");
$client->query_safe("SELECT fs_acquire_slot('acme', 'ck', '3 seconds')");
$client->{run}->signal('KILL');
$client->{run}->finish;
is($q->("SELECT slots_in_use FROM fs_tenants WHERE queue = 'ck'"), '2', 'the dead client still holds its slots');
is($q->("SELECT fs_acquire_slot('acme', 'ck') IS NULL"), 't', 'so the tenant is at its limit');
$node->poll_query_until('postgres', "SELECT fs_acquire_slot('acme', 'ck', '1 hour') IS NOT NULL")
  or die 'slots were never freed';
$node->poll_query_until('postgres', "SELECT fs_acquire_slot('acme', 'ck', '1 hour') IS NOT NULL")
  or die 'the second slot was never freed';
pass('after the leases expire the slots are free again, with no release');
is($q->("SELECT leases_expired FROM fs_tenants WHERE queue = 'ck'"), '2', 'both leases counted as expired');
$q->("SELECT fs_release_slot(lease_id) FROM fs_leases WHERE queue = 'ck'");

# Leases of a transaction left open by a client that dies.
$client = $node->background_psql('postgres');
$client->query_safe("BEGIN");
$client->query_safe("SELECT fs_acquire_slot('acme', 'ck', '1 hour')");
$client->query_safe("SELECT fs_acquire_slot('acme', 'ck', '1 hour')");
is($q->("SELECT slots_in_use FROM fs_tenants WHERE queue = 'ck'"), '2', 'open transaction holds two slots');
$client->{run}->signal('KILL');
$client->{run}->finish;
$node->poll_query_until('postgres', "SELECT slots_in_use = 0 FROM fs_tenants WHERE queue = 'ck'")
  or die 'slots of the aborted transaction were not returned';
pass('the backend aborts the transaction and returns its slots');
is($q->("SELECT count(*) FROM fs_leases WHERE queue = 'ck'"), '0', 'and its leases are gone');

$node->stop;
done_testing();
