# Crash recovery replays fairshare's state from WAL: after kill -9 of the
# postmaster, leases taken before the crash renew and still count (no
# over-admission), a drained budget stays drained (no fail-open minute),
# the fair order goes on from its tags, lease ids move on, and each queue's
# backlog equals its table at the next claim.  A decision made more than two
# intervals before the crash is never lost, without any fs_wal_sync().
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

# The state file is written only at start: what survives comes from WAL.
my $node = fs_node('crash', "fairshare.state_save_interval = 0\n");
my $q = sub { $node->safe_psql('postgres', shift) };

$q->(q{
	SELECT fs_set_limit('*', 'q', max_slots => 2);
	SELECT fs_set_limit('drained', 'q', budget_ms_per_minute => 60);
	CREATE TABLE jobs (id bigserial PRIMARY KEY, tenant text NOT NULL);
	SELECT fs_register_queue('q', 'jobs', tenant => 'tenant', order_by => 'id');
	INSERT INTO jobs (tenant) SELECT 't' || (i % 4) FROM generate_series(1, 200) i;
});
my @held = split /\n/, $q->("SELECT fs_acquire_slot('full', 'q', '1 hour') FROM generate_series(1, 2)");
is($q->("SELECT fs_acquire_slot('full', 'q') IS NULL"), 't', 'a tenant at its max_slots is denied');
# 60 ms a minute: one more run of 10 ms takes 10 s to accrue.
is($q->("SELECT fs_spend_tokens('drained', 100, 10, 'q')"), '6', 'a budget is spent');
is($q->("SELECT fs_spend_tokens('drained', 1, 10, 'q')"), '0', 'and drained');
is($q->(q{WITH c AS (SELECT (j.job).id FROM fs_claim('q', NULL::jobs, 8) j),
	d AS (DELETE FROM jobs WHERE id IN (SELECT id FROM c) RETURNING 1)
	SELECT count(*) FROM d}), '8', 'rows are claimed in fair order');
my $tags = q{SELECT tenant, virtual_finish FROM fs_tenants WHERE queue = 'q' AND tenant LIKE 't%' ORDER BY 1};
my $tags_before = $q->($tags);
my $vtime_before = $q->("SELECT virtual_time FROM fs_fairness WHERE queue = 'q'");
my $leases = q{SELECT lease_id, tenant, expires_at FROM fs_leases ORDER BY lease_id};
my $leases_before = $q->($leases);
my $max_id = $q->("SELECT max(lease_id) FROM fs_leases");

# No fs_wal_sync(): three intervals pass, and the writer logs by itself.
select(undef, undef, undef, 0.35);
fs_crash($node);

is($q->("SELECT start_kind FROM fs_stats"), 'replayed', 'the state was replayed from WAL');
is($q->($leases), $leases_before, 'every lease came back, as it was');
is($q->("SELECT slots_in_use FROM fs_tenants WHERE tenant = 'full'"), '2', 'held slots count');
is($q->("SELECT fs_acquire_slot('full', 'q') IS NULL"), 't', 'so the tenant at its max_slots is still denied');
is($q->("SELECT bool_and(fs_renew_slot(l, '1 hour')) FROM unnest('{" . join(',', @held) . "}'::bigint[]) l"),
	't', 'its leases renew');
is($q->("SELECT fs_spend_tokens('drained', 1, 10, 'q')"), '0', 'the drained budget stays drained');
is($q->("SELECT reason FROM fs_decisions WHERE tenant = 'drained' ORDER BY decided_at DESC LIMIT 1"),
	'no_budget', 'denied for its budget, not failed open');
is($q->($tags), $tags_before, 'the fair order\'s tags go on');
cmp_ok($q->("SELECT virtual_time FROM fs_fairness WHERE queue = 'q'"), '>=', $vtime_before,
	'and so does the virtual time');
my $new = $q->("SELECT fs_acquire_slot('new', 'q')");
cmp_ok($new, '>', $max_id, 'a new lease id is above every id handed out before');
$q->("SELECT fs_release_slot($new)");

# The backlog equals the table at the next claim (no fs_resync()).
$q->("SELECT count(*) FROM fs_claim('q', NULL::jobs, 1)");
is($q->("SELECT string_agg(tenant || ':' || ready_rows, ',' ORDER BY tenant) FROM fs_tenants
	WHERE queue = 'q' AND tenant LIKE 't%'"),
	$q->("SELECT string_agg(tenant || ':' || n, ',' ORDER BY tenant) FROM
	(SELECT tenant, count(*) n FROM jobs GROUP BY tenant) c"),
	'each tenant\'s backlog equals its rows in the table');

# A second crash goes on from the first one's state.
$leases_before = $q->($leases);
select(undef, undef, undef, 0.35);
fs_crash($node);
is($q->($leases), $leases_before, 'a second crash keeps the leases too');
is($q->("SELECT replayed_snapshot FROM fs_replication"), 't', 'from a complete snapshot and the batches after it');

$node->stop;
done_testing();
