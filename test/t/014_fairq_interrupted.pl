# Fair dequeue work that is interrupted: a recount whose backend is
# terminated or cancelled, or runs past statement_timeout, leaves nothing
# behind (the next recount runs and counts exactly), and a cancel or a
# timeout during a recount of every queue, or during the triggers' compile
# of a registration, cancels the statement instead of becoming a warning.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $node = fs_node('fairq_interrupted');
my $q = sub { $node->safe_psql('postgres', shift) };

# Recounts run the owner's code: ri_tenant() sleeps on row 1 when the
# session asks it to (ri.sleep), so a recount in such a session is slow
# while the triggers of every other session are not, or when ri_control
# says so (for the background worker).  ri_const() sleeps when called,
# which a compile does for an immutable function of constants.
$q->(q{
	CREATE TABLE ri_control (sleep float8);
	CREATE FUNCTION ri_tenant(tenant text, id int) RETURNS text
	LANGUAGE plpgsql IMMUTABLE AS $$
	DECLARE
		s text;
	BEGIN
		IF id = 1 THEN
			s := coalesce(nullif(current_setting('ri.sleep', true), ''),
			              (SELECT sleep::text FROM public.ri_control LIMIT 1));
			IF s IS NOT NULL THEN
				PERFORM pg_sleep(s::float8);
			END IF;
		END IF;
		RETURN tenant;
	END $$;
	CREATE FUNCTION ri_const(v int) RETURNS int
	LANGUAGE plpgsql IMMUTABLE AS $$
	BEGIN
		IF coalesce(current_setting('ri.sleep', true), '') <> '' THEN
			PERFORM pg_sleep(current_setting('ri.sleep')::float8);
		END IF;
		RETURN v;
	END $$;
	CREATE TABLE ri (id int PRIMARY KEY, tenant text NOT NULL);
	CREATE TABLE ri2 (id int PRIMARY KEY, tenant text NOT NULL);
	SELECT queue FROM fs_register_queue('ri', 'ri', 'public.ri_tenant(tenant, id)', 'id');
	SELECT queue FROM fs_register_queue('ri2', 'ri2', 'public.ri_tenant(tenant, id)', 'id');
	INSERT INTO ri SELECT g, 't' || g % 3 FROM generate_series(1, 9) g;
	INSERT INTO ri2 SELECT g, 'u' || g % 2 FROM generate_series(1, 4) g;
});
is($q->("SELECT string_agg(queue_name || '|' || tenants || '|' || ready_rows, ',' ORDER BY queue_name) FROM fs_resync()"),
	'ri|3|9,ri2|2|4', 'both queues counted');

# Start `sql` in a new session with ri.sleep set, and return the session and
# its pid once it is asleep inside the recount.
sub start_slow
{
	my ($sql) = @_;
	my $bg = $node->background_psql('postgres', on_error_stop => 0);
	my $pid = $bg->query_safe('SELECT pg_backend_pid()');
	$bg->query_safe("SET ri.sleep = '300'");
	$bg->query_until(qr/started/, "\\echo started\n$sql;\n");
	$node->poll_query_until('postgres',
		"SELECT wait_event = 'PgSleep' FROM pg_stat_activity WHERE pid = $pid")
	  or die "the recount of $pid did not start";
	return ($bg, $pid);
}

# The counts are exact and the queue is not left marked as being recounted.
# (Polled: the background worker, restarted, may be recounting it for an
# instant; a queue left marked would never be recounted again.)
sub counts_exact
{
	my ($what) = @_;
	ok($node->poll_query_until('postgres', "SELECT tenants || '|' || ready_rows FROM fs_resync('ri')", '3|9'),
		"$what: fs_resync() runs again and counts exactly");
	is($q->("SELECT sum(ready_rows) FROM fs_tenants WHERE queue = 'ri'"), '9',
		"$what: the live counts are exact");
	is($q->("SELECT count(*) FROM fs_claim('ri', NULL::ri, 3)"), '3',
		"$what: claims are served");
}

# Terminated in the middle of fs_resync(queue).
my ($bg, $pid) = start_slow("SELECT * FROM fs_resync('ri')");
is($q->("SELECT ready_rows IS NULL FROM fs_resync('ri')"), 't',
	'while it runs, another recount of the queue steps aside');
$q->("SELECT pg_terminate_backend($pid)");
$node->poll_query_until('postgres', "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid")
  or die "backend $pid did not exit";
eval { $bg->quit };
counts_exact('terminated');

# Terminated in the middle of a recount of every queue.
($bg, $pid) = start_slow('SELECT * FROM fs_resync()');
$q->("SELECT pg_terminate_backend($pid)");
$node->poll_query_until('postgres', "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid")
  or die "backend $pid did not exit";
eval { $bg->quit };
counts_exact('terminated in fs_resync(NULL)');

# The background worker terminated in the middle of its recount (the one it
# makes when it starts).
my $worker = "SELECT pid FROM pg_stat_activity WHERE backend_type = 'fairshare scheduler'";
$node->poll_query_until('postgres', "SELECT count(*) = 1 FROM ($worker) w")
  or die 'no scheduler';
$q->("INSERT INTO ri_control VALUES (300)");
$q->("SELECT pg_terminate_backend(pid) FROM ($worker) w");
$node->poll_query_until('postgres', "SELECT count(*) = 1 FROM ($worker AND wait_event = 'PgSleep') w")
  or die 'the restarted scheduler did not start its recount';
is($q->("SELECT ready_rows IS NULL FROM fs_resync('ri')"), 't',
	'the background worker is recounting');
$q->("DELETE FROM ri_control");
$q->("SELECT pg_terminate_backend(pid) FROM ($worker) w");
ok($node->poll_query_until('postgres', "SELECT tenants || '|' || ready_rows FROM fs_resync('ri')", '3|9'),
	'after the worker is terminated, fs_resync() runs again and counts exactly');
counts_exact('worker terminated');

# Cancelled: one queue, then every queue.  The statement is cancelled (no
# "could not recount" warning and no rows for the queues after it), and the
# session goes on.
for my $sql ("SELECT * FROM fs_resync('ri')", 'SELECT * FROM fs_resync()')
{
	($bg, $pid) = start_slow($sql);
	$q->("SELECT pg_cancel_backend($pid)");
	my ($out, $ret) = $bg->query("SELECT 'after'");
	like($bg->{stderr}, qr/canceling statement due to user request/, "$sql: cancelled");
	unlike($bg->{stderr}, qr/could not recount/, "$sql: the cancel is not turned into a warning");
	is($out, 'after', "$sql: no rows, and the session goes on");
	$bg->quit;
	counts_exact("cancelled $sql");
}

# statement_timeout, in a recount of every queue.
my ($ret, $out, $err) = $node->psql('postgres',
	"SET ri.sleep = '300'; SET statement_timeout = '1s'; SELECT * FROM fs_resync()");
isnt($ret, 0, 'statement_timeout stops a recount of every queue');
like($err, qr/canceling statement due to statement timeout/, 'with the timeout error');
unlike($err, qr/could not recount/, 'not a warning');
counts_exact('timed out');

# A cancel during the triggers' compile of a registration (its filter calls
# an immutable function of constants, evaluated when it is compiled) cancels
# the write instead of letting it through uncounted.
$q->(q{
	CREATE TABLE rc (id int PRIMARY KEY, tenant text NOT NULL);
	SELECT queue FROM fs_register_queue('rc', 'rc', 'tenant', 'id', filter => 'id > public.ri_const(0)');
});
($ret, $out, $err) = $node->psql('postgres',
	"SET ri.sleep = '300'; SET statement_timeout = '1s'; INSERT INTO rc VALUES (1, 'a')");
isnt($ret, 0, 'statement_timeout during the compile stops the write');
like($err, qr/canceling statement due to statement timeout/, 'with the timeout error');
unlike($err, qr/cannot follow table/, 'not a warning');
$bg = $node->background_psql('postgres', on_error_stop => 0);
$pid = $bg->query_safe('SELECT pg_backend_pid()');
$bg->query_safe("SET ri.sleep = '300'");
$bg->query_until(qr/started/, "\\echo started\nINSERT INTO rc VALUES (2, 'a');\n");
$node->poll_query_until('postgres', "SELECT wait_event = 'PgSleep' FROM pg_stat_activity WHERE pid = $pid")
  or die 'the compile did not start';
$q->("SELECT pg_cancel_backend($pid)");
($out) = $bg->query("SELECT 'after'");
like($bg->{stderr}, qr/canceling statement due to user request/, 'a cancel during the compile cancels the write');
unlike($bg->{stderr}, qr/cannot follow table/, 'not a warning');
$bg->quit;
is($q->('SELECT count(*) FROM rc'), '0', 'nothing was written');
$q->('INSERT INTO rc VALUES (3, \'a\')');
is($q->("SELECT ready_rows FROM fs_tenants WHERE queue = 'rc' AND tenant = 'a'"), '1',
	'a write that is not interrupted is counted');

ok(!$node->log_contains(qr/terminated by signal/), 'no backend crashed');
$node->stop;
done_testing();
