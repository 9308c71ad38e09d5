# A tenant's shard moved to another node (citus_move_shard_placement):
# decisions follow it at once; leases granted before the move stay on the
# node that granted them and are still released and renewed there; the old
# node refuses the tenant's decisions.  The bound of the move: until the
# old leases end, the tenant may hold them on the old node beside up to its
# limit on the new one.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareCitus;

my ($coord, @workers) = fs_citus_cluster(2);
my $q = sub { $coord->safe_psql('postgres', shift) };
my %by_group = fs_citus_by_group(@workers);

$q->("CREATE TABLE jobs (tenant text NOT NULL, id bigserial, PRIMARY KEY (tenant, id))");
$q->("SELECT create_distributed_table('jobs', 'tenant')");
$q->("SELECT fs_set_limit('*', 'q', max_slots => 2)");
$q->("SELECT fs_citus_setup('jobs')");

my $t = 'mover';
my $from_group = $q->("SELECT fs_tenant_node('$t')");
my $from = $by_group{$from_group};
my ($to) = grep { $_ != $from } @workers;
my $to_group = $to->safe_psql('postgres', 'SELECT groupid FROM pg_dist_local_group');
$q->("INSERT INTO jobs (tenant) VALUES ('$t')");

my $old = $q->("SELECT fs_acquire_slot('$t', 'q', '1 hour')");
is($q->("SELECT fs_lease_node($old)"), $from_group, 'the lease names the first owner');

my $shard = $q->("SELECT get_shard_id_for_distribution_column('jobs', '$t')");
$q->("SELECT citus_move_shard_placement($shard, '127.0.0.1', " . $from->port . ", '127.0.0.1', " . $to->port
	  . ", shard_transfer_mode => 'block_writes')");
is($q->("SELECT fs_tenant_node('$t')"), $to_group, 'the coordinator places the tenant on the new node');
is($from->safe_psql('postgres', "SELECT fs_tenant_node('$t')"), $to_group, 'so does the old node');

# Decisions follow the shard.
my $new1 = $q->("SELECT fs_acquire_slot('$t', 'q', '1 hour')");
my $new2 = $q->("SELECT fs_acquire_slot('$t', 'q', '1 hour')");
is($q->("SELECT fs_lease_node($new1)"), $to_group, 'the next lease is the new node\'s');
is($q->("SELECT fs_acquire_slot('$t', 'q', '1 hour')"), '', 'the new node enforces the limit');
is($to->safe_psql('postgres', "SELECT slots_in_use FROM fs_tenants WHERE tenant = '$t'"), 2,
	'the bound: 2 slots on the new node');
is($from->safe_psql('postgres', "SELECT count(*) FROM fs_leases WHERE tenant = '$t'"), 1,
	'beside the lease from before the move on the old node');

# The old node refuses the tenant's decisions.
my ($ret, $out, $err) = $from->psql('postgres', "SELECT fs_acquire_slot('$t', 'q'), 1");
like($err, qr/which does not own the tenant/, 'the old node refuses the tenant');

# The old lease is still renewed and released where it was granted.
is($q->("SELECT fs_renew_slot($old)"), 't', 'the old lease renews through the coordinator');
is($to->safe_psql('postgres', "SELECT fs_release_slot($old)"), 't', 'and is released from the new node');
is($from->safe_psql('postgres', "SELECT count(*) FROM fs_leases WHERE tenant = '$t'"), 0,
	'the old node holds nothing of the tenant');
is($q->("SELECT fs_release_slot($new1)") . $q->("SELECT fs_release_slot($new2)"), 'tt', 'the new leases release');

done_testing();
