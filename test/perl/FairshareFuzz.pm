# FairshareFuzz: what the fuzz tests (test/t/040_sqlsmith.pl,
# test/t/041_fs_fuzz.pl) share: a database with fairshare in every state
# worth fuzzing (registered queues of every key type, limits, leases,
# schedules with and without a command), and the checks that the server
# never crashed.
package FairshareFuzz;

use strict;
use warnings;

use Exporter 'import';
use PostgreSQL::Test::Utils;

our @EXPORT = qw(fuzz_seconds fuzz_setup_sql fuzz_repair_sql fuzz_crashes fuzz_crash_report fuzz_log_offset);

# How long a fuzz test runs: FS_FUZZ_SECONDS, else the test's default.
sub fuzz_seconds
{
	my ($default) = @_;
	my $s = $ENV{FS_FUZZ_SECONDS} // $default;
	die "FS_FUZZ_SECONDS must be a positive number" unless $s =~ /^\d+$/ && $s > 0;
	return $s;
}

# The tables the fuzzers work on, created if missing (a DROP TABLE by the
# fuzzer is undone by running this again), with a few rows when empty.
sub fuzz_repair_sql
{
	return q{
CREATE TABLE IF NOT EXISTS fz_jobs (
    id bigserial PRIMARY KEY, tenant text NOT NULL, priority int NOT NULL DEFAULT 0,
    cost float8 DEFAULT 1, created_at timestamptz NOT NULL DEFAULT now(), payload jsonb DEFAULT '{}',
    ext_id text NOT NULL UNIQUE DEFAULT md5(random()::text));
CREATE TABLE IF NOT EXISTS fz_running (job_id bigint PRIMARY KEY, tenant text, started_at timestamptz DEFAULT now());
CREATE TABLE IF NOT EXISTS fz_uuid (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(), tenant_id int, prio int NOT NULL DEFAULT 0,
    scheduled_at timestamptz NOT NULL DEFAULT now(), seq bigserial UNIQUE);
CREATE TABLE IF NOT EXISTS fz_text (id text PRIMARY KEY, t text, prio int DEFAULT 0);
CREATE TABLE IF NOT EXISTS fz_text_running (job_id text PRIMARY KEY);
CREATE TABLE IF NOT EXISTS solid_queue_ready_executions (
    id bigserial PRIMARY KEY, job_id bigint NOT NULL, queue_name character varying NOT NULL,
    priority integer NOT NULL DEFAULT 0, created_at timestamp(6) without time zone NOT NULL DEFAULT now());
CREATE UNIQUE INDEX IF NOT EXISTS index_solid_queue_ready_executions_on_job_id
    ON solid_queue_ready_executions (job_id);
CREATE INDEX IF NOT EXISTS index_solid_queue_poll_by_queue
    ON solid_queue_ready_executions (queue_name, priority, job_id);
CREATE TABLE IF NOT EXISTS solid_queue_claimed_executions (
    id bigserial PRIMARY KEY, job_id bigint NOT NULL, process_id bigint,
    created_at timestamp(6) without time zone NOT NULL DEFAULT now());
CREATE UNIQUE INDEX IF NOT EXISTS index_solid_queue_claimed_executions_on_job_id
    ON solid_queue_claimed_executions (job_id);
CREATE TABLE IF NOT EXISTS fz_log (at timestamptz DEFAULT now(), what text);
INSERT INTO fz_jobs (tenant, priority, cost)
    SELECT 't' || (i % 7), i % 3, i % 5 FROM generate_series(1, 60) i
     WHERE NOT EXISTS (SELECT FROM fz_jobs);
INSERT INTO fz_uuid (tenant_id, prio) SELECT i % 5, i % 2 FROM generate_series(1, 40) i
     WHERE NOT EXISTS (SELECT FROM fz_uuid);
INSERT INTO fz_text SELECT i::text, 'x' || (i % 4), i % 3 FROM generate_series(1, 40) i
     WHERE NOT EXISTS (SELECT FROM fz_text);
INSERT INTO solid_queue_ready_executions (job_id, queue_name, priority)
    SELECT i, 'tenant_' || (i % 6), i % 2 FROM generate_series(1, 60) i
     WHERE NOT EXISTS (SELECT FROM solid_queue_ready_executions);
};
}

# Everything the fuzzers start from: registered queues with keys of type
# bigint, uuid and text, a whole-row tenant, Solid Queue's pair of tables.
sub fuzz_setup_sql
{
	return fuzz_repair_sql() . q{
CREATE ROLE fz_app LOGIN;
GRANT ALL ON ALL TABLES IN SCHEMA public TO fz_app;
GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO fz_app;
SELECT fs_register_queue('fz_plain', 'fz_jobs', tenant => 'tenant', order_by => 'priority, id',
       running_table => 'fz_running', running_key => 'job_id', cost => 'cost',
       enqueued_at => 'created_at', charge_runtime => true);
SELECT fs_register_queue('fz_uuid', 'fz_uuid', tenant => 'tenant_id', order_by => 'prio',
       filter => 'scheduled_at <= now() AND prio >= 0');
-- a whole-row reference (fz_text IS NOT NULL): no column of the table is
-- the triggers' alone
SELECT fs_register_queue('fz_text', 'fz_text', tenant => 'CASE WHEN fz_text IS NOT NULL THEN t END',
       order_by => 'prio, id', running_table => 'fz_text_running', running_key => 'job_id');
SELECT fs_register_queue('solid_queue', 'solid_queue_ready_executions',
       tenant => 'queue_name', order_by => 'priority, job_id', key => 'job_id',
       running_table => 'solid_queue_claimed_executions', enqueued_at => 'created_at');
SELECT fs_set_limit('*', 'solid_queue', max_slots => 3);
SELECT fs_set_limit('*', 'fz_plain', max_slots => 2, weight => 2);
SELECT fs_set_limit('t1', 'fz_plain', max_slots => 5, min_slots => 1, budget_ms_per_minute => 1000);
SELECT fs_set_limit('acme', max_slots => 3, throttle_pct => 50);
SELECT fs_set_limit('*', '*', max_slots => 4);
SELECT fs_acquire_slot('acme'), fs_acquire_slot('acme', 'default', '1 hour'), fs_acquire_slot('t1', 'fz_plain');
SELECT fs_spend_tokens('t1', 3, 100, 'fz_plain');
SELECT fs_worker_heartbeat('w1', 4), fs_report_latency('2 seconds');
SELECT fs_route_enqueue('acme', 'Report', '[{"threshold": 2, "per": "1 minute", "queue": "slow"}]');
SELECT fs_schedule('fz_every_minute', '* * * * *');
SELECT fs_schedule('fz_nightly', '0 3 * * *', 'Europe/Paris', '{"k": 1}', 'acme', 'fz_plain');
SELECT fs_schedule('fz_command', '* * * * *', command => 'INSERT INTO fz_log (what) VALUES (''ran'')');
SELECT fs_schedule('fz_failing', '*/2 * * * *', command => 'SELECT 1/0', catchup => 'all');
SELECT * FROM fs_claim('fz_plain', NULL::fz_jobs, 2);
};
}

# Where the server log ends now: fuzz_crashes reads from there.
sub fuzz_log_offset
{
	my ($node) = @_;
	return -s $node->logfile // 0;
}

# The lines of the server log (from offset on) that tell of a backend that
# died: a signal, an abnormal exit, a PANIC, a failed assertion.  A crash
# restart keeps the postmaster, so only the log tells.
sub fuzz_crashes
{
	my ($node, $offset) = @_;
	my $log = slurp_file($node->logfile, $offset // 0);
	return grep {
		/terminated by signal|server process .* was terminated|server process .* exited with exit code [^0]|PANIC:|TRAP:|was terminated by exception/
	} split /\n/, $log;
}

# The crash lines with what each crashed process was running, for a report.
sub fuzz_crash_report
{
	my ($node, $offset) = @_;
	my $log = slurp_file($node->logfile, $offset // 0);
	my @lines = grep {
		/terminated by signal|server process .* was terminated|server process .* exited with exit code [^0]|PANIC:|TRAP:|Failed process was running/
	} split /\n/, $log;
	return map { length($_) > 2000 ? substr($_, 0, 2000) . '...' : $_ } @lines;
}

1;
