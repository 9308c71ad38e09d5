# bench/lib.sh: helpers for the benchmark scripts (sourced).
#
# Every benchmark runs fairshare and its baseline side by side, in one run,
# on one throwaway cluster, and reports ratios: this machine is shared and
# noisy, so absolute figures drift while ratios hold.  Each round runs every
# contender once, in turn; the median of the rounds is reported.

. "$(dirname "${BASH_SOURCE[0]}")/../test/lib.sh"

BENCH_DIR="$FS_ROOT/bench"
BENCH_RESULTS="$BENCH_DIR/results"
BENCH_SECONDS="${BENCH_SECONDS:-8}"
BENCH_ROUNDS="${BENCH_ROUNDS:-3}"

# Set up a benchmark: deps, build, install, a cluster (config on stdin).
bench_setup() {
	local name="$1"
	fs_install_deps $FS_DEPS_BUILD $FS_DEPS_BENCH && fs_install_npm || fs_die "could not install the Debian packages"
	fs_build_install || fs_die "the build failed"
	BENCH_WORK="$(fs_workdir "bench-$name")"
	PGPORT="${PGPORT:-5488}" fs_cluster_start "$BENCH_WORK"
	trap 'bench_teardown' EXIT
}

bench_teardown() {
	fs_cluster_stop
	[ -n "${BENCH_WORK:-}" ] && fs_as_root rm -rf "$BENCH_WORK"
}

# Copy a pgbench script (from stdin) where the postgres user can read it.
bench_script() {
	local path="$BENCH_WORK/$1.pgbench"
	fs_as_postgres sh -c "cat > '$path'"
	echo "$path"
}

# pgbench_tps SCRIPT CLIENTS [extra pgbench options]: transactions per second.
pgbench_tps() {
	local script="$1" clients="$2"; shift 2
	fs_as_postgres env PGHOST="$PGHOST" PGPORT="$PGPORT" PGOPTIONS="${PGOPTIONS:-}" "$PG_BINDIR/pgbench" \
		-n -M prepared -c "$clients" -j "$(( clients < 4 ? clients : 4 ))" -T "$BENCH_SECONDS" \
		-f "$script" "$@" postgres 2>&1 |
		sed -n 's/^tps = \([0-9]*\)[.0-9]* .*/\1/p'
}

# Median of the arguments.
median() {
	printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

# ratio A B: A / B with two decimals.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }

# verdict VALUE OP TARGET: "met" or "NOT met" (OP is >= or <=).
verdict() {
	awk -v v="$1" -v t="$3" -v op="$2" 'BEGIN {
		ok = (op == ">=") ? (v >= t) : (v <= t); print ok ? "met" : "NOT met" }'
}

# A one-line description of this machine, for results files.
machine_description() {
	echo "$(nproc) cores ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)), $(free -g | awk '/^Mem:/ { print $2 }') GiB RAM, $(. /etc/os-release; echo "$PRETTY_NAME"), $("$PG_BINDIR/postgres" --version)"
}

# Results: rows of "figure|fairshare|baseline|ratio|target|verdict" collected
# in BENCH_ROWS, printed as a table and written to bench/results/NAME.md.
BENCH_ROWS=()
bench_row() { BENCH_ROWS+=("$1|$2|$3|$4|$5|$6"); }

bench_report() {
	local name="$1" title="$2" file
	printf '\n%s\n\n' "$title"
	printf '%s\n' "${BENCH_ROWS[@]}" | awk -F'|' '
		BEGIN { printf "%-58s %14s %14s %8s %12s  %s\n", "figure", "fairshare", "baseline", "ratio", "target", "verdict" }
		{ printf "%-58s %14s %14s %8s %12s  %s\n", $1, $2, $3, $4, $5, $6 }'
	mkdir -p "$BENCH_RESULTS"
	file="$BENCH_RESULTS/$name.md"
	{
		echo "# $title"
		echo
		echo "Measured $(date -u '+%Y-%m-%d %H:%M UTC') with \`bench/$name\` on $(machine_description)."
		echo "Rounds: $BENCH_ROUNDS, $BENCH_SECONDS s each; medians."
		echo
		echo "| figure | fairshare | baseline | ratio | target | verdict |"
		echo "|---|---|---|---|---|---|"
		printf '%s\n' "${BENCH_ROWS[@]}" | awk -F'|' '{ printf "|"; for (i = 1; i <= NF; i++) printf " %s |", $i; printf "\n" }'
	} > "$file"
	# The same rows, tab-separated, for bench/run's summary.
	printf '%s\n' "${BENCH_ROWS[@]}" | tr '|' '\t' > "$BENCH_RESULTS/$name.tsv"
	echo
	echo "written to ${file#$FS_ROOT/}"
}
