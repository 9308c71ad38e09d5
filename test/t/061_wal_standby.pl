# A streaming standby replays fairshare's state from WAL: after the primary's
# decisions (slots, budgets, fair claims) and fs_wal_sync(), the standby's
# views show the primary's tenants, leases and fair order.  A standby made
# later from a base backup gets the whole state from the snapshot logged
# after the backup's checkpoint.  An acquire and a release within one
# interval write no lease to WAL.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

# Time stands still on both servers, so that balances compare exactly.
my $clock = "fairshare.debug_clock = 1767225600\n";
my $primary = fs_node('primary', $clock, allows_streaming => 1);
my $p = sub { $primary->safe_psql('postgres', shift) };

$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;
my $s = sub { $standby->safe_psql('postgres', shift) };

# Decisions on the primary.
$p->(q{
	SELECT fs_set_limit('*', 'q', max_slots => 3);
	SELECT fs_set_limit('drained', 'q', budget_ms_per_minute => 100);
	CREATE TABLE jobs (id bigserial PRIMARY KEY, tenant text NOT NULL);
	SELECT fs_register_queue('q', 'jobs', tenant => 'tenant', order_by => 'id');
	INSERT INTO jobs (tenant) SELECT 't' || (i % 5) FROM generate_series(1, 100) i;
});
$p->("SELECT fs_acquire_slot('a', 'q', '1 hour') FROM generate_series(1, 2)");
$p->("SELECT fs_acquire_slot('b', 'q', '1 hour')");
is($p->("SELECT fs_spend_tokens('drained', 10, 10, 'q')"), '10', 'the primary grants a budget');
is($p->("SELECT fs_spend_tokens('drained', 10, 10, 'q')"), '0', 'and drains it');
# Claimed rows that leave the ready table keep their leases.
is($p->(q{WITH c AS (SELECT (j.job).id FROM fs_claim('q', NULL::jobs, 7) j),
	d AS (DELETE FROM jobs WHERE id IN (SELECT id FROM c) RETURNING 1)
	SELECT count(*) FROM d}), '7',
	'the primary claims rows in fair order');

my $lsn = $p->("SELECT fs_wal_sync()");
$primary->wait_for_catchup($standby, 'replay', $lsn);

# The standby shows what the primary has.
my $tenants = q{SELECT queue, tenant, slots_in_use, ready_rows, virtual_finish, token_balance,
	granted, denied_tenant_limit, denied_no_budget, max_slots, budget_ms_per_minute
	FROM fs_tenants ORDER BY queue, tenant};
my $leases = q{SELECT lease_id, queue, tenant, state, expires_at, owner FROM fs_leases ORDER BY lease_id};
my $fair = q{SELECT queue, backlogged_tenants, ready_rows, rows_without_tenant, rows_untracked,
	virtual_time FROM fs_fairness ORDER BY queue};
my $shares = q{SELECT queue, tenant, virtual_finish FROM fs_fair_shares ORDER BY queue, tenant};
is($s->($tenants), $p->($tenants), 'fs_tenants on the standby equals the primary\'s');
is($s->($leases), $p->($leases), 'fs_leases on the standby equals the primary\'s');
is($s->("SELECT count(*) FROM fs_leases"), '10', 'with every lease (3 slots and 7 claims)');
is($s->($fair), $p->($fair), 'fs_fairness on the standby equals the primary\'s');
is($s->($shares), $p->($shares), 'and so does fs_fair_shares');
is($s->("SELECT role || '/' || (replayed_records > 0) || '/' || replayed_snapshot FROM fs_replication"),
	'standby/true/true', 'fs_replication: the standby replayed a snapshot and batches');
is($p->("SELECT role || '/' || writer_running || '/' || (records > 0) FROM fs_replication"),
	'primary/true/true', 'fs_replication: the primary\'s writer logged');

# Releases and renewals follow.
$p->("SELECT fs_release_slot(lease_id) FROM fs_leases WHERE tenant = 'a'");
$p->("SELECT fs_renew_slot(lease_id, '2 hours') FROM fs_leases WHERE tenant = 'b'");
$lsn = $p->("SELECT fs_wal_sync()");
$primary->wait_for_catchup($standby, 'replay', $lsn);
is($s->($leases), $p->($leases), 'releases and renewals are replayed');
is($s->("SELECT slots_in_use FROM fs_tenants WHERE tenant = 'a'"), '0', 'a released slot is free there');

# An acquire and its release within one interval write no lease.
$p->("ALTER SYSTEM SET fairshare.wal_interval = '2s'; SELECT pg_reload_conf()");
$p->("SELECT fs_wal_sync()");
my $before = $p->("SELECT bytes FROM fs_replication");
$p->("SELECT fs_release_slot(fs_acquire_slot('c', 'q')) FROM generate_series(1, 1000)");
$p->("SELECT fs_release_slot(fs_acquire_slot('c', 'q'))");
$lsn = $p->("SELECT fs_wal_sync()");
my $after = $p->("SELECT bytes FROM fs_replication");
cmp_ok($after - $before, '<', 2000,
	'1001 acquire+release pairs in one interval log no lease (only the tenant, ' . ($after - $before) . ' bytes)');
$primary->wait_for_catchup($standby, 'replay', $lsn);
is($s->("SELECT count(*) FROM fs_leases WHERE tenant = 'c'"), '0', 'and the standby has none of them');
is($s->("SELECT granted FROM fs_tenants WHERE tenant = 'c'"), '1001', 'but counts their decisions');
# With the writer off, fs_wal_sync() says so instead of waiting.
$p->("ALTER SYSTEM SET fairshare.wal_interval = 0; SELECT pg_reload_conf()");
my ($ret, $out, $err) = $primary->psql('postgres', "\\set VERBOSITY verbose\nSELECT fs_wal_sync()");
like($err, qr/ERROR:  55000: fairshare writes no WAL: fairshare.wal_interval is 0/,
	'fs_wal_sync() refuses when the WAL writer is off');
like($err, qr/HINT:  Set fairshare.wal_interval/, 'and says what to set');
$p->("ALTER SYSTEM RESET fairshare.wal_interval; SELECT pg_reload_conf()");

# A standby restarted replays again from its restartpoint, over the state
# file it saved at its shutdown: the same records twice change nothing.
$standby->restart;
$lsn = $p->("SELECT fs_wal_sync()");
$primary->wait_for_catchup($standby, 'replay', $lsn);
is($s->($tenants), $p->($tenants), 'after a restart of the standby, its tenants still equal the primary\'s');
is($s->($leases), $p->($leases), 'and so do its leases');

# One statement making so many decisions that the writer's lists of changed
# leases overflow: the writer logs a snapshot of the leases alone (the
# tenants are still tracked one by one), and a release whose listing was
# lost is replayed all the same (the lease is not in that snapshot).
my $held = $p->("SELECT fs_acquire_slot('h', 'q', '1 hour')");
$p->("SELECT fs_wal_sync()");
my $snapshots = $p->("SELECT snapshots FROM fs_replication");
$p->("SELECT fs_release_slot($held), count(*) FILTER (WHERE fs_release_slot(fs_acquire_slot('o' || (i % 50), 'q')))
	FROM generate_series(1, 300000) i");
$lsn = $p->("SELECT fs_wal_sync()");
$primary->wait_for_catchup($standby, 'replay', $lsn);
is($s->($leases), $p->($leases), 'after lease lists overflowed, the standby\'s leases equal the primary\'s');
is($s->($tenants), $p->($tenants), 'and so do its tenants (a snapshot of the leases does not sweep them)');
is($p->("SELECT snapshots FROM fs_replication"), $snapshots, 'no complete snapshot was logged for it');

# A standby made later from a base backup has the whole state.
$primary->backup('base2');
my $late = PostgreSQL::Test::Cluster->new('late');
$late->init_from_backup($primary, 'base2', has_streaming => 1);
$late->start;
$lsn = $p->("SELECT fs_wal_sync()");
$primary->wait_for_catchup($late, 'replay', $lsn);
is($late->safe_psql('postgres', $tenants), $p->($tenants), 'a later standby has every tenant');
is($late->safe_psql('postgres', $leases), $p->($leases), 'and every lease');

$late->stop;
$standby->stop;
$primary->stop;
done_testing();
