# The background worker: waits for its database and for the extension, runs
# each due command once as its owner, isolates failures and owners from
# each other, survives a crash in the middle of a run without losing or
# doubling it, honours the command timeout, follows fairshare.database on
# reload, and does not run on a standby.
#
# Time is driven with fairshare.debug_clock: ALTER SYSTEM, then a reload,
# which wakes the scheduler at once.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $src = $ENV{FS_SRC} or die "FS_SRC is not set";
my $t0 = 1704067200;    # 2024-01-01 00:00:00 UTC

my $node = PostgreSQL::Test::Cluster->new('scheduler');
$node->init(allows_streaming => 1);
$node->append_conf('postgresql.conf', slurp_file("$src/test/fairshare.conf"));
$node->append_conf('postgresql.conf', qq{
fairshare.database = 'app'
fairshare.debug_clock = $t0
fairshare.sweep_interval = '100ms'
fairshare.state_save_interval = '1s'
log_min_messages = log
});
$node->start;

# Set the clock to minute $m after $t0 and wait until the scheduler is done
# with that minute.
my $minute = 0;
sub advance_to_minute
{
	my ($m) = @_;
	my $at = $t0 + 60 * $m;
	$minute = $m;
	$node->safe_psql('app', "ALTER SYSTEM SET fairshare.debug_clock = $at; SELECT pg_reload_conf();");
	$node->poll_query_until('app',
		"SELECT last_pass_at = to_timestamp($at) AND state = 'idle' FROM fs_scheduler")
	  or die "the scheduler did not finish minute $m";
}

# --- Waiting for the database and the extension -----------------------------

$node->wait_for_log(qr/fairshare is waiting for database "app" to exist/);
pass('the launcher waits for a database that does not exist yet');

$node->safe_psql('postgres', 'CREATE DATABASE app');
$node->wait_for_log(qr/fairshare scheduler started in database "app"/);
$node->wait_for_log(qr/fairshare scheduler is waiting for the extension in database "app"/);
pass('then starts the scheduler there, which waits for the extension');

$node->safe_psql('app', q{
	SET client_min_messages = warning;
	CREATE EXTENSION fairshare;
	SELECT pg_reload_conf();
});
$node->poll_query_until('app', "SELECT state = 'idle' FROM fs_scheduler")
  or die "the scheduler did not notice the extension";
is( $node->safe_psql('app',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type IN ('fairshare launcher', 'fairshare scheduler')"),
	'2', 'one launcher and one scheduler run');

# --- Owners, commands and run data --------------------------------------------

$node->safe_psql('app', q{
	CREATE ROLE alice LOGIN;
	CREATE ROLE bob LOGIN;
	CREATE TABLE alice_runs (who name, schedule text, scheduled_for timestamptz,
	                         payload jsonb, tenant text, queue text, via_guc text);
	ALTER TABLE alice_runs OWNER TO alice;
	CREATE TABLE bob_runs (who name, schedule text, scheduled_for timestamptz, note text);
	ALTER TABLE bob_runs OWNER TO bob;
	-- What an unqualified call resolves to, for the search_path check.
	CREATE FUNCTION public.whoami() RETURNS text LANGUAGE sql AS $$ SELECT 'public' $$;
	CREATE SCHEMA bob_evil AUTHORIZATION bob;
});
$node->safe_psql('app', q{
	SET ROLE bob;
	-- A trojan: anyone whose search_path put bob_evil first would run it.
	GRANT USAGE ON SCHEMA bob_evil TO PUBLIC;
	CREATE FUNCTION bob_evil.whoami() RETURNS text LANGUAGE sql AS $$ SELECT 'bob_evil' $$;
});

my $record_alice = q{INSERT INTO alice_runs
	SELECT current_user, r.name, r.scheduled_for, r.payload, r.tenant, r.queue,
	       current_setting('fairshare.run_scheduled_for')
	  FROM fs_current_run() r};
$node->safe_psql('app', qq{
	SET ROLE alice;
	SELECT fs_schedule('a_minutely', '* * * * *', payload => '{"n": 1}', tenant => 'acme',
	                   queue => 'reports', command => \$\$$record_alice\$\$);
	SELECT fs_schedule('a_fails', '* * * * *', command => 'SELECT 1/0');
	SELECT fs_schedule('a_victim', '2 * * * *',
	                   command => \$\$INSERT INTO alice_runs (who, schedule, via_guc) SELECT current_user, 'a_victim', whoami()\$\$);
});
$node->safe_psql('app', q{
	SET ROLE bob;
	SELECT fs_schedule('b_minutely', '* * * * *',
	                   command => $$INSERT INTO bob_runs SELECT current_user, r.name, r.scheduled_for FROM fs_current_run() r$$);
	-- fs_schedule() refuses SET ROLE, SET SESSION AUTHORIZATION, temporary
	-- tables and PREPARE; run from dynamic SQL, they fail at run time.
	SELECT fs_schedule('b_set_role', '1 * * * *', command => $c$DO $x$BEGIN EXECUTE 'SET ROLE postgres'; END$x$$c$);
	SELECT fs_schedule('b_set_config', '1 * * * *', command => $$SELECT set_config('role', 'postgres', false)$$);
	SELECT fs_schedule('b_session_auth', '1 * * * *', command => $c$DO $x$BEGIN EXECUTE 'SET SESSION AUTHORIZATION postgres'; END$x$$c$);
	SELECT fs_schedule('b_read_alice', '1 * * * *', command => 'INSERT INTO bob_runs (note) SELECT who FROM alice_runs');
	SELECT fs_schedule('b_temp', '1 * * * *', command => $c$DO $x$BEGIN EXECUTE 'CREATE TEMP TABLE t (x int)'; END$x$$c$);
	SELECT fs_schedule('b_superuser_only', '1 * * * *', command => $$COPY bob_runs TO PROGRAM 'true'$$);
	SELECT fs_schedule('b_prepare', '1 * * * *', command => $c$DO $x$BEGIN EXECUTE 'PREPARE p AS SELECT 1'; END$x$$c$);
	SELECT fs_schedule('b_leak', '1 * * * *',
	                   command => 'SET search_path = bob_evil, public; SELECT pg_advisory_lock(7)');
});

advance_to_minute(1);

is( $node->safe_psql('app',
		q{SELECT who, schedule, scheduled_for, payload, tenant, queue, via_guc::timestamptz = scheduled_for FROM alice_runs}),
	'alice|a_minutely|2024-01-01 00:01:00+00|{"n": 1}|acme|reports|t',
	'a command runs once, as its owner, with the run data');
is($node->safe_psql('app', 'SELECT who, schedule FROM bob_runs'),
	'bob|b_minutely', "another owner's command runs as that owner");
is( $node->safe_psql('app',
		q{SELECT name || ': ' || state || coalesce(' ' || split_part(error, ' (SQLSTATE', 1), '')
		    FROM fs_recent_runs WHERE scheduled_for = '2024-01-01 00:01:00+00' ORDER BY name}),
	join("\n",
		'a_fails: failed division by zero',
		'a_minutely: succeeded',
		'b_leak: succeeded',
		'b_minutely: succeeded',
		'b_prepare: failed cannot execute PREPARE within security-restricted operation',
		'b_read_alice: failed permission denied for table alice_runs',
		'b_session_auth: failed cannot set parameter "session_authorization" within security-definer function',
		'b_set_config: failed cannot set parameter "role" within security-definer function',
		'b_set_role: failed cannot set parameter "role" within security-definer function',
		'b_superuser_only: failed must be superuser or have privileges of the pg_execute_server_program role to COPY to or from an external program',
		'b_temp: failed cannot create temporary table within security-restricted operation'),
	'failing commands are recorded with their error and do not stop the others; no command escalates');
is( $node->safe_psql('app',
		q{SELECT last_run_state, split_part(last_error, ' (SQLSTATE', 1) FROM fs_schedule_status WHERE name = 'a_fails'}),
	'failed|division by zero', 'the schedule shows its last error');

advance_to_minute(2);
is( $node->safe_psql('app', q{SELECT via_guc FROM alice_runs WHERE schedule = 'a_victim'}),
	'public', "one owner's session settings do not reach another owner's command");
is($node->safe_psql('app', q{SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'}),
	'0', "a command's session advisory locks end with its run");

# Waking up again at the same minute runs nothing twice.
$node->reload;
$node->poll_query_until('app', "SELECT state = 'idle' FROM fs_scheduler");
is( $node->safe_psql('app',
		q{SELECT count(*), count(DISTINCT scheduled_for) FROM alice_runs WHERE schedule = 'a_minutely'}),
	'2|2', 'each run once, across wake-ups');

# --- A crash in the middle of a run -------------------------------------------

# a_blocked's command waits on an advisory lock this session holds; the
# server then stops in an immediate (crash-like) way during the run.
$node->safe_psql('app', q{
	SET ROLE alice;
	SELECT fs_schedule('a_blocked', '3 * * * *',
	                   command => $$SELECT pg_advisory_xact_lock_shared(42); INSERT INTO alice_runs (who, schedule, scheduled_for) SELECT current_user, 'a_blocked', (fs_current_run()).scheduled_for$$);
});
my $holder = $node->background_psql('app');
$holder->query_safe('SELECT pg_advisory_lock(42)');
$node->safe_psql('app', "ALTER SYSTEM SET fairshare.debug_clock = " . ($t0 + 180) . "; SELECT pg_reload_conf();");
$node->poll_query_until('app',
	q{SELECT count(*) = 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted})
  or die "the command did not start";
is( $node->safe_psql('app',
		q{SELECT query FROM pg_stat_activity WHERE backend_type = 'fairshare scheduler'}),
	'fairshare: schedule '
	  . $node->safe_psql('app', q{SELECT schedule_id FROM fs_schedules WHERE name = 'a_blocked'}),
	'pg_stat_activity shows the schedule being run, not its command');
$node->stop('immediate');
$holder->{run}->finish;
$node->start;
$node->poll_query_until('app',
	"SELECT last_pass_at = to_timestamp(" . ($t0 + 180) . ") AND state = 'idle' FROM fs_scheduler")
  or die "the scheduler did not run minute 3 after the restart";
is( $node->safe_psql('app',
		q{SELECT schedule, count(*) FROM alice_runs WHERE scheduled_for = '2024-01-01 00:03:00+00' GROUP BY 1 ORDER BY 1}),
	"a_blocked|1\na_minutely|1",
	'a run interrupted by a crash runs once after the restart, and finished runs are not run again');
is( $node->safe_psql('app',
		q{SELECT count(*) FROM fs_schedule_runs WHERE scheduled_for = '2024-01-01 00:03:00+00' AND name = 'a_blocked'}),
	'1', 'the ledger has the run once');

# --- Command timeout ------------------------------------------------------------

$node->safe_psql('app', q{
	ALTER SYSTEM SET fairshare.command_timeout = '200ms';
	SET ROLE alice;
	SELECT fs_schedule('a_slow', '4 * * * *', command => 'SELECT pg_sleep(30)');
});
advance_to_minute(4);
like(
	$node->safe_psql('app', q{SELECT state || ' ' || error FROM fs_recent_runs WHERE name = 'a_slow'}),
	qr/^failed canceling statement due to statement timeout/,
	'a command running past fairshare.command_timeout is cancelled and recorded');

# A command that catches its cancellation cannot run on: a deadline it
# cannot catch ends the scheduler, whose successor records the run as
# failed without running it again, and carries on with the pass.
my $stubborn_loop = q{DO $do$ BEGIN LOOP BEGIN PERFORM pg_sleep(1); EXCEPTION WHEN query_canceled THEN NULL; END; END LOOP; END $do$};
$node->safe_psql('app', qq{
	CREATE SEQUENCE stubborn_starts;
	GRANT USAGE ON SEQUENCE stubborn_starts TO alice;
	SET ROLE alice;
	SELECT fs_schedule('a_stubborn', '5 * * * *',
	                   command => \$c\$SELECT nextval('stubborn_starts'); $stubborn_loop\$c\$);
	SELECT fs_schedule('a_catches_once', '5 * * * *',
	                   command => \$c\$DO \$do\$ BEGIN PERFORM pg_sleep(1); EXCEPTION WHEN query_canceled THEN NULL; END \$do\$\$c\$);
	SELECT fs_schedule('a_after_stubborn', '5 * * * *',
	                   command => \$\$INSERT INTO alice_runs (who, schedule) VALUES (current_user, 'a_after_stubborn')\$\$);
});
my $stubborn_pid = $node->safe_psql('app', 'SELECT scheduler_pid FROM fs_scheduler');
advance_to_minute(5);
isnt($node->safe_psql('app', 'SELECT scheduler_pid FROM fs_scheduler'),
	$stubborn_pid, 'a command ignoring its cancellation ends the scheduler');
ok($node->log_contains(qr/fairshare scheduler exited to end the command of schedule \d+, which ran past fairshare.command_timeout and ignored its cancellation/),
	'which says why in the log');
is( $node->safe_psql('app',
		q{SELECT name || ': ' || state || coalesce(' ' || error, '') FROM fs_recent_runs
		   WHERE name IN ('a_stubborn', 'a_catches_once', 'a_after_stubborn') ORDER BY name}),
	join("\n",
		'a_after_stubborn: succeeded',
		'a_catches_once: failed the command ran past fairshare.command_timeout (200 ms) and ignored its cancellation (SQLSTATE 57014)',
		'a_stubborn: failed the command ran past fairshare.command_timeout and ignored its cancellation: the scheduler exited to end it'),
	'the next scheduler records the run as failed and carries on; a command that caught its cancellation and ended fails too');
is($node->safe_psql('app', 'SELECT last_value FROM stubborn_starts'),
	'1', 'the command that ended the scheduler did not run again');

$node->safe_psql('app', q{ALTER SYSTEM RESET fairshare.command_timeout; SELECT pg_reload_conf();});

# --- A command's rows are not kept ----------------------------------------------

# The scheduler's peak resident size (kB), from /proc.
sub scheduler_peak_kb
{
	my $pid = $node->safe_psql('app',
		q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'fairshare scheduler'});
	my ($kb) = slurp_file("/proc/$pid/status") =~ /^VmHWM:\s+(\d+) kB/m
	  or die "no VmHWM in /proc/$pid/status";
	return ($pid, $kb);
}

# About 200 MB of rows: kept until the command ends, they would raise the
# scheduler's peak memory by as much.
$node->safe_psql('app', q{
	SET ROLE alice;
	SELECT fs_schedule('a_wide', '6 * * * *',
	                   command => $$SELECT repeat('x', 1000) FROM generate_series(1, 200000)$$);
});
my ($wide_pid, $peak_before) = scheduler_peak_kb();
advance_to_minute(6);
my ($wide_pid_after, $peak_after) = scheduler_peak_kb();
is($node->safe_psql('app', q{SELECT state FROM fs_recent_runs WHERE name = 'a_wide'}),
	'succeeded', 'a command returning many wide rows runs');
is($wide_pid_after, $wide_pid, 'in the same scheduler');
cmp_ok($peak_after - $peak_before, '<', 50 * 1024,
	"and its rows do not stay in the scheduler's memory");

# --- Schedules that give no run do not end a pass ------------------------------

# At minute 9, a_skip_late's run of minute 7 is too late for catchup 'skip'
# and is dropped; a_after_skip, due after it, still runs in the same pass.
$node->safe_psql('app', q{
	SET ROLE alice;
	SELECT fs_schedule('a_skip_late', '7 * * * *', catchup => 'skip',
	                   command => $$INSERT INTO alice_runs (who, schedule) VALUES (current_user, 'a_skip_late')$$);
	SELECT fs_schedule('a_after_skip', '9 * * * *',
	                   command => $$INSERT INTO alice_runs (who, schedule) VALUES (current_user, 'a_after_skip')$$);
});
advance_to_minute(9);
is( $node->safe_psql('app',
		q{SELECT name || ' ' || state FROM fs_recent_runs WHERE name IN ('a_skip_late', 'a_after_skip') ORDER BY name}),
	"a_after_skip succeeded\na_skip_late skipped",
	'a schedule whose late run is skipped does not keep the ones after it from running in the same pass');

# --- Owners are roles that may still log in --------------------------------------

# Each of these roles schedules a command, then is dropped and replaced by a
# role of the same name, renamed, made NOLOGIN, or refused CONNECT.  None
# of those commands runs; the role that is left alone runs its own.
$node->safe_psql('app', q{
	CREATE TABLE owner_runs (who name, schedule text);
	GRANT INSERT ON owner_runs TO PUBLIC;
	CREATE ROLE o_kept LOGIN;
	CREATE ROLE o_dropped LOGIN;
	CREATE ROLE o_renamed LOGIN;
	CREATE ROLE o_nologin LOGIN;
	CREATE ROLE o_noconnect LOGIN;
});
foreach my $role (qw(o_kept o_dropped o_renamed o_nologin o_noconnect))
{
	$node->safe_psql('app', qq{
		SET ROLE $role;
		SELECT fs_schedule('$role', '11 * * * *',
		                   command => \$\$INSERT INTO owner_runs VALUES (current_user, '$role')\$\$);
	});
}
$node->safe_psql('app', q{
	DROP ROLE o_dropped;
	CREATE ROLE o_dropped LOGIN;
	ALTER ROLE o_renamed RENAME TO o_renamed_2;
	ALTER ROLE o_nologin NOLOGIN;
	REVOKE CONNECT ON DATABASE app FROM PUBLIC;
	GRANT CONNECT ON DATABASE app TO alice, bob, o_kept, o_dropped, o_renamed_2, o_nologin;
});
is( $node->safe_psql('app', q{
		SET ROLE o_dropped;
		SELECT count(*) FROM fs_schedule_status;
		SELECT fs_unschedule('o_dropped');}),
	"0\nf", 'a role created with the name of a dropped owner does not get its schedules');
is($node->safe_psql('app', q{SET ROLE o_renamed_2; SELECT name, owner FROM fs_schedule_status}),
	'o_renamed|o_renamed', 'a renamed owner still sees its schedule');
advance_to_minute(11);
is($node->safe_psql('app', 'SELECT who, schedule FROM owner_runs'),
	'o_kept|o_kept', "only the command of the owner left alone ran");
is( $node->safe_psql('app',
		q{SELECT name || ': ' || state || ' ' || error FROM fs_recent_runs
		   WHERE name LIKE 'o\_%' AND state = 'failed' ORDER BY name}),
	join("\n",
		q{o_dropped: failed role "o_dropped" (OID } . $node->safe_psql('app',
			q{SELECT owner_oid FROM fs_schedules WHERE name = 'o_dropped'}) . q{) no longer exists: its schedules do not run},
		q{o_noconnect: failed role "o_noconnect" may not connect to database "app": its schedules do not run},
		q{o_nologin: failed role "o_nologin" may not log in: its schedules do not run},
		q{o_renamed: failed role "o_renamed" was renamed to "o_renamed_2": its schedules do not run until it calls fs_schedule() for them again}),
	'the others are recorded as failed, saying why');
$node->safe_psql('app', q{
	SET ROLE o_renamed_2;
	SELECT fs_schedule('o_renamed', '12 * * * *',
	                   command => $$INSERT INTO owner_runs VALUES (current_user, 'o_renamed')$$);
	RESET ROLE;
	GRANT CONNECT ON DATABASE app TO PUBLIC;
});
advance_to_minute(12);
is($node->safe_psql('app', q{SELECT who FROM owner_runs WHERE schedule = 'o_renamed'}),
	'o_renamed_2', 'a renamed owner takes its schedule back by calling fs_schedule() again');

# --- Owners are served fairly ----------------------------------------------------

# At minute 14, alice has three slow commands due since minute 13, and bob
# one quick command due at 14.  Oldest first, bob's would wait for all of
# alice's; served by least time used, it waits for one at most.
$node->safe_psql('app', q{
	SET ROLE alice;
	SELECT fs_schedule('a_slow_' || i, '13 * * * *', command => 'SELECT pg_sleep(0.5)')
	  FROM generate_series(1, 3) i;
	SET ROLE bob;
	SELECT fs_schedule('b_quick', '14 * * * *',
	                   command => $$INSERT INTO bob_runs (note) VALUES ('b_quick')$$);
});
advance_to_minute(14);
is( $node->safe_psql('app', q{
		SELECT count(*) <= 1 FROM fs_schedule_runs a, fs_schedule_runs b
		 WHERE a.name LIKE 'a\_slow\_%' AND b.name = 'b_quick' AND a.claimed_at < b.claimed_at}),
	't', "one owner's slow commands delay another owner's run by one command at most");
is( $node->safe_psql('app',
		q{SELECT count(*) FROM fs_schedule_runs WHERE name LIKE 'a\_slow\_%' AND state = 'succeeded'}),
	'3', 'and they all run in the same pass');

# --- Old runs are pruned ----------------------------------------------------------

# Runs older than fairshare.run_retention go, several batches in one pass.
$node->safe_psql('app', q{
	INSERT INTO fs_schedule_runs (schedule_id, scheduled_for, owner_oid, owner, name, state, claimed_at)
	SELECT -1, timestamptz '2000-01-01 00:00+00' + g * interval '1 minute', 10, 'postgres', 'ancient',
	       'succeeded', timestamptz '2000-01-01 00:00+00'
	  FROM generate_series(1, 25000) g;
});
my $pruned_before = $node->safe_psql('app', 'SELECT runs_pruned FROM fs_scheduler');
advance_to_minute(15);
my $pruned_first = $node->safe_psql('app', "SELECT runs_pruned - $pruned_before FROM fs_scheduler");
# A pass prunes for 5 s at most: on a loaded machine the rest waits for the
# next pass (two at most here).
for my $m (16, 17)
{
	last if $node->safe_psql('app', q{SELECT count(*) FROM fs_schedule_runs WHERE name = 'ancient'}) eq '0';
	note("the pass of minute " . ($m - 1) . " stopped at its time bound");
	advance_to_minute($m);
}
cmp_ok($pruned_first, '>=', 10000, 'a pass deletes runs past fairshare.run_retention, a batch of 10,000 at least');
is( $node->safe_psql('app', qq{
		SELECT (SELECT count(*) FROM fs_schedule_runs WHERE name = 'ancient'),
		       runs_pruned - $pruned_before FROM fs_scheduler}),
	'0|25000', 'every run past fairshare.run_retention goes, in batches');

# --- The worker's housekeeping --------------------------------------------------

is( $node->safe_psql('app',
		q{SELECT runs_succeeded > 0, runs_failed > 0, last_sweep_at IS NOT NULL,
		         last_state_save_at IS NOT NULL FROM fs_scheduler}),
	't|t|t|t', 'fs_scheduler counts runs; the launcher sweeps leases and saves the state file');
my $lease = $node->safe_psql('app',
	q{SELECT fs_acquire_slot('sweep_me', 'sweep_q', '1 second')});
$node->safe_psql('app', "ALTER SYSTEM SET fairshare.debug_clock = " . ($t0 + 60 * ($minute + 1)) . "; SELECT pg_reload_conf();");
$node->poll_query_until('app', q{SELECT count(*) = 0 FROM fs_leases WHERE queue = 'sweep_q'})
  or die "expired lease not swept";
pass('the launcher frees expired leases without any decision needing the slot');

# --- Following fairshare.database ---------------------------------------------

$node->safe_psql('app', q{ALTER SYSTEM SET fairshare.database = 'postgres'; SELECT pg_reload_conf();});
$node->wait_for_log(qr/fairshare scheduler started in database "postgres"/);
is( $node->safe_psql('postgres',
		q{SELECT datname FROM pg_stat_activity WHERE backend_type = 'fairshare scheduler'}),
	'postgres', 'a new fairshare.database takes effect on reload');
$node->safe_psql('postgres', q{ALTER SYSTEM SET fairshare.database = ''; SELECT pg_reload_conf();});
$node->poll_query_until('postgres',
	q{SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type = 'fairshare scheduler'})
  or die "the scheduler did not stop";
pass('an empty fairshare.database stops the scheduler');

# --- Not on a standby ------------------------------------------------------------

$node->backup('backup');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($node, 'backup', has_streaming => 1);
$standby->start;
$node->wait_for_catchup($standby);
is( $standby->safe_psql('postgres',
		q{SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'fairshare%'}),
	'0', 'no fairshare worker runs on a standby');
$standby->promote;
$standby->poll_query_until('postgres',
	q{SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'fairshare launcher'})
  or die "no launcher after promotion";
pass('the launcher starts when the standby is promoted');

$standby->stop;
$node->stop;
done_testing();
