# Schedules on a Citus cluster: kept and run on the coordinator only, so
# each run happens once for the whole cluster; a worker refuses them.  The
# clock is fairshare.debug_clock on every node, moved a minute at a time.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareCitus;

my $t0 = 1704067200;    # 2024-01-01 00:00:00 UTC
my ($coord, @workers) = fs_citus_cluster(2, "fairshare.debug_clock = $t0\nfairshare.sweep_interval = '100ms'");
my $q = sub { $coord->safe_psql('postgres', shift) };

$q->("CREATE TABLE jobs (tenant text NOT NULL, id bigserial, PRIMARY KEY (tenant, id))");
$q->("SELECT create_distributed_table('jobs', 'tenant')");
$q->("SELECT fs_citus_setup('jobs')");
$q->("CREATE TABLE runs (tenant text NOT NULL, scheduled_for timestamptz, node int)");
$q->("SELECT create_distributed_table('runs', 'tenant', colocate_with => 'jobs')");

# Each tenant's job lands in its shard; which node's scheduler ran it is
# recorded too.
for my $t ('acme', 'globex', 'initech')
{
	$q->(qq{SELECT fs_schedule('every_minute_$t', '* * * * *', tenant => '$t',
	         command => \$\$INSERT INTO runs SELECT r.tenant, r.scheduled_for,
	                       (SELECT groupid FROM pg_dist_local_group) FROM fs_current_run() r\$\$)});
}
my ($ret, $out, $err) = $workers[0]->psql('postgres', "SELECT fs_schedule('on_worker', '* * * * *')");
like($err, qr/fs_schedule\(\) runs on the coordinator, not on node group \d+/, 'a worker refuses a schedule');
($ret, $out, $err) = $workers[1]->psql('postgres', "SELECT * FROM fs_claim_due_schedules(10)");
like($err, qr/fs_claim_due_schedules\(\) runs on the coordinator/, 'and refuses to claim runs');

for my $m (1 .. 3)
{
	my $at = $t0 + 60 * $m;
	for my $n ($coord, @workers)
	{
		$n->safe_psql('postgres', "ALTER SYSTEM SET fairshare.debug_clock = $at; SELECT pg_reload_conf()");
	}
	$coord->poll_query_until('postgres',
		"SELECT count(*) = 3 FROM runs WHERE scheduled_for = to_timestamp($at)")
	  or die "the runs of minute $m did not happen";
}
# Let every scheduler look once more at the last minute.
sleep 1;
is($q->("SELECT count(*) FROM runs"), 9, 'three schedules over three minutes: nine runs');
is($q->("SELECT count(*) FROM (SELECT DISTINCT tenant, scheduled_for FROM runs) r"), 9, 'none twice');
is($q->("SELECT string_agg(DISTINCT node::text, ',') FROM runs"), '0', 'all run by the coordinator');
is( join(',', map { $_->safe_psql('postgres', "SELECT count(*) FROM fs_schedules") } @workers),
	'0,0', 'the workers keep no schedule');

done_testing();
