# A streaming standby refuses every fairshare decision with SQLSTATE 25006
# (fairshare decides on the primary only) and still answers its views.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $primary = fs_node('primary', undef, allows_streaming => 1);
my $p = sub { $primary->safe_psql('postgres', shift) };
$p->("CREATE TABLE jobs (id bigserial PRIMARY KEY, tenant text NOT NULL)");
$p->("SELECT fs_register_queue('q', 'jobs', tenant => 'tenant', order_by => 'id')");
my $lease = $p->("SELECT fs_acquire_slot('t1', 'q', '1 hour')");
ok($lease > 0, 'the primary decides');

$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;
$primary->wait_for_catchup($standby, 'replay', $primary->lsn('insert'));

# Each deciding function, as a standby refuses it: SQLSTATE and message.
my @refused = (
	["SELECT fs_acquire_slot('t1', 'q')", 'acquire a fairshare slot'],
	["SELECT fs_release_slot($lease)", 'release a fairshare lease'],
	["SELECT fs_renew_slot($lease)", 'renew a fairshare lease'],
	["SELECT fs_spend_tokens('t1', 1, 10, 'q')", 'spend fairshare tokens'],
	["SELECT fs_charge_tokens('t1', 10, 'q')", 'charge fairshare tokens'],
	["SELECT * FROM fs_claim('q', NULL::jobs, 1)", 'claim rows with fairshare'],
	["SELECT fs_worker_heartbeat('w1', 4, 'q')", 'record a worker heartbeat'],
	["SELECT fs_report_latency('10 ms', 'q')", 'report a queue latency'],
	["SELECT fs_reset()", 'reset fairshare counters'],
	["SELECT fs_save_state()", 'save the fairshare state file'],
	["SELECT fs_resync('q')", 'recount a fairshare queue'],
	["SELECT * FROM fs_claim_due_schedules()", 'take due schedule runs'],
	["SELECT fs_schedule('s', '* * * * *', 'UTC')", 'change a fairshare schedule'],
	["SELECT fs_unschedule('s')", 'remove a fairshare schedule'],
	["SELECT fs_route_enqueue('t1', 'c', '[]')", 'route a job with fairshare tiers'],
	["SELECT fs_register_queue('q2', 'jobs', tenant => 'tenant', order_by => 'id')",
		'register a fair-dequeue queue'],
	["SELECT fs_unregister_queue('q')", 'unregister a fair-dequeue queue'],
	["SELECT fs_wal_sync()", 'wait for the fairshare WAL writer'],
);
for my $case (@refused)
{
	my ($sql, $what) = @$case;
	my ($ret, $out, $err) = $standby->psql('postgres', "\\set VERBOSITY verbose\n$sql");
	like($err, qr/ERROR:  25006: cannot \Q$what\E during recovery/, "standby refuses: $sql");
	like($err, qr/DETAIL:  This server is a standby: fairshare decides on the primary only/,
		"and says why: $sql");
}

# Views still answer on a standby.
is($standby->safe_psql('postgres', "SELECT count(*) >= 0 FROM fs_stats"), 't', 'fs_stats answers');
is($standby->safe_psql('postgres', "SELECT count(*) >= 0 FROM fs_tenants"), 't', 'fs_tenants answers');
is($standby->safe_psql('postgres', "SELECT count(*) FROM fs_effective_limits('t1', 'q')"), '1',
	'fs_effective_limits answers');

# And the primary goes on deciding.
is($p->("SELECT fs_release_slot($lease)"), 't', 'the primary still decides');

$standby->stop;
$primary->stop;
done_testing();
