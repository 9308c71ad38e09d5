# Fair dequeue in two levels under real concurrency: 14 pgbench clients
# claim batches from a queue registered with a subkey (some claims rolled
# back, whole or to a savepoint), while others enqueue into old and new
# sub-keys and recount the queue.  Three tenants stay backlogged throughout:
# one spreads its rows over 1,000 sub-keys, one keeps a single sub-key, one
# has two sub-keys weighted 3 to 1.  Afterwards, from the claim log: each
# tenant got a third of the rows (within 5%), and inside the weighted one
# the sub-keys got 3 to 1 (within 5%), and the splitter's 1,000 sub-keys took
# turns (within 4 rows of each other); no row was claimed twice; and the
# sub-keys' counts in shared memory equal the table's, then drain to none.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $node = fs_node('subkeys_concurrency');
my $q = sub { $node->safe_psql('postgres', shift) };

$q->(q{
	CREATE TABLE sj (id bigserial PRIMARY KEY, tenant text NOT NULL, sub text, priority int NOT NULL DEFAULT 0);
	CREATE TABLE claimed (job_id bigint PRIMARY KEY, tenant text NOT NULL, sub text);
	SELECT queue FROM fs_register_queue('sq', 'sj', tenant => 'tenant', order_by => 'priority, id',
	       subkey => 'sub');
	INSERT INTO fs_subkey_weights (queue, tenant, subkey, weight) VALUES ('sq', 'pair', 'heavy', 3);
	INSERT INTO sj (tenant, sub) SELECT 'splitter', 'key' || (i % 1000) FROM generate_series(1, 40000) i;
	INSERT INTO sj (tenant, sub) SELECT 'single', 'only' FROM generate_series(1, 40000) i;
	INSERT INTO sj (tenant, sub) SELECT 'pair', CASE WHEN i % 2 = 0 THEN 'heavy' ELSE 'light' END
	  FROM generate_series(1, 40000) i;
	SELECT fs_reset();
});

# A batch, its rows deleted and its slots given back in its transaction.
my $batch = q{
\set n random(1, 10)
BEGIN;
WITH c AS (SELECT lease_id, (j.job).id, j.tenant, (j.job).sub FROM fs_claim('sq', NULL::sj, :n) j),
     d AS (DELETE FROM sj USING c WHERE sj.id = c.id),
     l AS (INSERT INTO claimed SELECT id, tenant, sub FROM c)
SELECT count(fs_release_slot(lease_id)) FROM c;
COMMIT;
};

# Claims undone, whole and to a savepoint, with one kept after it.
my $undo = q{
\set n random(1, 10)
BEGIN;
SELECT count(*) FROM fs_claim('sq', NULL::sj, :n);
ROLLBACK;
BEGIN;
SAVEPOINT a;
SELECT count(*) FROM fs_claim('sq', NULL::sj, :n);
ROLLBACK TO a;
WITH c AS (SELECT lease_id, (j.job).id, j.tenant, (j.job).sub FROM fs_claim('sq', NULL::sj, 2) j),
     d AS (DELETE FROM sj USING c WHERE sj.id = c.id),
     l AS (INSERT INTO claimed SELECT id, tenant, sub FROM c)
SELECT count(fs_release_slot(lease_id)) FROM c;
COMMIT;
};

# New rows, in old and new sub-keys (and some rolled back); rows moved
# between sub-keys; recounts now and then.
my $enqueue = q{
\set k random(1, 3000)
INSERT INTO sj (tenant, sub) VALUES ('splitter', 'key' || :k), ('single', 'only'),
       ('pair', CASE WHEN :k % 2 = 0 THEN 'heavy' ELSE 'light' END);
BEGIN;
INSERT INTO sj (tenant, sub) VALUES ('splitter', 'gone' || :k);
ROLLBACK;
UPDATE sj SET sub = 'key' || (:k % 1000) WHERE id = (SELECT id FROM sj WHERE tenant = 'splitter' AND id % 97 = :k % 97 LIMIT 1 FOR UPDATE SKIP LOCKED);
};
my $recount = q{
SELECT count(*) FROM fs_resync('sq');
\sleep 200 ms
};

$node->pgbench(
	'--no-vacuum --client=14 --jobs=4 --time=10 --max-tries=1',
	0,
	[qr{number of failed transactions: 0 \(0\.000%\)}],
	[qr{^$}],
	'14 clients claim, undo, enqueue and recount a queue with sub-keys',
	{
		'sk_batch@8' => $batch,
		'sk_undo@2' => $undo,
		'sk_enqueue@3' => $enqueue,
		'sk_recount@1' => $recount,
	});

my $served = $q->("SELECT count(*) FROM claimed");
ok($served > 3000, "many rows were claimed concurrently ($served)");
is($q->("SELECT count(DISTINCT tenant) FROM sj"), '3', 'every tenant stayed backlogged');

# One share per tenant, however many sub-keys it has.
my $shares = $q->(q{
	SELECT string_agg(tenant || ' ' || round(share * 3, 3), ', ' ORDER BY tenant)
	  FROM (SELECT tenant, count(*)::numeric / sum(count(*)) OVER () AS share
	          FROM claimed GROUP BY 1) s});
is($q->(q{
	SELECT string_agg(tenant, ', ')
	  FROM (SELECT tenant, count(*)::numeric / sum(count(*)) OVER () AS share
	          FROM claimed GROUP BY 1) s
	 WHERE abs(share * 3 - 1) >= 0.05}), '', "each tenant served a third within 5% ($shares)");
my $pair = $q->(q{
	SELECT round(count(*) FILTER (WHERE sub = 'heavy')::numeric / count(*), 4)
	  FROM claimed WHERE tenant = 'pair'});
ok(abs($pair / 0.75 - 1) < 0.05, "inside the weighted tenant, 3 to 1 within 5% ($pair of its rows to the heavier)");
my $spread = $q->(q{
	SELECT count(*) || ' ' || min(c) || ' ' || max(c)
	  FROM (SELECT sub, count(*) AS c FROM claimed WHERE tenant = 'splitter' AND sub ~ '^key[0-9]{1,3}$' GROUP BY 1) s});
my ($nkeys, $min, $max) = split / /, $spread;
ok($nkeys == 1000 && $max - $min <= 4, "the splitter's sub-keys took turns ($nkeys keys, $min to $max rows each)");

# What is left counts exactly, per sub-key, then drains.
is($q->(q{
	SELECT count(*) FROM (SELECT tenant, coalesce(sub, '*') AS sub, count(*) AS c FROM sj GROUP BY 1, 2) t
	  FULL JOIN fs_fair_subkeys('sq') f ON f.tenant = t.tenant AND f.subkey = t.sub
	 WHERE t.c IS DISTINCT FROM f.ready_rows}), '0', 'every sub-key counts what the table has');
fs_check_drains($node, 'sq', 'sj');
is($q->("SELECT count(*) FROM fs_fair_subkeys('sq')"), '0', 'no sub-key is left in shared memory');

$node->stop;
done_testing();
