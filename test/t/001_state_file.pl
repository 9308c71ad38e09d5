# The state file: a clean restart keeps state; a crash starts slot counts
# empty and keeps leases as orphans that re-register on renew; a damaged file
# is ignored.  Without WAL (fairshare.wal_interval = 0): with it, a crash
# replays the state instead (062_wal_crash.pl).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $node = fs_node('state', "restart_after_crash = on\nfairshare.wal_interval = 0");
my $q = sub { $node->safe_psql('postgres', shift) };

$q->("SELECT fs_set_limit('acme', 'st', max_slots => 3)");
my $lease1 = $q->("SELECT fs_acquire_slot('acme', 'st', '1 hour')");
my $lease2 = $q->("SELECT fs_acquire_slot('acme', 'st', '1 hour')");
my $short = $q->("SELECT fs_acquire_slot('acme', 'st', '1 second')");
$q->("SELECT fs_acquire_slot('acme', 'st')");    # denied: counted
is($q->("SELECT slots_in_use || '/' || granted || '/' || denied_tenant_limit FROM fs_tenants WHERE queue = 'st'"),
	'3/3/1', 'three slots held, one denial counted');

# Clean restart: counters and leases come back; the expired one does not.
sleep 2;
$node->restart;
is($q->("SELECT start_kind FROM fs_stats"), 'restored', 'clean restart restores');
is($q->("SELECT slots_in_use || '/' || granted || '/' || denied_tenant_limit FROM fs_tenants WHERE queue = 'st'"),
	'2/3/1', 'slots from live leases, counters kept');
is($q->("SELECT string_agg(lease_id::text, ',' ORDER BY lease_id) FROM fs_leases WHERE queue = 'st'"),
	join(',', sort { $a <=> $b } ($lease1, $lease2)), 'live leases keep their ids');
my $lease3 = $q->("SELECT fs_acquire_slot('acme', 'st')");
ok($lease3 > $lease2, 'new lease ids are above old ones');
$q->("SELECT fs_release_slot($lease3)");
is($q->("SELECT fs_renew_slot($lease1)"), 't', 'a restored lease renews');
is($q->("SELECT fs_release_slot($short)"), 'f', 'the lease that expired across the restart is gone');

# Crash (the postmaster is killed): slots start empty; the leases of the last
# save (at startup, periodically by the worker, or fs_save_state()) become
# orphans.  A lease taken after the last save is not known after the crash.
my $unsaved = $q->("SELECT fs_acquire_slot('acme', 'st', '1 hour')");
$q->("SELECT fs_save_state()");
my $after_save = $q->("SELECT fs_release_slot($unsaved)");
my $too_late = $q->("SELECT fs_acquire_slot('acme', 'st', '1 hour')");
fs_crash($node);
is($q->("SELECT start_kind FROM fs_stats"), 'after_crash', 'crash is recognised');
is($q->("SELECT coalesce(sum(slots_in_use), 0) FROM fs_tenants WHERE queue = 'st'"), '0',
	'slot counts start empty after a crash');
is($q->("SELECT count(*) FROM fs_leases WHERE queue = 'st' AND state = 'orphan'"), '3',
	'leases of the last save are orphans');
is($q->("SELECT fs_renew_slot($lease1)"), 't', 'renewing an orphan re-registers it');
is($q->("SELECT slots_in_use FROM fs_tenants WHERE queue = 'st'"), '1', 're-registered lease counts');
is($q->("SELECT fs_release_slot($lease2)"), 't', 'releasing an orphan ends it');
is($q->("SELECT fs_renew_slot(12345)"), 'f', 'an unknown lease does not re-register');
is($q->("SELECT fs_renew_slot($too_late)"), 'f', 'a lease taken after the last save is unknown');
is($q->("SELECT leases_orphaned || '/' || leases_reregistered FROM fs_stats"), '3/1', 'orphans counted');
is($q->("SELECT fs_acquire_slot('acme', 'st') IS NOT NULL"), 't', 'decisions work after a crash');
# A budget's balance is unknown for a minute after a crash: spends fail open.
$q->("SELECT fs_set_limit('acme', 'st', budget_ms_per_minute => 100)");
is($q->("SELECT fs_spend_tokens('acme', 50, 100, 'st')"), '50', 'a spend right after a crash is granted in full');
is($q->("SELECT reason FROM fs_decisions WHERE kind = 'spend' AND tenant = 'acme' ORDER BY seq DESC LIMIT 1"),
	'fail_open', 'and recorded as fail_open');

# A backend crash (the postmaster re-creates shared memory) is a crash too.
$q->("SELECT fs_release_slot(lease_id) FROM fs_leases WHERE queue = 'st' AND state <> 'releasing'");
my $held = $q->("SELECT fs_acquire_slot('acme', 'st', '1 hour')");
$q->("SELECT fs_save_state()");
my $bg = $node->background_psql('postgres');
my $pid = $bg->query_safe('SELECT pg_backend_pid()');
kill 'KILL', $pid;
$bg->quit;
$node->poll_query_until('postgres', "SELECT start_kind = 'after_crash' AND leases_orphaned = 1 FROM fs_stats")
  or die "the server did not come back after a backend crash";
is($q->("SELECT state FROM fs_leases WHERE lease_id = $held"), 'orphan', 'reinitialised shared memory keeps orphans');
is($q->("SELECT fs_renew_slot($held)"), 't', 'and they re-register');

# A damaged state file is logged and ignored.
$node->stop;
my $file = $node->data_dir . '/pg_stat/fairshare.state';
ok(-s $file, 'a clean stop writes the state file');
open(my $fh, '+<', $file) or die $!;
binmode $fh;
seek($fh, 40, 0);
print $fh "garbage";
close $fh;
my $logstart = -s $node->logfile;
$node->start;
ok($node->log_contains(qr/ignoring fairshare state file .* it is damaged/, $logstart), 'damage is logged');
is($q->("SELECT start_kind || '/' || (SELECT count(*) FROM fs_tenants) FROM fs_stats"),
	'fresh/0', 'and fairshare starts empty');

# A file that is not a state file at all.
$node->stop;
open($fh, '>', $file) or die $!;
print $fh "not a state file" x 10;
close $fh;
$node->start;
is($q->("SELECT start_kind FROM fs_stats"), 'fresh', 'a foreign file is ignored');

# A file with a valid CRC whose values are out of range: a next lease id
# near INT64_MAX would make the ids handed out next wrap negative.
sub crc32c
{
	my ($data) = @_;
	my $crc = 0xFFFFFFFF;
	for my $byte (unpack('C*', $data))
	{
		$crc ^= $byte;
		$crc = ($crc & 1) ? (($crc >> 1) ^ 0x82F63B78) : ($crc >> 1) for 1 .. 8;
	}
	return $crc ^ 0xFFFFFFFF;
}
$q->("SELECT fs_acquire_slot('acme', 'range', '1 hour')");
$node->stop;
open($fh, '<', $file) or die $!;
binmode $fh;
my $image = do { local $/; <$fh> };
close $fh;
is(unpack('V', substr($image, -4)), crc32c(substr($image, 0, -4)), 'the test computes the file\'s CRC-32C');
substr($image, 32, 8) = pack('q<', 9223372036854775800);    # next_lease_id
substr($image, -4) = pack('V', crc32c(substr($image, 0, -4)));
open($fh, '>', $file) or die $!;
binmode $fh;
print $fh $image;
close $fh;
$logstart = -s $node->logfile;
$node->start;
ok($node->log_contains(qr/ignoring fairshare state file .* next lease id 9223372036854775800 is out of range/, $logstart),
	'an out-of-range next lease id is logged');
is($q->("SELECT start_kind || '/' || (SELECT count(*) FROM fs_leases) FROM fs_stats"), 'fresh/0',
	'and the file is ignored');
my $fresh_id = $q->("SELECT fs_acquire_slot('acme', 'range', '1 hour')");
cmp_ok($fresh_id, '>', 0, 'lease ids stay positive');
$q->("SELECT fs_release_slot($fresh_id)");

# An immediate shutdown kills backends wherever they are: it counts as a crash.
$q->("SELECT fs_acquire_slot('acme', 'st', '1 hour')");
$q->("SELECT fs_save_state()");
$node->stop('immediate');
$node->start;
is($q->("SELECT start_kind || '/' || (SELECT count(*) FROM fs_leases WHERE state = 'orphan') FROM fs_stats"),
	'after_crash/1', 'an immediate shutdown is treated as a crash');

# Queues nobody uses any more are not restored: only those of a tenant or lease.
$q->("SELECT fs_worker_heartbeat('w', 1, 'only_a_heartbeat_' || i) FROM generate_series(1, 5) i");
is($q->("SELECT count(*) FROM fs_queues WHERE queue LIKE 'only_a_heartbeat_%'"), '5', 'queues made by heartbeats');
$node->restart;
is($q->("SELECT count(*) FROM fs_queues WHERE queue LIKE 'only_a_heartbeat_%'"), '0',
	'are gone after a restart');
is($q->("SELECT count(*) FROM fs_queues WHERE queue = 'st'"), '1', 'a queue with tenants is kept');

# fairshare.save_state = off: nothing is saved or restored.
$q->("SELECT fs_acquire_slot('acme', 'st', '1 hour')");
$node->append_conf('postgresql.conf', 'fairshare.save_state = off');
$node->restart;
is($q->("SELECT start_kind || '/' || (SELECT count(*) FROM fs_leases) FROM fs_stats"),
	'fresh/0', 'save_state = off starts empty');

$node->stop;
done_testing();
