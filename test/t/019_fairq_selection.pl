# A claim's selection: a queue registered with a selector (here the job's
# kind, as Solid Queue's and GoodJob's queue_name) is claimed from with
# fs_claim(..., selector_in => names or patterns, selector_not_in => ...),
# as a worker serving some of a table's queues does.  The rows claimed are
# those selected, in fair order among the tenants that have such rows; a
# tenant with no row in a selection is not held back for other claims; the
# patterns are data (no SQL, LIKE's own wildcards taken literally); and a
# selection on a queue without a selector is refused.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $node = fs_node('fairq_selection');
my $q = sub { $node->safe_psql('postgres', shift) };

$q->(q{
	CREATE TABLE jobs (id bigserial PRIMARY KEY, tenant text NOT NULL, kind text NOT NULL);
	SELECT fs_set_limit('*', 'sel', max_slots => 1000);
	SELECT queue FROM fs_register_queue('sel', 'jobs', tenant => 'tenant', order_by => 'id',
	       selector => 'kind');
	-- big has 300 rows of kind 'default', 30 'mailers'; small1 and small2 10 'mailers' each;
	-- odd has rows of kinds 'report_%' and 'reportX'.
	INSERT INTO jobs (tenant, kind) SELECT 'big', 'default' FROM generate_series(1, 300);
	INSERT INTO jobs (tenant, kind) SELECT 'big', 'mailers' FROM generate_series(1, 30);
	INSERT INTO jobs (tenant, kind) SELECT 'small' || (1 + i % 2), 'mailers' FROM generate_series(1, 20) i;
	INSERT INTO jobs (tenant, kind) VALUES ('odd', 'report_%'), ('odd', 'reportX');
});
is($q->("SELECT selector FROM fs_fair_queues WHERE queue = 'sel'"), 'kind', 'the selector is stored');

my $claim = sub {
	my ($args) = @_;
	return $q->(qq{
		WITH c AS (SELECT tenant, (job).id, (job).kind FROM fs_claim('sel', NULL::jobs, 6, '1 minute', $args)),
		     d AS (DELETE FROM jobs USING c WHERE jobs.id = c.id)
		SELECT string_agg(tenant || ':' || kind, ' ' ORDER BY tenant, id) FROM c});
};

is($claim->("selector_in => '{mailers}'"), 'big:mailers big:mailers small1:mailers small1:mailers small2:mailers small2:mailers',
	'selector_in: only mailers, in fair order over the three tenants that have some');
is($claim->("selector_in => '{mail*}'"), 'big:mailers big:mailers small1:mailers small1:mailers small2:mailers small2:mailers',
	'a pattern with * selects the same');
is($claim->("selector_not_in => '{default,mailers}'"), 'odd:report_% odd:reportX',
	'selector_not_in leaves those out');
$q->("INSERT INTO jobs (tenant, kind) VALUES ('odd', 'report_%'), ('odd', 'reportX')");
is($claim->(q{selector_in => '{report_%}'}), 'odd:report_%',
	'% and _ in a name are taken literally, not as LIKE wildcards');
my $rows = $q->("SELECT count(*) FROM jobs");
is($claim->(q{selector_in => ARRAY['x'') OR true OR (''']}), '',
	'a pattern is data: quotes select nothing');
is($q->("SELECT count(*) FROM jobs"), $rows, 'and claim nothing');

# Tenants a selective claim finds without rows in its selection are not
# marked short for other claims (fs_fairness.short_probes counts the marks).
is($claim->("selector_in => '{nothing}'"), '', 'a selection with no rows claims nothing');
is($claim->("selector_in => '{mailers}', selector_not_in => '{mail*}'"), '', 'nor does an empty one');
is($q->("SELECT short_probes FROM fs_fairness WHERE queue = 'sel'"), '0',
	'no tenant was marked short by the selective claims');
is($claim->("selector_in => '{mailers}'"), 'big:mailers big:mailers small1:mailers small1:mailers small2:mailers small2:mailers',
	'the next mailers claim goes on in fair order');
like($claim->("NULL"), qr/^big:default big:default /,
	'and a claim with no selection serves big with the others at once (not passed over)');

# Many tenants ahead in the fair order without rows in a selection do not
# hold its rows back: past them, the rest come in the queue's own order.
$q->(q{
	CREATE TABLE sjobs (id bigserial PRIMARY KEY, tenant text NOT NULL, kind text NOT NULL);
	SELECT fs_set_limit('*', 'starve', max_slots => 1000);
	SELECT queue FROM fs_register_queue('starve', 'sjobs', tenant => 'tenant', order_by => 'id',
	       selector => 'kind');
	INSERT INTO sjobs (tenant, kind) SELECT 'm', 'mailers' FROM generate_series(1, 5);
});
my $sclaim = sub {
	my ($n) = @_;
	return $q->(qq{
		WITH c AS (SELECT tenant, (job).id, (job).kind FROM fs_claim('starve', NULL::sjobs, $n, '1 minute',
		                                                       selector_in => '{mailers}')),
		     d AS (DELETE FROM sjobs USING c WHERE sjobs.id = c.id)
		SELECT string_agg(tenant || ':' || kind, ' ' ORDER BY id) FROM c});
};
is($sclaim->(2), 'm:mailers m:mailers', 'm is served (its tag moves on)');
$q->("INSERT INTO sjobs (tenant, kind) SELECT 'r' || i, 'reports' FROM generate_series(1, 40) i");
is($sclaim->(1), 'm:mailers',
	'40 tenants ahead of m with only reports rows do not hold back a mailers claim');
is($q->("SELECT count(*) FROM sjobs WHERE kind = 'reports'"), '40', 'and their rows stay');

# Errors.
$q->(q{
	CREATE TABLE plain_jobs (id bigserial PRIMARY KEY, tenant text NOT NULL);
	SELECT queue FROM fs_register_queue('plain', 'plain_jobs', tenant => 'tenant', order_by => 'id');
});
my ($ret, $out, $err) = $node->psql('postgres',
	"\\set VERBOSITY verbose\nSELECT * FROM fs_claim('plain', NULL::plain_jobs, 1, selector_in => '{a}')");
like($err, qr/ERROR:  22023: queue "plain" has no selector to select rows by/, 'a selection needs a selector');
like($err, qr/HINT:  Register the queue with selector =>/, 'and says how to get one');
($ret, $out, $err) = $node->psql('postgres',
	"\\set VERBOSITY verbose\nSELECT * FROM fs_claim('sel', NULL::jobs, 1, selector_in => '{a,NULL}')");
like($err, qr/ERROR:  22004: selector_in must not contain nulls/, 'a NULL pattern is refused');
($ret, $out, $err) = $node->psql('postgres',
	"\\set VERBOSITY verbose\nSELECT fs_register_queue('bad', 'jobs', tenant => 'tenant', order_by => 'id', selector => 'id > 0')");
like($err, qr/ERROR:  42804: selector of queue "bad" must be text, varchar, char or name, not boolean/, 'a selector must be text');

$node->stop;
done_testing();
