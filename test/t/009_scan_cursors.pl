# Whole-table scans and their cursors, under cancels, terminations and churn.
#
# A scan of a partitioned table (the fs_leases and fs_tenants views, the
# state file, eviction) holds one partition lock for one batch, then parks a
# cursor in the partition's entry list and goes on from it (src/core/scanlist.c).
# A cursor is one list node per process: one linked twice corrupts a list
# (a later scan loses entries, loops or crashes), so a scan must never be
# left parked by a cancel or a terminate, and a new backend must find its
# cursor out of every list.  A scan serves no interrupt itself: a cancel or
# a terminate lands before or after it.  Here, with 200,000 leases (about
# 1,600 batches a scan):
#
# 1. statement timeouts that end statements made of scans, in one session
#    that scans again after each; then every count is exact;
# 2. backends terminated while they scan, while other sessions scan and take
#    and release slots; then new backends (in the dead ones' PGPROC places,
#    with their cursors) scan and save the state file, and every count is
#    exact;
# 3. no crash and no broken invariant in the log.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $leases = 200000;
my $node = fs_node('scan_cursors', qq{
fairshare.max_leases = 262144
fairshare.max_tenants = 4096
fairshare.sweep_interval = '1h'
fairshare.state_save_interval = '1s'
});
my $q = sub { $node->safe_psql('postgres', shift) };

$q->("SELECT fs_set_limit('*', 'big', max_slots => 1000)");
$q->("SELECT count(fs_acquire_slot('t' || (i % 1000), 'big', '1 day')) FROM generate_series(1, $leases) i");
my $exact = sub {
	my ($what) = @_;
	is($q->("SELECT count(*) FROM fs_leases WHERE queue = 'big'"), $leases, "$what: every lease listed");
	is($q->("SELECT sum(slots_in_use) FROM fs_tenants WHERE queue = 'big'"), $leases,
		"$what: every slot counted");
	is($q->("SELECT count(*) FROM fs_tenants WHERE queue = 'big'"), '1000', "$what: every tenant listed");
};
$exact->('filled');

# ------------------------------------------------------------------
# 1. Scans ended by a statement timeout, in one session
# ------------------------------------------------------------------
my $script = '';
for my $ms (1, 2, 3, 5, 8, 13, 1, 2, 3, 5, 8, 13)
{
	$script .= "SET statement_timeout = '${ms}ms';\n"
	  . "SELECT count(*) FROM fs_leases;\n"
	  . "SELECT count(*) FROM fs_tenants;\n"
	  . "RESET statement_timeout;\n"
	  . "SELECT 'after ' || count(*) FROM fs_leases WHERE queue = 'big';\n";
}
my ($rc, $stdout, $stderr) = $node->psql('postgres', $script, on_error_stop => 0);
my $timeouts = () = $stderr =~ /canceling statement due to statement timeout/g;
ok($timeouts >= 4, "statement timeouts ended statements of scans ($timeouts of 24)");
my @after = $stdout =~ /^after (\d+)$/mg;
is(scalar(@after), 12, 'the session scanned again after each');
is(scalar(grep { $_ == $leases } @after), 12, 'and each of its scans listed every lease');
unlike($stderr, qr/FATAL|invariant/, 'no session ended');
$exact->('after the timeouts');

# ------------------------------------------------------------------
# 2. Backends terminated in the middle of scans, with churn
# ------------------------------------------------------------------
my @psql = ('psql', '-XAtq', '-d', $node->connstr('postgres'));
my $scan_loop = q{
DO $$
BEGIN
	FOR i IN 1 .. 100000 LOOP
		PERFORM count(*) FROM fs_leases;
		PERFORM count(*) FROM fs_tenants;
	END LOOP;
END $$;
};
my $churn_loop = q{
DO $$
DECLARE
	l bigint;
BEGIN
	FOR i IN 1 .. 100000 LOOP
		l := fs_acquire_slot('churn' || (i % 50), 'small', '1 minute');
		PERFORM fs_release_slot(l);
		PERFORM count(*) FROM fs_leases WHERE queue = 'small';
	END LOOP;
END $$;
};
my $killed = 0;
for my $round (1 .. 6)
{
	my @h;
	for my $n (1 .. 3)
	{
		my ($o, $e) = ('', '');
		push @h, IPC::Run::start([ @psql, '-c', "SET application_name = 'scanner'", '-c', $scan_loop ],
			'>', \$o, '2>', \$e, IPC::Run::timeout(120));
	}
	my ($co, $ce) = ('', '');
	my $churn = IPC::Run::start([ @psql, '-c', "SET application_name = 'churner'", '-c', $churn_loop ],
		'>', \$co, '2>', \$ce, IPC::Run::timeout(120));
	# Let the scans get under way, then end them at different moments.
	for my $n (1 .. 3)
	{
		select(undef, undef, undef, 0.05 + 0.07 * $n + 0.01 * $round);
		$killed += $q->(q{SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE application_name = 'scanner' AND pid <> pg_backend_pid()
			AND pid = (SELECT min(pid) FROM pg_stat_activity WHERE application_name = 'scanner')});
	}
	$q->(q{SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name IN ('scanner', 'churner')});
	$_->finish for @h;
	$churn->finish;
}
ok($killed >= 12, "scanning backends terminated ($killed)");

# New backends take the terminated ones' places (and cursors): they scan,
# several at a time, and the state file is saved meanwhile.
my @h;
my @outs;
for my $n (1 .. 6)
{
	my ($o, $e) = ('', '');
	push @outs, [ \$o, \$e ];
	push @h, IPC::Run::start([ @psql, '-c', "SELECT count(*) FROM fs_leases WHERE queue = 'big'",
		'-c', 'SELECT fs_save_state()', '-c', "SELECT count(*) FROM fs_leases WHERE queue = 'big'" ],
		'>', \$o, '2>', \$e, IPC::Run::timeout(120));
}
$_->finish for @h;
is(scalar(grep { ${ $_->[0] } eq "$leases\nt\n$leases\n" } @outs), 6,
	'new backends in the dead ones\' places scan every lease, and save the state file');
$exact->('after the terminations');
is($q->("SELECT coalesce(sum(slots_in_use), 0) FROM fs_tenants WHERE queue = 'small'"), '0',
	'the churn\'s slots all came back');

# ------------------------------------------------------------------
# 3. No crash
# ------------------------------------------------------------------
ok(!$node->log_contains(qr/terminated by signal|invariant violated/), 'no crash, no broken invariant');
$node->stop;
done_testing();
