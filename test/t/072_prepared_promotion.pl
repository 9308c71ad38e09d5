# A change of fs_limits prepared on a primary and committed on its standby
# after a promotion applies then: the standby has no note of it (notes live
# in the shared memory of the server that prepared), so the xid below the
# new primary's boundary is what publishes it.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $primary = fs_node('primary', "max_prepared_transactions = 5", allows_streaming => 1);
$primary->safe_psql('postgres', "SELECT fs_set_limit('p', 'pq', max_slots => 5)");
$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;

$primary->safe_psql('postgres', "BEGIN; SELECT fs_set_limit('p', 'pq', max_slots => 1); PREPARE TRANSACTION 'promo'");
$primary->wait_for_catchup($standby, 'replay', $primary->lsn('insert'));
$primary->stop('immediate');
$standby->promote;

my $s = sub { $standby->safe_psql('postgres', shift) };
my $granted = sub { $s->("SELECT fs_acquire_slot('p', 'pq', '1 hour') IS NOT NULL") };
is($s->("SELECT count(*) FROM pg_prepared_xacts"), 1, 'the prepared transaction survives the promotion');
is($granted->() . $granted->(), 'tt', 'before COMMIT PREPARED the old limit (5) holds');
$s->("COMMIT PREPARED 'promo'");
is($granted->(), 'f', 'after it the new limit (1) holds');

# Prepared on the new primary: noted, as on any primary.
$s->("BEGIN; SELECT fs_set_limit('p', 'pq', max_slots => 3); PREPARE TRANSACTION 'after'");
is($granted->(), 'f', 'a change prepared after the promotion does not apply yet');
$s->("COMMIT PREPARED 'after'");
is($granted->(), 't', 'and applies at COMMIT PREPARED');

# A PREPARE that fails takes its note back: the name is taken.
$s->("BEGIN; SELECT fs_set_limit('q', 'pq', max_slots => 2); PREPARE TRANSACTION 'dup'");
my ($ret, $out, $err) = $standby->psql('postgres',
	"BEGIN; SELECT fs_set_limit('r', 'pq', max_slots => 2); PREPARE TRANSACTION 'dup'");
like($err, qr/transaction identifier "dup" is already in use/, 'a PREPARE that fails');
$s->("ROLLBACK PREPARED 'dup'");
is($s->("SELECT count(*) FROM fs_limits WHERE tenant IN ('q', 'r')"), 0, 'leaves nothing behind');

done_testing();
