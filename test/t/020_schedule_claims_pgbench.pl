# Many sessions calling fs_claim_due_schedules() at once, with as_of moving
# back and forth between them (pgbench), never get the same run twice, and
# between them account for every scheduled instant exactly once: each one
# was either handed out, or skipped by its catch-up policy and recorded so
# in the ledger.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $src = $ENV{FS_SRC} or die "FS_SRC is not set";

my $node = PostgreSQL::Test::Cluster->new('claims');
$node->init;
$node->append_conf('postgresql.conf', slurp_file("$src/test/fairshare.conf"));
$node->append_conf('postgresql.conf', "fairshare.database = ''\n");
$node->start;

# 300 schedules created at 2024-01-01 00:00 UTC, running every minute or
# every 7 minutes, with each catch-up policy.  Runs are claimed up to
# 00:00 + 150 minutes.
$node->safe_psql('postgres', q{
	SET client_min_messages = warning;
	CREATE EXTENSION fairshare;
	SET fairshare.debug_clock = 1704067200;
	SELECT fs_schedule('stress_' || g, CASE WHEN g % 2 = 0 THEN '* * * * *' ELSE '*/7 * * * *' END,
	                   catchup => (ARRAY['latest', 'all', 'skip'])[1 + g % 3])
	  FROM generate_series(1, 300) g;
	CREATE TABLE claimed (client int, schedule_id bigint, scheduled_for timestamptz);
});

$node->pgbench(
	'--no-vacuum --client=8 --jobs=2 --transactions=150',
	0,
	[qr/processed: 1200\/1200/],
	[qr/^$/],
	'concurrent claims',
	{
		'claims' => q{
\set m random(0, 150)
INSERT INTO claimed
SELECT :client_id, schedule_id, scheduled_for
  FROM fs_claim_due_schedules(40, timestamptz '2024-01-01 00:00+00' + :m * interval '1 minute');
}
	});

# Claim what is left up to the end, so that every instant has been dealt with.
$node->safe_psql('postgres', q{
	INSERT INTO claimed
	SELECT -1, schedule_id, scheduled_for
	  FROM fs_claim_due_schedules(1000000, '2024-01-01 02:30:00+00');
});

is($node->safe_psql('postgres',
		'SELECT count(*) > 1000, count(*) = count(DISTINCT (schedule_id, scheduled_for)) FROM claimed'),
	't|t', 'no run was handed out twice');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM (
	  (SELECT schedule_id, scheduled_for FROM claimed
	   EXCEPT SELECT schedule_id, scheduled_for FROM fs_schedule_runs WHERE state = 'claimed')
	  UNION ALL
	  (SELECT schedule_id, scheduled_for FROM fs_schedule_runs WHERE state = 'claimed'
	   EXCEPT SELECT schedule_id, scheduled_for FROM claimed)) d}),
	'0', 'what the sessions got is exactly what the ledger says was claimed');

# Every instant of every schedule up to 02:30, once: run, skipped, or in the
# missed range recorded on the next ledger row.
is($node->safe_psql('postgres', q{
	WITH expected AS (
	  SELECT s.schedule_id, t
	    FROM fs_schedule_status s,
	         LATERAL fs_next_runs(s.cron, s.timezone, '2024-01-01 00:00+00', 200) t
	   WHERE t <= '2024-01-01 02:30+00'),
	accounted AS (
	  SELECT schedule_id, scheduled_for AS t FROM fs_schedule_runs
	  UNION ALL
	  SELECT r.schedule_id, m
	    FROM fs_schedule_runs r, fs_schedule_status s,
	         LATERAL fs_next_runs(s.cron, s.timezone, r.missed_since - interval '1 second', 200) m
	   WHERE s.schedule_id = r.schedule_id AND r.missed_since IS NOT NULL AND m < r.scheduled_for)
	SELECT (SELECT count(*) FROM expected),
	       (SELECT count(*) FROM accounted),
	       (SELECT count(*) FROM (SELECT schedule_id, t FROM expected
	                              EXCEPT SELECT schedule_id, t FROM accounted) missing),
	       (SELECT count(*) FROM (SELECT schedule_id, t FROM accounted
	                              GROUP BY 1, 2 HAVING count(*) > 1) doubled)}),
	# 150 schedules * 150 minutes + 150 schedules * 22 times of */7 in 00:01..02:30
	'25800|25800|0|0', 'every scheduled instant is accounted for exactly once');
is($node->safe_psql('postgres', q{
	SELECT string_agg(DISTINCT state, ',' ORDER BY state) FROM fs_schedule_runs}),
	'claimed,skipped', 'the policies were exercised');

$node->stop;
done_testing();
