# The cluster the scale-out tests run on: a coordinator and two workers, with
# fairshare on every node and its calls delegated by Citus.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareCitus;

my ($coord, @workers) = fs_citus_cluster(2);
my $q = sub { $coord->safe_psql('postgres', shift) };

is($q->("SELECT count(*) FROM pg_dist_node WHERE isactive AND hasmetadata"), 3,
	'a coordinator and two workers with metadata');
is($_->safe_psql('postgres', "SELECT extversion FROM pg_extension WHERE extname = 'fairshare'"),
	$q->("SELECT extversion FROM pg_extension WHERE extname = 'fairshare'"),
	'fairshare created on ' . $_->name) for @workers;

done_testing();
