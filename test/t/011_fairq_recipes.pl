# The recipes end to end: Solid Queue's and GoodJob's tables (examples/*/
# schema.sql), registered as examples/*/fairshare.sql does, worked by four
# Ruby worker processes each (examples/*/worker.rb, three threads each)
# running the queue's own transactions with fs_claim() swapped in.  One
# greedy tenant enqueues first, then ten small ones.
#
# The test watches from the side, with triggers of its own on the queue's
# tables: a claim log with a primary key (a job claimed twice fails its
# worker's claim transaction, and the worker) and a probe of running jobs
# per tenant.  Then, from the tables: every job ran once and finished, no
# tenant ran more than max_slots jobs at once, no lease is left, and the
# small tenants were served before the greedy tenant's backlog.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $node = fs_node('fairq_recipes');
my $src = fs_src();
my $q = sub { $node->safe_psql('postgres', shift) };

# Run the workers of a recipe, wait for them to go idle and exit; returns
# whether all exited cleanly, and the jobs each says it performed.
sub run_workers
{
	my ($recipe, $count) = @_;
	my @workers;
	for my $i (1 .. $count)
	{
		my ($out, $err) = ('', '');
		my $h = IPC::Run::start(
			[ 'ruby', "$src/examples/$recipe/worker.rb", '--db', $node->connstr('postgres'),
			  '--threads', '3', '--exit-when-idle', '2', '--name', "$recipe-$i" ],
			'>', \$out, '2>', \$err,
			IPC::Run::timeout(180));
		push @workers, [ $h, \$err ];
	}
	my $ok = 1;
	my @performed;
	for my $w (@workers)
	{
		my ($h, $err) = @$w;
		$h->finish;
		if ($h->result != 0)
		{
			diag("worker failed: $$err");
			$ok = 0;
		}
		note($$err);
		push @performed, $$err =~ /performed (\d+) jobs/ ? $1 : 0;
	}
	return ($ok, @performed);
}

sub check_workers
{
	my ($recipe, $jobs) = @_;
	my ($ok, @performed) = run_workers($recipe, 4);
	ok($ok, "four $recipe workers ran and exited cleanly");
	my $sum = 0;
	$sum += $_ for @performed;
	is($sum, $jobs, "together they performed all $jobs jobs");
	ok(!grep({ $_ == 0 } @performed), "each of them performed jobs (@performed)");
}

# Solid Queue.
$q->("\\i $src/examples/solid_queue/schema.sql");
$q->("\\i $src/examples/solid_queue/fairshare.sql");
$q->(q{
	CREATE TABLE claim_log (job_id bigint PRIMARY KEY);
	CREATE TABLE probe (tenant text PRIMARY KEY, running int NOT NULL DEFAULT 0, max_seen int NOT NULL DEFAULT 0);
	CREATE FUNCTION sq_watch() RETURNS trigger LANGUAGE plpgsql AS $$
	DECLARE
	    t text;
	BEGIN
	    IF TG_OP = 'INSERT' THEN
	        SELECT queue_name INTO t FROM solid_queue_jobs WHERE id = NEW.job_id;
	        INSERT INTO claim_log VALUES (NEW.job_id);
	        INSERT INTO probe AS p VALUES (t, 1, 1) ON CONFLICT (tenant)
	            DO UPDATE SET running = p.running + 1, max_seen = greatest(p.max_seen, p.running + 1);
	    ELSE
	        SELECT queue_name INTO t FROM solid_queue_jobs WHERE id = OLD.job_id;
	        UPDATE probe SET running = running - 1 WHERE tenant = t;
	    END IF;
	    RETURN NULL;
	END $$;
	CREATE TRIGGER watch AFTER INSERT OR DELETE ON solid_queue_claimed_executions
	    FOR EACH ROW EXECUTE FUNCTION sq_watch();
	CREATE FUNCTION sq_enqueue(tenant text, jobs int) RETURNS void LANGUAGE sql AS $$
	    WITH j AS (
	        INSERT INTO solid_queue_jobs (queue_name, class_name, arguments, priority, created_at, updated_at)
	        SELECT tenant, 'SleepJob', '{"sleep": 0.005}', 0, now() AT TIME ZONE 'UTC', now() AT TIME ZONE 'UTC'
	          FROM generate_series(1, jobs)
	        RETURNING id, queue_name, priority)
	    INSERT INTO solid_queue_ready_executions (job_id, queue_name, priority, created_at)
	    SELECT id, queue_name, priority, now() AT TIME ZONE 'UTC' FROM j $$;
	SELECT sq_enqueue('tenant_greedy', 300);
	SELECT sq_enqueue('tenant_' || i, 10) FROM generate_series(1, 10) i;
});
check_workers('solid_queue', 400);
is($q->("SELECT count(*) || '/' || count(finished_at) FROM solid_queue_jobs"), '400/400',
	'every Solid Queue job finished');
is($q->("SELECT (SELECT count(*) FROM solid_queue_ready_executions) + (SELECT count(*) FROM solid_queue_claimed_executions)"),
	'0', 'no execution is left ready or claimed');
is($q->("SELECT count(*) FROM claim_log"), '400', 'each job was claimed exactly once');
is($q->("SELECT coalesce(string_agg(tenant || ' ran ' || max_seen, ', '), '') FROM probe WHERE max_seen > 3"),
	'', 'no tenant ran more than its 3 slots at once');
is($q->("SELECT count(*) FROM fs_leases WHERE queue = 'solid_queue'"), '0',
	'every lease was released when its claimed execution went');
ok($q->(q{
	SELECT (SELECT max(finished_at) FROM solid_queue_jobs WHERE queue_name <> 'tenant_greedy')
	     < (SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY finished_at)
	          FROM solid_queue_jobs WHERE queue_name = 'tenant_greedy')}) eq 't',
	'the small tenants finished before half of the greedy backlog did');
ok($q->("SELECT rows_released = 400 AND rows_claimed = 400 FROM fs_fairness WHERE queue = 'solid_queue'") eq 't',
	'fs_fairness counted 400 claims and 400 releases');

# GoodJob.
$q->("\\i $src/examples/good_job/schema.sql");
$q->("\\i $src/examples/good_job/fairshare.sql");
$q->(q{
	TRUNCATE probe;
	CREATE TABLE gj_claim_log (id uuid PRIMARY KEY);
	CREATE FUNCTION gj_watch() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
	    IF OLD.locked_by_id IS NULL AND NEW.locked_by_id IS NOT NULL THEN
	        INSERT INTO gj_claim_log VALUES (NEW.id);
	        INSERT INTO probe AS p VALUES (NEW.concurrency_key, 1, 1) ON CONFLICT (tenant)
	            DO UPDATE SET running = p.running + 1, max_seen = greatest(p.max_seen, p.running + 1);
	    ELSIF OLD.locked_by_id IS NOT NULL AND NEW.locked_by_id IS NULL THEN
	        UPDATE probe SET running = running - 1 WHERE tenant = NEW.concurrency_key;
	    END IF;
	    RETURN NULL;
	END $$;
	CREATE TRIGGER watch AFTER UPDATE OF locked_by_id ON good_jobs FOR EACH ROW EXECUTE FUNCTION gj_watch();
	CREATE FUNCTION gj_enqueue(tenant text, jobs int) RETURNS void LANGUAGE sql AS $$
	    INSERT INTO good_jobs (queue_name, priority, serialized_params, scheduled_at, created_at, updated_at,
	                           active_job_id, concurrency_key, job_class)
	    SELECT 'default', 0, '{"job_class": "SleepJob", "arguments": [0.005]}',
	           now() AT TIME ZONE 'UTC', clock_timestamp() AT TIME ZONE 'UTC', now() AT TIME ZONE 'UTC',
	           gen_random_uuid(), tenant, 'SleepJob'
	      FROM generate_series(1, jobs) $$;
	SELECT gj_enqueue('tenant_greedy', 300);
	SELECT gj_enqueue('tenant_' || i, 10) FROM generate_series(1, 10) i;
	-- scheduled for later: must not run in this test
	INSERT INTO good_jobs (queue_name, priority, serialized_params, scheduled_at, created_at, updated_at,
	                       active_job_id, concurrency_key, job_class)
	VALUES ('default', 0, '{"arguments": [0]}', (now() AT TIME ZONE 'UTC') + interval '1 hour',
	        now() AT TIME ZONE 'UTC', now() AT TIME ZONE 'UTC', gen_random_uuid(), 'tenant_later', 'SleepJob');
});
check_workers('good_job', 400);
is($q->("SELECT count(*) || '/' || count(finished_at) FROM good_jobs WHERE concurrency_key <> 'tenant_later'"),
	'400/400', 'every GoodJob job due finished');
is($q->("SELECT count(*) FROM good_jobs WHERE concurrency_key = 'tenant_later' AND performed_at IS NULL AND locked_by_id IS NULL"),
	'1', 'the job scheduled for later was left alone');
is($q->("SELECT count(*) || '/' || count(DISTINCT active_job_id) FROM good_job_executions WHERE finished_at IS NOT NULL"),
	'400/400', 'one finished execution per job');
is($q->("SELECT count(*) FROM gj_claim_log"), '400', 'each job was claimed exactly once');
is($q->("SELECT coalesce(string_agg(tenant || ' ran ' || max_seen, ', '), '') FROM probe WHERE max_seen > 3"),
	'', 'no tenant ran more than its 3 slots at once');
is($q->("SELECT count(*) FROM fs_leases WHERE queue = 'good_job'"), '0',
	'every lease was released when its job finished');
ok($q->(q{
	SELECT (SELECT max(finished_at) FROM good_jobs WHERE concurrency_key NOT IN ('tenant_greedy', 'tenant_later'))
	     < (SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY finished_at)
	          FROM good_jobs WHERE concurrency_key = 'tenant_greedy')}) eq 't',
	'the small tenants finished before half of the greedy backlog did');
is($q->("SELECT ready_rows FROM fs_tenants WHERE queue = 'good_job' AND tenant = 'tenant_later'"), '1',
	'the scheduled job still counts as backlog');

$node->stop;
done_testing();
