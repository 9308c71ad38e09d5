# Every query of the postgres_exporter file runs against the extension and
# returns the columns the file declares as metrics.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $node = fs_node('monitoring');
$node->safe_psql('postgres', q{
	SELECT fs_acquire_slot('acme');
	SELECT fs_spend_tokens('acme', 1);
	SELECT fs_worker_heartbeat('w1', 4);
});

my $file = slurp_file(fs_src() . '/examples/monitoring/postgres_exporter.yml');
my @blocks = split /^(?=\w+:\s*$)/m, $file;
my $queries = 0;
foreach my $block (@blocks)
{
	my ($name) = $block =~ /^(\w+):/ or next;
	my ($query) = $block =~ /^\s+query: "(.*)"\s*$/m or next;
	my @declared = $block =~ /^\s+- (\w+): \{/mg;
	my ($ret, $out, $err) = $node->psql('postgres', "\\pset format unaligned\n\\pset tuples_only off\n$query",
		extra_params => ['-X']);
	is($ret, 0, "$name runs") or diag($err);
	my ($header) = split /\n/, $out;
	is_deeply([ split /\|/, $header // '' ], \@declared, "$name returns the declared columns");
	$queries++;
}
is($queries, 3, 'all queries checked');

$node->stop;
done_testing();
