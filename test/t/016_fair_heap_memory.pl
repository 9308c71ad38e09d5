# Shared memory grows with each setting on its own, never with their
# product: fairshare takes at most 320 bytes per tenant entry
# (fairshare.max_tenants), 2.5 kB per queue (fairshare.max_queues) and
# 296 bytes per lease (fairshare.max_leases), 300 bytes per sub-key entry
# (fairshare.max_subkeys, 10,000 here), plus 8 MB for the rest; the
# fair order ("fairshare fair dequeue") at most 40 bytes per tenant and 2 kB
# per queue, plus 64 kB.  These are the bounds README.md gives (with the
# figures measured).  Checked in pg_shmem_allocations at the defaults and
# at 10,000 queues with a million tenants, where a directory per queue sized
# for every tenant would take over 600 MB on its own, and with a million
# leases.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

# Shared memory allocated by a node: everything named (the anonymous part
# holds the hash tables' entries), and fairshare's fair order.
sub allocated
{
	my ($node) = @_;
	my ($total, $fair) = split /\|/, $node->safe_psql('postgres', q{
		SELECT sum(allocated_size) FILTER (WHERE name IS NOT NULL),
		       coalesce(sum(allocated_size) FILTER (WHERE name = 'fairshare fair dequeue'), 0)
		  FROM pg_shmem_allocations});
	return ($total, $fair);
}

# The same server without fairshare: what PostgreSQL itself takes.
my $plain = PostgreSQL::Test::Cluster->new('plain');
$plain->init;
{
	open(my $fh, '<', fs_src() . '/test/fairshare.conf') or die "fairshare.conf: $!";
	local $/;
	$plain->append_conf('postgresql.conf', <$fh>);
	close $fh;
}
$plain->append_conf('postgresql.conf', "shared_preload_libraries = ''");
$plain->start;
my ($base) = allocated($plain);
$plain->stop;
ok($base > 0, "PostgreSQL alone allocates $base bytes");

for my $case ([10000, 1024, 16384, 'the defaults'],
	[1000000, 10000, 16384, 'a million tenants in 10,000 queues'],
	[10000, 1024, 1000000, 'a million leases'])
{
	my ($tenants, $queues, $leases, $what) = @$case;
	my $node = fs_node("memory_${tenants}_${queues}_$leases",
		"fairshare.max_tenants = $tenants\nfairshare.max_queues = $queues\n" .
		  "fairshare.max_leases = $leases\nfairshare.max_subkeys = 10000");
	my ($total, $fair) = allocated($node);
	my $fair_bound = 40 * $tenants + 2048 * $queues + 65536;
	my $bound = 320 * $tenants + 2560 * $queues + 296 * $leases + 300 * 10000 + 8 * 1024 * 1024;

	ok($fair > 0 && $fair <= $fair_bound,
		"$what: the fair order takes $fair bytes, within $fair_bound");
	ok($total - $base <= $bound,
		"$what: fairshare takes " . ($total - $base) . " bytes, within $bound");
	is($node->safe_psql('postgres', 'SELECT max_tenants FROM fs_stats'), $tenants,
		"$what: the server runs with them");
	$node->stop;
}

done_testing();
