# frozen_string_literal: true

# What the Solid Queue and GoodJob demo adapters share: their options, the
# traffic (from a fixed seed, so that every run sees the same), the demo's
# own tables and how a job records that it started.
require "optparse"
require "cgi"

module Demo
  module_function

  # Options of `worker` and `enqueue`.
  def options(argv)
    opts = { mode: "fifo", threads: 3, name: "worker", greedy_jobs: 0, small_tenants: 0, small_rate: 1.0,
             seconds: 0.0, job_ms: 50, seed: 42 }
    OptionParser.new do |p|
      p.on("--mode MODE", %w[fifo fair]) { |v| opts[:mode] = v }
      p.on("--threads N", Integer) { |v| opts[:threads] = v }
      p.on("--name NAME") { |v| opts[:name] = v }
      p.on("--greedy-jobs N", Integer) { |v| opts[:greedy_jobs] = v }
      p.on("--small-tenants N", Integer) { |v| opts[:small_tenants] = v }
      p.on("--small-rate R", Float) { |v| opts[:small_rate] = v }
      p.on("--seconds S", Float) { |v| opts[:seconds] = v }
      p.on("--job-ms N", Integer) { |v| opts[:job_ms] = v }
      p.on("--seed N", Integer) { |v| opts[:seed] = v }
    end.parse!(argv)
    opts
  end

  # DATABASE_URL with a connection pool big enough for `threads` workers.
  def database_url(threads)
    url = ENV.fetch("DATABASE_URL")
    return url if url.match?(/[?&]pool=/)

    "#{url}#{url.include?('?') ? '&' : '?'}pool=#{threads + 5}"
  end

  # The small tenants' arrivals: [seconds from the start, tenant number],
  # a Poisson process at `small_rate` jobs/s over `seconds`, tenants drawn
  # uniformly from Ruby's Random(seed): integrations/node/demo/traffic.js
  # draws the same schedule for the Node libraries.
  def arrivals(opts)
    return [] if opts[:small_tenants] <= 0 || opts[:seconds] <= 0

    rng = Random.new(opts[:seed])
    list = []
    t = 0.0
    loop do
      t += -Math.log(1.0 - rng.rand) / opts[:small_rate]
      break if t >= opts[:seconds]

      list << [t, 1 + rng.rand(opts[:small_tenants])]
    end
    list
  end

  # Enqueues the demo's traffic: the greedy tenant's jobs at once (in bulks
  # of 500), then the small tenants' as they arrive.  `build` makes the
  # ActiveJob of (ref, tenant); each bulk is logged in demo_enqueued in the
  # same transaction as its enqueue.
  def enqueue(opts, &build)
    opts[:greedy_jobs].times.each_slice(500) do |slice|
      enqueue_bulk(slice.map { |i| ["g-#{i}", "greedy"] }, &build)
    end
    start = monotonic
    counts = Hash.new(0)
    list = arrivals(opts)
    list.each do |at, n|
      delay = at - (monotonic - start)
      sleep(delay) if delay.positive?
      enqueue_bulk([["s-#{n}-#{counts[n] += 1}", "small_#{n}"]], &build)
    end
    warn("enqueued #{opts[:greedy_jobs]} greedy jobs and #{list.size} small-tenant jobs")
  end

  # One transaction: the refs logged, then the jobs enqueued in one bulk.
  def enqueue_bulk(pairs, &build)
    ActiveRecord::Base.transaction do
      sql = "INSERT INTO demo_enqueued (ref, tenant, enqueued_at) " \
            "SELECT r, t, clock_timestamp() FROM unnest(?::text[], ?::text[]) AS x(r, t)"
      execute(sql, text_array(pairs.map(&:first)), text_array(pairs.map(&:last)))
      ActiveJob.perform_all_later(pairs.map { |ref, tenant| build.call(ref, tenant) })
    end
  end

  # What every demo job does first: log that it started, in this worker.
  def started(ref)
    execute("INSERT INTO demo_started (ref, worker, started_at) VALUES (?, ?, clock_timestamp())",
            ref, ENV.fetch("DEMO_WORKER_NAME", "worker"))
  end

  # What a demo job does last where its end is wanted (examples/citus).
  def finished(ref)
    execute("INSERT INTO demo_finished (ref, finished_at) VALUES (?, clock_timestamp())", ref)
  end

  def execute(sql, *values)
    ActiveRecord::Base.connection.execute(ActiveRecord::Base.sanitize_sql_array([sql, *values]))
  end

  def text_array(values)
    PG::TextEncoder::Array.new(name: "text[]", delimiter: ",").encode(values)
  end

  def monotonic
    ::Process.clock_gettime(::Process::CLOCK_MONOTONIC)
  end
end
