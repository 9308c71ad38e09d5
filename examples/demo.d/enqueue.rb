#!/usr/bin/env ruby
# frozen_string_literal: true

# The demo's traffic, enqueued the way Solid Queue enqueues (a job row and
# its ready execution in one transaction): at the start, one greedy tenant
# floods the queue with a burst of jobs; then, for the rest of the run, small
# tenants trickle in one job at a time at random moments.  The schedule comes
# from a fixed seed, so both runs of the demo see exactly the same traffic.
#
#   enqueue.rb --db CONNINFO --seconds 20 --greedy-jobs 4000
#              --small-tenants 20 --small-rate 8 --job-ms 50
require "json"
require "optparse"
require "pg"

opts = { db: "", seconds: 20.0, greedy_jobs: 4000, small_tenants: 20, small_rate: 8.0, job_ms: 50, seed: 42 }
OptionParser.new do |p|
  p.on("--db CONNINFO") { |v| opts[:db] = v }
  p.on("--seconds N", Float) { |v| opts[:seconds] = v }
  p.on("--greedy-jobs N", Integer) { |v| opts[:greedy_jobs] = v }
  p.on("--small-tenants N", Integer) { |v| opts[:small_tenants] = v }
  p.on("--small-rate JOBS_PER_SECOND", Float) { |v| opts[:small_rate] = v }
  p.on("--job-ms N", Integer) { |v| opts[:job_ms] = v }
  p.on("--seed N", Integer) { |v| opts[:seed] = v }
end.parse!

# Poisson arrivals of small-tenant jobs over the run, each for a tenant
# drawn at random.
rng = Random.new(opts[:seed])
arrivals = []
t = 0.0
loop do
  t += -Math.log(1.0 - rng.rand) / opts[:small_rate]
  break if t >= opts[:seconds]

  arrivals << [t, format("tenant_%02d", 1 + rng.rand(opts[:small_tenants]))]
end

conn = PG.connect(opts[:db])
arguments = JSON.dump(sleep: opts[:job_ms] / 1000.0)
conn.prepare("enqueue", <<~SQL)
  WITH j AS (
    INSERT INTO solid_queue_jobs (queue_name, class_name, arguments, priority, created_at, updated_at)
    SELECT $1, 'DemoJob', $2, 0, clock_timestamp() AT TIME ZONE 'UTC', clock_timestamp() AT TIME ZONE 'UTC'
      FROM generate_series(1, $3)
    RETURNING id, queue_name, priority, created_at)
  INSERT INTO solid_queue_ready_executions (job_id, queue_name, priority, created_at)
  SELECT id, queue_name, priority, created_at FROM j
SQL

start = Process.clock_gettime(Process::CLOCK_MONOTONIC)
conn.exec_prepared("enqueue", ["tenant_greedy", arguments, opts[:greedy_jobs]])
arrivals.each do |at, tenant|
  delay = at - (Process.clock_gettime(Process::CLOCK_MONOTONIC) - start)
  sleep(delay) if delay.positive?
  conn.exec_prepared("enqueue", [tenant, arguments, 1])
end
conn.close
warn("enqueued #{opts[:greedy_jobs]} greedy jobs and #{arrivals.size} small-tenant jobs")
