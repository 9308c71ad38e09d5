# The launcher (lease sweeps, state file saves) follows a reload of its
# intervals at once, and a cancel does not end it.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $node = fs_node('launcher', "fairshare.sweep_interval = '1h'\nfairshare.database = ''\n");
my $q = sub { $node->safe_psql('postgres', shift) };

$node->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'fairshare launcher'")
  or die "no launcher";
my $pid = $q->("SELECT pid FROM pg_stat_activity WHERE backend_type = 'fairshare launcher'");

# A cancel is ignored: the same launcher goes on.
$q->("SELECT pg_cancel_backend($pid)");
sleep 1;
is($q->("SELECT pid FROM pg_stat_activity WHERE backend_type = 'fairshare launcher'"), $pid,
	'a cancel does not end the launcher');
unlike(slurp_file($node->logfile), qr/fairshare launcher.*exited with exit code/,
	'it did not exit');

# A lease that expires: swept an hour from now, unless the reload that
# shortens the interval applies at once.
$q->("SELECT fs_acquire_slot('sw', 'swq', '100 milliseconds')");
$q->("ALTER SYSTEM SET fairshare.sweep_interval = '100ms'; SELECT pg_reload_conf()");
ok($node->poll_query_until('postgres', "SELECT count(*) = 0 FROM fs_leases WHERE queue = 'swq'"),
	'a shorter sweep_interval applies at the reload');
is($q->("SELECT pid FROM pg_stat_activity WHERE backend_type = 'fairshare launcher'"), $pid,
	'by the same launcher');

$node->stop;
done_testing();
