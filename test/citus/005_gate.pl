# The global gate on a Citus cluster: a heartbeat (and a latency report)
# sent to the coordinator reaches every node, since a worker connected
# there serves tenants of every node; each node computes the ceilings of its
# own tenants from it.  A heartbeat sent to a worker node counts there only.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareCitus;

my ($coord, @workers) = fs_citus_cluster(2,
	"fairshare.tenant_share = 0.5\nfairshare.dampen_window = 0\nfairshare.backpressure_latency = '10s'");
my $q = sub { $coord->safe_psql('postgres', shift) };
my %by_group;
$by_group{ $_->safe_psql('postgres', 'SELECT groupid FROM pg_dist_local_group') } = $_ for @workers;

$q->("CREATE TABLE jobs (tenant text NOT NULL, id bigserial, PRIMARY KEY (tenant, id))");
$q->("SELECT create_distributed_table('jobs', 'tenant')");
$q->("SELECT fs_set_limit('*', 'g', max_slots => 10)");
$q->("SELECT fs_citus_setup('jobs')");
my @tenants = split /\n/, $q->(
	q{SELECT DISTINCT ON (fs_tenant_node(t)) t FROM (SELECT 'gate-' || i AS t FROM generate_series(1, 50) i) x
	   ORDER BY fs_tenant_node(t), t});
my $acquire = sub { my ($t) = @_; $q->("SELECT fs_acquire_slot('$t', 'g', '1 hour')") };

# 4 live threads, sent to the coordinator: every node's ceiling is 2.
$q->("SELECT fs_worker_heartbeat('w1', 4, 'g')");
for my $n (@workers)
{
	is($n->safe_psql('postgres', "SELECT worker || ':' || threads FROM fs_workers WHERE queue = 'g'"),
		'w1:4', 'the heartbeat reached ' . $n->name);
}
for my $t (@tenants)
{
	my $granted = grep { $acquire->($t) ne '' } 1 .. 3;
	is($granted, 2, "tenant $t on node group " . $q->("SELECT fs_tenant_node('$t')") . ': 2 of 4 live threads');
	is($by_group{ $q->("SELECT fs_tenant_node('$t')") }->safe_psql('postgres',
			"SELECT denied_global_gate FROM fs_tenants WHERE tenant = '$t'"),
		1, '  the third denied by the gate');
}

# More threads: every ceiling follows.
$q->("SELECT fs_worker_heartbeat('w1', 8, 'g')");
is(scalar(grep { $acquire->($tenants[0]) ne '' } 1 .. 3), 2, 'with 8 live threads, 2 more');

# A heartbeat sent to one worker node counts there only.
$workers[0]->safe_psql('postgres', "SELECT fs_worker_heartbeat('local', 2, 'g')");
is($workers[0]->safe_psql('postgres', "SELECT count(*) FROM fs_workers WHERE queue = 'g'"), 2,
	'a heartbeat sent to a worker node counts there');
is($workers[1]->safe_psql('postgres', "SELECT count(*) FROM fs_workers WHERE queue = 'g'"), 1,
	'and not on the other');

# A latency report sent to the coordinator reaches every node too.
$q->("SELECT fs_report_latency('30 seconds', 'g')");
for my $n (@workers)
{
	is($n->safe_psql('postgres', "SELECT latency_ms || ' ' || backpressure FROM fs_queues WHERE queue = 'g'"),
		'30000 latency', 'the latency reached ' . $n->name);
}

# Going away (0 threads) leaves every node too.
$q->("SELECT fs_worker_heartbeat('w1', 0, 'g')");
is(join(',', map { $_->safe_psql('postgres', "SELECT count(*) FROM fs_workers WHERE worker = 'w1'") } @workers),
	'0,0', 'a stopping worker leaves every node');

# A worker node that cannot be reached: a warning, the others still get it.
$workers[1]->stop('fast');
my ($ret, $out, $err) = $coord->psql('postgres', "SELECT fs_worker_heartbeat('w2', 4, 'g')");
is($ret, 0, 'a heartbeat succeeds with a node down');
like($err, qr/WARNING:  could not send fs_worker_heartbeat\(\) to node group \d+/, 'with a warning');
is($workers[0]->safe_psql('postgres', "SELECT threads FROM fs_workers WHERE worker = 'w2'"), 4,
	'the node that is up got it');
$workers[1]->start;

done_testing();
