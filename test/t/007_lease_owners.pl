# A lease's owner survives restarts and crashes (the state file keeps it);
# a state file of format version 1 (0.4.0), from before owners, is still
# read and its leases come back without an owner (the first role to renew
# one becomes its owner); a version 3 file (field by field) with fields and
# sections of a later build gives back what this build knows; a file of a
# version this build does not know is ignored, never misread.  Without WAL
# (fairshare.wal_interval = 0), so that the state file is all there is.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $node = fs_node('owners', "restart_after_crash = on\nfairshare.wal_interval = 0");
my $q = sub { $node->safe_psql('postgres', shift) };
# Run as a role; returns (stdout, stderr).
my $as = sub {
	my ($role, $sql) = @_;
	my ($out, $err) = ('', '');
	$node->psql('postgres', "SET ROLE $role; $sql", stdout => \$out, stderr => \$err);
	return ($out, $err);
};

$q->(q{
	CREATE ROLE alice IN ROLE fairshare_app;
	CREATE ROLE bob IN ROLE fairshare_app;
	SELECT fs_set_limit('acme', 'own', max_slots => 5);
});
my ($lease) = $as->('alice', "SELECT fs_acquire_slot('acme', 'own', '1 hour')");
like($lease, qr/^\d+$/, 'alice takes a lease');

# A clean restart keeps the owner.
$node->restart;
is($q->("SELECT start_kind FROM fs_stats"), 'restored', 'clean restart restores');
is($q->("SELECT owner FROM fs_leases WHERE lease_id = $lease"), 'alice', 'the owner is kept');
my ($out, $err) = $as->('bob', "SELECT fs_renew_slot($lease)");
like($err, qr/permission denied to renew lease $lease/, 'another role still may not renew it');

# A crash keeps it too: the orphan re-registers for its owner only.
$q->("SELECT fs_save_state()");
fs_crash($node);
is($q->("SELECT state || '/' || owner FROM fs_leases WHERE lease_id = $lease"), 'orphan/alice',
	'an orphan keeps its owner');
($out, $err) = $as->('bob', "SELECT fs_renew_slot($lease)");
like($err, qr/permission denied to renew lease $lease/, 'another role may not re-register it');
($out) = $as->('alice', "SELECT fs_renew_slot($lease)");
is($out, 't', 'its owner re-registers it');

# CRC-32C (Castagnoli), as PostgreSQL computes it for the state file.
my @crc_table;
for my $i (0 .. 255)
{
	my $c = $i;
	$c = ($c & 1) ? (($c >> 1) ^ 0x82F63B78) : ($c >> 1) for 1 .. 8;
	$crc_table[$i] = $c;
}
sub crc32c
{
	my $crc = 0xFFFFFFFF;
	$crc = $crc_table[($crc ^ $_) & 0xFF] ^ ($crc >> 8) for unpack('C*', $_[0]);
	return $crc ^ 0xFFFFFFFF;
}

# The state file as 0.4.0 wrote it (format version 1: fixed-size records,
# no lease owners), made from scratch: a header (magic, version, kind,
# tenant_size, lease_size, stats_size as uint32; saved_at, next_lease_id as
# int64: 40 bytes), then sections (tag, item_size as uint32, count as
# uint64: 16 bytes) and their items, then the END section and the CRC.
# Queues are (dboid uint32, name char[64]); leases (lease_id int64,
# queue_index uint32, tenant char[64], 4 bytes of padding, acquired_at and
# expires_at int64: 96 bytes); the tenant records (224 bytes in 0.4.0) are
# zeros here, as this build skips them.  The next lease id comes from the
# file this build wrote (its header is laid out as version 1's).
my $file = $node->data_dir . '/pg_stat/fairshare.state';
sub write_v1_state
{
	my ($version, %lease) = @_;
	my $data = slurp_file($file);
	my (undef, undef, undef, undef, undef, undef, $saved_lo, $saved_hi, $next_lo, $next_hi) =
	  unpack('V10', $data);
	my $section = sub { my ($tag, $size, $count) = @_; pack('V4', $tag, $size, $count, 0) };
	my $out = pack('V10', 0x46535331, $version, 1, 224, 96, 88, $saved_lo, $saved_hi, $next_lo, $next_hi);
	$out .= $section->(1, 68, 1) . pack('V a64', $lease{dboid}, $lease{queue});
	$out .= $section->(2, 224, 1) . ("\0" x 224);
	my $q64 = sub { pack('V2', $_[0] % 2**32, int($_[0] / 2**32)) };
	$out .= $section->(3, 96, 1) . $q64->($lease{id}) . pack('V a64 V', 0, $lease{tenant}, 0) .
	  $q64->($lease{acquired}) . $q64->($lease{expires});
	$out .= $section->(0xFFFF, 0, 0);
	$out .= pack('V', crc32c($out));
	open(my $fh, '>', $file) or die "$file: $!";
	binmode $fh;
	print $fh $out;
	close $fh;
}

# The lease, in PostgreSQL's microseconds since 2000.
my %lease = (id => $lease, queue => 'own', tenant => 'acme');
($lease{dboid}, $lease{acquired}, $lease{expires}) = split /\|/, $q->(qq{
	SELECT (SELECT oid FROM pg_database WHERE datname = current_database()),
	       ((extract(epoch FROM acquired_at) - 946684800) * 1000000)::bigint,
	       ((extract(epoch FROM expires_at) - 946684800) * 1000000)::bigint
	  FROM fs_leases WHERE lease_id = $lease});

# Version 1, as 0.4.0 wrote it: leases come back without an owner.
$node->stop;
write_v1_state(1, %lease);
my $logstart = -s $node->logfile;
$node->start;
ok(!$node->log_contains(qr/ignoring fairshare state file/, $logstart), 'a version 1 file is read');
is($q->("SELECT start_kind FROM fs_stats"), 'restored', 'and restores');
is($q->("SELECT state || '/' || coalesce(owner::text, 'none') FROM fs_leases WHERE lease_id = $lease"),
	'live/none', 'its leases come back without an owner');
is($q->("SELECT slots_in_use FROM fs_tenants WHERE queue = 'own' AND tenant = 'acme'"), '1',
	'and hold their slots');
($out) = $as->('bob', "SELECT fs_renew_slot($lease)");
is($out, 't', 'any role that may renew renews a lease without an owner');
is($q->("SELECT owner FROM fs_leases WHERE lease_id = $lease"), 'bob', 'and becomes its owner');
($out, $err) = $as->('alice', "SELECT fs_release_slot($lease)");
like($err, qr/permission denied to release lease $lease/, 'then it is that role\'s lease');

# Version 3 (field by field), as a later build might write it: a lease item
# with a field this build does not know (id 200), and a section it does not
# know (tag 77).  The lease comes back whole; the rest is skipped.
sub write_v3_state
{
	my (%lease) = @_;
	my $data = slurp_file($file);
	my @h = unpack('V10', $data);
	my $section = sub { my ($tag, $count, $items) = @_; pack('V4', $tag, 0, $count, 0) . $items };
	my $field = sub { my ($id, $bytes) = @_; pack('C C', $id, length($bytes)) . $bytes };
	my $item = sub { my $b = join('', @_); pack('v', length($b)) . $b };
	my $q64 = sub { pack('V2', $_[0] % 2**32, int($_[0] / 2**32)) };
	my $out = pack('V10', 0x46535331, 3, 1, 0, 0, 0, @h[6 .. 9]);
	$out .= $section->(1, 1, $item->($field->(1, pack('V', $lease{dboid})), $field->(2, $lease{queue}),
		$field->(9, 'a later field of queues')));
	$out .= $section->(77, 1, $item->($field->(1, 'a later section')));
	$out .= $section->(3, 1, $item->($field->(1, $q64->($lease{id})), $field->(200, 'later'),
		$field->(2, pack('V', 0)), $field->(3, $lease{tenant}), $field->(4, $q64->($lease{acquired})),
		$field->(5, $q64->($lease{expires})), $field->(6, pack('V', $lease{owner}))));
	$out .= pack('V4', 0xFFFF, 0, 0, 0);
	$out .= pack('V', crc32c($out));
	open(my $fh, '>', $file) or die "$file: $!";
	binmode $fh;
	print $fh $out;
	close $fh;
}
$lease{owner} = $q->("SELECT 'bob'::regrole::oid");
$node->stop;
write_v3_state(%lease);
$logstart = -s $node->logfile;
$node->start;
ok(!$node->log_contains(qr/ignoring fairshare state file/, $logstart),
	'a version 3 file with a later field and section is read');
is($q->("SELECT state || '/' || owner FROM fs_leases WHERE lease_id = $lease"), 'live/bob',
	'its lease comes back whole, owner included');

# A version this build does not know: ignored, and said so.
$node->stop;
write_v1_state(99, %lease);
$logstart = -s $node->logfile;
$node->start;
ok($node->log_contains(qr/ignoring fairshare state file .* written by another version/, $logstart),
	'a file of an unknown version is ignored');
is($q->("SELECT start_kind || '/' || (SELECT count(*) FROM fs_leases) FROM fs_stats"), 'fresh/0',
	'and fairshare starts empty');

$node->stop;
done_testing();
