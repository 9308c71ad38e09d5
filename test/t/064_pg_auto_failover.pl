# An automatic failover by a real failover manager: pg_auto_failover (a
# monitor and two nodes, each run by pg_autoctl, on this machine).  Under
# pgbench load the primary's pg_autoctl and postmaster are killed; the
# monitor sees it gone and has the secondary promoted.  The new primary goes
# on from the replayed state: no tenant is above max_slots counting the
# leases granted before the failover that still renew there and the ones
# granted after it, and a drained budget stays drained.
use strict;
use warnings;

use IPC::Run;
use Time::HiRes qw(time);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $MAX = 3;
my $TENANTS = 8;

my $autoctl = '/usr/bin/pg_autoctl';
ok(-x $autoctl, 'pg_autoctl is installed (Debian package postgresql-15-auto-failover)')
  or BAIL_OUT('pg_autoctl is missing');
my ($pgctl) = grep { -x $_ } map { "$_/pg_ctl" } split /:/, $ENV{PATH};
my $base = PostgreSQL::Test::Utils::tempdir;
# pg_autoctl keeps its files under the XDG directories: keep them here.
$ENV{XDG_CONFIG_HOME} = "$base/config";
$ENV{XDG_DATA_HOME} = "$base/data";
$ENV{XDG_RUNTIME_DIR} = "$base/run";
mkdir $_ for ("$base/config", "$base/data", "$base/run");
delete $ENV{PGHOST};
delete $ENV{PGPORT};

my %port = map { $_ => PostgreSQL::Test::Cluster::get_free_port() } qw(monitor node1 node2);
my @services;

# Run `pg_autoctl run` for a node in the background.
sub run_service
{
	my ($name) = @_;
	my $h = IPC::Run::start([ $autoctl, 'run', '--pgdata', "$base/$name" ],
		'>', "$base/$name.log", '2>&1');
	push @services, $h;
	return $h;
}

# A psql query on a node, by port (trust authentication on localhost).
sub query
{
	my ($port, $db, $sql) = @_;
	my ($out, $err);
	IPC::Run::run([ 'psql', '-XAtq', '-h', 'localhost', '-p', $port, '-d', $db, '-c', $sql ],
		'>', \$out, '2>', \$err);
	chomp $out if defined $out;
	return $out;
}

# Wait until `$sql` on a node returns 't' (at most 180 s).
sub wait_for
{
	my ($port, $db, $sql, $what) = @_;
	for (my $i = 0; $i < 1800; $i++)
	{
		my $r = query($port, $db, $sql);
		return 1 if defined $r && $r eq 't';
		select(undef, undef, undef, 0.1);
	}
	BAIL_OUT("timed out waiting for $what");
}

# The monitor, with health checks made fast for the test.
system_or_bail($autoctl, 'create', 'monitor', '--pgdata', "$base/monitor", '--pgport', $port{monitor},
	'--hostname', 'localhost', '--auth', 'trust', '--no-ssl', '--pgctl', $pgctl);
run_service('monitor');
wait_for($port{monitor}, 'pg_auto_failover', 'SELECT true', 'the monitor');
query($port{monitor}, 'pg_auto_failover', q{
	ALTER SYSTEM SET pgautofailover.health_check_period = 1000;
	ALTER SYSTEM SET pgautofailover.health_check_timeout = 1000;
	ALTER SYSTEM SET pgautofailover.health_check_max_retries = 1;
	ALTER SYSTEM SET pgautofailover.health_check_retry_delay = 500;
	ALTER SYSTEM SET pgautofailover.node_considered_unhealthy_timeout = 3000;
	ALTER SYSTEM SET pgautofailover.primary_demote_timeout = 3000;
	SELECT pg_reload_conf();
});
my $monitor_uri = "postgres://autoctl_node\@localhost:$port{monitor}/pg_auto_failover?sslmode=disable";

# A data node: made by pg_autoctl, fairshare preloaded before it runs.
sub create_node
{
	my ($name) = @_;
	system_or_bail($autoctl, 'create', 'postgres', '--pgdata', "$base/$name", '--pgport', $port{$name},
		'--hostname', 'localhost', '--name', $name, '--auth', 'trust', '--no-ssl', '--pgctl', $pgctl,
		'--monitor', $monitor_uri, '--dbname', 'postgres');
	open(my $in, '<', fs_src() . '/test/fairshare.conf') or die $!;
	my $conf = do { local $/; <$in> };
	close $in;
	# A standby's copy of the primary's postgresql.conf has it already.
	PostgreSQL::Test::Utils::append_to_file("$base/$name/postgresql.conf", "\n$conf\n")
	  unless slurp_file("$base/$name/postgresql.conf") =~ /fairshare\.max_tenants/;
	system("$pgctl -D $base/$name -m fast stop >/dev/null 2>&1");
	my $h = run_service($name);
	wait_for($port{$name}, 'postgres', 'SELECT true', "${name}'s postgres, run by pg_autoctl");
	return $h;
}

my $node1 = create_node('node1');
wait_for($port{monitor}, 'pg_auto_failover',
	"SELECT reportedstate = 'single' FROM pgautofailover.node WHERE nodename = 'node1'", 'node1 as single');
is(query($port{node1}, 'postgres', "SHOW shared_preload_libraries"), 'fairshare',
	'the node runs with fairshare preloaded');
query($port{node1}, 'postgres', qq{
	CREATE EXTENSION fairshare;
	SELECT fs_set_limit('*', 'q', max_slots => $MAX);
	SELECT fs_set_limit('budget', 'q', budget_ms_per_minute => 60);
	CREATE TABLE granted (lease_id bigint PRIMARY KEY, tenant text NOT NULL);
});
create_node('node2');
wait_for($port{monitor}, 'pg_auto_failover',
	q{SELECT count(*) FILTER (WHERE reportedstate = 'primary') = 1
	     AND count(*) FILTER (WHERE reportedstate = 'secondary') = 1 FROM pgautofailover.node},
	'a primary and a secondary');
pass('pg_auto_failover runs a primary and a secondary');

# Load on the primary: acquire for random tenants, recording each grant in
# the same transaction; the budget drained first (6 runs of 10 ms).
is(query($port{node1}, 'postgres', "SELECT fs_spend_tokens('budget', 100, 10, 'q')"), '6',
	'the budget is drained');
my $drained_at = time;
my $script = "$base/acquire.pgbench";
PostgreSQL::Test::Utils::append_to_file($script, q{
\set t random(1, } . $TENANTS . q{)
BEGIN;
INSERT INTO granted SELECT l, 't' || :t FROM fs_acquire_slot('t' || :t, 'q', '1 hour') l WHERE l IS NOT NULL;
COMMIT;
SELECT fs_spend_tokens('budget', 1, 10, 'q');
});
my $load = IPC::Run::start(
	[ 'pgbench', '-n', '-c', '8', '-T', '60', '-f', $script, '-h', 'localhost', '-p', $port{node1},
	  'postgres' ],
	'>', \my $out, '2>', \my $err);
wait_for($port{node1}, 'postgres', 'SELECT count(*) >= 10 FROM granted', 'the load');
select(undef, undef, undef, 0.5);

# The primary's machine goes: every process of node1 (its postmaster and its
# pg_autoctl) killed at once, nothing shut down.
system('pkill', '-KILL', '-f', "$base/node1");
$node1->finish;
$load->finish;

wait_for($port{node2}, 'postgres', 'SELECT NOT pg_is_in_recovery()', 'the promotion of node2');
pass('the monitor had node2 promoted');
wait_for($port{node2}, 'postgres',
	"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'fairshare wal writer'",
	'the WAL writer on the new primary');
is(query($port{node2}, 'postgres', 'SELECT start_kind FROM fs_stats'), 'replayed',
	'the new primary goes on from the replayed state');

my $over = 0;
my $renewed = 0;
for my $t (1 .. $TENANTS)
{
	my $alive = query($port{node2}, 'postgres',
		"SELECT count(*) FILTER (WHERE fs_renew_slot(lease_id, '1 hour')) FROM granted WHERE tenant = 't$t'");
	$renewed += $alive;
	my $fresh = query($port{node2}, 'postgres',
		"SELECT count(l) FROM generate_series(1, $MAX + 2) i, fs_acquire_slot('t$t', 'q', '1 hour') l");
	$over++ if $alive + $fresh > $MAX;
}
is($over, 0, 'no tenant above max_slots across the automatic failover');
cmp_ok($renewed, '>', 0, "leases granted before the failover renew ($renewed)");
# 60 ms a minute accrue 1 ms a second: what was not spent since the drain,
# and no more (one run of slack for a spend lost in the last interval).
my $granted = query($port{node2}, 'postgres', "SELECT fs_spend_tokens('budget', 1000, 10, 'q')");
my $accrued = int((time - $drained_at) / 10) + 1;
cmp_ok($granted, '<=', $accrued,
	"the drained budget stays drained: $granted runs granted after the failover, accrued since: $accrued");

$_->kill_kill for @services;
system("$pgctl -D $base/$_ -m immediate stop >/dev/null 2>&1") for qw(node2 monitor);
# pg_autoctl's own children outlive a killed supervisor: every process of
# this test (they have its XDG_CONFIG_HOME) goes.
for my $environ (glob('/proc/[0-9]*/environ'))
{
	open(my $fh, '<', $environ) or next;
	my $env = do { local $/; <$fh> };
	close $fh;
	next unless defined $env && index($env, "XDG_CONFIG_HOME=$base/config\0") >= 0;
	my ($pid) = $environ =~ m{/proc/(\d+)/};
	kill 'KILL', $pid unless $pid == $$;
}
done_testing();
