# shellcheck shell=bash
# Sourced by this adapter's executables: the vendored Rails, Solid Queue and
# GoodJob gems ($FS_RUBY_VENDOR, default $FS_ROOT/../shared/vendor/ruby) and
# the fairshare gem on RUBYLIB.
FS_ROOT="${FS_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)}"
FS_RUBY_VENDOR="${FS_RUBY_VENDOR:-$FS_ROOT/../shared/vendor/ruby}"
. "$FS_RUBY_VENDOR/env.sh"
export FS_ROOT FS_RUBY_VENDOR RUBYLIB="$FS_ROOT/integrations/ruby/lib:$RUBYLIB"
