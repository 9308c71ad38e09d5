# shellcheck shell=bash
# examples/demo.d/run.sh: one run of the noisy neighbour, sourced by
# examples/demo and examples/citus after they started their server(s) and
# set ADAPTER, LIBRARY, PLOT, WORKERS, THREADS, SECONDS_TO_RUN,
# SMALL_TENANTS, SMALL_RATE, JOB_MS and DRAIN.  The caller defines
# demo_prepare MODE, which readies the library's tables (made afresh by the
# adapter's setup) for a run of MODE (fifo or fair).

# Option checks, and arithmetic on decimals.
number() { awk -v v="$2" 'BEGIN { exit !(v ~ /^[0-9]+([.][0-9]+)?$/ && v + 0 > 0) }' ||
	fs_die "$1 needs a positive number, not '$2'"; }
integer() { [[ "$2" =~ ^[1-9][0-9]*$ ]] || fs_die "$1 needs a positive whole number, not '$2'"; }
calc() { awk "BEGIN { print ($1) }"; }

# The workers and traffic of the current run, stopped together.
PIDS=()
stop_all() {
	local pid
	for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
	PIDS=()
}

# One run: the library's tables made afresh, workers and traffic started
# together; live progress once a second; the run ends when every small
# tenant's job started (with --drain: every job), or at 3x the traffic's
# duration (with --drain: when nothing started for 30 s).
run() {
	local run="$1" mode="$2" greedy="$3" title="$4"
	local t0 started enq now elapsed left limit line last_progress=0 progress
	fs_log "$title: $WORKERS workers x $THREADS threads; $greedy greedy jobs at once, small tenants for ${SECONDS_TO_RUN}s"
	"$ADAPTER/setup" >>"$PLOT/setup.log" 2>&1 || { cat "$PLOT/setup.log" >&2; fs_die "the $LIBRARY setup failed"; }
	fs_psql -d postgres -o /dev/null -c 'TRUNCATE demo_enqueued, demo_started, demo_finished, demo_ready'
	demo_prepare "$mode"
	PIDS=()
	for i in $(seq 1 "$WORKERS"); do
		"$ADAPTER/worker" --mode "$mode" --threads "$THREADS" --name "$run-$i" >>"$PLOT/workers.log" 2>&1 &
		PIDS+=($!)
	done
	# Traffic starts once every worker is up (the adapter's ready says when).
	if [ -x "$ADAPTER/ready" ]; then
		"$ADAPTER/ready" --workers "$WORKERS" >>"$PLOT/workers.log" 2>&1 ||
			{ cat "$PLOT/workers.log" >&2; fs_die "the $LIBRARY workers did not start"; }
	else
		sleep 3
	fi
	t0="$(fs_psql -d postgres -Atc 'SELECT clock_timestamp()')"
	started=$(date +%s.%N)
	"$ADAPTER/enqueue" --seconds "$SECONDS_TO_RUN" --greedy-jobs "$greedy" \
		--small-tenants "$SMALL_TENANTS" --small-rate "$SMALL_RATE" --job-ms "$JOB_MS" --seed 42 \
		>>"$PLOT/enqueue.log" 2>&1 &
	enq=$!
	limit=$(calc "3 * $SECONDS_TO_RUN + 10")
	while :; do
		sleep 1
		elapsed=$(awk -v a="$(date +%s.%N)" -v b="$started" 'BEGIN { printf "%.1f", a - b }')
		line="$(fs_psql -d postgres -Atc "
			WITH e AS (SELECT e.ref, e.tenant, e.enqueued_at, s.ref IS NOT NULL AS ran
			             FROM demo_enqueued e
			             LEFT JOIN (SELECT DISTINCT ref FROM demo_started) s USING (ref))
			SELECT format('%s %6ss   greedy backlog %5s   small jobs started %4s of %-4s   oldest small job waiting %6ss   %5s jobs started',
			       rpad('$run', 5), $elapsed,
			       count(*) FILTER (WHERE tenant = 'greedy' AND NOT ran),
			       count(*) FILTER (WHERE tenant <> 'greedy' AND ran),
			       count(*) FILTER (WHERE tenant <> 'greedy'),
			       coalesce(round(extract(epoch FROM clock_timestamp() - min(enqueued_at)
			                               FILTER (WHERE tenant <> 'greedy' AND NOT ran)), 1), 0),
			       count(*) FILTER (WHERE ran))
			  FROM e")"
		echo "$line"
		for pid in "${PIDS[@]}"; do
			kill -0 "$pid" 2>/dev/null || { cat "$PLOT/workers.log" >&2; fs_die "a $LIBRARY worker died"; }
		done
		if [ -n "$enq" ] && ! kill -0 "$enq" 2>/dev/null; then
			wait "$enq" || { cat "$PLOT/enqueue.log" >&2; fs_die "enqueueing failed"; }
			enq=""
		fi
		if [ -z "$enq" ]; then
			left="$(fs_psql -d postgres -Atc "
				SELECT count(*) FROM demo_enqueued e
				 WHERE NOT EXISTS (SELECT FROM demo_started s WHERE s.ref = e.ref)
				   AND ($DRAIN = 1 OR e.tenant <> 'greedy')")"
			[ "$left" = 0 ] && break
		fi
		if [ "$DRAIN" = 1 ]; then
			progress="$(fs_psql -d postgres -Atc 'SELECT count(*) FROM demo_started')"
			if [ "$progress" != "$last_progress" ]; then
				last_progress="$progress"
				limit=$(calc "$elapsed + 30")
			fi
		fi
		if [ "$(calc "$elapsed > $limit")" = 1 ]; then
			fs_log "$title: stopping at ${elapsed}s with jobs still waiting"
			break
		fi
	done
	[ -n "$enq" ] && PIDS+=("$enq")
	stop_all
	fs_psql -d postgres -o /dev/null -v run="$run" -v t0="$t0" <<'SQL'
INSERT INTO demo_results (run, tenant, enqueued, started, starts)
SELECT :'run', e.tenant,
       extract(epoch FROM e.enqueued_at - :'t0'::timestamptz),
       extract(epoch FROM min(s.started_at) - :'t0'::timestamptz),
       count(s.ref)
  FROM demo_enqueued e LEFT JOIN demo_started s USING (ref)
 GROUP BY e.ref, e.tenant, e.enqueued_at;
SQL
}

