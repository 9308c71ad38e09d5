# FairshareCitus: a Citus cluster on this machine for fairshare's scale-out
# tests (test/citus/*.pl): a coordinator and workers, each with
# shared_preload_libraries = 'citus,fairshare', Citus created on each, the
# workers added to the coordinator, and fairshare created on the coordinator
# (Citus creates it on the workers).
package FairshareCitus;

use strict;
use warnings;

use Exporter 'import';
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use FairshareTest;

our @EXPORT = qw(fs_citus_cluster fs_citus_node_of);

# fs_citus_cluster($workers, $extra): ($coordinator, @workers), started and
# joined.  The nodes reach each other over TCP on 127.0.0.1 (Citus's
# connections); the tests reach them over their Unix sockets as usual.
sub fs_citus_cluster
{
	my ($nworkers, $extra) = @_;
	my $conf = do
	{
		local $/;
		open(my $fh, '<', fs_src() . '/test/fairshare.conf') or die "fairshare.conf: $!";
		<$fh>;
	};
	my @nodes;
	for my $i (0 .. $nworkers)
	{
		my $node = PostgreSQL::Test::Cluster->new($i == 0 ? 'coordinator' : "worker$i");
		$node->init;
		$node->append_conf('postgresql.conf', $conf);
		# Citus must come first; its two-phase commit needs prepared transactions.
		$node->append_conf('postgresql.conf', <<EOF);
shared_preload_libraries = 'citus,fairshare'
listen_addresses = '127.0.0.1'
max_prepared_transactions = 50
citus.enable_statistics_collection = off
citus.max_client_connections = 200
EOF
		$node->append_conf('postgresql.conf', $extra) if defined $extra;
		$node->append_conf('pg_hba.conf', "host all all 127.0.0.1/32 trust\n");
		$node->start;
		$node->safe_psql('postgres', 'CREATE EXTENSION citus');
		push @nodes, $node;
	}
	my ($coordinator, @workers) = @nodes;
	$coordinator->safe_psql('postgres',
		"SELECT citus_set_coordinator_host('127.0.0.1', " . $coordinator->port . ')');
	$coordinator->safe_psql('postgres', "SELECT citus_add_node('127.0.0.1', " . $_->port . ')')
	  for @workers;
	$coordinator->safe_psql('postgres', 'CREATE EXTENSION fairshare');
	return @nodes;
}

# fs_citus_node_of($coordinator, $table, $value): the port of the node whose
# shard of $table holds the distribution value $value.
sub fs_citus_node_of
{
	my ($coordinator, $table, $value) = @_;
	return $coordinator->safe_psql('postgres', qq{
		SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
		 WHERE p.shardid = get_shard_id_for_distribution_column('$table', '$value')});
}

1;
