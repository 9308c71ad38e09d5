# Claims through the coordinator of a queue on a distributed table: each
# claim is sent to one node, chosen so that the order is fair across the
# tenants of all nodes (a node's share of the claims is the sum of the
# weights of its tenants that can be served); the rows are locked on the
# shard that holds them, in the caller's transaction, which commits in one
# phase on that node and keeps to it.  Under load, claimers connected to
# the coordinator get every tenant its weighted share of the whole cluster
# (Jain's index over all tenants), while an observer checks that no tenant
# ever runs more jobs than its limit.  Claims follow a shard that moves.
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

$q->("CREATE TABLE jobs (tenant text NOT NULL, id bigint NOT NULL, PRIMARY KEY (tenant, id))");
$q->("SELECT create_distributed_table('jobs', 'tenant', shard_count => 4)");
$q->("CREATE TABLE running (tenant text NOT NULL, job_id bigint NOT NULL, PRIMARY KEY (tenant, job_id))");
$q->("SELECT create_distributed_table('running', 'tenant', colocate_with => 'jobs')");
$q->("SELECT fs_citus_setup('jobs')");
$q->("SELECT fs_set_limit('*', 'q', max_slots => 100)");
$q->("SELECT fs_register_queue('q', 'jobs', 'tenant', 'id', key => 'id', running_table => 'running',"
	  . " running_key => 'job_id')");

# Tenants by node: one on the first node, three on the second.
my %fresh;
for my $i (1 .. 400)
{
	my $t = "t-$i";
	my $g = $q->("SELECT fs_tenant_node('$t')");
	push @{ $fresh{$g} }, $t if @{ $fresh{$g} // [] } < 4;
}
my ($a1) = @{ $fresh{ $groups[0] } };
my ($b1, $b2, $b3) = @{ $fresh{ $groups[1] } };

# A claim outside a transaction block asks the nodes their weights when the
# scheduler has not (its first); from then on the scheduler keeps them.
is($q->("SELECT count(*) FROM fs_claim('q', NULL::jobs, 5)"), 0, 'an empty queue gives no rows');
# Called inside another query, Citus does not delegate it: it refuses.
my ($ret, $out, $err) = $coord->psql('postgres',
	"SELECT count(*) FROM (SELECT * FROM fs_claim_at('fairshare-node-0', 'q', NULL::jobs, 1) LIMIT 1) c");
like($err, qr/fs_claim_at\(\) ran on node group 0, not on group \d+ that holds its anchor's shard/,
	'fs_claim_at() that Citus does not delegate refuses to claim');
($ret, $out, $err) = $coord->psql('postgres',
	"SELECT count(*) FROM (SELECT * FROM fs_claimable_weight_at('fairshare-node-0', 'q') LIMIT 1) w");
like($err, qr/fs_claimable_weight_at\(\) ran on node group 0, not on group \d+/,
	'so does fs_claimable_weight_at()');
# A NULL tenant or anchor in a call Citus would delegate is refused before
# Citus looks up its shard (Citus 13.2 crashes the backend on that).
for my $call ("SELECT fs_claimable_weight_at(NULL, 'q')", "SELECT * FROM fs_release_slot_at(NULL, 1)",
	"BEGIN; SELECT fs_claim_at(NULL, 'q', NULL::jobs, 1); COMMIT")
{
	($ret, $out, $err) = $coord->psql('postgres', $call);
	like($err, qr/node_anchor must not be null/, "a NULL anchor is refused: $call");
}
for my $call ("SELECT fs_acquire_slot(NULL, 'q')", "SELECT * FROM fs_spend_tokens(NULL, 1)",
	"BEGIN; SELECT fs_charge_tokens(NULL, 1.0); COMMIT",
	"PREPARE a(text) AS SELECT fs_acquire_slot(\$1, 'q'); EXECUTE a(NULL)")
{
	($ret, $out, $err) = $coord->psql('postgres', $call);
	like($err, qr/tenant must not be null/, "a NULL tenant is refused: $call");
}
is($q->("SELECT 1"), 1, 'and the coordinator is still up');

# One claim in a transaction after another, each claimed, started and taken
# out of the ready table: the first node holds 1 tenant of weight 1, the
# second 3, so the first serves a quarter of the claims.
$q->("INSERT INTO jobs SELECT t, i FROM unnest(ARRAY['$a1', '$b1', '$b2', '$b3']) t, generate_series(1, 50) i");
sleep 1;	# the scheduler's weights
my $session = $coord->background_psql('postgres');
my $pid = $session->query_safe("SELECT pg_backend_pid()");
my %by_node;
for (1 .. 40)
{
	$session->query_safe("BEGIN");
	my $row = $session->query_safe(
		"SELECT tenant || '|' || (job).id || '|' || fs_lease_node(lease_id) FROM fs_claim('q', NULL::jobs, 1)");
	my ($t, $id, $node) = split /\|/, $row;
	$session->query_safe("INSERT INTO running VALUES ('$t', $id); DELETE FROM jobs WHERE tenant = '$t' AND id = $id; COMMIT");
	$by_node{$node}++;
}
is(join(',', map { $by_node{$_} // 0 } @groups), '10,30', 'claims go to the nodes by their tenants\' weights (10 and 30 of 40)');
is($q->("SELECT count(*) FROM running"), 40, 'every claimed job runs');
is($q->("SELECT count(*) FROM pg_dist_transaction WHERE gid LIKE 'citus\\_0\\_${pid}\\_%'"), 0,
	'and every claiming transaction committed in one phase');
is(join(',', map { $_->safe_psql('postgres', "SELECT count(*) FROM fs_leases WHERE queue = 'q'") } @by_group{@groups}),
	'10,30', "each node holds the leases of its claims");
$q->("DELETE FROM running WHERE tenant = '$a1'");
$q->("DELETE FROM running WHERE tenant IN ('$b1', '$b2', '$b3')");
is(join(',', map { $_->safe_psql('postgres', "SELECT count(*) FROM fs_leases WHERE queue = 'q'") } @by_group{@groups}),
	'0,0', 'finished jobs release their leases on their nodes');

# A transaction keeps to the node of its first claim: its second claim
# comes from there too, while the other node has rows.
$session->query_safe("BEGIN");
my @nodes = map { $session->query_safe("SELECT fs_lease_node(lease_id) FROM fs_claim('q', NULL::jobs, 1)") } 1 .. 4;
$session->query_safe("ROLLBACK");
is(scalar(grep { $_ eq $nodes[0] } @nodes), 4, 'every claim of a transaction comes from its first claim\'s node');
# Outside a transaction block each claim is its own (20: the four claims
# rolled back above count in their node's pass, as claims that were made).
@nodes = map { $session->query_safe("SELECT fs_lease_node(lease_id) FROM fs_claim('q', NULL::jobs, 1)") } 1 .. 20;
ok((grep { $_ ne $nodes[0] } @nodes), 'outside a block claims go to both nodes');
$session->quit;

# Load: 8 claimers connected to the coordinator.  The first node holds a
# tenant of weight 1 and one capped at 1 job at a time; the second two of
# weight 1 and one of weight 2.  So the uncapped tenants' shares are 1:1:1:2
# of the whole cluster, whatever node they are on.
$q->("TRUNCATE jobs, running");
my ($capped) = $fresh{ $groups[0] }[1];
$q->("SELECT fs_set_limit('$b3', 'q', weight => 2)");
$q->("SELECT fs_set_limit('$capped', 'q', max_slots => 1)");
$q->("INSERT INTO jobs SELECT t, i FROM unnest(ARRAY['$a1', '$capped', '$b1', '$b2', '$b3']) t,"
	  . " generate_series(1, 20000) i");
$q->("CREATE TABLE served (tenant text, at timestamptz DEFAULT clock_timestamp())");
$q->("CREATE TABLE seen (tenant text, holders bigint)");
sleep 1;
fs_citus_claim_load($coord, $ENV{FS_CITUS_LOAD_SECONDS} // 10, [ $coord, 8 ]);
my %n = map { split /\|/ } split /\n/, $q->("SELECT tenant, count(*) FROM served GROUP BY 1");
my %weight = ($a1 => 1, $b1 => 1, $b2 => 1, $b3 => 2);
my $total = 0;
$total += $n{$_} // 0 for keys %weight;
cmp_ok($total, '>', 300, "the uncapped tenants were served $total jobs");
my %share = map { $_ => ($n{$_} // 0) / $total } keys %weight;
my ($sum, $sumsq) = (0, 0);
for (keys %weight)
{
	my $x = $share{$_} / $weight{$_};
	$sum += $x;
	$sumsq += $x * $x;
}
my $jain = $sum * $sum / (4 * $sumsq);
cmp_ok($jain, '>=', 0.99, sprintf("Jain's index of the weighted shares over all tenants of both nodes: %.4f", $jain));
ok(abs($share{$a1} - 0.2) <= 0.03 && abs($share{$b3} - 0.4) <= 0.04,
	sprintf("the first node's tenant has %.3f (of 0.2), the second's heavy one %.3f (of 0.4)", $share{$a1}, $share{$b3}));
is($q->("SELECT coalesce(max(holders), 0) FROM seen WHERE tenant = '$capped'"), 1,
	'the tenant capped at 1 never ran 2 jobs at once, and ran');
is(join(',', map { $_->safe_psql('postgres', 'SELECT count(*) FROM pg_prepared_xacts') } @workers), '0,0',
	'no prepared transaction is left');
is(join(',', map { $_->safe_psql('postgres', "SELECT count(*) FROM fs_leases WHERE queue = 'q'") } @workers), '0,0',
	'every lease was released');

# A shard moved to the other node: claims through the coordinator follow
# it, also in a session that claimed before the move.
$q->("TRUNCATE jobs, running");
$q->("INSERT INTO jobs SELECT '$b1', i FROM generate_series(1, 30) i");
my ($node_a, $node_b) = @by_group{@groups};
my $mover = $q->("SELECT get_shard_id_for_distribution_column('jobs', '$b1')");
my $claim_node = sub {
	my ($session) = @_;
	return $session->query_safe(
		"BEGIN; SELECT fs_lease_node(lease_id) FROM fs_claim('q', NULL::jobs, 1); ROLLBACK;");
};
my $claimer = $coord->background_psql('postgres');
sleep 1;	# the scheduler's weights
is($claim_node->($claimer), $groups[1], "before the move, ${b1}'s rows come from the second node");
$q->("SELECT citus_move_shard_placement($mover, '127.0.0.1', " . $node_b->port . ", '127.0.0.1', "
	  . $node_a->port . ", shard_transfer_mode => 'block_writes')");
sleep 1;
is($claim_node->($claimer), $groups[0], 'after it, from the first node, in the same session');
$claimer->quit;

# When no node has claimable weight as last asked, a session's claims try
# the nodes in turn, so that a row that came since is found on whichever
# node holds it.  The scheduler serves another database here, so nothing
# asks the weights but a claim outside a block (when they are a second
# old); a block's claims never do.
$q->("CREATE TABLE tjobs (tenant text NOT NULL, id bigint NOT NULL, PRIMARY KEY (tenant, id))");
$q->("SELECT create_distributed_table('tjobs', 'tenant', colocate_with => 'jobs')");
$q->("SELECT fs_register_queue('tq', 'tjobs', 'tenant', 'id', key => 'id')");
my $log_offset = -s $coord->logfile;
$coord->append_conf('postgresql.conf', "fairshare.database = 'template1'");
$coord->reload;
$coord->wait_for_log(qr/fairshare scheduler stopping in database "postgres"/, $log_offset);
my $turns = $coord->background_psql('postgres');
is($turns->query_safe("SELECT count(*) FROM fs_claim('tq', NULL::tjobs, 1)"), 0,
	'outside a block, a claim of an empty queue asks every node: none has weight');
my ($late) = grep { $q->("SELECT fs_tenant_node('$_')") == $groups[-1] } map { "late-$_" } 1 .. 50;
$q->("INSERT INTO tjobs VALUES ('$late', 1)");
my @turn = map { $turns->query_safe("BEGIN; SELECT count(*) FROM fs_claim('tq', NULL::tjobs, 1); ROLLBACK;") } 1 .. 2;
is(join(',', @turn), '0,1',
	"with no weight anywhere, a block's claims try the nodes in turn: the second finds the second node's row");
$turns->quit;

done_testing();
