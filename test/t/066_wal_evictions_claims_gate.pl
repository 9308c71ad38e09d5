# What else a standby replays, and a promoted standby goes on with:
# - tenants the primary evicts are forgotten on the standby too, one by one
#   as they go (a standby as small as the primary has room for the tenants
#   that replace them, and evicts nothing of its own), or by the next
#   complete snapshot (here: the WAL writer was off meanwhile, and the
#   snapshot it logs when it is on again drops the list of evictions);
# - the claim map: a job claimed before the failover releases its lease when
#   its row leaves the running table after it;
# - the worker heartbeats: the standby's fs_workers and fs_queues show the
#   primary's, and the global gate holds across the promotion.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $primary = fs_node('primary', "fairshare.max_tenants = 32\nfairshare.dampen_window = 0\n",
	allows_streaming => 1);
my $p = sub { $primary->safe_psql('postgres', shift) };

$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;
my $s = sub { $standby->safe_psql('postgres', shift) };
my $sync = sub { $primary->wait_for_catchup($standby, 'replay', $p->("SELECT fs_wal_sync()")) };
my $tenants = q{SELECT queue || ':' || tenant FROM fs_tenants ORDER BY queue, tenant};

# Evictions: 30 tenants take and give back a slot, and the standby has
# them; 30 more do, in a table of 32 entries.
$p->("SELECT fs_set_limit('*', 'slots', max_slots => 10)");
$p->("SELECT fs_release_slot(fs_acquire_slot('e' || i, 'slots')) FROM generate_series(1, 30) i");
$sync->();
is($s->("SELECT count(*) FROM fs_tenants WHERE queue = 'slots'"), '30', 'the standby has 30 tenants');
my $standby_evictions = $s->("SELECT evictions FROM fs_stats");
$p->("SELECT fs_release_slot(fs_acquire_slot('e' || i, 'slots')) FROM generate_series(31, 60) i");
cmp_ok($p->("SELECT evictions FROM fs_stats"), '>', 0, 'the primary evicted idle tenants');
$sync->();
is($s->($tenants), $p->($tenants), 'the standby forgets the tenants the primary evicted');
is($s->("SELECT evictions FROM fs_stats"), $standby_evictions,
	'and, as small as the primary, it evicted none of its own');
cmp_ok($s->("SELECT count(*) FROM fs_tenants"), '<=', 32, 'and holds no more than the primary can');

# With the writer off, evictions are listed but not logged; the snapshot
# logged when it is on again drops the list and names every tenant, and the
# standby forgets the others.
$p->("ALTER SYSTEM SET fairshare.wal_interval = 0; SELECT pg_reload_conf()");
$p->("SELECT fs_release_slot(fs_acquire_slot('f' || i, 'slots')) FROM generate_series(1, 60) i");
$p->("ALTER SYSTEM RESET fairshare.wal_interval; SELECT pg_reload_conf()");
$primary->poll_query_until('postgres', "SELECT wal_interval_ms = 100 FROM fs_replication")
	or die "the writer did not come back";
$sync->();
is($s->($tenants), $p->($tenants), 'after a snapshot, the standby has exactly the primary\'s tenants');

# The claim map: six jobs claimed into the running table, one finished.
$p->(q{
	CREATE TABLE rj (id int PRIMARY KEY, tenant text NOT NULL);
	CREATE TABLE rj_running (job_id int PRIMARY KEY);
	SELECT queue FROM fs_register_queue('rq', 'rj', 'tenant', 'id',
	       running_table => 'rj_running', running_key => 'job_id');
	SELECT fs_set_limit('*', 'rq', max_slots => 10);
	INSERT INTO rj SELECT i, CASE WHEN i <= 10 THEN 'a' ELSE 'b' END FROM generate_series(1, 20) i;
	WITH c AS (SELECT (job).id FROM fs_claim('rq', NULL::rj, 6)),
	     d AS (DELETE FROM rj USING c WHERE rj.id = c.id)
	INSERT INTO rj_running SELECT id FROM c;
});
$p->("DELETE FROM rj_running WHERE job_id = (SELECT min(job_id) FROM rj_running)");
my $rq_leases = "SELECT count(*) FROM fs_leases WHERE queue = 'rq'";
is($p->($rq_leases), '5', 'five claimed jobs run on the primary');

# Heartbeats: a worker of 8 threads; the gate lets a tenant hold 2 of them.
$p->("SELECT fs_worker_heartbeat('w1', 8, 'slots')");
ok($standby->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM fs_workers WHERE worker = 'w1' AND threads = 8 AND live"),
	'the heartbeat reaches the standby\'s fs_workers');
is($s->("SELECT live_workers || '/' || live_threads FROM fs_queues WHERE queue = 'slots'"), '1/8',
	'the standby\'s fs_queues counts the primary\'s live worker');
is($p->("SELECT count(fs_acquire_slot('g', 'slots')) FROM generate_series(1, 3)"), '2',
	'the gate holds tenant g to 2 slots on the primary');

$sync->();
is($s->($rq_leases), '5', 'the standby has the running jobs\' leases');

# Failover.
$primary->stop('immediate');
$standby->promote;
$standby->poll_query_until('postgres', "SELECT NOT pg_is_in_recovery()")
	or die "the standby was not promoted";

is($s->("SELECT count(fs_acquire_slot('h', 'slots')) FROM generate_series(1, 3)"), '2',
	'after the promotion, the gate still holds a tenant to 2 slots (the heartbeat was replicated)');
is($s->("SELECT count(*) FROM fs_acquire_slot('g', 'slots') WHERE fs_acquire_slot IS NOT NULL"), '0',
	'and tenant g, at its 2 slots from before the failover, gets none');
$s->("DELETE FROM rj_running WHERE job_id IN (SELECT job_id FROM rj_running ORDER BY job_id LIMIT 2)");
is($s->($rq_leases), '3', 'jobs claimed before the failover release their leases as they finish after it');
$s->("DELETE FROM rj_running");
is($s->($rq_leases), '0', 'every one of them');
is($s->("SELECT sum(slots_in_use) FROM fs_tenants WHERE queue = 'rq'"), '0', 'and their slots are free');

$standby->stop;
done_testing();
