# A claim pairs each run with the schedule as it is when the claim locks
# it: a schedule changed by fs_schedule() after the claim started, and
# before the claim reached it, is handed out with its new payload, not with
# the one the claim's snapshot saw.
#
# To get there, a claim walks through many due schedules (filler rows) to
# the changed one, the last in order; the change commits while the claim
# is on its way, without waiting for it.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $node = fs_node('claims_change', "fairshare.database = ''\n");

# Filler schedules due at 01:00, the target at 01:30; as_of 02:00.
sub set_up
{
	my ($fillers) = @_;
	$node->safe_psql('postgres', qq{
		TRUNCATE fs_schedules CASCADE;
		TRUNCATE fs_schedule_runs;
		SET fairshare.debug_clock = 1704067200;
		SELECT fs_schedule('target', '30 1 * * *', payload => '{"v": "old"}');
		WITH s AS (
		  INSERT INTO fs_schedules (owner_oid, owner, name, payload, queue)
		  SELECT 10, 'postgres', 'filler_' || g, '{}', 'default' FROM generate_series(1, $fillers) g
		  RETURNING schedule_id)
		INSERT INTO fs_schedule_state (schedule_id, cron, timezone, catchup, has_command, next_run_at)
		SELECT schedule_id, '0 * * * *', 'UTC', 'latest', false, '2024-01-01 01:00+00' FROM s;
		VACUUM ANALYZE fs_schedules;
		VACUUM ANALYZE fs_schedule_state;
	});
}

my $result;
my $fillers = 100000;
for (my $attempt = 1; $attempt <= 3; $attempt++, $fillers *= 2)
{
	set_up($fillers);
	$node->safe_psql('postgres', 'CREATE TABLE IF NOT EXISTS change_outcome (outcome text); TRUNCATE change_outcome');
	my $claimer = $node->background_psql('postgres');
	my $changer = $node->background_psql('postgres');
	# Plans and caches ready, so that the claim takes its snapshot at once.
	$claimer->query_safe(q{SELECT count(*) FROM fs_claim_due_schedules(1, '2024-01-01 00:00+00')});
	$claimer->query_safe('BEGIN');
	# The changer waits until the claim runs, gives it 20 ms to take its
	# snapshot, and changes the target without waiting for a lock: if the
	# claim already holds it, the claim was too quick for this test, which
	# tries again with more filler schedules.
	$changer->query_until(qr/waiting/, q{
		\echo waiting
		SET lock_timeout = '100ms';
		DO $$
		BEGIN
		  LOOP
		    PERFORM pg_stat_clear_snapshot();
		    EXIT WHEN EXISTS (SELECT FROM pg_stat_activity
		                       WHERE state = 'active' AND query LIKE '%CREATE TEMP TABLE claimed%'
		                         AND pid <> pg_backend_pid());
		    PERFORM pg_sleep(0.001);
		  END LOOP;
		  PERFORM pg_sleep(0.02);
		  PERFORM fs_schedule('target', '30 1 * * *', payload => '{"v": "new"}');
		  INSERT INTO change_outcome VALUES ('changed');
		EXCEPTION WHEN lock_not_available THEN
		  INSERT INTO change_outcome VALUES ('the claim held the target already');
		END $$;
	});
	$claimer->query_until(qr/claiming/, q{
		\echo claiming
		CREATE TEMP TABLE claimed AS
		SELECT * FROM fs_claim_due_schedules(10000000, '2024-01-01 02:00+00');
	});
	$changer->query_safe('SELECT 1');
	$result = $claimer->query_safe(q{SELECT payload FROM claimed WHERE name = 'target'});
	$claimer->query_safe('COMMIT');
	$claimer->quit;
	$changer->quit;
	my $outcome = $node->safe_psql('postgres', 'SELECT outcome FROM change_outcome');
	if ($outcome eq 'changed')
	{
		$result =~ s/^\s+|\s+$//g;
		last;
	}
	note("no change while the claim was on its way ($outcome); again with more schedules");
	$result = undef;
}
ok(defined $result, 'a schedule changed while a claim was on its way to it');
is($result, '{"v": "new"}', 'is handed out with its new payload');
is($node->safe_psql('postgres', q{
		SELECT count(*) FROM fs_schedule_runs WHERE name = 'target'}),
	'1', 'once');

$node->stop;
done_testing();
