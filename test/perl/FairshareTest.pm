# FairshareTest: helpers shared by fairshare's TAP tests (test/t/*.pl).
package FairshareTest;

use strict;
use warnings;

use Exporter 'import';
use File::Basename qw(dirname);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

our @EXPORT = qw(fs_node fs_src fs_crash fs_drain fs_check_drains);

# The source tree the tests run from (test/run sets FS_SRC).
sub fs_src
{
	return $ENV{FS_SRC} // dirname(dirname(dirname(__FILE__)));
}

# A started node with fairshare preloaded (test/fairshare.conf plus $extra
# lines) and the extension created in database postgres.  %init goes to
# PostgreSQL::Test::Cluster's init (allows_streaming => 1 for a primary).
sub fs_node
{
	my ($name, $extra, %init) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(%init);
	my $conf = do
	{
		# Slurp, and only here: the node's start reads its pid file with $/.
		local $/;
		open(my $fh, '<', fs_src() . '/test/fairshare.conf') or die "fairshare.conf: $!";
		<$fh>;
	};
	$node->append_conf('postgresql.conf', $conf);
	$node->append_conf('postgresql.conf', $extra) if defined $extra;
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION fairshare');
	return $node;
}

# Drain a fair queue: claim 500 rows at a time, delete them by their `id`
# and give back their slots, in one transaction, until a claim finds none.
sub fs_drain
{
	my ($node, $queue, $table) = @_;
	$node->safe_psql('postgres', qq{
		DO \$\$
		DECLARE n int;
		BEGIN
		    LOOP
		        WITH c AS (SELECT lease_id, (j.job).id FROM fs_claim('$queue', NULL::$table, 500) j),
		             d AS (DELETE FROM $table USING c WHERE $table.id = c.id)
		        SELECT count(fs_release_slot(lease_id)) INTO n FROM c;
		        EXIT WHEN n = 0;
		    END LOOP;
		END \$\$});
}

# The end of a test under concurrency: every tenant of the queue counts what
# its table has, the queue drains (fs_drain), no lease of it is left,
# nothing failed open, and the server neither crashed nor found a broken
# invariant (the debug build's checks).
sub fs_check_drains
{
	my ($node, $queue, $table) = @_;
	my $q = sub { $node->safe_psql('postgres', shift) };
	is($q->("SELECT coalesce(sum(ready_rows), 0) FROM fs_tenants WHERE queue = '$queue'"),
		$q->("SELECT count(*) FROM $table"), 'every tenant counts what the table has');
	fs_drain($node, $queue, $table);
	is($q->("SELECT count(*) FROM $table"), '0', 'the queue drains');
	is($q->("SELECT count(*) FROM fs_leases WHERE queue = '$queue'"), '0', 'no lease is left');
	is($q->("SELECT fail_open FROM fs_stats"), '0', 'nothing failed open');
	ok(!$node->log_contains(qr/terminated by signal|invariant violated/),
		'no crash, no broken invariant');
}

# Crash the server: kill -9 the postmaster, wait for it and its children to
# be gone, and start it again.
sub fs_crash
{
	my ($node) = @_;
	my $pid = $node->{_pid};
	$node->kill9;
	for (my $i = 0; $i < 300 && kill(0, $pid); $i++)
	{
		select(undef, undef, undef, 0.1);
	}
	# Orphaned backends notice the postmaster's death and exit; until then
	# the old shared memory is in use and the start is refused.
	for (my $i = 0; $i < 100; $i++)
	{
		return if $node->start(fail_ok => 1);
		select(undef, undef, undef, 0.3);
	}
	die "the server did not start again after the crash";
}

1;
