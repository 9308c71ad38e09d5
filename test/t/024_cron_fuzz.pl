# A short libFuzzer run over the cron engine (test/fuzz/run): the parser on
# arbitrary bytes, and the next-run search checked against a brute force in
# synthetic time zones.  Longer runs: test/fuzz/run SECONDS.
use strict;
use warnings;

use Test::More;

my $src = $ENV{FS_SRC} or die "FS_SRC is not set";
my $seconds = $ENV{FS_FUZZ_SECONDS} // 30;

my $output = `"$src/test/fuzz/run" $seconds 2>&1`;
my $status = $? >> 8;
is($status, 0, "libFuzzer found no crash, hang or wrong answer in ${seconds}s")
  or diag($output);
like($output, qr/^Done \d+ runs/m, 'the fuzzer ran') or diag($output);
done_testing();
