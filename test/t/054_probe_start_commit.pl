# A commit that puts rows into the ready state makes them visible before
# its commit callback voids the tenant's probe start.  In that window no
# claim may use the start: the debug build's pause point holds such a
# commit there for three seconds, and meanwhile a claim in another session
# takes the new row first.  On the normal build the pause point does not
# exist and the test is skipped.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $node = fs_node('probe_start_commit');
my $q = sub { $node->safe_psql('postgres', shift) };

if ($q->("SELECT current_setting('fairshare.debug_pause', true) IS NULL") eq 't')
{
	$node->stop;
	plan skip_all => 'the pause point is in the debug build only (make FS_DEBUG=1)';
}

$q->(q{
	CREATE TABLE pj (id int PRIMARY KEY, tenant text NOT NULL);
	SELECT queue FROM fs_register_queue('pq', 'pj', 'tenant', 'id');
	INSERT INTO pj SELECT i, 'a' FROM generate_series(100, 2000) i;
	SELECT fs_resync('pq');
});
# Claims 100 rows and deletes them: the first row it took.
my $take = q{
	WITH c AS (SELECT (job).id FROM fs_claim('pq', NULL::pj, 100) j),
	     d AS (DELETE FROM pj USING c WHERE pj.id = c.id RETURNING pj.id)
	SELECT min(id) FROM d};
is($q->($take), '100', 'the first claim takes the first rows');
is($q->($take), '200', 'the second the next');
is($q->($take), '300', 'the third the next: the start is past 200');

my $bg = $node->background_psql('postgres');
my $pid = $bg->query_safe('SELECT pg_backend_pid()');
$bg->query_safe("SET fairshare.debug_pause = 'commit_visible:3000'");
$bg->query_until(qr/started/, "\\echo started\nINSERT INTO pj VALUES (5, 'a');\n");
ok($node->poll_query_until('postgres', 'SELECT count(*) = 1 FROM pj WHERE id = 5'),
	'the row is visible while its commit is held');
is($q->($take), '5', 'a claim in the window takes it first');
is($q->("SELECT state FROM pg_stat_activity WHERE pid = $pid"), 'active',
	'and the commit was still held when it did');
$bg->query_safe('SELECT 1');
$bg->quit;

is($q->($take), '499', 'claims go on in order (the one in the window took 5 and 400 to 498)');
ok(!$node->log_contains(qr/terminated by signal|invariant violated/), 'no crash, no broken invariant');
$node->stop;
done_testing();
