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

our @EXPORT = qw(fs_citus_cluster fs_citus_node_of fs_citus_by_group fs_citus_observe_holders
  fs_citus_claim_load);

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

# fs_citus_by_group(@nodes): a map from each node's Citus group to the node.
sub fs_citus_by_group
{
	my %by_group;
	$by_group{ $_->safe_psql('postgres', 'SELECT groupid FROM pg_dist_local_group') } = $_ for @_;
	return %by_group;
}

# fs_citus_observe_holders($coordinator, $script, $seconds): run the pgbench
# $script with 8 clients through the coordinator for $seconds while an
# observer on the coordinator records, every 50 ms, the tenant with the most
# rows in the distributed table `running` (a client holding a slot marks it
# there) into the table `seen (tenant, holders)`.  Checks that no pgbench
# transaction failed and that the observer looked often enough; returns the
# number of looks.
sub fs_citus_observe_holders
{
	my ($coordinator, $script, $seconds) = @_;
	my $observer = $coordinator->background_psql('postgres');
	my @cmd = ('pgbench', '-n', '-M', 'simple', '-c', '8', '-j', '2', '-T', $seconds, '-f', $script,
		'-h', $coordinator->host, '-p', $coordinator->port, 'postgres');
	my ($stdout, $stderr) = ('', '');
	my $bench = IPC::Run::start(\@cmd, '>', \$stdout, '2>', \$stderr);
	my $polls = 0;
	while ($bench->pumpable)
	{
		$observer->query_safe("INSERT INTO seen (tenant, holders)"
			  . " SELECT tenant, count(*) FROM running GROUP BY tenant ORDER BY 2 DESC LIMIT 1");
		$polls++;
		$bench->pump_nb;
		select(undef, undef, undef, 0.05);
	}
	$bench->finish;
	$observer->quit;
	Test::More::like($stdout, qr/number of failed transactions: 0/, 'no pgbench transaction failed')
	  or Test::More::diag($stderr);
	Test::More::cmp_ok($polls, '>', 20, "the observer looked $polls times");
	return $polls;
}

# fs_citus_claim_load($coordinator, $seconds, [$node, $clients], ...): for
# $seconds, run $clients claimers connected to each $node, each claiming one
# job of queue 'q' (rows of the distributed table `jobs`) at a time: claimed,
# started (a row in `running`) and taken out of `jobs` in one transaction,
# recorded in the table `served` (tenant) of the node it is connected to,
# and finished in the next.  Meanwhile an observer on the coordinator
# records every 50 ms how many jobs each tenant runs into `seen (tenant,
# holders)`.  Checks that no claimer failed or stopped and that the
# observer looked often enough.
sub fs_citus_claim_load
{
	my ($coordinator, $seconds, @targets) = @_;
	my $script = $coordinator->basedir . '/claim_load.sql';
	unlink $script;
	PostgreSQL::Test::Utils::append_to_file($script, <<'EOF');
BEGIN;
SELECT count(*) AS got, coalesce(max((job).tenant), '') AS t, coalesce(max((job).id), 0) AS id
  FROM fs_claim('q', NULL::jobs, 1) \gset
\if :got
INSERT INTO running VALUES (':t', :id);
DELETE FROM jobs WHERE tenant = ':t' AND id = :id;
INSERT INTO served (tenant) VALUES (':t');
\endif
COMMIT;
\if :got
\sleep 1 ms
DELETE FROM running WHERE tenant = ':t' AND job_id = :id;
\endif
EOF
	my @runs;
	for my $target (@targets)
	{
		my ($node, $clients) = @$target;
		my ($stdout, $stderr) = ('', '');
		my @cmd = ('pgbench', '-n', '-M', 'simple', '-c', $clients, '-j', ($clients > 4 ? 2 : 1), '-T',
			$seconds, '-f', $script, '-h', $node->host, '-p', $node->port, 'postgres');
		push @runs, [ IPC::Run::start(\@cmd, '>', \$stdout, '2>', \$stderr), \$stdout, \$stderr ];
	}
	my $observer = $coordinator->background_psql('postgres');
	my $polls = 0;
	while (grep { $_->[0]->pumpable } @runs)
	{
		$observer->query_safe("INSERT INTO seen SELECT tenant, count(*) FROM running GROUP BY tenant");
		$polls++;
		# One pgbench may end before another: pump only what still runs.
		eval { $_->[0]->pump_nb; 1 } for grep { $_->[0]->pumpable } @runs;
		select(undef, undef, undef, 0.05);
	}
	$_->[0]->finish for @runs;
	$observer->quit;
	for my $run (@runs)
	{
		Test::More::like(${ $run->[1] }, qr/number of failed transactions: 0/, 'no claimer transaction failed')
		  or Test::More::diag(${ $run->[2] });
		Test::More::unlike(${ $run->[2] }, qr/aborted|ERROR/, 'and no claimer stopped')
		  or Test::More::diag(${ $run->[2] });
	}
	Test::More::cmp_ok($polls, '>', 20, "the observer looked $polls times");
	return $polls;
}

1;
