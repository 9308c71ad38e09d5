# Fair dequeue across restarts.  A clean restart keeps the queue's virtual
# time, the tenants' tags and the map from claimed rows to leases (so a job
# that finishes after the restart still releases its lease); backlogs are
# recounted from the table at the queue's first use (or by the scheduler as
# it starts).  After a crash the backlogs start empty and are recounted the
# same way, and a claim saved before the crash releases its (orphaned) lease
# when it finishes.  The scheduler recounts every fairshare.resync_interval,
# so drift heals on its own.  Without WAL (fairshare.wal_interval = 0): with
# it, a crash replays the state (062_wal_crash.pl).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $node = fs_node('fairq_restart', "restart_after_crash = on\nfairshare.wal_interval = 0");
my $q = sub { $node->safe_psql('postgres', shift) };

$q->(q{
	CREATE TABLE rj (id int PRIMARY KEY, tenant text NOT NULL);
	CREATE TABLE rj_running (job_id int PRIMARY KEY);
	SELECT queue FROM fs_register_queue('rq', 'rj', 'tenant', 'id',
	       running_table => 'rj_running', running_key => 'job_id');
	SELECT fs_set_limit('*', 'rq', max_slots => 10);
	SELECT fs_set_limit('b', 'rq', weight => 2);
	INSERT INTO rj SELECT i, CASE WHEN i <= 20 THEN 'a' ELSE 'b' END FROM generate_series(1, 40) i;
});
my $claim = sub {
	my ($n) = @_;
	return $q->(qq{
		WITH c AS (SELECT (job).id, tenant FROM fs_claim('rq', NULL::rj, $n)),
		     d AS (DELETE FROM rj USING c WHERE rj.id = c.id),
		     r AS (INSERT INTO rj_running SELECT id FROM c)
		SELECT string_agg(tenant, ' ') FROM c});
};
is($claim->(6), 'a b b a b b', 'weights 1:2 before the restart');
my $state = "SELECT string_agg(tenant || '=' || virtual_finish || '/' || ready_rows || '/' || slots_in_use, ' ' ORDER BY tenant) FROM fs_tenants WHERE queue = 'rq'";
my $vt = "SELECT virtual_time FROM fs_fairness WHERE queue = 'rq'";
my $before = $q->($state);
my $vt_before = $q->($vt);
is($before, 'a=2/18/2 b=2/16/4', 'tags, backlog and slots before');

# Clean restart.
$node->restart;
is($q->("SELECT start_kind FROM fs_stats"), 'restored', 'a clean restart restores');
is($q->($vt), $vt_before, 'the virtual time is kept');
is($q->("SELECT count(*) FROM fs_leases WHERE queue = 'rq' AND state = 'live'"), '6', 'the leases are kept');
is($claim->(3), 'a b b', 'the fair order goes on where it stopped (the backlog recounted first)');
is($q->($state), 'a=3/17/3 b=3/14/6', 'counts recounted from the table, tags kept');
$q->("DELETE FROM rj_running WHERE job_id IN (1, 2)");
is($q->("SELECT slots_in_use FROM fs_tenants WHERE queue = 'rq' AND tenant = 'a'"), '1',
	'a job claimed before the restart releases its lease when it finishes');

# Crash: backlog counts are lost with shared memory and recounted at first
# use or by the scheduler as it starts; the leases and claims saved last (fs_save_state, as the background
# worker does periodically) come back as orphans.
$q->("SELECT fs_save_state()");
fs_crash($node);
is($q->("SELECT start_kind FROM fs_stats"), 'after_crash', 'the crash is recognised');
is($claim->(2), 'a b', 'the first claim (or the scheduler starting) recounts, and it serves');
is($q->("SELECT sum(ready_rows) FROM fs_tenants WHERE queue = 'rq'"), $q->("SELECT count(*) FROM rj"),
	'the recount matches the table');
is($q->("SELECT count(*) FROM fs_leases WHERE queue = 'rq' AND state = 'orphan'"), '7',
	'claims from before the crash hold orphaned leases');
$q->("DELETE FROM rj_running WHERE job_id IN (3, 21)");
is($q->("SELECT count(*) FROM fs_leases WHERE queue = 'rq' AND state = 'orphan'"), '5',
	'finishing them ends their orphaned leases');
$q->("DELETE FROM rj_running");
is($q->("SELECT count(*) FROM fs_leases WHERE queue = 'rq'"), '0', 'and every lease ends');

# Drift heals without anyone calling fs_resync(): rows written with the
# triggers off are not counted until the scheduler's periodic recount.
$q->(q{
	ALTER TABLE rj DISABLE TRIGGER USER;
	INSERT INTO rj SELECT i, 'c' FROM generate_series(1001, 1005) i;
	ALTER TABLE rj ENABLE TRIGGER USER;
});
is($q->("SELECT count(*) FROM fs_tenants WHERE queue = 'rq' AND tenant = 'c'"), '0',
	'rows written with the triggers off are not counted');
my $resyncs = $q->("SELECT resyncs FROM fs_fairness WHERE queue = 'rq'");
$node->append_conf('postgresql.conf', 'fairshare.resync_interval = 1');
$node->reload;
ok($node->poll_query_until('postgres',
		"SELECT ready_rows = 5 FROM fs_tenants WHERE queue = 'rq' AND tenant = 'c'"),
	'the scheduler recounts every fairshare.resync_interval');
ok($q->("SELECT resyncs > $resyncs FROM fs_fairness WHERE queue = 'rq'") eq 't', 'and counts its recounts');

$node->stop;
done_testing();
