# The relay: on the coordinator, a per-tenant call that is its statement's
# whole work, outside a transaction block, goes to the tenant's node over
# fairshare's own connection instead of through Citus, with the same
# effect.  A plan kept from outside a block and run inside one joins the
# block; a node's error comes back as it was raised; a cancel while the
# node answers is served at once; where the relay cannot connect (a
# password only pg_dist_authinfo holds, a node behind a pooler named in
# pg_dist_poolinfo), Citus carries the call.  Calls
# that Citus tried to delegate after PostgreSQL flattened them, and
# crashed on, now run.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use FairshareCitus;

my ($coord, @workers) = fs_citus_cluster(2);
my $q = sub { $coord->safe_psql('postgres', shift) };
my %by_group = fs_citus_by_group(@workers);

$q->("CREATE TABLE jobs (tenant text NOT NULL, id bigserial, PRIMARY KEY (tenant, id))");
$q->("SELECT create_distributed_table('jobs', 'tenant')");
$q->("SELECT fs_set_limit('*', 'q', max_slots => 2, budget_ms_per_minute => 60000)");
$q->("SELECT fs_set_limit('*', 'blk', max_slots => 100)");
$q->("SELECT fs_citus_setup('jobs')");
my ($ta, $tb) = split /\n/, $q->(
	q{SELECT DISTINCT ON (fs_tenant_node(t)) t FROM (SELECT 'tenant-' || i AS t FROM generate_series(1, 50) i) x
	   ORDER BY fs_tenant_node(t), t});
my $owner_a = $by_group{ $q->("SELECT fs_tenant_node('$ta')") };
my $owner_b = $by_group{ $q->("SELECT fs_tenant_node('$tb')") };
# The relay backends on a node (of one role, if given).
my $relays = sub {
	my ($node, $role) = @_;
	$node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE application_name = 'fairshare relay'"
		  . (defined $role ? " AND usename = '$role'" : ''));
};
# The statement a node's relay backend ran last (one relay backend there).
my $relayed = sub {
	shift->safe_psql('postgres',
		"SELECT regexp_replace(query, '^SELECT [a-z_]+\\.([a-z_]+)\\(.*\$', '\\1')"
		  . " FROM pg_stat_activity WHERE application_name = 'fairshare relay'");
};

# Relayed: one connection per node and role, kept by the session.
my $s = $coord->background_psql('postgres', on_error_stop => 0);
my $l1 = $s->query_safe("SELECT fs_acquire_slot('$ta', 'q', '1 hour')");
my $l2 = $s->query_safe("SELECT * FROM fs_acquire_slot('$ta', 'q', '1 hour')");
is($s->query_safe("SELECT fs_acquire_slot('$ta', 'q', '1 hour')"), '', 'the limit holds through the relay');
is($relays->($owner_a), 1, "the calls went over one connection to the tenant's node");
is($relays->($owner_b), 0, 'and none to the other node');
is($owner_a->safe_psql('postgres', "SELECT count(*) FROM fs_leases WHERE tenant = '$ta'"), 2,
	'the node holds the leases');
is($q->("SELECT count(*) FROM fs_leases"), 0, 'the coordinator none');
is($relayed->($owner_a), 'fs_acquire_slot', 'the relay ran the acquire');
is($s->query_safe("SELECT fs_renew_slot($l1, '2 hours')"), 't', 'a renew through the coordinator');
is($relayed->($owner_a), 'fs_renew_slot', 'relayed');
is($s->query_safe("SELECT fs_release_slot($l1)"), 't', 'a release through the coordinator');
is($relayed->($owner_a), 'fs_release_slot', 'relayed');
is($s->query_safe("SELECT fs_release_slot($l1)"), 'f', 'a second release is false');

# Off, Citus carries the calls: the same answers, no connection of ours.
$s->query_safe("SET fairshare.relay_calls = off");
is($s->query_safe("SELECT fs_spend_tokens('$tb', 2, 100, 'q')"), 2, 'with the relay off, Citus delegates');
is($relays->($owner_b), 0, 'and no relay connection is made');
$s->query_safe("RESET fairshare.relay_calls");
is($s->query_safe("SELECT fs_spend_tokens('$tb', 2, 100, 'q')"), 2, 'on again, the same answer');
is($relays->($owner_b), 1, 'over the relay');
is($owner_b->safe_psql('postgres', "SELECT granted FROM fs_tenants WHERE tenant = '$tb' AND queue = 'q'"), 2,
	"both calls granted on the tenant's node");

# A node's error comes back as the node raised it; the connection stays.
my ($out, $ret) = $s->query("SELECT fs_spend_tokens('$tb', -1, 100, 'q')");
like($s->{stderr}, qr/ERROR:  requested_runs must be/, "the node's error is the caller's");
$s->{stderr} = '';
is($relayed->($owner_b), 'fs_spend_tokens', 'raised by the relayed call');
like($s->query_safe("SELECT fs_charge_tokens('$tb', 50, 'q')"), qr/^-?[0-9.e+]+$/, 'the next call is answered');
is($relayed->($owner_b), 'fs_charge_tokens', 'relayed on the same connection');

# A connection lives no longer than Citus keeps its own.
my $relay_pid = sub {
	shift->safe_psql('postgres', "SELECT pid FROM pg_stat_activity WHERE application_name = 'fairshare relay'");
};
my $pid_before = $relay_pid->($owner_b);
$s->query_safe("SET citus.max_cached_connection_lifetime = 0");
$s->query_safe("SELECT fs_spend_tokens('$tb', 0, 100, 'q')");
$owner_b->poll_query_until('postgres',
	"SELECT count(*) = 1 AND min(pid) <> $pid_before FROM pg_stat_activity WHERE application_name = 'fairshare relay'")
  or die 'the relay kept a connection past citus.max_cached_connection_lifetime';
pass('past citus.max_cached_connection_lifetime the connection is made anew');
$s->query_safe("RESET citus.max_cached_connection_lifetime");

# A node that Citus reaches through a pooler (pg_dist_poolinfo) is left to
# Citus: the kept connection closes at the next call, and none is made
# around the pooler (here the pooler's address is the node's own).
my $granted_b = sub {
	$owner_b->safe_psql('postgres', "SELECT granted FROM fs_tenants WHERE tenant = '$tb' AND queue = 'q'");
};
my ($nodeid_b, $pool_b) = split /\|/, $q->(
	"SELECT nodeid, format('host=%s port=%s', nodename, nodeport) FROM pg_dist_node WHERE nodeport = "
	  . $owner_b->port);
is($relays->($owner_b), 1, "the session's relay connection to the node stands");
$q->("INSERT INTO pg_dist_poolinfo VALUES ($nodeid_b, '$pool_b')");
my $granted_before = $granted_b->();
is($s->query_safe("SELECT fs_spend_tokens('$tb', 1, 100, 'q')"), 1, 'a call to a node behind a pooler is answered');
is($granted_b->(), $granted_before + 1, "on the tenant's node");
$owner_b->poll_query_until('postgres',
	"SELECT count(*) = 0 FROM pg_stat_activity WHERE application_name = 'fairshare relay'")
  or die 'the relay kept its connection to a node named in pg_dist_poolinfo';
pass('the relay closed its connection to the node once pg_dist_poolinfo named a pooler');
is($s->query_safe("SELECT fs_spend_tokens('$tb', 1, 100, 'q')"), 1, 'the next call is answered too');
is($relays->($owner_b), 0, 'through Citus: the relay made no connection around the pooler');
$q->("DELETE FROM pg_dist_poolinfo WHERE nodeid = $nodeid_b");
is($s->query_safe("SELECT fs_spend_tokens('$tb', 1, 100, 'q')"), 1, 'without the pooler');
is($relays->($owner_b), 1, 'the relay connects again');
is($relayed->($owner_b), 'fs_spend_tokens', 'and relays the call');

# Calls the relay leaves to Citus or refuses, as before.
($out, $ret) = $s->query("SELECT fs_acquire_slot('$ta', 'q'), 1");
like($s->{stderr}, qr/does not own the tenant/, 'a call that is not the whole statement is refused');
$s->{stderr} = '';
($out, $ret) = $s->query("DO \$\$ BEGIN PERFORM fs_acquire_slot('$ta', 'q'); END \$\$");
like($s->{stderr}, qr/does not own the tenant/, 'so is a call from a function');
$s->{stderr} = '';
$s->query_safe("BEGIN");
my $l3 = $s->query_safe("SELECT fs_acquire_slot('$ta', 'q')");
$s->query_safe("ROLLBACK");
is($owner_a->safe_psql('postgres', "SELECT count(*) FROM fs_leases WHERE tenant = '$ta'"), 1,
	'a call in a rolled-back block is undone on the node');

# Only the call alone is relayed: work after it in the statement goes to
# Citus, which runs the whole statement on the node or refuses it.
like($s->query_safe("SELECT fs_acquire_slot('$ta', 'other') LIMIT 1"), qr/^\d+$/,
	'a call with a LIMIT is delegated by Citus as before');
($out, $ret) = $s->query("SELECT l::int4 FROM fs_acquire_slot('$ta', 'other') l");
like($s->{stderr}, qr/ERROR/, 'a call whose answer a cast then rejects fails');
$s->{stderr} = '';
$q->("CREATE TABLE loc (id int PRIMARY KEY)");
$q->("INSERT INTO loc VALUES (1)");
($out, $ret) = $s->query("WITH d AS (INSERT INTO loc VALUES (1) RETURNING 1) SELECT fs_acquire_slot('$ta', 'other')");
like($s->{stderr}, qr/ERROR/, 'so does one beside a WITH that fails');
$s->{stderr} = '';
is($owner_a->safe_psql('postgres', "SELECT count(*) FROM fs_leases WHERE queue = 'other'"), 1,
	'and neither left a lease on the node');

# Statements that Citus 13.2 tried to delegate once PostgreSQL had
# flattened them, and crashed on: now planned without Citus, and relayed.
$q->("CREATE VIEW tenant_view AS SELECT '$ta'::text AS t");
like($s->query_safe("SELECT fs_acquire_slot(t, 'blk') FROM (VALUES ('$ta')) v(t)"), qr/^\d+$/,
	'a call on a VALUES row runs');
is($relayed->($owner_a), 'fs_acquire_slot', 'relayed');
like($s->query_safe("SELECT fs_acquire_slot(t, 'blk') FROM (SELECT '$ta' AS t) s"), qr/^\d+$/,
	'so does one on a subquery without tables');
like($s->query_safe("SELECT fs_acquire_slot(t, 'blk') FROM tenant_view"), qr/^\d+$/,
	'and one on a view without tables');
($out, $ret) = $s->query("SELECT fs_acquire_slot(t, 'blk') FROM (VALUES (NULL::text)) v(t)");
like($s->{stderr}, qr/tenant must not be null/, 'a NULL tenant from VALUES is an error');
$s->{stderr} = '';
# A SQL function that reads a distributed table, inlined: planned by
# Citus, never over the coordinator's empty copy of the table.
$q->("INSERT INTO jobs (tenant) VALUES ('$ta')");
$q->("CREATE FUNCTION tenants_in_jobs() RETURNS SETOF text LANGUAGE sql STABLE AS 'SELECT tenant FROM jobs'");
($out, $ret) = $s->query("SELECT fs_acquire_slot(t, 'blk') FROM tenants_in_jobs() s(t)");
like($s->{stderr}, qr/ERROR/, 'a call over an inlined function that reads a distributed table is left to Citus');
$s->{stderr} = '';
is($s->query_safe("SELECT count(*) FROM jobs"), 1, 'and the coordinator is still up');
$s->quit;

# A plan kept from outside a block (the relay's), run inside one: the call
# joins the block there, so that the rollback undoes it.
my $script = $coord->basedir . '/kept.sql';
PostgreSQL::Test::Utils::append_to_file($script, <<EOF);
\\set i :i + 1
\\if :i = 7
BEGIN;
\\endif
SELECT fs_acquire_slot('$ta', 'blk', '1 hour');
\\if :i = 7
ROLLBACK;
\\endif
EOF
my ($stdout, $stderr) = ('', '');
IPC::Run::run(['pgbench', '-n', '-M', 'prepared', '-D', 'i=0', '-t', '7', '-c', '1', '-f', $script,
		'-h', $coord->host, '-p', $coord->port, 'postgres'], '>', \$stdout, '2>', \$stderr);
like($stdout, qr/number of transactions actually processed: 7\/7/, 'seven calls of one prepared statement')
  or diag($stderr);
is($owner_a->safe_psql('postgres', "SELECT count(*) FROM fs_leases WHERE tenant = '$ta' AND queue = 'blk'"), 3 + 6,
	'the one in the rolled-back block is undone on the node');

# A cancel while the node answers: the node's backend is stopped, the
# caller's statement_timeout cancels the call at once and the connection is
# closed; the next call connects again.
my $s2 = $coord->background_psql('postgres', on_error_stop => 0);
$s2->query_safe("SELECT fs_acquire_slot('$ta', 'blk')");
my $pid = $owner_a->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE application_name = 'fairshare relay'");
like($pid, qr/^\d+$/, 'one relay backend on the node');
kill 'STOP', $pid;
$s2->query_safe("SET statement_timeout = '500ms'");
my $t0 = time;
($out, $ret) = $s2->query("SELECT fs_acquire_slot('$ta', 'blk')");
my $waited = time - $t0;
kill 'CONT', $pid;
like($s2->{stderr}, qr/canceling statement due to statement timeout/, 'the call is canceled');
like($s2->{stderr}, qr/CONTEXT:  while node group \d+ answered a call relayed to it, which may have been made there/,
	'saying that the call may have been made');
$s2->{stderr} = '';
cmp_ok($waited, '<', 5, sprintf('within its timeout (%.1f s)', $waited));
$s2->query_safe("RESET statement_timeout");
like($s2->query_safe("SELECT fs_acquire_slot('$ta', 'blk')"), qr/^\d+$/, 'the next call connects again');
$owner_a->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM pg_stat_activity WHERE application_name = 'fairshare relay'")
  or die 'the stopped relay backend never went away';
pass('the canceled connection is gone from the node');
$s2->quit;

# A role whose node connections need a password that only pg_dist_authinfo
# holds: the relay cannot connect, and Citus carries the calls.
$q->("CREATE ROLE pw LOGIN PASSWORD 'secret-pw' IN ROLE fairshare_app");
$q->("INSERT INTO pg_dist_authinfo (nodeid, rolename, authinfo) VALUES (0, 'pw', 'password=secret-pw')");
for my $node (@workers)
{
	my $hba = $node->data_dir . '/pg_hba.conf';
	my $conf = PostgreSQL::Test::Utils::slurp_file($hba);
	open(my $fh, '>', $hba) or die "$hba: $!";
	print $fh "host all pw 127.0.0.1/32 scram-sha-256\n$conf";
	close $fh;
	$node->reload;
}
my $s3 = $coord->background_psql('postgres');
$s3->query_safe("SET ROLE pw");
is($s3->query_safe("SELECT fs_spend_tokens('$ta', 1, 100, 'q')"), 1,
	'a role the relay cannot connect as is served through Citus');
is($s3->query_safe("SELECT fs_spend_tokens('$ta', 1, 100, 'q')"), 1, 'and again');
is($relays->($owner_a, 'pw'), 0, 'with no relay connection while its session lasts');
$s3->quit;

# A role that may not read pg_dist_poolinfo (Citus grants it to every role;
# here that was taken back) is served through Citus too, its kept
# connection closed.
$q->("CREATE ROLE np LOGIN IN ROLE fairshare_app");
my $s4 = $coord->background_psql('postgres');
$s4->query_safe("SET ROLE np");
is($s4->query_safe("SELECT fs_spend_tokens('$ta', 1, 100, 'q')"), 1, 'a role that may read it');
is($relays->($owner_a, 'np'), 1, 'is relayed');
$q->("REVOKE SELECT ON pg_dist_poolinfo FROM PUBLIC");
is($s4->query_safe("SELECT fs_spend_tokens('$ta', 1, 100, 'q')"), 1,
	'once it may not, its call is answered');
$owner_a->poll_query_until('postgres',
	"SELECT count(*) = 0 FROM pg_stat_activity WHERE application_name = 'fairshare relay' AND usename = 'np'")
  or die 'the relay kept its connection for a role that may no longer read pg_dist_poolinfo';
pass('through Citus: the kept connection closed');
is($s4->query_safe("SELECT fs_spend_tokens('$ta', 1, 100, 'q')"), 1, 'and the next call too');
is($relays->($owner_a, 'np'), 0, 'with no relay connection made');
$s4->quit;
$q->("GRANT SELECT ON pg_dist_poolinfo TO PUBLIC");

done_testing();
