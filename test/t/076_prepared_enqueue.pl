# Jobs enqueued in prepared transactions under real concurrency: one
# session enqueues rows of random tenants (and sub-keys) and prepares,
# another commits (or rolls back) each prepared transaction, as Citus does
# from its own connections, while 6 pgbench clients claim and delete rows
# and a recount runs now and then.  A prepared transaction's rows are
# counted at COMMIT PREPARED and never before; a rolled-back one's never:
# afterwards the counts equal the table's, no rolled-back row was ever
# claimed, nothing is left prepared, and the queue drains.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $node = fs_node('prepared_enqueue', "max_prepared_transactions = 20\n");
my $q = sub { $node->safe_psql('postgres', shift) };

$q->(q{
	CREATE TABLE pj (id bigserial PRIMARY KEY, tenant text NOT NULL, sub text NOT NULL,
	                 rolled_back boolean NOT NULL DEFAULT false);
	CREATE TABLE claimed (job_id bigint PRIMARY KEY, rolled_back boolean NOT NULL);
	SELECT queue FROM fs_register_queue('pe', 'pj', tenant => 'tenant', order_by => 'id', subkey => 'sub');
	INSERT INTO pj (tenant, sub) SELECT 'base' || (i % 5), 's' || (i % 3) FROM generate_series(1, 20000) i;
});

my $claim = q{
\set n random(1, 10)
WITH c AS (SELECT lease_id, (j.job).id, (j.job).rolled_back FROM fs_claim('pe', NULL::pj, :n) j),
     d AS (DELETE FROM pj USING c WHERE pj.id = c.id),
     l AS (INSERT INTO claimed SELECT id, rolled_back FROM c)
SELECT count(fs_release_slot(lease_id)) FROM c;
};
my $recount = q{
SELECT count(*) FROM fs_resync('pe');
\sleep 100 ms
};
my $script_dir = $node->basedir;
PostgreSQL::Test::Utils::append_to_file("$script_dir/claim.sql", $claim);
PostgreSQL::Test::Utils::append_to_file("$script_dir/recount.sql", $recount);
my @cmd = ('pgbench', '-n', '-c', '6', '-j', '2', '-T', '8',
	'-f', "$script_dir/claim.sql\@20", '-f', "$script_dir/recount.sql\@1",
	'-h', $node->host, '-p', $node->port, 'postgres');
my ($stdout, $stderr) = ('', '');
my $bench = IPC::Run::start(\@cmd, '>', \$stdout, '2>', \$stderr);

my $preparer = $node->background_psql('postgres');
my $finisher = $node->background_psql('postgres');
my ($committed, $rolled_back) = (0, 0);
my $i = 0;
while ($bench->pumpable)
{
	$i++;
	my $back = $i % 5 == 0 ? 1 : 0;
	my $tenants = 1 + $i % 4;
	$preparer->query_safe(
		"BEGIN; INSERT INTO pj (tenant, sub, rolled_back)"
		  . " SELECT 'p' || ($i + t) % 40, 's' || (t % 2), ${back}::boolean FROM generate_series(1, $tenants) t,"
		  . " generate_series(1, 3); PREPARE TRANSACTION 'pe_$i'");
	$finisher->query_safe(($back ? 'ROLLBACK' : 'COMMIT') . " PREPARED 'pe_$i'");
	$back ? $rolled_back++ : $committed++;
	$bench->pump_nb;
}
$bench->finish;
$preparer->quit;
$finisher->quit;
like($stdout, qr/number of failed transactions: 0/, 'no claim failed') or diag($stderr);
cmp_ok($committed, '>', 50, "$committed prepared enqueues committed in another session");
cmp_ok($rolled_back, '>', 10, "$rolled_back rolled back");
is($q->("SELECT count(*) FROM pg_prepared_xacts"), '0', 'nothing is left prepared');
is($q->("SELECT count(*) FROM claimed WHERE rolled_back"), '0', 'no rolled-back row was ever claimed');
cmp_ok($q->("SELECT count(*) FROM claimed"), '>', 1000, 'the clients claimed rows meanwhile');
is($q->("SELECT count(*) FROM pj WHERE rolled_back"), '0', 'and none is in the table');
is( $q->(q{SELECT count(*) FROM (SELECT tenant, sub, count(*) AS n FROM pj GROUP BY 1, 2) t
	  FULL JOIN fs_fair_subkeys('pe') s ON s.tenant = t.tenant AND s.subkey = t.sub
	  WHERE coalesce(t.n, 0) <> coalesce(s.ready_rows, 0)}),
	'0', 'every sub-key counts what the table has');
fs_check_drains($node, 'pe', 'pj');

$node->stop;
done_testing();
