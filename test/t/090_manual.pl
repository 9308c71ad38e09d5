# The manual stays true to the extension: every function, view and table the
# extension installs, and every fairshare.* setting, is in README.md; every
# fs_ function README.md names exists; META.json carries the version of
# fairshare.control.
use strict;
use warnings;

use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $src = fs_src();
my $readme = slurp_file("$src/README.md");
my $node = fs_node('manual');

my @objects = split /\n/, $node->safe_psql('postgres', q{
	SELECT DISTINCT coalesce(p.proname, c.relname)
	  FROM pg_depend d
	  LEFT JOIN pg_proc p ON d.classid = 'pg_proc'::regclass AND p.oid = d.objid
	  LEFT JOIN pg_class c ON d.classid = 'pg_class'::regclass AND c.oid = d.objid
	 WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
	   AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'fairshare')
	   AND coalesce(p.proname, c.relname) IS NOT NULL
	   AND coalesce(c.relkind, 'r') <> 'S'   -- sequences behind identity/serial columns
	 ORDER BY 1});
cmp_ok(scalar(@objects), '>', 20, 'the extension has its objects');
foreach my $name (@objects)
{
	ok($readme =~ /`\Q$name\E[`(]/, "README.md documents $name");
}

my @gucs = split /\n/, $node->safe_psql('postgres',
	"SELECT name FROM pg_settings WHERE name LIKE 'fairshare.%' ORDER BY 1");
cmp_ok(scalar(@gucs), '>', 5, 'fairshare has its settings');
foreach my $guc (@gucs)
{
	ok($readme =~ /^\| `\Q$guc\E` \|/m, "README.md's configuration table has $guc");
}

my %installed = map { $_ => 1 } @objects;
my %named = map { $_ => 1 } ($readme =~ /\b(fs_[a-z_]+)\(/g);
foreach my $name (sort keys %named)
{
	ok($installed{$name}, "$name, named in README.md, exists");
}

my ($control_version) = slurp_file("$src/fairshare.control") =~ /default_version = '([^']+)'/;
system("make -s -C '$src' META.json PG_CONFIG=pg_config >/dev/null") == 0 or die "make META.json failed";
my $meta = decode_json(slurp_file("$src/META.json"));
is($meta->{version}, $control_version, 'META.json has the version of fairshare.control');
is($meta->{provides}{fairshare}{version}, $control_version, 'and so does what it provides');
is($node->safe_psql('postgres', "SELECT extversion FROM pg_extension WHERE extname = 'fairshare'"),
	$control_version, 'a fresh install is that version');

$node->stop;
done_testing();
