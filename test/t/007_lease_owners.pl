# A lease's owner survives restarts and crashes (the state file keeps it);
# a state file of format version 1, from before owners, is still read and
# its leases come back without an owner (the first role to renew one
# becomes its owner); a file of a version this build does not know is
# ignored, never misread.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $node = fs_node('owners', 'restart_after_crash = on');
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

# Rewrite the (clean) state file: version $version, leases without owners
# when $drop_owner, tenant records of $tenant_bytes bytes when given (as
# 0.4.0 wrote them: 224; their contents do not matter, the section is
# skipped when its records are not this build's).  Header: magic, version, kind, tenant_size, lease_size,
# stats_size (uint32 each), saved_at, next_lease_id (int64): 40 bytes.
# Sections: tag, item_size (uint32), count (uint64), then the items.
my $file = $node->data_dir . '/pg_stat/fairshare.state';
sub rewrite_state
{
	my ($version, $drop_owner, $tenant_bytes) = @_;
	my $data = slurp_file($file);
	$data = substr($data, 0, length($data) - 4);    # the CRC
	my ($magic, undef, $kind, $tenant_size, $lease_size, $stats_size) = unpack('V6', $data);
	my $v2_lease = 104;    # owner at offset 96, then padding
	die "unexpected lease record size $lease_size" unless $lease_size == $v2_lease;
	my $new_lease = $drop_owner ? 96 : $lease_size;
	my $new_tenant = $tenant_bytes // $tenant_size;
	my $out = pack('V6', $magic, $version, $kind, $new_tenant, $new_lease, $stats_size) .
	  substr($data, 24, 16);
	my $pos = 40;
	while ($pos < length($data))
	{
		my ($tag, $size, $lo, $hi) = unpack('V4', substr($data, $pos, 16));
		my $count = $lo + $hi * 2**32;
		my $items = substr($data, $pos + 16, $size * $count);
		$pos += 16 + $size * $count;
		if ($tag == 3 && $drop_owner)
		{
			$out .= pack('V4', $tag, $new_lease, $lo, $hi);
			$out .= substr($items, $_ * $size, $new_lease) for 0 .. $count - 1;
		}
		elsif ($tag == 2 && $new_tenant != $size)
		{
			$out .= pack('V4', $tag, $new_tenant, $lo, $hi);
			$out .= substr($items . ("\0" x $new_tenant), $_ * $size, $new_tenant) for 0 .. $count - 1;
		}
		else
		{
			$out .= pack('V4', $tag, $size, $lo, $hi) . $items;
		}
	}
	$out .= pack('V', crc32c($out));
	open(my $fh, '>', $file) or die "$file: $!";
	binmode $fh;
	print $fh $out;
	close $fh;
}

# Version 1, with 0.4.0's tenant records: leases come back without an owner.
$node->stop;
rewrite_state(1, 1, 224);
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

# A version this build does not know: ignored, and said so.
$node->stop;
rewrite_state(99, 0);
$logstart = -s $node->logfile;
$node->start;
ok($node->log_contains(qr/ignoring fairshare state file .* written by another version/, $logstart),
	'a file of an unknown version is ignored');
is($q->("SELECT start_kind || '/' || (SELECT count(*) FROM fs_leases) FROM fs_stats"), 'fresh/0',
	'and fairshare starts empty');

$node->stop;
done_testing();
