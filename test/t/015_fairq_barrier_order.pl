# Recounts of four queues while transactions change all of them: the commit
# barriers never hold a recount back for long.
#
# A recount closes its queue's commit barrier and waits for the commits inside
# to leave; a transaction that changed rows of two queues enters both barriers
# before it commits.  Entered in any order, a commit inside barrier A waiting at
# barrier B (closed by B's recount, which waits for a commit inside B that waits
# at A, closed by A's recount) would hold both recounts until they give up
# (after 10 s).  Commits enter the barriers in one order (the queues' ids), so
# a wait can only be for a barrier further along.
#
# 12 pgbench clients insert into and delete from the four tables in one
# transaction, in two orders, while four more recount one queue each in a
# loop.  Every recount must succeed and none may take a second; the counts
# equal the tables at the end.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $seconds = 15;
my $node = fs_node('fairq_barrier_order');
my $q = sub { $node->safe_psql('postgres', shift) };

my @queues = qw(ga gb gc gd);
for my $queue (@queues)
{
	$q->(qq{
		CREATE TABLE $queue (id bigserial PRIMARY KEY, tenant text NOT NULL);
		SELECT queue FROM fs_register_queue('$queue', '$queue', tenant => 'tenant', order_by => 'id');
		INSERT INTO $queue (tenant) SELECT 't' || i % 10 FROM generate_series(1, 1000) i;
	});
}
$q->('CREATE TABLE recounts (queue text NOT NULL, ms float8 NOT NULL, ready bigint)');

# Each queue changed by an insert and a delete, first in one order, then in
# the other.
my $all = "\\set t random(0, 9)\n";
for my $order ([@queues], [reverse @queues])
{
	$all .= "BEGIN;\n";
	$all .= "INSERT INTO $_ (tenant) VALUES ('t' || :t);\nDELETE FROM $_ WHERE id = (SELECT min(id) FROM $_);\n"
	  for @$order;
	$all .= "COMMIT;\n";
}
my $recount = q{
DO $$ DECLARE t0 timestamptz := clock_timestamp(); r bigint; BEGIN SELECT ready_rows INTO r FROM fs_resync('%s'); INSERT INTO recounts VALUES ('%s', extract(epoch FROM clock_timestamp() - t0) * 1000, r); END $$;
};

# One client recounts each queue all the time; twelve change them all.
my %bg;
local $ENV{PGHOST} = $node->host;
local $ENV{PGPORT} = $node->port;
my $dir = PostgreSQL::Test::Utils::tempdir();
for my $queue (@queues)
{
	my $path = "$dir/recount_$queue.sql";
	open(my $fh, '>', $path) or die "$path: $!";
	print $fh sprintf($recount, $queue, $queue);
	close $fh;
	my ($out, $err) = ('', '');
	$bg{$queue} = [ IPC::Run::start(
		[ 'pgbench', '--no-vacuum', '--client=1', "--time=$seconds", '-f', $path, 'postgres' ],
		'<', \undef, '>', \$out, '2>', \$err, IPC::Run::timeout($seconds + 120)), \$out, \$err ];
}
$node->pgbench(
	"--no-vacuum --client=12 --jobs=4 --time=$seconds --max-tries=20",
	0,
	[qr{number of failed transactions: 0 \(0\.000%\)}],
	[qr{^$}],
	'12 clients changed the four queues in one transaction, in two orders',
	{ 'all_queues' => $all });
for my $queue (sort keys %bg)
{
	my ($h, $out, $err) = @{ $bg{$queue} };
	ok($h->finish, "the client recounting $queue exited cleanly") or diag($$err);
}

# (A recount that finds the queue being recounted, by the other client or
# the background worker, returns NULL at once; one that gives up at a barrier
# returns NULL after 10 s.)
my ($n, $ran, $max) = split /\|/, $q->(q{
	SELECT count(*), count(ready), round(max(ms)::numeric, 1) FROM recounts});
cmp_ok($ran, '>', 100, "the queues were recounted ($ran of $n recounts ran)");
cmp_ok($max, '<', 1000, "no recount took a second (longest ${max} ms)");

for my $queue (@queues)
{
	is($q->(qq{
		SELECT count(*) FROM (SELECT tenant, ready_rows FROM fs_tenants WHERE queue = '$queue' AND ready_rows <> 0) s
		  FULL JOIN (SELECT tenant, count(*) AS n FROM $queue GROUP BY 1) t USING (tenant)
		 WHERE coalesce(s.ready_rows, 0) <> coalesce(t.n, 0)}),
		'0', "queue $queue counts its table exactly");
}
ok(!$node->log_contains(qr/terminated by signal|PANIC/), 'no backend crashed');

$node->stop;
done_testing();
