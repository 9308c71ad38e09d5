# Slots in transactions that Citus commits in two phases.  A transaction
# that takes or gives back a slot and writes on another node is prepared on
# each node (PREPARE TRANSACTION, then COMMIT or ROLLBACK PREPARED from
# Citus's connections): a slot taken holds while prepared and is returned if
# the transaction is rolled back; a slot released stays counted until the
# transaction commits.  Under load, an observer checks that no tenant ever
# has more holders than its limit.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareCitus;

my ($coord, @workers) = fs_citus_cluster(2);
my $q = sub { $coord->safe_psql('postgres', shift) };
my %by_group = fs_citus_by_group(@workers);

$q->("CREATE TABLE jobs (tenant text NOT NULL, id bigserial, PRIMARY KEY (tenant, id))");
$q->("SELECT create_distributed_table('jobs', 'tenant')");
# A deferred unique key: a duplicate fails only when the node prepares.
$q->("CREATE TABLE marks (tenant text NOT NULL, k int NOT NULL,"
	  . " UNIQUE (tenant, k) DEFERRABLE INITIALLY DEFERRED)");
$q->("SELECT create_distributed_table('marks', 'tenant', colocate_with => 'jobs')");
$q->("SELECT fs_set_limit('*', 'q', max_slots => 2)");
$q->("SELECT fs_citus_setup('jobs')");

# Two tenants on different nodes.
my @groups = sort { $a <=> $b } keys %by_group;
my ($ta, $tb);
for my $i (1 .. 100)
{
	my $g = $q->("SELECT fs_tenant_node('p-$i')");
	$ta //= "p-$i" if $g == $groups[0];
	$tb //= "p-$i" if $g == $groups[1];
}
my ($owner_a, $owner_b) = @by_group{@groups};
my $slots_a = sub {
	$owner_a->safe_psql('postgres',
		"SELECT coalesce(max(slots_in_use), 0) || '/' || (SELECT count(*) FROM fs_leases WHERE tenant = '$ta')"
		  . " FROM fs_tenants WHERE queue = 'q' AND tenant = '$ta'");
};
my $prepared = sub {
	join(',', map { $_->safe_psql('postgres', 'SELECT count(*) FROM pg_prepared_xacts') } @workers);
};

# Taken on one node, written on the other: Citus prepares both.
my $l1 = $q->("BEGIN; SELECT fs_acquire_slot('$ta', 'q', '1 hour');"
	  . " INSERT INTO jobs (tenant) VALUES ('$tb'); COMMIT;");
ok($l1 ne '', 'a slot taken in a transaction that writes on two nodes commits');
is($slots_a->(), '1/1', 'the slot holds on its node after the two-phase commit');
is($owner_b->safe_psql('postgres', "SELECT count(*) FROM jobs WHERE tenant = '$tb'"), 1,
	'and the write on the other node committed with it');

# The same, rolled back by a duplicate found when the other node prepares.
$q->("INSERT INTO marks VALUES ('$tb', 1)");
my ($ret, $out, $err) = $coord->psql('postgres',
	"BEGIN; SELECT fs_acquire_slot('$ta', 'q', '1 hour'); INSERT INTO marks VALUES ('$tb', 1); COMMIT;");
like($err, qr/duplicate key value/, 'a transaction that fails as the nodes prepare is rolled back');
is($slots_a->(), '1/1', 'and the slot it took is returned');

# Released in a transaction that writes on two nodes: freed at commit ...
is($q->("BEGIN; SELECT fs_release_slot($l1); INSERT INTO jobs (tenant) VALUES ('$tb'); COMMIT;"), 't',
	'a release in a transaction that writes on two nodes commits');
is($slots_a->(), '0/0', 'and frees the slot');

# ... and live again when it is rolled back.
my $l2 = $q->("SELECT fs_acquire_slot('$ta', 'q', '1 hour')");
($ret, $out, $err) = $coord->psql('postgres',
	"BEGIN; SELECT fs_release_slot($l2); INSERT INTO marks VALUES ('$tb', 1); COMMIT;");
like($err, qr/duplicate key value/, 'a release whose transaction fails as the nodes prepare');
is($slots_a->(), '1/1', 'leaves the lease live');
is($q->("SELECT fs_renew_slot($l2)"), 't', 'and it renews');

# Prepared on a node and ended from another session, as Citus's recovery does.
# (In an expression the call runs here, on its owner, not through Citus.
# Citus refuses to prepare, on a worker, a transaction that read a reference
# table, as loading fairshare's settings does: the session loads them first.)
my $warm = "SELECT fs_tenant_node('$ta'), fs_release_slot(fs_acquire_slot('$ta', 'q'));";
$owner_a->safe_psql('postgres',
	"$warm BEGIN; SELECT fs_acquire_slot('$ta', 'q', '1 hour') > 0; PREPARE TRANSACTION 'fs_take'");
is($slots_a->(), '2/2', 'a prepared acquire holds its slot');
is($q->("SELECT fs_acquire_slot('$ta', 'q')"), '', 'which counts against the limit');
$owner_a->safe_psql('postgres', "ROLLBACK PREPARED 'fs_take'");
is($slots_a->(), '1/1', 'ROLLBACK PREPARED in another session returns it');
$owner_a->safe_psql('postgres', "$warm BEGIN; SELECT fs_release_slot($l2) IS TRUE; PREPARE TRANSACTION 'fs_give'");
is( $owner_a->safe_psql('postgres', "SELECT state FROM fs_leases WHERE lease_id = $l2"),
	'releasing', 'a prepared release keeps the lease until the end');
$owner_a->safe_psql('postgres', "COMMIT PREPARED 'fs_give'");
is($slots_a->(), '0/0', 'COMMIT PREPARED in another session frees it');
is($prepared->(), '0,0', 'no prepared transaction is left');

# A PREPARE refused after the slots were parked (here by Citus, whose check
# comes after fairshare's: a fresh session loads the settings from a
# reference table) returns them as any rollback does.
($ret, $out, $err) = $owner_a->psql('postgres',
	"BEGIN; SELECT fs_acquire_slot('$ta', 'q', '1 hour') > 0; PREPARE TRANSACTION 'fs_refused'");
like($err, qr/cannot use 2PC in transactions involving multiple servers/, 'Citus refuses the PREPARE');
is($slots_a->(), '0/0', 'and the slot parked before it is returned');
is($prepared->(), '0,0', 'nothing was prepared');

# 8 clients through the coordinator on 20 tenants (limit 2 each).  Each
# takes a slot in a transaction that also writes another tenant's job (on
# either node), marks it held, and gives it back in a transaction that
# deletes the mark and writes another job: both are committed in two phases
# whenever the two tenants are on different nodes.
$q->("CREATE TABLE running (tenant text NOT NULL, client int NOT NULL)");
$q->("SELECT create_distributed_table('running', 'tenant', colocate_with => 'jobs')");
$q->("CREATE TABLE seen (at timestamptz DEFAULT clock_timestamp(), tenant text, holders bigint)");
my $script = $coord->basedir . '/prepared.sql';
PostgreSQL::Test::Utils::append_to_file($script, <<'EOF');
\set t random(1, 20)
\set u random(1, 20)
BEGIN;
SELECT fs_acquire_slot('load-:t', 'q', '1 minute') AS lease \gset
INSERT INTO jobs (tenant) VALUES ('load-:u');
COMMIT;
SELECT (':lease' <> '')::int AS granted \gset
\if :granted
INSERT INTO running VALUES ('load-:t', :client_id);
\sleep 2 ms
BEGIN;
DELETE FROM running WHERE tenant = 'load-:t' AND client = :client_id;
SELECT fs_release_slot(:lease);
INSERT INTO jobs (tenant) VALUES ('load-:u');
COMMIT;
\endif
EOF
fs_citus_observe_holders($coord, $script, $ENV{FS_CITUS_LOAD_SECONDS} // 10);
is($q->("SELECT coalesce(max(holders), 0) <= 2 FROM seen"), 't',
	'no tenant ever had more than 2 holders (max ' . $q->("SELECT coalesce(max(holders), 0) FROM seen") . ')');
cmp_ok($q->("SELECT count(*) FROM seen WHERE holders = 2"), '>', 0, 'tenants did reach their limit');
my $two_phase = $q->("SELECT count(*) FROM jobs WHERE tenant LIKE 'load-%'");
cmp_ok($two_phase, '>', 100, "the clients committed $two_phase transactions that wrote jobs");
is( join(',', map { $_->safe_psql('postgres',
			"SELECT count(*) || '/' || (SELECT coalesce(sum(slots_in_use), 0) FROM fs_tenants WHERE tenant LIKE 'load-%')"
			  . " FROM fs_leases WHERE tenant LIKE 'load-%'") } @workers),
	'0/0,0/0', 'every lease was released and every slot given back');
is($prepared->(), '0,0', 'no prepared transaction is left');

done_testing();
