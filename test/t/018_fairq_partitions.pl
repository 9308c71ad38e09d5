# A partitioned ready table: the parent registered as a queue, one of its
# partitions as another queue of its own, in either order.  Each row fires
# one trigger (the parent's, cloned to every partition, serves both
# queues), so both backlogs equal their tables; a partition made later is
# covered; TRUNCATE of one partition recounts the parent's queue; claims
# lock rows FOR UPDATE SKIP LOCKED through the parent; unregistering the
# parent gives the partition its own trigger back.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $node = fs_node('fairq_partitions');
my $q = sub { $node->safe_psql('postgres', shift) };

$q->(q{
	CREATE TABLE pj (id bigint PRIMARY KEY, tenant text NOT NULL) PARTITION BY RANGE (id);
	CREATE TABLE pj_1 PARTITION OF pj FOR VALUES FROM (0) TO (1000);
	CREATE TABLE pj_2 PARTITION OF pj FOR VALUES FROM (1000) TO (2000);
	SELECT fs_set_limit('*', 'all', max_slots => 100);
	SELECT fs_set_limit('*', 'first', max_slots => 100);
});
is($q->("SELECT queue FROM fs_register_queue('all', 'pj', tenant => 'tenant', order_by => 'id')"),
	'all', 'the partitioned parent registers');
is($q->("SELECT queue FROM fs_register_queue('first', 'pj_1', tenant => 'tenant', order_by => 'id')"),
	'first', 'and so does one of its partitions, as a queue of its own');

my $backlog = sub {
	my ($queue) = @_;
	return $q->("SELECT coalesce(sum(ready_rows), 0) FROM fs_tenants WHERE queue = '$queue'");
};
my $count = sub { $q->("SELECT count(*) FROM " . shift) };
my $own_triggers = q{SELECT string_agg(tgrelid::regclass || ':' || tgname, ' ' ORDER BY tgrelid::regclass::text, tgname)
	FROM pg_trigger WHERE tgname LIKE 'fs_fair_ready%' AND tgparentid = 0};

$q->("INSERT INTO pj SELECT i, 't' || (i % 3) FROM generate_series(1, 1999) i");
is($backlog->('all'), '1999', 'the parent\'s queue counts every row once');
is($backlog->('first'), '999', 'the partition\'s queue counts its own rows once');
is($q->($own_triggers),
	'pj:fs_fair_ready pj:fs_fair_ready_truncate pj_1:fs_fair_ready_truncate pj_2:fs_fair_ready_truncate',
	'one row trigger, on the parent (cloned to the partitions); a TRUNCATE trigger on each');

# A partition made later is covered by the parent's trigger.
$q->("CREATE TABLE pj_3 PARTITION OF pj FOR VALUES FROM (2000) TO (3000)");
$q->("INSERT INTO pj SELECT i, 'late' FROM generate_series(2000, 2099) i");
is($backlog->('all'), '2099', 'rows of a partition made later are counted');

# Claims lock rows through the parent, in fair order, and leave both counts right.
is($q->(q{WITH c AS (SELECT (j.job).id FROM fs_claim('all', NULL::pj, 30) j)
	DELETE FROM pj WHERE id IN (SELECT id FROM c) RETURNING 1}) =~ tr/\n// + 1, 30,
	'fs_claim() claims 30 rows of the partitioned table');
is($backlog->('all'), $count->('pj'), 'the parent\'s backlog equals its table after the claim');
is($backlog->('first'), $count->('pj_1'), 'and the partition\'s equals its own');
is($q->(q{WITH c AS (SELECT (j.job).id FROM fs_claim('first', NULL::pj_1, 5) j)
	DELETE FROM pj_1 WHERE id IN (SELECT id FROM c) RETURNING 1}) =~ tr/\n// + 1, 5,
	'the partition\'s queue claims from the partition');
is($backlog->('all'), $count->('pj'), 'both backlogs still equal their tables');
is($backlog->('first'), $count->('pj_1'), 'the partition\'s too');

# TRUNCATE of one partition: the parent's queue is recounted at its next use.
$q->("TRUNCATE pj_2");
$q->("BEGIN; SELECT count(*) FROM fs_claim('all', NULL::pj, 1); ROLLBACK");
is($backlog->('all'), $count->('pj'), 'after TRUNCATE of a partition, the parent\'s backlog equals its table');

# Unregistered, the parent leaves the partition its own trigger.
$q->("DELETE FROM pj WHERE id BETWEEN 900 AND 999");
is($backlog->('first'), $count->('pj_1'), 'deletes through the parent count once in the partition\'s queue');
$q->("SELECT fs_unregister_queue('all')");
is($q->($own_triggers), 'pj_1:fs_fair_ready pj_1:fs_fair_ready_truncate',
	'with the parent unregistered, the partition has its own triggers');
$q->("INSERT INTO pj VALUES (900, 'after')");
is($backlog->('first'), $count->('pj_1'), 'and its queue still counts its rows');

# The other order: the partition first, then the parent.
is($q->("SELECT queue FROM fs_register_queue('all', 'pj', tenant => 'tenant', order_by => 'id')"),
	'all', 'the parent registers again with a registered partition below it');
$q->("INSERT INTO pj VALUES (901, 'again'), (1500, 'again')");
is($backlog->('first'), $count->('pj_1'), 'the partition\'s queue counts each row once');
$q->("SELECT count(*) FROM fs_resync('all')");
$q->("INSERT INTO pj VALUES (902, 'again')");
is($backlog->('all'), $count->('pj'), 'and the parent\'s too');

# A partition's registration that passes the whole row to a function (by
# the partition's own name) is compiled against the partition, not the
# parent, when the parent's trigger reads its columns.
$q->(q{
	CREATE FUNCTION tenant_of(pj_2) RETURNS text IMMUTABLE LANGUAGE sql AS $$ SELECT $1.tenant $$;
	SELECT fs_unregister_queue('first');
});
is($q->("SELECT queue FROM fs_register_queue('second', 'pj_2', tenant => 'tenant_of(pj_2)', order_by => 'id')"),
	'second', 'a partition registers with a whole-row expression');
is($q->("SELECT queue FROM fs_register_queue('all', 'pj', tenant => 'tenant', order_by => 'id')"),
	'all', 'and its parent registers again above it');
$q->("BEGIN; SELECT count(*) FROM fs_claim('second', NULL::pj_2, 1); ROLLBACK");
$q->("INSERT INTO pj VALUES (1501, 'whole')");
is($backlog->('second'), $count->('pj_2'), 'the partition\'s queue counts its rows once');
is($q->("SELECT fs_unregister_queue('all')"), 't', 'the parent unregisters');

$node->stop;
done_testing();
