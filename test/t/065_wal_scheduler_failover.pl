# The scheduler across a failover: a schedule's runs are taken exactly once
# each through the ledger table, which PostgreSQL replicates itself.  The
# primary runs the first minutes, is killed, the standby is promoted, and its
# scheduler runs the minutes after (catchup 'all': the minute missed while
# no primary ran too).  Every minute ran exactly once: none doubled, none
# missed.
#
# Time is driven with fairshare.debug_clock (ALTER SYSTEM on the server that
# runs the scheduler, then a reload).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $t0 = 1704067200;    # 2024-01-01 00:00:00 UTC
my $primary = fs_node('sched_primary', "fairshare.database = 'postgres'\nfairshare.debug_clock = $t0\n",
	allows_streaming => 1);

# Set the clock of `$node` to minute $m after $t0, and wait until its
# scheduler is done with that minute.
sub advance_to_minute
{
	my ($node, $m) = @_;
	my $at = $t0 + 60 * $m;
	$node->safe_psql('postgres', "ALTER SYSTEM SET fairshare.debug_clock = $at; SELECT pg_reload_conf();");
	$node->poll_query_until('postgres',
		"SELECT last_pass_at = to_timestamp($at) AND state = 'idle' FROM fs_scheduler")
	  or die "the scheduler did not finish minute $m";
}

$primary->safe_psql('postgres', q{
	CREATE TABLE runs (scheduled_for timestamptz NOT NULL, server text NOT NULL);
	SELECT fs_schedule('every_minute', '* * * * *', 'UTC',
		command => $$INSERT INTO runs VALUES (current_setting('fairshare.run_scheduled_for')::timestamptz,
		                                    current_setting('cluster_name'))$$,
		catchup => 'all');
});
$primary->poll_query_until('postgres', "SELECT state = 'idle' FROM fs_scheduler")
  or die "no scheduler";

$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('sched_standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;

advance_to_minute($primary, $_) for 1 .. 3;
is($primary->safe_psql('postgres', 'SELECT count(*) FROM runs'), '3', 'the primary ran minutes 1 to 3');
$primary->wait_for_catchup($standby, 'replay', $primary->lsn('insert'));
is($standby->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'fairshare%'"),
	'0', 'no fairshare worker runs on the standby');

$primary->stop('immediate');
$standby->promote;
$standby->poll_query_until('postgres', "SELECT state = 'idle' FROM fs_scheduler")
  or die "no scheduler on the new primary";
pass('the new primary\'s scheduler starts');

# Minute 4 passes with no primary; the new one runs at minute 5, catching up.
advance_to_minute($standby, 5);
advance_to_minute($standby, 6);
is($standby->safe_psql('postgres',
		q{SELECT string_agg(to_char(scheduled_for AT TIME ZONE 'UTC', 'HH24:MI') || ' ' || server, ', '
		                     ORDER BY scheduled_for) FROM runs}),
	'00:01 sched_primary, 00:02 sched_primary, 00:03 sched_primary, 00:04 sched_standby, '
	  . '00:05 sched_standby, 00:06 sched_standby',
	'every minute ran exactly once across the failover');
is($standby->safe_psql('postgres',
		"SELECT count(*) FROM fs_schedule_runs GROUP BY scheduled_for HAVING count(*) > 1"),
	'', 'the ledger has one row per run');

$standby->stop;
done_testing();
