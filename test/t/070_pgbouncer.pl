# fairshare through PgBouncer in transaction mode (Debian's pgbouncer): 16
# clients share 4 server connections, so one client's transactions run on
# different backends.  A lease outlives the backend and the transaction
# that took it: acquired in one transaction, renewed in another and
# released in a third, each perhaps on another server connection, and a
# tenant never holds more than its max_slots (a probe table counts the
# holders).  Fair claims into a running table release their leases when the
# rows leave it in a later transaction.  Both of pgbench's protocols that
# poolers in transaction mode support run: simple queries and unnamed
# extended-protocol statements (what ruby-pg's exec_params and node-postgres
# send); named prepared statements are not used (see README.md, Poolers).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use FairshareTest;

my $node = fs_node('pooled');
my $q = sub { $node->safe_psql('postgres', shift) };
$q->(q{
	SELECT fs_set_limit('*', 'sq', max_slots => 2);
	SELECT fs_set_limit('*', 'jq', max_slots => 3);
	CREATE TABLE probe (tenant text PRIMARY KEY, holders int NOT NULL DEFAULT 0, max_seen int NOT NULL DEFAULT 0,
	                    grants bigint NOT NULL DEFAULT 0);
	INSERT INTO probe SELECT 't' || i FROM generate_series(1, 8) i;
	CREATE TABLE failures (what text NOT NULL);
	CREATE TABLE jobs (id bigserial PRIMARY KEY, tenant text NOT NULL);
	CREATE TABLE jobs_running (job_id bigint PRIMARY KEY, client int NOT NULL);
	SELECT queue FROM fs_register_queue('jq', 'jobs', tenant => 'tenant', order_by => 'id',
	       running_table => 'jobs_running', running_key => 'job_id');
	INSERT INTO jobs (tenant) SELECT 'j' || (i % 10) FROM generate_series(1, 20000) i;
});

# PgBouncer, transaction pooling, 4 server connections for 16 clients.
my $dir = PostgreSQL::Test::Utils::tempdir();
my $port = PostgreSQL::Test::Cluster::get_free_port();
open(my $fh, '>', "$dir/userlist.txt") or die $!;
print $fh qq{"postgres" ""\n};
close $fh;
open($fh, '>', "$dir/pgbouncer.ini") or die $!;
print $fh <<"INI";
[databases]
postgres = host=@{[ $node->host ]} port=@{[ $node->port ]} dbname=postgres

[pgbouncer]
listen_addr =
listen_port = $port
unix_socket_dir = $dir
auth_type = trust
auth_file = $dir/userlist.txt
pool_mode = transaction
default_pool_size = 4
max_client_conn = 100
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
INI
close $fh;
my $bouncer = IPC::Run::start([ 'pgbouncer', "$dir/pgbouncer.ini" ], '<', \undef, '>', "$dir/out", '2>', "$dir/err");
my $up = 0;
for (1 .. 100)
{
	$up = 1, last if -S "$dir/.s.PGSQL.$port";
	select(undef, undef, undef, 0.1);
}
ok($up, 'pgbouncer listens') or BAIL_OUT('pgbouncer did not start: ' . slurp_file("$dir/err"));

my $hold = q{
\set t random(1, 8)
SELECT coalesce(fs_acquire_slot('t' || :t, 'sq', '1 minute'), 0) AS lease \gset
\if :lease > 0
UPDATE probe SET holders = holders + 1, max_seen = greatest(max_seen, holders + 1), grants = grants + 1
 WHERE tenant = 't' || :t;
SELECT fs_renew_slot(:lease, '1 minute')::int AS renewed \gset
\if :renewed = 0
INSERT INTO failures VALUES ('renew of ' || :lease || ' returned false');
\endif
UPDATE probe SET holders = holders - 1 WHERE tenant = 't' || :t;
SELECT fs_release_slot(:lease)::int AS released \gset
\if :released = 0
INSERT INTO failures VALUES ('release of ' || :lease || ' returned false');
\endif
\endif
};
my $claim = q{
BEGIN;
WITH c AS (SELECT (j.job).id FROM fs_claim('jq', NULL::jobs, 2) j),
     d AS (DELETE FROM jobs USING c WHERE jobs.id = c.id)
INSERT INTO jobs_running SELECT id, :client_id FROM c;
COMMIT;
DELETE FROM jobs_running WHERE client = :client_id;
};
open($fh, '>', "$dir/hold.sql") or die $!;
print $fh $hold;
close $fh;
open($fh, '>', "$dir/claim.sql") or die $!;
print $fh $claim;
close $fh;

for my $protocol ('simple', 'extended')
{
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run(
		[ 'pgbench', '--no-vacuum', '-h', $dir, '-p', $port, '--client=16', '--jobs=4', '--time=8',
		  "--protocol=$protocol", '-f', "$dir/hold.sql\@3", '-f', "$dir/claim.sql\@1", 'postgres' ],
		'<', \undef, '>', \$out, '2>', \$err, IPC::Run::timeout(120));
	ok($ok, "16 clients through pgbouncer ($protocol protocol)") or diag("$err\n$out");
	like($out, qr/number of failed transactions: 0 /, "no transaction failed ($protocol)");
	is($err, '', "pgbench printed no error ($protocol)");
}

is($q->("SELECT count(*) FROM failures"), '0', 'renew and release of a held lease never failed on another backend');
is($q->("SELECT coalesce(string_agg(tenant || ' saw ' || max_seen, ', '), '') FROM probe WHERE max_seen > 2"), '',
	'no tenant ever held more than its max_slots');
cmp_ok($q->("SELECT sum(grants) FROM probe"), '>', 100, 'many slots were taken');
cmp_ok($q->("SELECT 20000 - count(*) FROM jobs"), '>', 100, 'many jobs were claimed');
is($q->("SELECT count(*) FROM jobs_running"), '0', 'every claimed job finished');
is($q->("SELECT count(*) FROM fs_leases"), '0', 'and released its lease, on whatever backend');
is($q->("SELECT coalesce(sum(slots_in_use), 0) FROM fs_tenants"), '0', 'no slot is in use');
cmp_ok($q->("SELECT count(*) FROM pg_stat_activity WHERE client_addr IS NULL AND application_name = 'pgbench'"),
	'<=', 4, 'the clients shared at most 4 server connections');

$bouncer->kill_kill;
$node->stop;
done_testing();
