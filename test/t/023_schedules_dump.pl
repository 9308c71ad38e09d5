# pg_dump of a database with schedules, by roles that are not superusers,
# after ALTER EXTENSION fairshare UPDATE: the database owner dumps the
# schedules it may see with --enable-row-security; a role with BYPASSRLS
# dumps every role's; without either, pg_dump stops at row-level security,
# as documented.  Schedules are dumped, the ledger of runs is not, and a
# superuser restores the dump.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $node = fs_node('dump', "fairshare.database = ''\n");

$node->safe_psql('postgres', q{
	CREATE ROLE app_owner LOGIN;
	CREATE ROLE alice LOGIN;
	CREATE ROLE dumper LOGIN BYPASSRLS;
	CREATE DATABASE app OWNER app_owner;
});
$node->safe_psql('app', q{
	SET client_min_messages = warning;
	CREATE EXTENSION fairshare VERSION '0.1.0';
	ALTER EXTENSION fairshare UPDATE;
	SET ROLE app_owner;
	SELECT fs_schedule('owner_schedule', '0 * * * *', payload => '{"who": "app_owner"}');
	SET ROLE alice;
	SELECT fs_schedule('alice_schedule', '0 * * * *', payload => '{"who": "alice"}');
	RESET ROLE;
	-- A claim reaches at most a minute past fairshare's clock: move it.
	SELECT set_config('fairshare.debug_clock', extract(epoch FROM now() + interval '2 hours')::text, false);
	SELECT count(*) FROM fs_claim_due_schedules(1000, now() + interval '2 hours');
});
is($node->safe_psql('app', 'SELECT count(*) FROM fs_schedule_runs'), '2', 'the ledger has runs');

sub dump_as
{
	my ($role, @options) = @_;
	my ($stdout, $stderr);
	my $ok = IPC::Run::run(
		[ 'pg_dump', @options, '--no-sync', '-U', $role, '-d', $node->connstr('app') ],
		'>', \$stdout, '2>', \$stderr);
	return ($ok, $stdout, $stderr);
}

my ($ok, $dump, $err) = dump_as('app_owner', '--enable-row-security');
ok($ok, 'the database owner dumps the database with --enable-row-security') or diag($err);
like($dump, qr/owner_schedule/, 'with its own schedule');
unlike($dump, qr/alice_schedule/, "and not another role's");
like($dump, qr/setval\('public\.fs_schedules_schedule_id_seq'/, 'and the sequence of schedule ids');
unlike($dump, qr/COPY public\.fs_schedule_runs/, 'but not the ledger of runs');

($ok, $dump, $err) = dump_as('app_owner');
ok(!$ok, 'without --enable-row-security it cannot');
like($err, qr/row-level security/, 'and pg_dump says row-level security is why');

($ok, $dump, $err) = dump_as('dumper');
ok($ok, 'a role with BYPASSRLS dumps the database') or diag($err);
like($dump, qr/owner_schedule/, "with the owner's schedule");
like($dump, qr/alice_schedule/, "and alice's");
unlike($dump, qr/COPY public\.fs_schedule_runs/, 'but not the ledger of runs');

# A superuser restores it into a new database.
my $file = PostgreSQL::Test::Utils::tempdir() . '/app.sql';
open(my $fh, '>', $file) or die "$file: $!";
print $fh $dump;
close $fh;
$node->safe_psql('postgres', 'CREATE DATABASE app_restored');
$node->command_ok(
	[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('app_restored'), '-f', $file ],
	'a superuser restores the dump');
is( $node->safe_psql('app_restored', q{
		SELECT string_agg(s.owner || ' ' || s.name || ' ' || st.next_run_at::text, ', ' ORDER BY s.name)
		  FROM fs_schedules s JOIN fs_schedule_state st USING (schedule_id)
		 WHERE s.owner_oid = (SELECT oid FROM pg_roles WHERE rolname = s.owner)}),
	$node->safe_psql('app', q{
		SELECT string_agg(s.owner || ' ' || s.name || ' ' || st.next_run_at::text, ', ' ORDER BY s.name)
		  FROM fs_schedules s JOIN fs_schedule_state st USING (schedule_id)}),
	'the schedules come back with their owners and next runs');
is($node->safe_psql('app_restored', 'SELECT count(*) FROM fs_schedule_runs'), '0',
	'and an empty ledger');

$node->stop;
done_testing();
