# Schedule commands cannot reach past their owner: nothing one owner's
# command leaves in the scheduler's session (settings, temporary objects,
# advisory locks) reaches the next owner's command or the
# scheduler's own work; a command cannot change its role; an owner locked
# out by the rules PostgreSQL applies at login (NOLOGIN, VALID UNTIL,
# CONNECTION LIMIT, CONNECT, ALLOW_CONNECTIONS) runs nothing, and the reason
# is recorded; a failing run records the real error and SQLSTATE.
#
# Time is driven with fairshare.debug_clock: ALTER SYSTEM, then a reload.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $src = $ENV{FS_SRC} or die "FS_SRC is not set";
my $t0 = 1704067200;    # 2024-01-01 00:00:00 UTC

my $node = PostgreSQL::Test::Cluster->new('schedule_security');
$node->init;
$node->append_conf('postgresql.conf', slurp_file("$src/test/fairshare.conf"));
$node->append_conf('postgresql.conf', qq{
fairshare.database = 'app'
fairshare.debug_clock = $t0
log_min_messages = log
});
$node->start;
$node->safe_psql('postgres', q{
	SET client_min_messages = warning;
	CREATE EXTENSION fairshare;
	CREATE DATABASE app;
});
$node->safe_psql('app', q{SET client_min_messages = warning; CREATE EXTENSION fairshare;});
$node->poll_query_until('postgres', "SELECT state = 'idle' FROM fs_scheduler")
  or die "the scheduler did not start";

# Set the clock to minute $m after $t0 and wait until the scheduler is done
# with that minute.  From database postgres: app may refuse connections.
sub advance_to_minute
{
	my ($m) = @_;
	my $at = $t0 + 60 * $m;
	$node->safe_psql('postgres', "ALTER SYSTEM SET fairshare.debug_clock = $at; SELECT pg_reload_conf();");
	$node->poll_query_until('postgres',
		"SELECT last_pass_at = to_timestamp($at) AND state = 'idle' FROM fs_scheduler")
	  or die "the scheduler did not finish minute $m";
}

sub runs_at
{
	my ($m, $like) = @_;
	return $node->safe_psql('app', qq{
		SELECT name || ': ' || state || coalesce(' ' || error, '') FROM fs_recent_runs
		 WHERE scheduled_for = to_timestamp($t0 + 60 * $m) AND name LIKE '$like' ORDER BY name});
}

# --- What one owner's command leaves behind -----------------------------------

$node->safe_psql('app', q{
	CREATE ROLE alice LOGIN;
	CREATE ROLE bob LOGIN;
	CREATE SCHEMA alice_evil AUTHORIZATION alice;
	GRANT USAGE ON SCHEMA alice_evil TO PUBLIC;
	-- Who ran alice's code: the trap must only ever see alice.
	CREATE TABLE spied (who name, via text);
	GRANT INSERT ON spied TO PUBLIC;
	CREATE TABLE bob_seen (who name, search_path text, temp_functions bigint, advisory_locks bigint,
	                       read_only text, cast_ok text);
	ALTER TABLE bob_seen OWNER TO bob;
	CREATE TABLE alice_rows (x int);
	ALTER TABLE alice_rows OWNER TO alice;
});
$node->safe_psql('app', q{
	SET ROLE alice;
	CREATE FUNCTION alice_evil.spy(t text) RETURNS boolean LANGUAGE sql
	    AS $$ INSERT INTO public.spied VALUES (current_user, t) RETURNING true $$;
	CREATE FUNCTION alice_evil.lower(t text) RETURNS text LANGUAGE sql
	    AS $$ SELECT alice_evil.spy('lower') :: text $$;
	CREATE FUNCTION alice_evil.deferred() RETURNS trigger LANGUAGE plpgsql
	    AS $$ BEGIN PERFORM alice_evil.spy('deferred trigger'); RETURN NULL; END $$;
	CREATE CONSTRAINT TRIGGER alice_deferred AFTER INSERT ON alice_rows
	    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION alice_evil.deferred();
	-- Minute 1: each leaves something in the session, and succeeds.
	SELECT fs_schedule('a_search_path', '1 * * * *',
	    command => $$SELECT set_config('search_path', 'alice_evil, public', false)$$);
	SELECT fs_schedule('a_temp_domain', '1 * * * *',
	    command => $$CREATE DOMAIN pg_temp.text AS pg_catalog.text CHECK (alice_evil.spy(VALUE))$$);
	SELECT fs_schedule('a_temp_function', '1 * * * *',
	    command => $$CREATE FUNCTION pg_temp.lower(text) RETURNS text LANGUAGE sql AS 'SELECT alice_evil.spy($1)::text'$$);
	SELECT fs_schedule('a_advisory_lock', '1 * * * *', command => 'SELECT pg_advisory_lock(42)');
	SELECT fs_schedule('a_read_only', '1 * * * *', command => 'SET transaction_read_only = on');
	SELECT fs_schedule('a_deferred', '1 * * * *', command => 'INSERT INTO alice_rows VALUES (1)');
	-- A command cannot change its role, even from dynamic SQL.
	SELECT fs_schedule('a_set_role', '1 * * * *',
	    command => $c$DO $x$BEGIN EXECUTE 'SET ROLE postgres'; END$x$$c$);
	SELECT fs_schedule('a_session_authorization', '1 * * * *',
	    command => $c$DO $x$BEGIN EXECUTE 'SET SESSION AUTHORIZATION postgres'; END$x$$c$);
});
$node->safe_psql('app', q{
	SET ROLE bob;
	-- Minute 2: what bob's command finds.
	SELECT fs_schedule('b_observe', '2 * * * *', command => $$
		INSERT INTO bob_seen
		SELECT current_user, current_setting('search_path'),
		       (SELECT count(*) FROM pg_proc WHERE pronamespace = pg_my_temp_schema()),
		       (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()),
		       current_setting('transaction_read_only'),
		       lower('X'::text)$$);
});

advance_to_minute(1);
is(runs_at(1, 'a\_%'), join("\n",
		'a_advisory_lock: succeeded',
		'a_deferred: failed cannot fire deferred trigger within security-restricted operation (SQLSTATE 42501)',
		'a_read_only: succeeded',
		'a_search_path: succeeded',
		'a_session_authorization: failed cannot set parameter "session_authorization" within security-definer function (SQLSTATE 42501)',
		'a_set_role: failed cannot set parameter "role" within security-definer function (SQLSTATE 42501)',
		'a_temp_domain: failed cannot create a type in a temporary schema within security-restricted operation (SQLSTATE 42501)',
		'a_temp_function: succeeded'),
	'the commands that leave state behind ran; PostgreSQL refuses SET ROLE, SET SESSION AUTHORIZATION, temporary types and deferred triggers at run time');
is( $node->safe_psql('app', q{
		SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		 WHERE n.nspname LIKE 'pg\_temp\_%' AND p.proname = 'lower'}),
	'0', "a command's temporary function is dropped after its run");
is( $node->safe_psql('app', q{
		SELECT count(*) FROM pg_locks l JOIN fs_scheduler s ON l.pid = s.scheduler_pid
		 WHERE l.locktype = 'advisory'}),
	'0', "a command's session advisory lock is released after its run");

advance_to_minute(2);
is( $node->safe_psql('app', 'SELECT * FROM bob_seen'),
	'bob|"$user", public|0|0|off|x',
	"the next owner's command runs as that owner, with the default search_path, no temporary object, no advisory lock, a writable transaction");
is($node->safe_psql('app', 'SELECT count(*) FROM spied'), '0',
	"no code of alice's ran as bob or as the scheduler");
is(runs_at(2, 'b\_%'), 'b_observe: succeeded', "bob's run succeeded");

# --- The real error of a failing run -------------------------------------------

# Commands fs_schedule() refuses may still be stored (made before it did):
# their runs fail with the error that says why, and its SQLSTATE.
$node->safe_psql('app', q{
	SET ROLE alice;
	SELECT fs_schedule('a_commit', '3 * * * *', command => 'SELECT 1');
	SELECT fs_schedule('a_copy', '3 * * * *', command => 'SELECT 1');
	SELECT fs_schedule('a_vacuum', '3 * * * *', command => 'SELECT 1');
	RESET ROLE;
	UPDATE fs_schedules SET command = 'COMMIT' WHERE name = 'a_commit';
	UPDATE fs_schedules SET command = 'COPY alice_rows FROM STDIN' WHERE name = 'a_copy';
	UPDATE fs_schedules SET command = 'VACUUM alice_rows' WHERE name = 'a_vacuum';
});
advance_to_minute(3);
is(runs_at(3, 'a\_%'), join("\n",
		q{a_commit: failed transaction control (BEGIN, COMMIT, ROLLBACK, SAVEPOINT, RELEASE, PREPARE TRANSACTION) cannot be used in a schedule's command (SQLSTATE 2D000)},
		q{a_copy: failed COPY FROM STDIN or TO STDOUT (no client is connected to the background worker) cannot be used in a schedule's command (SQLSTATE 0A000)},
		q{a_vacuum: failed VACUUM cannot run inside a transaction block (SQLSTATE 25001)}),
	'a run that cannot run records the real error and SQLSTATE');
is( $node->safe_psql('app', q{
		SELECT last_run_state || ' ' || last_error FROM fs_schedule_status WHERE name = 'a_commit'}),
	q{failed transaction control (BEGIN, COMMIT, ROLLBACK, SAVEPOINT, RELEASE, PREPARE TRANSACTION) cannot be used in a schedule's command (SQLSTATE 2D000)},
	'the schedule shows it as its last error');

# --- Owners locked out as at login -------------------------------------------

$node->safe_psql('app', q{
	CREATE TABLE owner_runs (who name);
	GRANT INSERT ON owner_runs TO PUBLIC;
	CREATE ROLE o_kept LOGIN;
	CREATE ROLE o_expired LOGIN;
	CREATE ROLE o_no_connections LOGIN;
	CREATE ROLE o_nologin LOGIN;
	CREATE ROLE o_super LOGIN SUPERUSER;
});
foreach my $role (qw(o_kept o_expired o_no_connections o_nologin o_super))
{
	$node->safe_psql('app', qq{
		SET ROLE $role;
		SELECT fs_schedule('$role', '4-5 * * * *',
		                   command => 'INSERT INTO owner_runs VALUES (current_user)');
	});
}
$node->safe_psql('app', q{
	ALTER ROLE o_expired VALID UNTIL '2000-01-01 00:00+00';
	ALTER ROLE o_no_connections CONNECTION LIMIT 0;
	ALTER ROLE o_super CONNECTION LIMIT 0;
	ALTER ROLE o_nologin NOLOGIN;
});
advance_to_minute(4);
is($node->safe_psql('app', 'SELECT who FROM owner_runs ORDER BY who'), "o_kept\no_super",
	'the commands of locked-out owners do not run (a superuser passes CONNECTION LIMIT, as at login)');
is(runs_at(4, 'o\_%'), join("\n",
		'o_expired: failed role "o_expired" expired at 2000-01-01 00:00:00+00 (VALID UNTIL): its schedules do not run',
		'o_kept: succeeded',
		'o_no_connections: failed role "o_no_connections" has 0 sessions, its CONNECTION LIMIT is 0: its schedules do not run while the run would exceed it',
		'o_nologin: failed role "o_nologin" may not log in: its schedules do not run',
		'o_super: succeeded'),
	'their runs are recorded as failed, saying why');
is( $node->safe_psql('app', q{
		SELECT last_run_state || ' ' || last_error FROM fs_schedule_status WHERE name = 'o_expired'}),
	'failed role "o_expired" expired at 2000-01-01 00:00:00+00 (VALID UNTIL): its schedules do not run',
	'fs_schedule_status shows the reason');

# A database that does not allow connections runs no command.
$node->safe_psql('postgres', 'ALTER DATABASE app ALLOW_CONNECTIONS false');
advance_to_minute(5);
$node->safe_psql('postgres', 'ALTER DATABASE app ALLOW_CONNECTIONS true');
is(runs_at(5, 'o\_k%'),
	'o_kept: failed database "app" does not allow connections (ALLOW_CONNECTIONS false): no schedule runs',
	'a database closed to connections runs no command, and says so');
is($node->safe_psql('app', 'SELECT count(*) FROM owner_runs'), '2', 'nothing ran at minute 5');

# Unlocked, an owner's next scheduled run runs (the refused ones are not retried).
$node->safe_psql('app', q{
	ALTER ROLE o_expired VALID UNTIL 'infinity';
	SET ROLE o_expired;
	SELECT fs_schedule('o_expired', '6 * * * *', command => 'INSERT INTO owner_runs VALUES (current_user)');
});
advance_to_minute(6);
is($node->safe_psql('app', q{SELECT count(*) FROM owner_runs WHERE who = 'o_expired'}), '1',
	'once unlocked, the next run runs, once');

# A database at its CONNECTION LIMIT runs no command but a superuser's.
$node->safe_psql('app', q{
	SET ROLE o_kept;
	SELECT fs_schedule('o_kept', '7 * * * *', command => 'INSERT INTO owner_runs VALUES (current_user)');
	SET ROLE o_super;
	SELECT fs_schedule('o_super', '7 * * * *', command => 'INSERT INTO owner_runs VALUES (current_user)');
});
$node->safe_psql('postgres', 'ALTER DATABASE app CONNECTION LIMIT 0');
advance_to_minute(7);
$node->safe_psql('postgres', 'ALTER DATABASE app CONNECTION LIMIT -1');
like(runs_at(7, 'o\_k%'),
	qr/^o_kept: failed database "app" has \d+ sessions, its CONNECTION LIMIT is 0: no schedule runs while the run would exceed it$/,
	'a database at its connection limit runs no command of a role that is not a superuser');
is(runs_at(7, 'o\_s%'), 'o_super: succeeded', "a superuser's command passes the database's connection limit");

done_testing();
