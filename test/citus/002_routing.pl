# fs_citus_setup(): each tenant's decisions on the node that holds its
# shard, called on the coordinator or any node, in and out of transaction
# blocks; lease ids that name their node, released and renewed from
# anywhere; limits set once on the coordinator, on every node at commit; no
# over-admission under 8 clients, checked by an observer across the nodes.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareCitus;

my ($coord, @workers) = fs_citus_cluster(2);
my %node_by_group;
my $q = sub { $coord->safe_psql('postgres', shift) };

$q->("CREATE TABLE jobs (tenant text NOT NULL, id bigserial, PRIMARY KEY (tenant, id))");
$q->("SELECT create_distributed_table('jobs', 'tenant')");
%node_by_group = fs_citus_by_group($coord, @workers);

# Refusals.
my ($ret, $out, $err) = $workers[0]->psql('postgres', "SELECT fs_citus_setup('jobs')");
like($err, qr/fs_citus_setup\(\) must be called on the coordinator/, 'setup is refused on a worker');
$q->("CREATE TABLE plain (tenant text)");
($ret, $out, $err) = $coord->psql('postgres', "SELECT fs_citus_setup('plain')");
like($err, qr/table (public\.)?plain is not distributed by hash/, 'a table that is not distributed is refused');
$q->("CREATE TABLE by_int (tenant int, id int)");
$q->("SELECT create_distributed_table('by_int', 'tenant')");
($ret, $out, $err) = $coord->psql('postgres', "SELECT fs_citus_setup('by_int')");
like($err, qr/distribution column of (public\.)?by_int is of type integer, not text/, 'a non-text tenant column is refused');
is($q->("SELECT fs_tenant_node('t1') IS NULL"), 't', 'before the setup no tenant has a node');

$q->("SELECT fs_set_limit('*', 'q', max_slots => 2)");
$q->("SELECT fs_citus_setup('jobs')");

# fairshare places tenants as Citus does.
is( $q->(
		q{SELECT count(*) FROM generate_series(1, 2000) i,
		         LATERAL (SELECT 'tenant-' || i AS t) x
		   WHERE fs_tenant_node(t) IS DISTINCT FROM
		         (SELECT groupid FROM pg_dist_placement
		           WHERE shardid = get_shard_id_for_distribution_column('jobs', t))}),
	0, 'fs_tenant_node() agrees with Citus for 2,000 tenants');
my @tenants = split /\n/, $q->(
	q{SELECT DISTINCT ON (fs_tenant_node(t)) t FROM (SELECT 'tenant-' || i AS t FROM generate_series(1, 50) i) x
	   ORDER BY fs_tenant_node(t), t});
is(scalar(@tenants), 2, 'tenants on both workers');
my ($ta, $tb) = @tenants;
my $ga = $q->("SELECT fs_tenant_node('$ta')");
my $gb = $q->("SELECT fs_tenant_node('$tb')");
my $owner_a = $node_by_group{$ga};
my $owner_b = $node_by_group{$gb};

# Limits: set once on the coordinator, on every node when it commits.
is( join(',', map { $_->safe_psql('postgres', "SELECT max_slots FROM fs_limits WHERE queue = 'q' AND tenant = '*'") }
		  ($coord, @workers)),
	'2,2,2', 'a limit set on the coordinator is on every node');
$q->("BEGIN; SELECT fs_set_limit('$ta', 'q', max_slots => 9); ROLLBACK");
is( join(',', map { $_->safe_psql('postgres', "SELECT count(*) FROM fs_limits WHERE tenant = '$ta'") }
		  ($coord, @workers)),
	'0,0,0', 'a rolled-back change is on no node');

# Acquire on the coordinator: the owner decides, and the lease names it.
my $l1 = $q->("SELECT fs_acquire_slot('$ta', 'q', '1 hour')");
my $l2 = $q->("SELECT fs_acquire_slot('$ta', 'q', '1 hour')");
is($q->("SELECT fs_acquire_slot('$ta', 'q', '1 hour')"), '', 'the third slot is denied (limit 2)');
is($q->("SELECT fs_lease_node($l1)"), $ga, 'the lease names the owner');
is($owner_a->safe_psql('postgres', "SELECT count(*) FROM fs_leases WHERE tenant = '$ta'"),
	2, 'the owner holds both leases');
is($q->("SELECT count(*) FROM fs_leases"), 0, 'the coordinator holds none');

# Release and renew from the coordinator and from the other worker.
is($q->("SELECT fs_renew_slot($l1, '2 hours')"), 't', 'renewed from the coordinator');
is($owner_b->safe_psql('postgres', "SELECT fs_release_slot($l1)"), 't', 'released from the other worker');
is($q->("SELECT fs_release_slot($l1)"), 'f', 'a second release is false');
is($q->("SELECT fs_renew_slot($l1)"), 'f', 'so is a renew of a released lease');

# The node-side functions refuse a lease of another node (an anchor whose
# shard is elsewhere): they never send it on.
($ret, $out, $err) = $coord->psql('postgres', "SELECT * FROM fs_release_slot_at('$tb', $l2)");
like($err, qr/fs_release_slot_at\(\) for lease $l2 ran on node group $gb, not on group $ga that granted it/,
	'fs_release_slot_at() on another node is an error');
($ret, $out, $err) = $coord->psql('postgres', "SELECT * FROM fs_renew_slot_at('$tb', $l2, '1 hour')");
like($err, qr/fs_renew_slot_at\(\) for lease $l2 ran on node group $gb/, 'so is fs_renew_slot_at()');

# In a transaction block: the owner's transaction joins, a rollback undoes.
$q->("BEGIN; SELECT fs_acquire_slot('$ta', 'q'); SELECT fs_release_slot($l2); ROLLBACK");
is($owner_a->safe_psql('postgres', "SELECT count(*) || '/' || max(state) FROM fs_leases WHERE tenant = '$ta'"),
	'1/live', 'a rolled-back acquire and release leave the owner as it was');
$q->("BEGIN; SELECT fs_release_slot($l2); SELECT fs_acquire_slot('$ta', 'q'); COMMIT");
is($owner_a->safe_psql('postgres', "SELECT count(*) FROM fs_leases WHERE tenant = '$ta'"),
	1, 'a committed release and acquire in one block apply on the owner');

# Ids no node granted are unknown everywhere; one of the coordinator's is
# the coordinator's to release.
is($workers[0]->safe_psql('postgres',
		'SELECT fs_release_slot(-1), fs_release_slot(0), fs_renew_slot(-5), fs_release_slot((1000::bigint << 52) + 5)'),
	'f|f|f|f', 'unknown lease ids are false on a worker');
($ret, $out, $err) = $workers[0]->psql('postgres', 'SELECT fs_release_slot(5)');
like($err, qr/lease 5 was granted by the coordinator/, "the coordinator's lease is released there");

# A transaction that changes the setting sees its change, and forgets it
# when it rolls back.
is( $q->("BEGIN; DELETE FROM fs_cluster; SELECT fs_tenant_node('$ta') IS NULL; ROLLBACK; SELECT fs_tenant_node('$ta')"),
	"t\n$ga", 'a rolled-back change of the setting is forgotten');
($ret, $out, $err) = $coord->psql('postgres', "SELECT fs_acquire_slot('$ta', 'q'), 1");
like($err, qr/does not own the tenant/, 'and the guard is still on');

# Tokens go to the owner too.
$q->("SELECT fs_set_limit('$tb', 'q', budget_ms_per_minute => 60000)");
is($q->("SELECT fs_spend_tokens('$tb', 3, 100, 'q')"), 3, 'tokens spent through the coordinator');
is($owner_b->safe_psql('postgres', "SELECT count(*) FROM fs_tenants WHERE tenant = '$tb' AND queue = 'q'"),
	1, 'on the owner');

# A call Citus does not delegate is refused, never counted on the wrong node.
($ret, $out, $err) = $coord->psql('postgres', "SELECT fs_acquire_slot('$ta', 'q'), 1");
like($err, qr/fs_acquire_slot\(\) for tenant "$ta" ran on node group 0, which does not own the tenant/,
	'an undelegated call is refused');
($ret, $out, $err) = $coord->psql('postgres',
	"DO \$\$ DECLARE v bigint; BEGIN v := fs_acquire_slot('$ta', 'q'); END \$\$");
like($err, qr/does not own the tenant/, 'so is a PL/pgSQL assignment');
($ret, $out, $err) = $coord->psql('postgres', "SELECT fs_spend_tokens('$tb', 1, 100, 'q') + 0");
like($err, qr/fs_spend_tokens\(\) for tenant "$tb" ran on node group 0/, 'and an undelegated spend');

# Fair dequeue on the coordinator: a reference table has no tenant's node
# and is refused (distributed tables are 007's); Citus local tables serve.
$q->("CREATE TABLE refq (id bigint PRIMARY KEY, tenant text NOT NULL)");
$q->("SELECT create_reference_table('refq')");
($ret, $out, $err) = $coord->psql('postgres', "SELECT fs_register_queue('dq', 'refq', 'tenant', 'id')");
like($err, qr/ready_table of queue "dq" cannot be served across the cluster: it is not distributed by hash/,
	'registering a reference table is refused');
$q->("CREATE TABLE cloc (id bigserial PRIMARY KEY, tenant text NOT NULL)");
$q->("SELECT citus_add_local_table_to_metadata('cloc')");
$q->("SELECT fs_register_queue('cl', 'cloc', 'tenant', 'id')");
$q->("INSERT INTO cloc (tenant) VALUES ('local-a'), ('local-b')");
is($q->("SELECT count(*) FROM fs_claim('cl', NULL::cloc, 5)"), 2, 'a Citus local table of the coordinator serves claims');
# Registered first, then added to Citus's metadata: the registration follows
# the table, which Citus keeps as its shard; registered again, it serves the
# new table, with exact counts.
$q->("CREATE TABLE clate (id bigserial PRIMARY KEY, tenant text NOT NULL)");
$q->("SELECT fs_register_queue('cll', 'clate', 'tenant', 'id')");
$q->("INSERT INTO clate (tenant) VALUES ('late-a'), ('late-b')");
$q->("SELECT citus_add_local_table_to_metadata('clate')");
($ret, $out, $err) = $coord->psql('postgres', "SELECT count(*) FROM fs_claim('cll', NULL::clate, 5)");
like($err, qr/row_type of queue "cll" must be (public\.)?clate_\d+/, 'a claim then names the shard as row_type');
$q->("SELECT fs_unregister_queue('cll')");
$q->("SELECT fs_register_queue('cll', 'clate', 'tenant', 'id')");
$q->("INSERT INTO clate (tenant) VALUES ('late-c')");
is($q->("SELECT count(*) FROM fs_claim('cll', NULL::clate, 5)"), 3, 'registered again, the queue serves claims');
is($q->("SELECT string_agg(tenant || ':' || ready_rows, ',' ORDER BY tenant) FROM fs_tenants WHERE queue = 'cll'"),
	'late-a:1,late-b:1,late-c:1', 'and counts each row once');

# An application role.
$q->("CREATE ROLE app LOGIN IN ROLE fairshare_app");
my $l3 = $coord->safe_psql('postgres', "SET ROLE app; SELECT fs_acquire_slot('$tb', 'q')");
ok($l3 ne '', 'a member of fairshare_app acquires through the coordinator');
is($coord->safe_psql('postgres', "SET ROLE app; SELECT fs_release_slot($l3)"), 't', 'and releases');

# 8 clients through the coordinator on 20 tenants (limit 2 each): a client
# holding a slot marks it in a distributed table; an observer on the
# coordinator counts the marks of each tenant across the nodes.
$q->("CREATE TABLE running (tenant text NOT NULL, client int NOT NULL)");
$q->("SELECT create_distributed_table('running', 'tenant', colocate_with => 'jobs')");
$q->("CREATE TABLE seen (at timestamptz DEFAULT clock_timestamp(), tenant text, holders bigint)");
my $script = $coord->basedir . '/hold.sql';
PostgreSQL::Test::Utils::append_to_file($script, <<'EOF');
\set t random(1, 20)
SELECT fs_acquire_slot('load-:t', 'q', '1 minute') AS lease \gset
SELECT (':lease' <> '')::int AS granted \gset
\if :granted
INSERT INTO running VALUES ('load-:t', :client_id);
\sleep 2 ms
DELETE FROM running WHERE tenant = 'load-:t' AND client = :client_id;
SELECT fs_release_slot(:lease);
\endif
EOF
fs_citus_observe_holders($coord, $script, $ENV{FS_CITUS_LOAD_SECONDS} // 15);
is($q->("SELECT coalesce(max(holders), 0) <= 2 FROM seen"), 't',
	'no tenant ever had more than 2 holders (max ' . $q->("SELECT coalesce(max(holders), 0) FROM seen") . ')');
cmp_ok($q->("SELECT count(*) FROM seen WHERE holders = 2"), '>', 0, 'tenants did reach their limit');
my @granted = map { $_->safe_psql('postgres', "SELECT coalesce(sum(granted), 0) FROM fs_tenants WHERE queue = 'q' AND tenant LIKE 'load-%'") } @workers;
ok($granted[0] > 0 && $granted[1] > 0, "both workers decided ($granted[0] and $granted[1] grants)");
is($q->("SELECT coalesce(sum(granted), 0) FROM fs_tenants WHERE queue = 'q'"), 0, 'the coordinator decided none');
is( join(',', map { $_->safe_psql('postgres', "SELECT count(*) FROM fs_leases WHERE tenant LIKE 'load-%'") } @workers),
	'0,0', 'every lease was released');

done_testing();
