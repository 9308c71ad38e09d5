# Fair dequeue on tables Citus distributes by tenant: a queue registered on
# the coordinator reaches every node in the registering transaction; each
# node counts and claims the tenants whose shards it holds, exactly fair
# among them, with rows locked on the shard that holds them; jobs enqueued,
# finished and truncated through two-phase commits are counted; a shard's
# move takes its tenants' rows to the new node's fair order.  Under load,
# claimers connected to each node directly get the weighted shares of the
# node's tenants while an observer checks that no tenant ever runs more jobs
# than its limit.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareCitus;

my ($coord, @workers) = fs_citus_cluster(2);
my $q = sub { $coord->safe_psql('postgres', shift) };
my %by_group = fs_citus_by_group(@workers);
my @groups = sort { $a <=> $b } keys %by_group;
my ($node_a, $node_b) = @by_group{@groups};

# Ids repeat across tenants: keys are unique only with the tenant, as a
# distributed table's unique indexes are.
$q->("CREATE TABLE jobs (tenant text NOT NULL, id bigint NOT NULL, PRIMARY KEY (tenant, id))");
$q->("SELECT create_distributed_table('jobs', 'tenant', shard_count => 4)");
$q->("CREATE TABLE running (tenant text NOT NULL, job_id bigint NOT NULL, PRIMARY KEY (tenant, job_id))");
$q->("SELECT create_distributed_table('running', 'tenant', colocate_with => 'jobs')");
$q->("CREATE TABLE other (tenant text NOT NULL, id bigint NOT NULL, PRIMARY KEY (id, tenant))");
$q->("SELECT create_distributed_table('other', 'id', colocate_with => 'none')");
$q->("CREATE TABLE local_jobs (tenant text NOT NULL, id bigint PRIMARY KEY)");
$q->("SELECT fs_set_limit('*', 'q', max_slots => 100)");

# Not set up yet: refused, with the reason.
my ($ret, $out, $err) = $coord->psql('postgres',
	"SELECT fs_register_queue('q', 'jobs', 'tenant', 'id', key => 'id')");
like($err, qr/cannot be served across the cluster: this database is not set up for Citus/,
	'a distributed table before fs_citus_setup() is refused');
$q->("SELECT fs_citus_setup('jobs')");
($ret, $out, $err) = $coord->psql('postgres',
	"SELECT fs_register_queue('o', 'other', 'tenant', 'id', key => 'id')");
like($err, qr/is not colocated with jobs/, 'a table not colocated with the setup table is refused');
($ret, $out, $err) = $coord->psql('postgres',
	"SELECT fs_register_queue('o', 'jobs', 'lower(tenant)', 'id', key => 'id')");
like($err, qr/its tenant expression is not its distribution column/,
	'a tenant other than the distribution column is refused');
($ret, $out, $err) = $coord->psql('postgres',
	"SELECT fs_register_queue('o', 'jobs', 'tenant', 'id', key => 'id', running_table => 'local_jobs',"
	  . " running_key => 'id')");
like($err, qr/has one table distributed by Citus and one not/, 'a local running table is refused');
($ret, $out, $err) = $node_a->psql('postgres',
	"SELECT fs_register_queue('o', 'jobs', 'tenant', 'id', key => 'id')");
like($err, qr/this is not the coordinator/, 'registering on a worker node is refused');

# A session on each node that lives through the registration.
my %live = map { $_ => $by_group{$_}->background_psql('postgres') } @groups;
$live{$_}->query_safe("SELECT count(*) FROM fs_fair_queues") for @groups;

$q->("SELECT fs_register_queue('q', 'jobs', 'tenant', 'id', key => 'id', running_table => 'running',"
	  . " running_key => 'job_id')");
for my $g (@groups)
{
	my $node = $by_group{$g};
	is( $node->safe_psql('postgres', "SELECT ready_table || ' ' || running_table FROM fs_fair_queues WHERE queue = 'q'"),
		'jobs running', "node $g has the registration");
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM pg_trigger"
			  . " WHERE tgrelid::regclass::text ~ '^jobs_[0-9]+\$' AND tgname LIKE 'fs_fair_ready%'"),
		2, "and fairshare's row trigger on each of its 2 shards");
}
is($q->("SELECT count(*) FROM fs_cluster_queues WHERE queue = 'q'"), 1, 'the coordinator published it');

# Tenants of each node: 'big' and three small ones.
my %tenants;
for my $i (1 .. 200)
{
	my $t = "t-$i";
	my $g = $q->("SELECT fs_tenant_node('$t')");
	push @{ $tenants{$g} }, $t if @{ $tenants{$g} // [] } < 4;
}
my @on_a = @{ $tenants{ $groups[0] } };
my @on_b = @{ $tenants{ $groups[1] } };

# Enqueued through the coordinator in one transaction for both nodes:
# prepared on each, counted at COMMIT PREPARED.
my $values = sub {
	my ($tenant, $from, $to) = @_;
	return join(', ', map { "('$tenant', $_)" } $from .. $to);
};
$q->("BEGIN; INSERT INTO jobs VALUES " . $values->($on_a[0], 1, 40) . ', ' . $values->($on_b[0], 1, 40)
	  . "; INSERT INTO jobs VALUES "
	  . join(', ', map { $values->($_, 1, 5) } @on_a[1 .. 3], @on_b[1 .. 3]) . "; COMMIT");
my $backlog = sub {
	my ($node) = @_;
	return $node->safe_psql('postgres',
		"SELECT string_agg(tenant || ':' || ready_rows, ',' ORDER BY tenant) FROM fs_tenants"
		  . " WHERE queue = 'q' AND ready_rows > 0");
};
my $expect = sub { join(',', map { "$_:" . ($_ eq $_[0] ? 40 : 5) } sort @_) };
is($backlog->($node_a), $expect->(@on_a), "node $groups[0] counts its own tenants' rows");
is($backlog->($node_b), $expect->(@on_b), "node $groups[1] counts its own tenants' rows");
($ret, $out, $err) = $coord->psql('postgres',
	"BEGIN; INSERT INTO jobs VALUES ('$on_a[1]', 100), ('$on_b[1]', 100);"
	  . " INSERT INTO jobs VALUES ('$on_b[1]', 1); COMMIT");
like($err, qr/duplicate key/, 'a two-node enqueue that fails');
is($backlog->($node_a) . ' ' . $backlog->($node_b), $expect->(@on_a) . ' ' . $expect->(@on_b),
	'counts nothing anywhere');

# Claims on a node: its tenants only, in fair order, one of each first.
my $claim = sub {
	my ($node, $n) = @_;
	return $node->safe_psql('postgres',
		"BEGIN; SELECT string_agg(tenant, ',' ORDER BY tenant) FROM"
		  . " (SELECT tenant FROM fs_claim('q', NULL::jobs, $n)) c; ROLLBACK");
};
is($claim->($node_a, 4), join(',', sort @on_a), "node $groups[0]'s first claim takes one row of each of its tenants");
is($claim->($node_b, 4), join(',', sort @on_b), "so does node $groups[1]'s");
is( $node_a->safe_psql('postgres',
		"BEGIN; SELECT count(DISTINCT (job).tenant || (job).id) FROM"
		  . " (SELECT job FROM fs_claim('q', NULL::jobs, 8) UNION ALL SELECT job FROM fs_claim('q', NULL::jobs, 8)) c;"
		  . " ROLLBACK"),
	16, 'two claims in one transaction get 16 different rows, whose ids repeat across tenants');
is($node_a->safe_psql('postgres', "SELECT short_probes FROM fs_fairness WHERE queue = 'q'"), 0,
	'and no tenant came up short');
is($q->("BEGIN; SELECT fs_lease_node(lease_id) > 0 FROM fs_claim('q', NULL::jobs, 1); ROLLBACK"), 't',
	'a claim on the coordinator is served by a worker node (test/citus/008 has the rest)');

# The registration sessions loaded before it are seen: re-registered with a
# filter, the sessions count only the rows it holds.
$q->("SELECT fs_register_queue('q', 'jobs', 'tenant', 'id', key => 'id', running_table => 'running',"
	  . " running_key => 'job_id', filter => 'id <= 3')");
is( $live{ $groups[0] }->query_safe(
		"BEGIN; SELECT count(*) FROM fs_claim('q', NULL::jobs, 100); ROLLBACK;"),
	12, 'a session that lived through a new registration claims by it');
$q->("SELECT fs_register_queue('q', 'jobs', 'tenant', 'id', key => 'id', running_table => 'running',"
	  . " running_key => 'job_id')");

# Claimed, started (a running row) and taken out of the ready table in one
# transaction on the node; finished by one DELETE of the node's running
# rows, which Citus runs over its own connections and commits in two
# phases: the leases are released when it commits.
my $start = sub {
	my ($node, $n) = @_;
	return $node->safe_psql('postgres', qq{
		BEGIN;
		CREATE TEMP TABLE c ON COMMIT DROP AS SELECT (job).tenant, (job).id FROM fs_claim('q', NULL::jobs, $n);
		INSERT INTO running SELECT tenant, id FROM c;
		DELETE FROM jobs j USING c WHERE j.tenant = c.tenant AND j.id = c.id;
		SELECT count(*) FROM c;
		COMMIT;});
};
is($start->($node_a, 6), 6, "6 jobs started on node $groups[0]");
my $leases = sub { $_[0]->safe_psql('postgres', "SELECT count(*) FROM fs_leases WHERE queue = 'q'") };
is($leases->($node_a), 6, 'with 6 leases');
$node_a->safe_psql('postgres', "DELETE FROM running");
is($leases->($node_a), 0, 'finished by a DELETE committed in two phases, they are released');
is($node_a->safe_psql('postgres', "SELECT rows_released FROM fs_fairness WHERE queue = 'q'"), 6,
	'each counted as released');
is( $node_a->safe_psql('postgres',
		"SELECT coalesce(sum(ready_rows), 0) FROM fs_tenants WHERE queue = 'q'"),
	49, 'and the backlog is the rows left');

# TRUNCATE through the coordinator (Citus gives shards no TRUNCATE trigger):
# each node forgets its backlog, and the jobs running are over.
is($start->($node_a, 4), 4, "4 more jobs started on node $groups[0]");
$q->("TRUNCATE jobs, running");
is($backlog->($node_a) . '|' . $backlog->($node_b), '|', 'a TRUNCATE empties every node\'s backlog');
is($leases->($node_a), 0, 'and releases the leases of the jobs that were running');
$q->("INSERT INTO jobs VALUES " . join(', ', map { $values->($_, 1, 5) } @on_a, @on_b));

# A shard moved to the other node: its tenants' rows are claimed there, and
# no longer on the old node, also by sessions that lived through the move.
my $mover = $on_a[1];
my $shard = $q->("SELECT get_shard_id_for_distribution_column('jobs', '$mover')");
my @same_shard = grep { $q->("SELECT get_shard_id_for_distribution_column('jobs', '$_')") == $shard } @on_a;
$q->("SELECT citus_move_shard_placement($shard, '127.0.0.1', " . $node_a->port . ", '127.0.0.1', "
	  . $node_b->port . ", shard_transfer_mode => 'block_writes')");
my $claimed_by = sub {
	my ($session) = @_;
	return $session->query_safe(
		"BEGIN; SELECT coalesce(string_agg(DISTINCT tenant, ',' ORDER BY tenant), '')"
		  . " FROM fs_claim('q', NULL::jobs, 100); ROLLBACK;");
};
my @left = grep { my $t = $_; !grep { $_ eq $t } @same_shard } @on_a;
is($claimed_by->($live{ $groups[0] }), join(',', sort @left), "the old node claims only the tenants it still holds");
is($claimed_by->($live{ $groups[1] }), join(',', sort(@on_b, @same_shard)), 'the new node claims the moved ones too');
is($backlog->($node_b), join(',', map { "$_:5" } sort(@on_b, @same_shard)), 'and counts their rows');
$_->quit for values %live;

# Load: 4 claimers on each node, connected to it directly, for a few
# seconds.  On each node two tenants of weight 1 and one of weight 2 with
# rows to spare, and one capped at 1 job at a time.  Each job is claimed,
# started and taken from the ready table in one transaction, and finished
# in the next.
$q->("TRUNCATE jobs, running");
my %role;
my %fresh;
for my $i (1 .. 400)
{
	my $t = "l-$i";
	my $g = $q->("SELECT fs_tenant_node('$t')");
	push @{ $fresh{$g} }, $t if @{ $fresh{$g} // [] } < 4;
}
for my $g (@groups)
{
	my ($one, $two, $heavy, $capped) = @{ $fresh{$g} };
	$role{$g} = { one => $one, two => $two, heavy => $heavy, capped => $capped };
	$q->("SELECT fs_set_limit('$heavy', 'q', weight => 2)");
	$q->("SELECT fs_set_limit('$capped', 'q', max_slots => 1)");
	$q->("INSERT INTO jobs SELECT t, i FROM unnest(ARRAY['$one', '$two', '$heavy', '$capped']) t,"
		  . " generate_series(1, 20000) i");
	$by_group{$g}->safe_psql('postgres', "CREATE TABLE served (tenant text, at timestamptz DEFAULT clock_timestamp())");
}
$q->("CREATE TABLE seen (tenant text, holders bigint)");
fs_citus_claim_load($coord, $ENV{FS_CITUS_LOAD_SECONDS} // 10, map { [ $_, 4 ] } @workers);
for my $g (@groups)
{
	my $r = $role{$g};
	my $node = $by_group{$g};
	my %n = map { split /\|/ } split /\n/,
	  $node->safe_psql('postgres', "SELECT tenant, count(*) FROM served GROUP BY 1");
	my $total = $n{ $r->{one} } + $n{ $r->{two} } + $n{ $r->{heavy} };
	cmp_ok($total, '>', 300, "node $g served $total jobs of its uncapped tenants");
	my %share = map { $_ => $n{ $r->{$_} } / $total } qw(one two heavy);
	ok(abs($share{one} - 0.25) <= 0.0125 && abs($share{two} - 0.25) <= 0.0125 && abs($share{heavy} - 0.5) <= 0.025,
		sprintf("node %d: shares %.3f, %.3f and %.3f within 5%% of 1:1:2", $g, @share{qw(one two heavy)}));
	is($q->("SELECT coalesce(max(holders), 0) FROM seen WHERE tenant = '$r->{capped}'"), 1,
		"node $g: its tenant capped at 1 never ran 2 jobs at once, and ran");
	is($node->safe_psql('postgres', "SELECT count(*) FROM fs_leases WHERE queue = 'q'"), 0,
		"node $g: every lease was released");
}
is(join(',', map { $_->safe_psql('postgres', 'SELECT count(*) FROM pg_prepared_xacts') } @workers), '0,0',
	'no prepared transaction is left');

# Unregistered from the coordinator only, and then everywhere.
($ret, $out, $err) = $node_a->psql('postgres', "SELECT fs_unregister_queue('q')");
like($err, qr/this is not the coordinator/, 'a worker node refuses to unregister it');
is($q->("SELECT fs_unregister_queue('q')"), 't', 'the coordinator unregisters it');
is( join(',', map { $_->safe_psql('postgres', "SELECT count(*) FROM fs_fair_queues WHERE queue = 'q'") } $coord, @workers),
	'0,0,0', 'and no node has it any more');
$q->("CREATE TABLE a_table_whose_name_is_too_long_for_its_shards (tenant text NOT NULL, id bigint NOT NULL,"
	  . " PRIMARY KEY (tenant, id))");
$q->("SELECT create_distributed_table('a_table_whose_name_is_too_long_for_its_shards', 'tenant', colocate_with => 'jobs')");
($ret, $out, $err) = $coord->psql('postgres',
	"SELECT fs_register_queue('long', 'a_table_whose_name_is_too_long_for_its_shards', 'tenant', 'id', key => 'id')");
like($err, qr/is too long for its shards' names/, 'a table name its shards cannot carry is refused');

# A registered distributed table dropped: Citus drops it on every node in
# two phases, and the registration goes with it everywhere.
$q->("CREATE TABLE dropped (tenant text NOT NULL, id bigint NOT NULL, PRIMARY KEY (tenant, id))");
$q->("SELECT create_distributed_table('dropped', 'tenant', colocate_with => 'jobs')");
$q->("SELECT fs_register_queue('dq', 'dropped', 'tenant', 'id', key => 'id')");
$q->("INSERT INTO dropped VALUES " . join(', ', map { "('$_', 1)" } @on_a, @on_b));
($ret, $out, $err) = $coord->psql('postgres', "DROP TABLE dropped");
is($ret, 0, 'a registered distributed table can be dropped') or diag($err);
is( join(',', map { $_->safe_psql('postgres', "SELECT count(*) FROM fs_fair_queues WHERE queue = 'dq'") } $coord, @workers),
	'0,0,0', 'and its registration is gone from every node');
is($q->("SELECT count(*) FROM fs_cluster_queues"), 0, 'and from fs_cluster_queues');

# The running table of a registered queue dropped, its ready table kept:
# each node's own cleanup of the registration leaves the ready table's
# triggers to the coordinator (Citus refuses a node's DDL on a distributed
# table), whose cleanup drops them everywhere.
$q->("CREATE TABLE kept (tenant text NOT NULL, id bigint NOT NULL, PRIMARY KEY (tenant, id))");
$q->("SELECT create_distributed_table('kept', 'tenant', colocate_with => 'jobs')");
$q->("CREATE TABLE gone (tenant text NOT NULL, job_id bigint NOT NULL, PRIMARY KEY (tenant, job_id))");
$q->("SELECT create_distributed_table('gone', 'tenant', colocate_with => 'jobs')");
$q->("SELECT fs_register_queue('kq', 'kept', 'tenant', 'id', key => 'id', running_table => 'gone',"
	  . " running_key => 'job_id')");
my $fs_triggers = "SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'fs\\_fair\\_%' AND tgrelid::regclass::text LIKE 'kept%'";
like(join(',', map { $_->safe_psql('postgres', $fs_triggers) } $coord, @workers), qr/^[1-9]\d*,[1-9]\d*,[1-9]\d*$/,
	'the ready table has its triggers on every node');
($ret, $out, $err) = $coord->psql('postgres', "DROP TABLE gone");
is($ret, 0, "a registered queue's distributed running table can be dropped") or diag($err);
is( join(',', map { $_->safe_psql('postgres', "SELECT count(*) FROM fs_fair_queues WHERE queue = 'kq'") } $coord, @workers),
	'0,0,0', 'and the registration is gone from every node');
is(join(',', map { $_->safe_psql('postgres', $fs_triggers) } $coord, @workers), '0,0,0',
	"and so are the ready table's triggers, on the table and its shards");
$q->("INSERT INTO kept VALUES " . join(', ', map { "('$_', 1)" } @on_a, @on_b));
is($q->("SELECT count(*) FROM kept"), scalar(@on_a) + scalar(@on_b), 'and the ready table takes rows');

done_testing();
