# The one window in which a crash loses more than an interval: after a
# checkpoint ends and before the WAL writer logs the snapshot that follows
# it (the writer notices the checkpoint at its next cycle).  Recovery then
# begins after the last snapshot and replays none: fairshare goes on from
# its state file and the batches since, as after a crash without WAL,
# starts as after a crash (budgets fail open for a minute), and the WAL
# writer says so in the server log with a warning as it starts.  The next crash, with a snapshot logged,
# is replayed in full again.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

# A long interval makes the window wide enough to crash in; the state file
# is written only at start.
my $node = fs_node('race', "fairshare.wal_interval = 10s\nfairshare.state_save_interval = 0\n");
my $q = sub { $node->safe_psql('postgres', shift) };

$q->("SELECT fs_set_limit('*', 'q', max_slots => 2)");
$q->("SELECT fs_acquire_slot('a', 'q', '1 hour') FROM generate_series(1, 2)");
$q->("SELECT fs_wal_sync()");
is($q->("SELECT count(*) FROM fs_leases"), '2', 'two leases, logged');

# A checkpoint, and the crash before the writer's next cycle.
my $offset = -s $node->logfile;
$q->("CHECKPOINT");
fs_crash($node);
$node->poll_query_until('postgres', "SELECT writer_running FROM fs_replication")
	or die "the WAL writer did not start";
my $log = slurp_file($node->logfile, $offset);
like($log, qr/WARNING:  fairshare state was not replayed from WAL: recovery found no complete snapshot/,
	'the server warns that recovery replayed no snapshot');
like($log, qr/DETAIL:  The state is the state file's and that of the 0 fairshare records replayed since the checkpoint recovery began at\. A crash between the end of a checkpoint and the WAL writer's next snapshot/,
	'and says why');
like($log, qr/HINT:  Changes made before that checkpoint and not logged since may be lost/,
	'and what it means');
is($q->("SELECT start_kind || '/' || (SELECT replayed_snapshot FROM fs_replication) FROM fs_stats"),
	'after_crash/false', 'the server starts as after a crash without WAL');
is($q->("SELECT count(*) FROM fs_leases"), '0', 'the leases logged before the checkpoint are unknown');

# With a snapshot logged after the checkpoint, the next crash loses nothing.
$q->("SELECT fs_acquire_slot('b', 'q', '1 hour') FROM generate_series(1, 2)");
$q->("SELECT fs_wal_sync()");
$offset = -s $node->logfile;
fs_crash($node);
$log = slurp_file($node->logfile, $offset);
like($log, qr/LOG:  fairshare state replayed from WAL: \d+ tenants, 2 leases/, 'a crash with a snapshot replays it');
unlike($log, qr/not replayed from WAL/, 'with no warning');
is($q->("SELECT start_kind FROM fs_stats"), 'replayed', 'and the state is known');

$node->stop;
done_testing();
