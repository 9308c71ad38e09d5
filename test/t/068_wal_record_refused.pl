# A standby refuses a fairshare WAL record it cannot read, with a clear
# message and a hint, and stops rather than replay it wrongly: a record of
# a newer format (fairshare upgraded on the primary before its standbys),
# and a record under fairshare's resource manager id that is not
# fairshare's (another extension given the same id).  The records are
# written by a test-only module (test/modules/wal_record), built here.
use strict;
use warnings;

use File::Copy qw(copy);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $src = fs_src();
my $mod = PostgreSQL::Test::Utils::tempdir();
copy("$src/test/modules/wal_record/$_", "$mod/$_") or die "copy $_: $!" for qw(Makefile wal_record.c);
# Built against the system's server headers, as fairshare is (test/lib.sh):
# the pg_config of the installation the tests run is a copy without them.
my ($major) = `pg_config --version` =~ /PostgreSQL (\d+)/ or die "pg_config --version";
ok(run_log([ 'make', '-s', '-C', $mod, "FS_SRC=$src", "PG_CONFIG=/usr/lib/postgresql/$major/bin/pg_config" ]),
	'the test module builds') or BAIL_OUT('cannot build test/modules/wal_record');

my $primary = fs_node('primary', '', allows_streaming => 1);
my $p = sub { $primary->safe_psql('postgres', shift) };
$p->("CREATE FUNCTION fs_test_wal_record(bigint, int) RETURNS pg_lsn
      AS '$mod/wal_record', 'fs_test_wal_record' LANGUAGE C STRICT");

my $id = $p->("SHOW fairshare.wal_rmgr_id");
my @cases = (
	[ 'newer', 0x46535731, 2,
	  qr/FATAL:  fairshare WAL record at [0-9A-F]+\/[0-9A-F]+ has format 2, newer than this server's fairshare reads \(1\)/,
	  qr/HINT:  Upgrade fairshare on the standbys first, then on the primary\./ ],
	[ 'foreign', 0x12345678, 1,
	  qr/FATAL:  WAL record at [0-9A-F]+\/[0-9A-F]+ of resource manager $id is not fairshare's/,
	  qr/HINT:  Another extension may use resource manager id $id: give each its own \(fairshare\.wal_rmgr_id\), the same on every server\./ ]);

for my $case (@cases)
{
	my ($name, $magic, $format, $message, $hint) = @$case;
	$primary->backup("base_$name");
	my $standby = PostgreSQL::Test::Cluster->new("standby_$name");
	$standby->init_from_backup($primary, "base_$name", has_streaming => 1);
	$standby->start;
	$primary->wait_for_catchup($standby, 'replay', $p->("SELECT fs_wal_sync()"));
	my $offset = -s $standby->logfile;

	$p->("SELECT fs_test_wal_record($magic, $format)");
	$standby->wait_for_log(qr/startup process \(PID \d+\) exited with exit code 1/, $offset);
	my $log = slurp_file($standby->logfile, $offset);
	like($log, $message, "$name record: the standby's startup process refuses it");
	like($log, $hint, "$name record: with what to do");
	like($log, qr/CONTEXT:  WAL redo at [0-9A-F\/]+ for fairshare\/BATCH/, "$name record: and where it is");
	$standby->wait_for_log(qr/database system is shut down/, $offset);
	ok(!$standby->stop('immediate', fail_ok => 1), "$name record: the standby stopped");
}

# The primary itself goes on (it never replays its own records while it runs).
is($p->("SELECT fs_acquire_slot('a', 'q') > 0"), 't', 'the primary goes on deciding');
$primary->stop;
done_testing();
