# Failover: the primary is killed (stop immediate) in the middle of pgbench
# load, a streaming standby is promoted, and the new primary goes on where
# the old one stopped, minus at most the replication lag and an interval:
# an independent check counts, per tenant, the leases granted before the
# failover that still renew on the new primary plus every lease granted
# after it, and finds none above max_slots; a drained budget stays drained.
# Done twice: promoted with pg_ctl promote, then (from a standby of the new
# primary) with pg_promote().
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

my $primary = fs_node('primary1', undef, allows_streaming => 1);
$primary->safe_psql('postgres', qq{
	SELECT fs_set_limit('*', 'q', max_slots => $MAX);
	SELECT fs_set_limit('budget', 'q', budget_ms_per_minute => 60);
	-- Every committed grant, replicated with the table's own WAL.
	CREATE TABLE granted (lease_id bigint PRIMARY KEY, tenant text NOT NULL, node text NOT NULL);
});

# Acquire for a random tenant, and record the grant in the same transaction.
my $script = "$PostgreSQL::Test::Utils::tmp_check/acquire.pgbench";
PostgreSQL::Test::Utils::append_to_file($script, q{
\set t random(1, } . $TENANTS . q{)
BEGIN;
INSERT INTO granted SELECT l, 't' || :t, current_setting('cluster_name')
  FROM fs_acquire_slot('t' || :t, 'q', '1 hour') l WHERE l IS NOT NULL;
COMMIT;
SELECT fs_spend_tokens('budget', 1, 10, 'q');
});

# A standby of `$from`, streaming.
sub standby_of
{
	my ($from, $name) = @_;
	$from->backup("base_$name");
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init_from_backup($from, "base_$name", has_streaming => 1);
	$node->append_conf('postgresql.conf', 'cluster_name = ' . $name);
	$node->start;
	return $node;
}

# Load the primary, then kill it in the middle of the load, and promote.
sub fail_over
{
	my ($old, $new, $how) = @_;

	# The budget drained before the load (60 ms a minute: 6 runs of 10 ms).
	$old->safe_psql('postgres', "SELECT fs_spend_tokens('budget', 100, 10, 'q')");
	my $drained_at = time;
	my $h = IPC::Run::start(
		[ 'pgbench', '-n', '-c', '8', '-T', '30', '-f', $script, '-h', $old->host, '-p', $old->port,
		  'postgres' ],
		'>', \my $out, '2>', \my $err);
	# Let the load run, some leases granted and logged.
	$old->poll_query_until('postgres', "SELECT count(*) >= 10 FROM granted") or die "no load";
	select(undef, undef, undef, 0.5);
	$old->stop('immediate');
	$h->finish;

	if ($how eq 'pg_ctl')
	{
		$new->promote;
	}
	else
	{
		$new->safe_psql('postgres', 'SELECT pg_promote()');
		$new->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()') or die "not promoted";
	}
	$new->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'fairshare wal writer'")
	  or die "no WAL writer on the new primary";
	is($new->safe_psql('postgres', 'SELECT start_kind FROM fs_stats'), 'replayed',
		"$how: the new primary goes on from the replayed state");

	# Each tenant: old leases that renew on the new primary, then new grants
	# up to its ceiling.  Never more than max_slots.
	my $over = 0;
	my $renewed = 0;
	for my $t (1 .. $TENANTS)
	{
		my $alive = $new->safe_psql('postgres',
			"SELECT count(*) FILTER (WHERE fs_renew_slot(lease_id, '1 hour'))
			   FROM granted WHERE tenant = 't$t'");
		$renewed += $alive;
		my $fresh = $new->safe_psql('postgres',
			"SELECT count(l) FROM generate_series(1, $MAX + 2) i, fs_acquire_slot('t$t', 'q', '1 hour') l");
		$over++ if $alive + $fresh > $MAX;
		# It may count more: a lease logged before its transaction committed.
		my $slots = $new->safe_psql('postgres', "SELECT slots_in_use FROM fs_tenants WHERE tenant = 't$t'");
		ok($slots >= $alive + $fresh && $slots <= $MAX,
			"$how: t$t counts its $alive renewed and $fresh new leases ($slots, at most $MAX)");
	}
	is($over, 0, "$how: no tenant above max_slots across the failover");
	my $granted = $new->safe_psql('postgres', 'SELECT count(*) FROM granted');
	cmp_ok($renewed, '>', 0, "$how: leases granted before the failover renew ($renewed of $granted recorded)");
	# 60 ms a minute accrue 1 ms a second: no more than accrued since the drain.
	my $runs = $new->safe_psql('postgres', "SELECT fs_spend_tokens('budget', 1000, 10, 'q')");
	my $accrued = int((time - $drained_at) / 10) + 1;
	cmp_ok($runs, '<=', $accrued,
		"$how: the drained budget stays drained ($runs runs granted, accrued since: $accrued)");
	my $ids = $new->safe_psql('postgres', "SELECT fs_acquire_slot('ids', 'q') > max(lease_id) FROM granted");
	is($ids, 't', "$how: new lease ids are above every id granted before");
}

my $standby = standby_of($primary, 'standby1');
fail_over($primary, $standby, 'pg_ctl');

# The new primary's own standby, promoted with pg_promote().
$standby->safe_psql('postgres', 'TRUNCATE granted; SELECT fs_release_slot(lease_id) FROM fs_leases');
my $second = standby_of($standby, 'standby2');
fail_over($standby, $second, 'pg_promote');

$second->stop;
done_testing();
