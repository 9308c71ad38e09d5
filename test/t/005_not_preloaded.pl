# Without shared_preload_libraries, every function says how to fix it.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('not_preloaded');
$node->init;
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION fairshare');

foreach my $call ("fs_acquire_slot('a')", "fs_release_slot(1)", "fs_renew_slot(1)",
	"fs_effective_limits('a')", "count(*) FROM fs_tenants", "count(*) FROM fs_stats")
{
	my ($ret, $out, $err) = $node->psql('postgres', "\\set VERBOSITY verbose\nSELECT $call");
	isnt($ret, 0, "$call fails");
	like($err, qr/ERROR:  55000: fairshare must be loaded via shared_preload_libraries/,
		"$call says why, with SQLSTATE 55000");
	like($err, qr/HINT:  Add fairshare to shared_preload_libraries in postgresql.conf and restart the server./,
		"$call says what to do");
}
is($node->safe_psql('postgres', 'SELECT 1'), '1', 'the server is fine');

$node->stop;
done_testing();
