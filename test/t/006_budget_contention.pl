# Budgets under real concurrency: 32 pgbench clients spend from one tenant's
# bucket, some in transactions that roll back (refunded).  Checked
# independently: the runs the clients saw granted and committed never cost
# more than the tokens that existed (a full bucket plus what accrued between
# the first and the last spend, measured outside the server), and the bucket
# was really used up.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use FairshareTest;

my $node = fs_node('budget_contention');
my $q = sub { $node->safe_psql('postgres', shift) };

my $cap = 3000;     # ms of worker time per minute: 50 per second
my $cost = 10;      # ms per run
$q->(qq{
	CREATE TABLE grants (runs int NOT NULL);
	SELECT fs_set_limit('hot', 'bc', budget_ms_per_minute => $cap);
});

my $spend = q{
SELECT fs_spend_tokens('hot', 2, 10, 'bc') AS granted \gset
INSERT INTO grants VALUES (:granted);
};
my $spend_and_roll_back = q{
BEGIN;
SELECT fs_spend_tokens('hot', 3, 10, 'bc');
ROLLBACK;
};

my $t0 = time();
$node->pgbench(
	'--no-vacuum --client=32 --jobs=4 --time=4',
	0,
	[qr{processed: \d+}],
	[qr{^$}],
	'32 clients spend from one bucket',
	{ 'fs_spend@3' => $spend, 'fs_rollback@1' => $spend_and_roll_back });
my $elapsed = time() - $t0;

my $granted_runs = $q->("SELECT sum(runs) FROM grants");
my $available = $cap + $cap / 60.0 * $elapsed;
my $spent = $granted_runs * $cost;
note("granted $granted_runs runs = $spent ms; at most $available ms existed in ${elapsed}s");
cmp_ok($spent, '<=', $available, 'never granted more tokens than existed');
cmp_ok($spent, '>=', $cap, 'the full bucket was used');
ok($q->("SELECT count(*) > 100 FROM grants WHERE runs = 0") eq 't', 'and clients were refused once it was empty');
my ($balance) = $q->("SELECT token_balance FROM fs_tenants WHERE queue = 'bc' AND tenant = 'hot'");
cmp_ok($balance, '>=', 0, 'the balance never went below zero by spending');
cmp_ok($balance, '<=', $cap, 'nor above the cap (refunds included)');
is($q->("SELECT granted + denied_no_budget FROM fs_tenants WHERE queue = 'bc' AND tenant = 'hot'") >=
	$q->("SELECT count(*) FROM grants"), 1, 'every spend was counted');

$node->stop;
done_testing();
