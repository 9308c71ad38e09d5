# Fault injection: every long operation and commit path of fairshare is
# stopped at its worst moment in each way PostgreSQL allows, and afterwards
# nothing is lost, doubled or left behind.
#
# Operations: a recount (fs_resync() of one queue, of every queue, the first
# fs_claim() after a restart), a claim in a transaction that already holds
# claimed rows, a claim of due schedules (at its lock of the schedules and
# at its ledger insert), fs_save_state(), a lease sweep (by a denied acquire,
# and by the launcher), a registration of a table with many rows (its index
# build).  Faults: pg_terminate_backend(), pg_cancel_backend(),
# statement_timeout and lock_timeout (a lock held by a second session where
# the operation needs one).  An operation is made slow by an owner function
# of the registered tenant expression that sleeps on row 1 when the session
# sets fx.sleep (recounts, index builds), by a lock held from a second
# session, or (where fairshare takes no lock and calls no user code) by
# repeating it in a loop.
#
# Out of memory: PostgreSQL has no way to make an allocation fail at a
# chosen point (a ulimit on the server fails whatever allocation comes first
# in any process, or brings in the kernel's OOM killer).  fairshare's debug
# build (make FS_DEBUG=1, the test/run debug suite) has fault points instead:
# each allocation that comes after shared state changed raises "out of
# memory" as palloc does when fairshare.debug_out_of_memory names it (name:N
# for its N-th pass).  On the debug build every such point is injected too;
# on the normal build the setting does not exist and those cases are left
# out.
#
# After each fault: the server did not crash, the session (after a cancel or
# a timeout) or a new one (after a terminate) works, the counts in shared
# memory match the tables (after a recount, and live where the fault must
# have left them exact), the leases are exactly those the test holds, no
# schedule run is claimed twice or lost, the state file loads, and a further
# fs_resync() runs (no queue left marked as being recounted).
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use FairshareTest;

my $t_start = time;
# No scheduler (its start-up recount would race the first claim after a
# restart, and it would claim the schedules' runs); the launcher sweeps
# expired leases only when the test asks it to.
my $node = fs_node('faults',
	"fairshare.database = ''\nfairshare.sweep_interval = '1h'\n");
my $q = sub { $node->safe_psql('postgres', shift) };

my ($faults, $violations) = (0, 0);
my $held = 0;    # leases the test holds right now

sub inv
{
	my ($ok, $name) = @_;
	$violations++ unless $ok;
	ok($ok, $name);
}

sub inv_is
{
	my ($got, $expected, $name) = @_;
	$violations++ unless defined $got && $got eq $expected;
	is($got, $expected, $name);
}

$q->(q{
	CREATE FUNCTION fx_tenant(tenant text, id int) RETURNS text
	LANGUAGE plpgsql IMMUTABLE AS $$
	BEGIN
		IF id = 1 AND coalesce(current_setting('fx.sleep', true), '') <> '' THEN
			PERFORM pg_sleep(current_setting('fx.sleep')::float8);
		END IF;
		RETURN tenant;
	END $$;
	CREATE TABLE fa (id int PRIMARY KEY, tenant text NOT NULL);
	CREATE TABLE fb (id int PRIMARY KEY, tenant text NOT NULL);
	CREATE TABLE fr (id int PRIMARY KEY, tenant text NOT NULL);
	SELECT queue FROM fs_register_queue('fa', 'fa', 'public.fx_tenant(tenant, id)', 'id');
	SELECT queue FROM fs_register_queue('fb', 'fb', 'public.fx_tenant(tenant, id)', 'id');
	SELECT fs_set_limit('*', 'fa', max_slots => 100);
	SELECT fs_set_limit('*', 'fb', max_slots => 100);
	SELECT fs_set_limit('sw', 'swq', max_slots => 1);
	INSERT INTO fa SELECT g, 't' || g % 5 FROM generate_series(1, 500) g;
	INSERT INTO fb SELECT g, 'u' || g % 3 FROM generate_series(1, 60) g;
	INSERT INTO fr SELECT g, 'r' || g % 7 FROM generate_series(1, 20000) g;
});
my %queues = (fa => 'fa', fb => 'fb');    # registered queue => its table

# ---------------------------------------------------------------- checks

sub no_crash
{
	my ($what) = @_;
	my $log = slurp_file($node->logfile);
	inv($log !~ /terminated by signal|server process .* was terminated/,
		"$what: the server did not crash");
}

# The live counts of every registered queue equal the tables' truth.
sub live_exact
{
	my ($what, @only) = @_;
	for my $queue (@only ? @only : sort keys %queues)
	{
		my $shm = $q->("SELECT coalesce(string_agg(tenant || '=' || ready_rows, ',' ORDER BY tenant), '')
		                  FROM fs_tenants WHERE queue = '$queue' AND ready_rows > 0");
		my $truth = $q->("SELECT coalesce(string_agg(t || '=' || n, ',' ORDER BY t), '')
		                    FROM (SELECT tenant AS t, count(*) AS n FROM $queues{$queue} GROUP BY 1) s");
		inv_is($shm, $truth, "$what: queue $queue counts ready rows exactly");
	}
}

# The leases are those the test holds, and so are the slots in use.
sub leases_exact
{
	my ($what) = @_;
	inv_is($q->("SELECT count(*) || '/' || count(*) FILTER (WHERE state = 'live') FROM fs_leases"),
		"$held/$held", "$what: $held leases, all live");
	inv_is($q->("SELECT coalesce(sum(slots_in_use), 0) FROM fs_tenants"), $held,
		"$what: $held slots in use");
}

# A recount of every queue runs (none is left marked as being recounted:
# its ready_rows would be NULL), the counts are exact, and another runs.
sub healed
{
	my ($what) = @_;
	my $n = scalar keys %queues;
	inv($node->poll_query_until('postgres',
			"SELECT count(*) = $n AND count(ready_rows) = $n FROM fs_resync()"),
		"$what: fs_resync() recounts every queue");
	live_exact("$what, recounted");
	inv_is($q->("SELECT count(ready_rows) FROM fs_resync()"), $n,
		"$what: a further fs_resync() runs");
}

sub after_fault
{
	my ($what, %o) = @_;
	no_crash($what);
	inv_is($q->('SELECT 1'), '1', "$what: a new session works");
	live_exact("$what, live") if $o{live};
	leases_exact($what);
	healed($what) unless $o{no_recount};
}

# ---------------------------------------------------------------- faults

# A second session holding a lock (or anything else) until released.
sub hold
{
	my ($sql) = @_;
	my ($in, $out, $err) = ('', '', '');
	my $h = IPC::Run::start([ 'psql', '-XAtq', '-d', $node->connstr('postgres') ],
		'<', \$in, '>', \$out, '2>', \$err, IPC::Run::timeout(120));
	$in .= "BEGIN; $sql; SELECT 'locked';\n";
	$h->pump until $out =~ /locked/;
	return sub { $in .= "ROLLBACK;\n\\q\n"; $h->finish; };
}

# Start $sql in a new session after $setup; return once it waits where
# $wait says ('sleep': in pg_sleep; 'lock': on a heavyweight lock; 'busy':
# running for 200 ms).
sub start_slow
{
	my ($sql, $setup, $wait) = @_;
	my $bg = $node->background_psql('postgres', on_error_stop => 0);
	my $pid = $bg->query_safe('SELECT pg_backend_pid()');
	$bg->query_safe($setup) if $setup;
	$bg->query_until(qr/started/, "\\echo started\n$sql;\n");
	my $cond = {
		sleep => "wait_event = 'PgSleep'",
		lock => "wait_event_type = 'Lock'",
		busy => "state = 'active' AND now() - query_start > '200ms'" }->{$wait};
	$node->poll_query_until('postgres', "SELECT $cond FROM pg_stat_activity WHERE pid = $pid")
	  or die "$sql did not start waiting ($wait)";
	return ($bg, $pid);
}

# Inject one fault into $sql.  kind: terminate, cancel, statement_timeout,
# lock_timeout.  o: setup (session SQL first), wait (how the operation is
# slow), lock (SQL that the second session holds while it runs), txn (the
# statement runs in a transaction block, ROLLBACK after a cancel),
# while_slow (called with the pid before a terminate or a cancel).
sub inject
{
	my ($what, $kind, $sql, %o) = @_;
	my $setup = $o{setup} // '';
	my $release = $o{lock} ? hold($o{lock}) : undef;
	$faults++;
	if ($kind eq 'terminate')
	{
		my ($bg, $pid) = start_slow($sql, $setup, $o{wait});
		$o{while_slow}->($pid) if $o{while_slow};
		$q->("SELECT pg_terminate_backend($pid)");
		$node->poll_query_until('postgres', "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid")
		  or die "backend $pid did not exit";
		eval { $bg->quit };
	}
	elsif ($kind eq 'cancel')
	{
		my ($bg, $pid) = start_slow($sql, $setup, $o{wait});
		$o{while_slow}->($pid) if $o{while_slow};
		$q->("SELECT pg_cancel_backend($pid)");
		$bg->query('ROLLBACK') if $o{txn};
		my ($out) = $bg->query("SELECT 'after'");
		like($bg->{stderr}, qr/canceling statement due to user request/, "$what: cancelled");
		inv_is($out, 'after', "$what: the session goes on");
		$bg->quit;
	}
	elsif ($kind eq 'out_of_memory')
	{
		my ($begin, $end) = $o{txn} ? ('BEGIN;', 'ROLLBACK;') : ('', '');
		my ($ret, $out, $err) = $node->psql('postgres',
			"$setup; SET fairshare.debug_out_of_memory = '$o{point}'; $begin $sql; $end "
			  . "RESET fairshare.debug_out_of_memory; SELECT 'after'",
			on_error_stop => 0);
		my ($name) = split /:/, $o{point};
		like($err, qr/out of memory.*\n.*fault point "$name"/, "$what: stopped by out of memory at $o{point}");
		inv(($out // '') =~ /after$/, "$what: the session goes on");
	}
	else
	{
		my $set = $kind eq 'statement_timeout'
		  ? "SET statement_timeout = '300ms'" : "SET lock_timeout = '300ms'";
		my $msg = $kind eq 'statement_timeout' ? 'statement timeout' : 'lock timeout';
		my ($begin, $end) = $o{txn} ? ('BEGIN;', 'ROLLBACK;') : ('', '');
		my ($ret, $out, $err) = $node->psql('postgres',
			"$setup; $set; $begin $sql; $end SET statement_timeout = 0; SELECT 'after'",
			on_error_stop => 0);
		# (A lock timeout in a recount of every queue stops them all, as a
		# cancel does: it is not a queue's failure to report and skip.)
		like($err, qr/canceling statement due to $msg/, "$what: stopped by the $msg");
		inv(($out // '') =~ /after$/, "$what: the session goes on");
	}
	$release->() if $release;
	after_fault($what, %o);
}

my $sleepy = "SET fx.sleep = '300'";

# The debug build's fault points (the normal build has no such setting).
my $debug_build = $q->("SELECT current_setting('fairshare.debug_out_of_memory', true) IS NOT NULL") eq 't';
note($debug_build ? 'debug build: out of memory is injected at the fault points'
                  : 'normal build: no fault points, out of memory is not injected');
sub inject_oom
{
	my ($what, $point, $sql, %o) = @_;
	inject("$what, out of memory at $point", 'out_of_memory', $sql, point => $point, %o)
	  if $debug_build;
}

# ---------------------------------------------------------------- recounts

for my $sql ("SELECT * FROM fs_resync('fa')", 'SELECT * FROM fs_resync()')
{
	for my $kind (qw(terminate cancel statement_timeout))
	{
		inject("$sql, $kind", $kind, $sql, setup => $sleepy, wait => 'sleep', live => 1);
	}
	inject("$sql, lock_timeout", 'lock_timeout', $sql,
		lock => 'LOCK fa IN ACCESS EXCLUSIVE MODE', live => 1);
	# Marked as being recounted, then out of memory before the count and
	# while applying it (a recount of every queue stops: it is not one
	# queue's failure to report and skip).
	inject_oom($sql, $_, $sql, live => 1) for qw(recount_count recount_apply);
}

# The first claim after a restart recounts the queue; stopped, the next one
# does it again (so no recount in between: fs_resync() would do it).
$node->restart;
inv_is($q->('SELECT start_kind FROM fs_stats'), 'restored', 'a clean restart restores the state file');
my $first_claim = "SELECT count(*) FROM fs_claim('fa', NULL::fa, 3)";
for my $kind (qw(terminate cancel statement_timeout))
{
	inject("first claim after a restart, $kind", $kind, $first_claim,
		setup => $sleepy, wait => 'sleep', no_recount => 1);
}
inject('first claim after a restart, lock_timeout', 'lock_timeout', $first_claim,
	lock => 'LOCK fa IN ACCESS EXCLUSIVE MODE', no_recount => 1);
inject_oom('first claim after a restart', $_, $first_claim, no_recount => 1)
  for qw(recount_count recount_apply);
inv_is($q->("BEGIN; $first_claim; ROLLBACK"), '3', 'the next first claim recounts and claims');
live_exact('first claim after the faults', 'fa');
healed('first claim after the faults');

# ---------------------------------------------------------------- claims

# A transaction holds rows claimed from fb; its next claim, from fa, waits
# for a lock on fa.  The transaction ends with the fault: its leases, its
# reservations and its locks go, and the counts are exact at once.
my $claims = "BEGIN; SELECT count(*) FROM fs_claim('fb', NULL::fb, 3) \\g /dev/null\n"
  . "SELECT count(*) FROM fs_claim('fa', NULL::fa, 5)";
for my $kind (qw(terminate cancel))
{
	inject("claim holding rows, $kind", $kind, $claims,
		lock => 'LOCK fa IN ACCESS EXCLUSIVE MODE', wait => 'lock', txn => 1, live => 1);
}
for my $kind (qw(statement_timeout lock_timeout))
{
	inject("claim holding rows, $kind", $kind,
		"SELECT count(*) FROM fs_claim('fb', NULL::fb, 3); SELECT count(*) FROM fs_claim('fa', NULL::fa, 5)",
		lock => 'LOCK fa IN ACCESS EXCLUSIVE MODE', txn => 1, live => 1);
}
# Out of memory in a claim that follows one holding rows: with its rows
# reserved, with some of its tenants' leases taken, with rows returned.
# (fb's claim of 3 rows passes each point once per tenant or row: the N-th
# pass falls in fa's claim.  claim_record is passed where the room for the
# claim records grows, before the claim changes anything: fa's claim of 10
# rows needs more than fb's left.)
inject_oom('claim holding rows', $_,
	"SELECT count(*) FROM fs_claim('fb', NULL::fb, 3); SELECT count(*) FROM fs_claim('fa', NULL::fa, 10)",
	txn => 1, live => 1)
  for qw(claim_record:2 claim_plan_starts:5 claim_query_args:2 claim_admit:6 claim_track_row:6);
# At commit, in a transaction that claimed rows and took one out of the
# ready state; and in the trigger, on the third row of an insert.
inject_oom('commit of a claim', 'pre_commit',
	"BEGIN; SELECT count(*) FROM fs_claim('fa', NULL::fa, 2); DELETE FROM fa WHERE id = (SELECT max(id) FROM fa); COMMIT",
	live => 1);
inject_oom('insert into a registered table', 'trigger_delta:3',
	"SELECT count(*) FROM fs_claim('fa', NULL::fa, 2); INSERT INTO fa SELECT g, 't1' FROM generate_series(100001, 100005) g",
	txn => 1, live => 1);
# A running row leaves its table: the leases of the first rows are released
# when the record of the second cannot be kept; the rollback gives them back.
if ($debug_build)
{
	$q->(q{
		CREATE TABLE fm (id int PRIMARY KEY, tenant text NOT NULL);
		CREATE TABLE fm_running (job_id int PRIMARY KEY);
		SELECT queue FROM fs_register_queue('fm', 'fm', tenant => 'tenant', order_by => 'id',
		       running_table => 'fm_running', running_key => 'job_id');
		SELECT fs_set_limit('*', 'fm', max_slots => 10);
		INSERT INTO fm SELECT g, 'm' || g % 2 FROM generate_series(1, 10) g;
		WITH c AS (SELECT (j.job).id FROM fs_claim('fm', NULL::fm, 3) j),
		     d AS (DELETE FROM fm USING c WHERE fm.id = c.id)
		INSERT INTO fm_running SELECT id FROM c;
	});
	$queues{fm} = 'fm';
	$held += 3;
	inject_oom('a running row leaves', 'running_release:2', 'DELETE FROM fm_running', txn => 1, live => 1);
	$q->('DELETE FROM fm_running');
	$held -= 3;
	leases_exact('the running rows left');
}
# A session's first acquire, and a spend of a budgeted tenant.
inject_oom('first acquire of a session', 'slot_record', "SELECT fs_acquire_slot('oom', 'fa', '1 hour')", no_recount => 1);
if ($debug_build)
{
	# A full bucket (a spend of 0 runs only asks): a token taken would show.
	$q->("SELECT fs_set_limit('ob', 'bq', budget_ms_per_minute => 60000); SELECT fs_spend_tokens('ob', 0, 1000, 'bq')");
	my $balance = "SELECT round(token_balance) FROM fs_tenants WHERE queue = 'bq' AND tenant = 'ob'";
	inv_is($q->($balance), '60000', 'spend of a budgeted tenant: the bucket is full');
	inject_oom('spend of a budgeted tenant', 'refund_entry', "SELECT fs_spend_tokens('ob', 5, 1000, 'bq')",
		txn => 1, no_recount => 1);
	inv_is($q->($balance), '60000', 'spend of a budgeted tenant, out of memory: no token taken');
}

# The same claim stopped later: its tenants planned, their rows reserved and
# their leases taken, while its query locks the rows (a sequential scan that
# evaluates the tenant expression, asleep on row 1).
my $seq = "SET enable_indexscan = off; SET enable_bitmapscan = off; SET enable_indexonlyscan = off";
my $late = "SELECT count(*) FROM fs_claim('fb', NULL::fb, 3); SET LOCAL fx.sleep = '300'; "
  . "SELECT count(*) FROM fs_claim('fa', NULL::fa, 5)";
for my $kind (qw(terminate cancel))
{
	inject("claim holding rows, in its row query, $kind", $kind, "BEGIN; $late",
		setup => $seq, wait => 'sleep', txn => 1, live => 1,
		while_slow => sub {
			my ($pid) = @_;
			cmp_ok($q->("SELECT count(*) FROM fs_leases WHERE holder_pid = $pid"), '>', 3,
				"claim holding rows, in its row query, $kind: stopped with the second claim's leases taken");
		});
}
inject('claim holding rows, in its row query, statement_timeout', 'statement_timeout', $late,
	setup => $seq, txn => 1, live => 1);
# Terminated while idle in the transaction that holds its claimed rows.
{
	my $bg = $node->background_psql('postgres', on_error_stop => 0);
	my $pid = $bg->query_safe('SELECT pg_backend_pid()');
	$bg->query_safe("BEGIN; SELECT count(*) FROM fs_claim('fa', NULL::fa, 4)");
	inv_is($q->("SELECT count(*) FROM fs_leases WHERE holder_pid = $pid"), '4', 'the idle transaction holds 4 leases');
	$faults++;
	$q->("SELECT pg_terminate_backend($pid)");
	$node->poll_query_until('postgres', "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid")
	  or die "backend $pid did not exit";
	eval { $bg->quit };
	after_fault('claim holding rows, terminated while idle', live => 1);
}

# ---------------------------------------------------------------- schedules

my $t0 = 1704067200;    # 2024-01-01 00:00:00 UTC
my $as_of = $t0 + 120;
$q->(qq{
	SET fairshare.debug_clock = $t0;
	SELECT fs_schedule('fx' || i, '* * * * *') FROM generate_series(1, 3) i;
});
my $sched_setup = "SET fairshare.debug_clock = $as_of";
my $due = "SELECT count(*) FROM fs_claim_due_schedules(as_of => to_timestamp($as_of))";
for my $kind (qw(terminate cancel statement_timeout lock_timeout))
{
	inject("schedule ledger insert, $kind", $kind, $due, setup => $sched_setup,
		lock => 'LOCK fs_schedule_runs IN SHARE MODE', wait => 'lock', no_recount => 1);
	inv_is($q->('SELECT count(*) FROM fs_schedule_runs'), '0', "schedule ledger insert, $kind: no run claimed");
}
for my $kind (qw(terminate cancel))
{
	inject("schedule claim, $kind", $kind, $due, setup => $sched_setup,
		lock => 'LOCK fs_schedule_state IN EXCLUSIVE MODE', wait => 'lock', no_recount => 1);
	inv_is($q->('SELECT count(*) FROM fs_schedule_runs'), '0', "schedule claim, $kind: no run claimed");
}
if ($debug_build)
{
	inject_oom('schedule claim', 'schedule_claim', $due, setup => $sched_setup, no_recount => 1);
	inv_is($q->('SELECT count(*) FROM fs_schedule_runs'), '0', 'schedule claim, out of memory: no run claimed');
}
inv_is($q->("$sched_setup; $due"), '3', 'after the faults, each schedule\'s run is claimed');
inv_is($q->("$sched_setup; $due"), '0', 'and only once');
inv_is($q->("SELECT count(*) || '/' || count(DISTINCT (schedule_id, scheduled_for)) FROM fs_schedule_runs"),
	'3/3', 'the ledger has each run once');
inv_is($q->("SELECT count(*) FROM fs_recent_runs WHERE name LIKE 'fx%' AND state = 'claimed'"), '3',
	'fs_recent_runs shows the three runs claimed');

# ---------------------------------------------------------------- state file

# fs_save_state() takes no heavyweight lock and calls no user code: it is
# made long by repeating it, and the fault lands in one of the saves or
# between two.  (lock_timeout does not apply: there is no lock to wait for.)
my @leases = split /\n/, $q->("SELECT fs_acquire_slot('keep' || i, 'fa', '1 hour') FROM generate_series(1, 2) i");
$held += 2;
my $saves = 'DO $$ BEGIN FOR i IN 1..10000000 LOOP PERFORM fs_save_state(); END LOOP; END $$';
for my $kind (qw(terminate cancel statement_timeout))
{
	inject("fs_save_state(), $kind", $kind, $saves, wait => 'busy', no_recount => 1);
}
my $pgstat = $node->data_dir . '/pg_stat';
opendir(my $dh, $pgstat) or die "$pgstat: $!";
my @tmp = grep { /^fairshare\.state\..*\.tmp$/ } readdir($dh);
closedir($dh);
inv_is(scalar(@tmp), 0, 'fs_save_state(): no temporary file left behind');
# The file the faults left must load: after an immediate stop (a crash for
# fairshare) the running file is read, its leases as orphans, and the WAL
# replayed over it makes them live again.
my $log_at = -s $node->logfile;
$node->stop('immediate');
$node->start;
like(substr(slurp_file($node->logfile), $log_at), qr/fairshare restored crashed state: \d+ tenants, \d+ leases/,
	'the running state file loads after an immediate stop');
inv_is($q->('SELECT start_kind FROM fs_stats'), 'replayed', 'and the WAL is replayed over it');
inv_is($q->("SELECT count(*) FROM fs_leases WHERE state = 'live' AND lease_id IN (" . join(',', @leases) . ')'),
	'2', 'the leases held come back live');
inv_is($q->('SELECT string_agg(fs_renew_slot(l)::text, \',\') FROM unnest(ARRAY[' . join(',', @leases) . ']::bigint[]) l'),
	'true,true', 'and renew');
after_fault('fs_save_state(), restarted');
# And a clean restart saves and restores.
$node->restart;
inv_is($q->('SELECT start_kind FROM fs_stats'), 'restored', 'a clean restart after the faults restores');
leases_exact('clean restart after the state file faults');
$q->('SELECT fs_release_slot(l) FROM unnest(ARRAY[' . join(',', @leases) . ']::bigint[]) l');
$held -= 2;
leases_exact('leases released');

# ---------------------------------------------------------------- sweeps

# Tenant sw may hold one slot; its lease expired.  An acquire frees it (the
# sweep of a denied acquire) and takes the slot; the fault comes right after,
# in the same statement, and the acquire's new lease goes with its rollback.
sub expired_lease
{
	$q->("SELECT fs_acquire_slot('sw', 'swq', '100 milliseconds')");
	$node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM fs_leases WHERE tenant = 'sw' AND expires_at < now()")
	  or die 'the lease did not expire';
}
my $acquire = "SELECT fs_acquire_slot('sw', 'swq', '1 hour') IS NOT NULL";
for my $kind (qw(terminate cancel statement_timeout))
{
	expired_lease();
	inject("sweep by an acquire, $kind", $kind, "$acquire, pg_sleep(300)", wait => 'sleep', no_recount => 1);
}
expired_lease();
# (An advisory lock: a table's lock would be taken when the statement is
# parsed, before the acquire.)
inject('sweep by an acquire, lock_timeout', 'lock_timeout', "$acquire, pg_advisory_xact_lock(4242)",
	lock => 'SELECT pg_advisory_xact_lock(4242)', no_recount => 1);
inv_is($q->("SELECT coalesce(sum(leases_expired), 0) > 0 FROM fs_tenants WHERE tenant = 'sw'"), 't',
	'the expired leases were freed');
inv_is($q->("SELECT fs_acquire_slot('sw', 'swq') IS NOT NULL"), 't', 'the slot is free to take');
$held++;
leases_exact('sweep by an acquire, after the faults');

# The launcher's sweep: it holds no lock a session could wait on and runs no
# user code, so the faults land between its sweeps.  Cancelled or
# terminated, it is started again (10 s later) and sweeps what expired
# meanwhile.  (A restart, not a reload, brings the short sweep interval in:
# the launcher waits out the sweep it planned with the old one.)
$q->("SELECT fs_release_slot(lease_id) FROM fs_leases WHERE tenant = 'sw'");
$held--;
my $launcher = "SELECT pid FROM pg_stat_activity WHERE backend_type = 'fairshare launcher'";
$node->append_conf('postgresql.conf', "fairshare.sweep_interval = '100ms'\n");
$node->restart;
$node->poll_query_until('postgres', "SELECT count(*) = 1 FROM ($launcher) l") or die 'no launcher';
$q->("SELECT fs_acquire_slot('sw', 'swq', '100 milliseconds')");
inv($node->poll_query_until('postgres', "SELECT count(*) = 0 FROM fs_leases WHERE tenant = 'sw'"),
	'the launcher sweeps the expired lease');
for my $kind (qw(cancel terminate))
{
	my $lpid = $q->($launcher);
	$faults++;
	$q->("SELECT pg_${kind}_backend($lpid)");
	$q->("SELECT fs_acquire_slot('sw', 'swq', '100 milliseconds')");
	inv($node->poll_query_until('postgres', "SELECT count(*) = 0 FROM fs_leases WHERE tenant = 'sw'"),
		"launcher, $kind: the lease that expired meanwhile is swept");
	inv($node->poll_query_until('postgres', "SELECT count(*) = 1 FROM ($launcher) l"),
		"launcher, $kind: a launcher runs");
	after_fault("launcher, $kind", no_recount => 1);
}

# ---------------------------------------------------------------- registration

# fr has 20,000 rows; its index on the tenant expression calls fx_tenant(),
# which sleeps on row 1.  An interrupted registration leaves nothing: no
# queue, no triggers, no index.
my $register = "SELECT queue FROM fs_register_queue('fr', 'fr', 'public.fx_tenant(tenant, id)', 'id')";
my $leftover = q{SELECT (SELECT count(*) FROM fs_fair_queues WHERE queue = 'fr') || '/' ||
                        (SELECT count(*) FROM pg_index WHERE indrelid = 'fr'::regclass) || '/' ||
                        (SELECT count(*) FROM pg_trigger WHERE tgrelid = 'fr'::regclass)};
for my $kind (qw(terminate cancel statement_timeout lock_timeout))
{
	my %o = $kind eq 'lock_timeout'
	  ? (lock => "INSERT INTO fr VALUES (100000, 'x')")
	  : (setup => $sleepy, wait => 'sleep');
	inject("registration, $kind", $kind, $register, %o);
	inv_is($q->($leftover), '0/1/0', "registration, $kind: no queue, index or trigger left");
}
inv_is($q->($register), 'fr', 'the registration succeeds after the faults');
$queues{fr} = 'fr';
healed('registration after the faults');

no_crash('at the end');
my @crashes = slurp_file($node->logfile) =~ /terminated by signal|server process .* was terminated/g;
diag(sprintf('faults injected: %d, crashes: %d, invariant violations: %d (%.0f s)',
	$faults, scalar(@crashes), $violations, time - $t_start));
$node->stop;
done_testing();
