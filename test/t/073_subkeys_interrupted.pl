# Claims from a queue with sub-keys that are interrupted: a backend
# terminated while it holds claimed rows, or in the middle of a claim, and a
# claim cancelled or timed out, leave the sub-keys' counts exact (every row
# of the table counted once, in its tenant and its sub-key) and the rows
# claimable; no backend crashes.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $node = fs_node('subkeys_interrupted');
my $q = sub { $node->safe_psql('postgres', shift) };

# sk() is the sub-key: it sleeps on row 1 (or sk.row) when the session asks (sk.sleep),
# so a claim in such a session is slow while the triggers of every other
# session are not.
$q->(q{
	CREATE FUNCTION sk(sub text, id int) RETURNS text
	LANGUAGE plpgsql IMMUTABLE AS $$
	BEGIN
		IF id = coalesce(nullif(current_setting('sk.row', true), ''), '1')::int
		   AND coalesce(current_setting('sk.sleep', true), '') <> '' THEN
			PERFORM pg_sleep(current_setting('sk.sleep')::float8);
		END IF;
		RETURN sub;
	END $$;
	CREATE TABLE sj (id int PRIMARY KEY, tenant text NOT NULL, sub text);
	SELECT queue FROM fs_register_queue('sq', 'sj', tenant => 'tenant', order_by => 'id',
	       subkey => 'public.sk(sub, id)');
	INSERT INTO sj SELECT g, 't' || g % 2, 's' || g % 3 FROM generate_series(1, 30) g;
});

# The sub-keys' counts equal the table's, and a claim is served.
sub counts_exact
{
	my ($what) = @_;
	my $table = $q->("SELECT string_agg(tenant || '/' || sub || '=' || n, ',' ORDER BY tenant, sub)
	                    FROM (SELECT tenant, sub, count(*) n FROM sj GROUP BY 1, 2) c");
	ok( $node->poll_query_until('postgres',
			"SELECT string_agg(tenant || '/' || subkey || '=' || ready_rows, ',' ORDER BY tenant, subkey) FROM fs_fair_subkeys('sq')",
			$table),
		"$what: the sub-keys' counts equal the table's");
	is($q->("SELECT sum(ready_rows) FROM fs_tenants WHERE queue = 'sq'"),
		$q->('SELECT count(*) FROM sj'), "$what: so do the tenants'");
	is($q->("BEGIN; SELECT count(*) FROM fs_claim('sq', NULL::sj, 4); ROLLBACK"), 4, "$what: claims are served");
}
counts_exact('at the start');

# A session whose claim is asleep in the sub-key of row 1: it and its pid.
sub start_slow_claim
{
	my $bg = $node->background_psql('postgres', on_error_stop => 0);
	my $pid = $bg->query_safe('SELECT pg_backend_pid()');
	$bg->query_safe("SET sk.sleep = '300'");
	$bg->query_until(qr/started/, "\\echo started\nSELECT count(*) FROM fs_claim('sq', NULL::sj, 30);\n");
	$node->poll_query_until('postgres', "SELECT wait_event = 'PgSleep' FROM pg_stat_activity WHERE pid = $pid")
	  or die 'the claim did not start';
	return ($bg, $pid);
}

# Terminated while its transaction holds claimed rows.
my $bg = $node->background_psql('postgres', on_error_stop => 0);
my $pid = $bg->query_safe('SELECT pg_backend_pid()');
$bg->query_safe('BEGIN');
is($bg->query_safe("SELECT count(*) FROM fs_claim('sq', NULL::sj, 6)"), 6, 'a session claims 6 rows');
$q->("SELECT pg_terminate_backend($pid)");
$node->poll_query_until('postgres', "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid")
  or die "backend $pid did not exit";
eval { $bg->quit };
counts_exact('terminated holding claimed rows');

# Terminated in the middle of a claim (asleep in the sub-key of row 1).
($bg, $pid) = start_slow_claim();
$q->("SELECT pg_terminate_backend($pid)");
$node->poll_query_until('postgres', "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid")
  or die "backend $pid did not exit";
eval { $bg->quit };
counts_exact('terminated in a claim');

# Cancelled in the middle of a claim: the statement is cancelled, the
# session goes on.
($bg, $pid) = start_slow_claim();
$q->("SELECT pg_cancel_backend($pid)");
my ($out) = $bg->query("SELECT 'after'");
like($bg->{stderr}, qr/canceling statement due to user request/, 'a claim is cancelled');
is($out, 'after', 'and the session goes on');
$bg->quit;
counts_exact('cancelled in a claim');

# statement_timeout in a claim that holds rows of an earlier claim.
my ($ret, $stdout, $err) = $node->psql('postgres', q{
	BEGIN;
	CREATE TEMP TABLE held AS SELECT (j.job).id FROM fs_claim('sq', NULL::sj, 5) j;
	SELECT set_config('sk.row', (SELECT min(id) FROM sj WHERE id NOT IN (SELECT id FROM held))::text, false);
	SET sk.sleep = '300';
	SET statement_timeout = '1s';
	SELECT count(*) FROM fs_claim('sq', NULL::sj, 30);
	COMMIT;
});
like($err, qr/canceling statement due to statement timeout/, 'a claim times out');
counts_exact('timed out in a claim');

# Claimed and deleted rows are gone from the counts; the rest still add up.
$q->("BEGIN; DELETE FROM sj WHERE id IN (SELECT (j.job).id FROM fs_claim('sq', NULL::sj, 7) j); COMMIT");
is($q->('SELECT count(*) FROM sj'), 23, '7 rows claimed and deleted');
counts_exact('after claims that committed');

ok(!$node->log_contains(qr/terminated by signal/), 'no backend crashed');
$node->stop;
done_testing();
