# SQLsmith against a server with fairshare in use: registered queues (bigint,
# uuid and text keys, Solid Queue's ready/claimed pair), limits, leases,
# schedules with and without a command.  SQLsmith builds random queries from
# the catalog; it runs as an unprivileged role that owns the job tables and
# may execute every fs_* function, with a statement_timeout, for
# FS_FUZZ_SECONDS (default 120) in all.
#
# SQLsmith reads the routines it may call from an unqualified pg_proc, so
# for part of the time a view named pg_proc in a schema searched before
# pg_catalog shows it fairshare's functions and a tenth of the built-in ones:
# most of its calls then go to fairshare.  The rest of the time it sees the
# whole catalog.  The server must never crash and must answer at the end.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(time);
use FairshareTest;
use FairshareFuzz;

# test/run installs it (Debian package sqlsmith).
my ($sqlsmith) = grep { -x } map { "$_/sqlsmith" } split /:/, $ENV{PATH};
BAIL_OUT('sqlsmith is not installed (Debian package sqlsmith)') unless $sqlsmith;

my $seconds = fuzz_seconds(120);
my $seed = $ENV{FS_FUZZ_SEED} // (time() * 1000 % 2**31);
diag "sqlsmith seed: $seed (FS_FUZZ_SEED=$seed reproduces the seeds), ${seconds}s";

my $node = fs_node('sqlsmith', qq{
log_min_messages = warning
# go on after a crash (PostgreSQL::Test::Cluster turns it off), to find more
restart_after_crash = on
log_min_error_statement = panic
# the queries are in SQLsmith's output; a crash's is in the log anyway
log_statement = none
});
my $log_start = fuzz_log_offset($node);
$node->safe_psql('postgres', fuzz_setup_sql());
$node->safe_psql('postgres', q{
CREATE ROLE fz_smith LOGIN;
ALTER ROLE fz_smith SET statement_timeout = '2s';
ALTER ROLE fz_smith SET lock_timeout = '1s';
ALTER ROLE fz_smith SET idle_in_transaction_session_timeout = '10s';
GRANT fairshare_admin TO fz_smith;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO fz_smith;
DO $$ DECLARE t text; BEGIN
  FOR t IN SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace
             AND c.relkind = 'r' AND c.relname LIKE ANY (ARRAY['fz\_%', 'solid\_queue\_%'])
  LOOP EXECUTE format('ALTER TABLE %I OWNER TO fz_smith', t); END LOOP;
END $$;
-- The narrowed catalog: fairshare's functions, every aggregate, a tenth of
-- the rest.
CREATE SCHEMA fz_catalog;
CREATE VIEW fz_catalog.pg_proc AS
  SELECT * FROM pg_catalog.pg_proc p
   WHERE p.proname LIKE 'fs\_%' OR p.prokind = 'a' OR p.oid::int8 % 10 = 0;
GRANT USAGE ON SCHEMA fz_catalog TO fz_smith;
GRANT SELECT ON fz_catalog.pg_proc TO fz_smith;
});

my $dir = $PostgreSQL::Test::Utils::tmp_check . '/sqlsmith';
mkdir $dir;
my $host = $node->host;
my $port = $node->port;

my ($stmts, $fs_stmts, $fs_calls, $runs) = (0, 0, 0, 0);
my %fs_functions;
my $deadline = time() + $seconds;
my $s = $seed;

# Runs until the deadline: SQLsmith stops itself after --max-queries, and
# timeout(1) kills it at the deadline, so nothing outlives the test; with
# --foreground it stays in the test's process group, so whatever stops the
# test stops it too.
while ((my $left = int($deadline - time())) > 2)
{
	$runs++;
	$s = ($s * 1103515245 + 12345) % 2**31;
	# two runs of three on the narrowed catalog
	my $narrow = $runs % 3 != 0;
	my $target = "host=$host port=$port dbname=postgres user=fz_smith"
	  . ($narrow ? " options='-c search_path=fz_catalog,pg_catalog,public'" : '');
	my $out = "$dir/run_$runs.sql";
	my $err = '';
	IPC::Run::run([ 'timeout', '--foreground', '-k', '5', $left, $sqlsmith, "--target=$target", "--seed=$s",
		'--max-queries=4000', '--dump-all-queries' ], '<', \undef, '>', $out, '2>', \$err);
	my $status = $? >> 8;

	# One statement per ";\n" at the end of a line.
	open my $fh, '<', $out or die "$out: $!";
	my $stmt = '';
	my ($n, $nfs, $ncalls) = (0, 0, 0);
	while (my $l = <$fh>)
	{
		$stmt .= $l;
		next unless $l =~ /;\s*$/;
		$n++;
		if ($stmt =~ /\bfs_/)
		{
			$nfs++;
			my @called = $stmt =~ /\b(fs_[a-z_]+)\(/g;
			$ncalls++ if @called;
			$fs_functions{$_}++ for @called;
		}
		$stmt = '';
	}
	close $fh;
	$stmts += $n;
	$fs_stmts += $nfs;
	$fs_calls += $ncalls;
	my @crashed = fuzz_crashes($node, $log_start);
	if (@crashed)
	{
		diag "crash during sqlsmith run $runs (seed $s, " . ($narrow ? 'narrowed' : 'whole') . " catalog), "
		  . "its queries kept in $out:\n  " . join("\n  ", @crashed[0 .. ($#crashed < 4 ? $#crashed : 4)]);
		last;
	}
	note "run $runs: seed $s, " . ($narrow ? 'narrowed' : 'whole') . " catalog, $n statements, "
	  . "$nfs naming fs_ objects, $ncalls calling fs_ functions, exit $status";
	note "sqlsmith said: " . substr($err, -2000) if $status != 0 && $status != 124 && $status != 137;
	unlink $out;
	# The server may be restarting after a crash: wait for it.
	last unless $node->poll_query_until('postgres', 'SELECT true');
}

my @crashes = fuzz_crashes($node, $log_start);
my $line = sprintf "statements fuzzed: %d, crashes: %d (%d runs; %d statements named fs_ objects, "
  . "%d called fs_ functions: %s)",
  $stmts, scalar(@crashes), $runs, $fs_stmts, $fs_calls,
  join(', ', map { "$_ $fs_functions{$_}" } sort { $fs_functions{$b} <=> $fs_functions{$a} } keys %fs_functions);
diag $line;

ok($stmts > 100, "sqlsmith ran $stmts statements");
ok($fs_calls > 0, "$fs_calls of them called fairshare's functions");
is(scalar(@crashes), 0, 'the server never crashed')
  or diag "crash lines in the server log:\n  " . join("\n  ", fuzz_crash_report($node, $log_start));
is($node->safe_psql('postgres', 'SELECT count(*) >= 0 FROM fs_tenants'), 't', 'the server still answers');

$node->stop('fast');
done_testing();
