# Jobs enqueued in prepared transactions under real concurrency: one
# session enqueues rows of random tenants into two queues (one with
# sub-keys, one without, whose busy tenants get probe starts) and prepares;
# two other sessions race to commit (or roll back) each prepared
# transaction, as Citus and its recovery may, while 6 pgbench clients claim
# and delete rows and a recount runs now and then.  A prepared
# transaction's rows are counted at COMMIT PREPARED and never before, a
# rolled-back one's never: afterwards the counts equal the tables', no
# rolled-back row was ever claimed, nothing is left prepared, and the queues
# drain.
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
	CREATE TABLE pj2 (id bigserial PRIMARY KEY, tenant text NOT NULL,
	                  rolled_back boolean NOT NULL DEFAULT false);
	CREATE TABLE claimed (job_id bigint, queue text, rolled_back boolean NOT NULL,
	                      PRIMARY KEY (queue, job_id));
	SELECT queue FROM fs_register_queue('pe', 'pj', tenant => 'tenant', order_by => 'id', subkey => 'sub');
	SELECT queue FROM fs_register_queue('pe2', 'pj2', tenant => 'tenant', order_by => 'id');
	INSERT INTO pj (tenant, sub) SELECT 'base' || (i % 5), 's' || (i % 3) FROM generate_series(1, 20000) i;
	INSERT INTO pj2 (tenant) SELECT 'base' || (i % 5) FROM generate_series(1, 20000) i;
});

my $claim = q{
\set n random(1, 10)
WITH c AS (SELECT lease_id, (j.job).id, (j.job).rolled_back FROM fs_claim('pe', NULL::pj, :n) j),
     d AS (DELETE FROM pj USING c WHERE pj.id = c.id),
     l AS (INSERT INTO claimed SELECT id, 'pe', rolled_back FROM c)
SELECT count(fs_release_slot(lease_id)) FROM c;
WITH c AS (SELECT lease_id, (j.job).id, (j.job).rolled_back FROM fs_claim('pe2', NULL::pj2, :n) j),
     d AS (DELETE FROM pj2 USING c WHERE pj2.id = c.id),
     l AS (INSERT INTO claimed SELECT id, 'pe2', rolled_back FROM c)
SELECT count(fs_release_slot(lease_id)) FROM c;
};
my $recount = q{
SELECT count(*) FROM fs_resync('pe');
SELECT count(*) FROM fs_resync('pe2');
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
my @finishers = map { $node->background_psql('postgres', on_error_stop => 0) } 1 .. 2;
my ($committed, $rolled_back, $raced) = (0, 0, 0);
my $i = 0;
while ($bench->pumpable)
{
	$i++;
	my $back = $i % 5 == 0 ? 1 : 0;
	my $tenants = 1 + $i % 4;
	$preparer->query_safe(
		"BEGIN; INSERT INTO pj (tenant, sub, rolled_back)"
		  . " SELECT 'p' || ($i + t) % 40, 's' || (t % 2), ${back}::boolean FROM generate_series(1, $tenants) t,"
		  . " generate_series(1, 3);"
		  . " INSERT INTO pj2 (tenant, rolled_back) SELECT 'p' || ($i + t) % 40, ${back}::boolean"
		  . " FROM generate_series(1, $tenants) t, generate_series(1, 3);"
		  . " PREPARE TRANSACTION 'pe_$i'");
	# Both finishers send the same end at once: one ends it, the other
	# finds it busy or gone.
	my $end = ($back ? 'ROLLBACK' : 'COMMIT') . " PREPARED 'pe_$i'";
	my $first = $finishers[$i % 2];
	my $second = $finishers[1 - $i % 2];
	$first->{stdin} .= "$end;\n\\echo done_$i\n";
	$second->{stdin} .= "$end;\n\\echo done_$i\n";
	PostgreSQL::Test::Utils::pump_until($_->{run}, $_->{timeout}, \$_->{stdout}, qr/done_$i/)
	  or die "a finisher did not answer" for ($first, $second);
	$raced++ if ($first->{stderr} . $second->{stderr}) =~ /busy|does not exist/;
	$_->{stdout} = $_->{stderr} = '' for @finishers;
	$back ? $rolled_back++ : $committed++;
	$bench->pump_nb;
}
$bench->finish;
$preparer->quit;
$_->quit for @finishers;
like($stdout, qr/number of failed transactions: 0/, 'no claim failed') or diag($stderr);
cmp_ok($committed, '>', 50, "$committed prepared enqueues committed in another session");
cmp_ok($rolled_back, '>', 10, "$rolled_back rolled back");
cmp_ok($raced, '>', 0, "the second finisher lost the race $raced times");
is($q->("SELECT count(*) FROM pg_prepared_xacts"), '0', 'nothing is left prepared');
is($q->("SELECT count(*) FROM claimed WHERE rolled_back"), '0', 'no rolled-back row was ever claimed');
cmp_ok($q->("SELECT count(*) FROM claimed"), '>', 1000, 'the clients claimed rows meanwhile');
is($q->("SELECT count(*) FROM pj WHERE rolled_back") + $q->("SELECT count(*) FROM pj2 WHERE rolled_back"),
	0, 'and none is in the tables');
is( $q->(q{SELECT count(*) FROM (SELECT tenant, sub, count(*) AS n FROM pj GROUP BY 1, 2) t
	  FULL JOIN fs_fair_subkeys('pe') s ON s.tenant = t.tenant AND s.subkey = t.sub
	  WHERE coalesce(t.n, 0) <> coalesce(s.ready_rows, 0)}),
	'0', 'every sub-key counts what the table has');
fs_check_drains($node, 'pe', 'pj');
fs_check_drains($node, 'pe2', 'pj2');

$node->stop;
done_testing();
