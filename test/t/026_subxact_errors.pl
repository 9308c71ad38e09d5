# A claim of due schedules writes its ledger rows in an internal
# subtransaction (to recover from rows already there).  Any other error in
# it (a lock_timeout behind a lock on the ledger, a cancel) must reach the
# caller with the subtransaction rolled back: the session goes on, and in
# autocommit the next statement runs and ROLLBACK says only that no
# transaction is in progress.  Left open, the next statement saw "current
# transaction is aborted" and ROLLBACK ended the session with a FATAL.
#
# The same rule for a decision that reads fs_limits: a lock timeout there is
# the statement's (it ends the statement), not a reason to fail open.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $t0 = 1704067200;    # 2024-01-01 00:00:00 UTC
my $node = fs_node('ledger_errors', "fairshare.database = ''\n");
$node->safe_psql('postgres', qq{
	SET fairshare.debug_clock = $t0;
	SELECT fs_schedule('due', '* * * * *');
});

# Another session holds a SHARE lock on the ledger for a while.
my ($in, $out, $err) = ('', '', '');
my $locker = IPC::Run::start(
	[ 'psql', '-XAtq', '-d', $node->connstr('postgres') ],
	'<', \$in, '>', \$out, '2>', \$err, IPC::Run::timeout(60));
$in .= "BEGIN; LOCK fs_schedule_runs IN SHARE MODE; SELECT 'locked';\n";
$locker->pump until $out =~ /locked/;

my $as_of = $t0 + 120;
my ($rc, $stdout, $stderr) = $node->psql('postgres', qq{
	SET fairshare.debug_clock = $as_of;
	SET lock_timeout = '200ms';
	SELECT count(*) FROM fs_claim_due_schedules(as_of => to_timestamp($as_of));
	SELECT 'next statement';
	ROLLBACK;
	SELECT 'session alive';
}, on_error_stop => 0);
like($stderr, qr/canceling statement due to lock timeout/, 'the claim stops at the lock timeout');
unlike($stderr, qr/current transaction is aborted/, 'the next statement is not in an aborted transaction');
unlike($stderr, qr/FATAL/, 'ROLLBACK does not end the session');
like($stdout, qr/next statement\nsession alive/, 'the session goes on');

# The same inside a transaction block: the block is aborted, ROLLBACK ends
# it cleanly, and the run is claimed once the lock is gone.
($rc, $stdout, $stderr) = $node->psql('postgres', qq{
	SET fairshare.debug_clock = $as_of;
	SET lock_timeout = '200ms';
	BEGIN;
	SELECT count(*) FROM fs_claim_due_schedules(as_of => to_timestamp($as_of));
	ROLLBACK;
	SELECT 'after rollback';
}, on_error_stop => 0);
like($stderr, qr/canceling statement due to lock timeout/, 'in a block: the lock timeout');
unlike($stderr, qr/FATAL|unexpected state/, 'in a block: ROLLBACK ends it cleanly');
like($stdout, qr/after rollback/, 'in a block: the session goes on');

$in .= "COMMIT;\n\\q\n";
$locker->finish;
is($node->safe_psql('postgres', qq{
	SET fairshare.debug_clock = $as_of;
	SELECT count(*) FROM fs_claim_due_schedules(as_of => to_timestamp($as_of));}),
	'1', 'the run is claimed once the lock is gone, exactly once');
# A decision that must read fs_limits behind an ACCESS EXCLUSIVE lock.
($in, $out, $err) = ('', '', '');
$locker = IPC::Run::start(
	[ 'psql', '-XAtq', '-d', $node->connstr('postgres') ],
	'<', \$in, '>', \$out, '2>', \$err, IPC::Run::timeout(60));
$in .= "BEGIN; LOCK fs_limits IN ACCESS EXCLUSIVE MODE; SELECT 'locked';\n";
$locker->pump until $out =~ /locked/;
($rc, $stdout, $stderr) = $node->psql('postgres', q{
	SET lock_timeout = '200ms';
	SELECT fs_acquire_slot('never_seen', 'lq');
	SELECT 'next statement';
}, on_error_stop => 0);
like($stderr, qr/canceling statement due to lock timeout/, 'a lock timeout reading fs_limits ends the statement');
unlike($stderr, qr/fails open/, 'and is not turned into a fail-open decision');
like($stdout, qr/next statement/, 'the session goes on');
$in .= "COMMIT;\n\\q\n";
$locker->finish;
is($node->safe_psql('postgres', "SELECT fail_open FROM fs_stats"), '0', 'nothing failed open');

unlike(slurp_file($node->logfile), qr/terminated by signal/, 'no backend crashed');

$node->stop;
done_testing();
