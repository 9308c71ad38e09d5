#!/usr/bin/env ruby
# frozen_string_literal: true

# The demo's verdict: both runs side by side from demo_results, and the
# picture of every job's wait over time (gnuplot).
#
#   report.rb --db CONNINFO --window SECONDS --picture FILE.png --library NAME
#
# Waits are from enqueue to the job's first start.  A job never started
# counts as waiting until the run ended (its wait is then at least that).
# Throughput is the jobs started in the first `window` seconds (while traffic
# arrives), per second.  A run named "empty" (the small tenants alone, with
# --empty-queue) is shown too: their wait on an empty queue.  Jain's index is over the tenants' service in that window, each
# divided by its max-min fair share of it (what it would get if capacity were
# shared equally among the tenants with work, none getting more than it
# asked for): 1 is perfectly fair, 1/n is one tenant taking everything.
require "optparse"
require "pg"

opts = { db: "", window: 20.0, picture: "fairshare-demo.png", data: nil, library: "Solid Queue",
         integration: "fairshare/solid_queue" }
OptionParser.new do |p|
  p.on("--db CONNINFO") { |v| opts[:db] = v }
  p.on("--window SECONDS", Float) { |v| opts[:window] = v }
  p.on("--picture FILE") { |v| opts[:picture] = v }
  p.on("--data DIR", "where to write the plot's data files") { |v| opts[:data] = v }
  p.on("--library NAME", "the queue library's name, for the labels") { |v| opts[:library] = v }
  p.on("--integration NAME", "fairshare's package for it, for the labels") { |v| opts[:integration] = v }
end.parse!

RUNS = [["fifo", "FIFO (#{opts[:library]}, stock)"], ["fair", "fairshare (#{opts[:integration]})"]].freeze
GREEDY = "greedy"

def percentile(sorted, pct)
  return nil if sorted.empty?

  sorted[[(pct / 100.0 * sorted.size).ceil - 1, 0].max]
end

# Max-min fair shares of `capacity` among `demands` (water-filling).
def max_min_shares(demands, capacity)
  shares = {}
  left = capacity.to_f
  pending = demands.select { |_, d| d.positive? }.sort_by { |_, d| d }
  until pending.empty?
    equal = left / pending.size
    tenant, demand = pending.first
    if demand <= equal
      shares[tenant] = demand.to_f
      left -= demand
      pending.shift
    else
      pending.each { |t, _| shares[t] = equal }
      break
    end
  end
  shares
end

# Jobs started per second from the first enqueue to the last start: the
# rate a run worked its whole backlog at (with --drain, every job).
def drain_rate(jobs)
  started = jobs.map { |j| j[2] }.compact
  return 0.0 if started.empty?

  span = started.max - jobs.map { |j| j[1] }.min
  span.positive? ? started.size / span : 0.0
end

def jain(values)
  return nil if values.empty?

  sum = values.sum
  squares = values.sum { |v| v * v }
  squares.zero? ? nil : sum * sum / (values.size * squares)
end

conn = PG.connect(opts[:db])
stats = {}
empty = conn.exec_params("SELECT enqueued, started FROM demo_results WHERE run = 'empty'").to_a
RUNS.each do |run, _|
  rows = conn.exec_params("SELECT tenant, enqueued, started, starts FROM demo_results WHERE run = $1", [run]).to_a
  abort("no results for the #{run} run") if rows.empty?
  jobs = rows.map { |r| [r["tenant"], r["enqueued"].to_f, r["started"]&.to_f] }
  ended = jobs.map { |_, _, c| c }.compact.max || opts[:window]
  wait = ->(j) { (j[2] || ended) - j[1] }
  small = jobs.reject { |j| j[0] == GREEDY }
  greedy = jobs.select { |j| j[0] == GREEDY }
  small_waits = small.map(&wait).sort
  greedy_claimed = greedy.select { |j| j[2] }
  in_window = jobs.select { |j| j[2] && j[2] <= opts[:window] }

  demands = Hash.new(0)
  jobs.each { |t, e, _| demands[t] += 1 if e <= opts[:window] }
  served = Hash.new(0)
  in_window.each { |t, _, _| served[t] += 1 }
  shares = max_min_shares(demands, in_window.size)
  ratios = shares.map { |t, s| s.positive? ? served[t] / s : nil }.compact

  stats[run] = {
    small_total: small.size, small_claimed: small.count { |j| j[2] },
    small_tenants: small.map(&:first).uniq.size,
    small_p50: percentile(small_waits, 50), small_p99: percentile(small_waits, 99),
    small_max: small_waits.last,
    greedy_total: greedy.size,
    greedy_in_window: greedy_claimed.count { |j| j[2] <= opts[:window] },
    throughput: in_window.size / opts[:window],
    jain: jain(ratios), ended: ended,
    drain_rate: drain_rate(jobs),
    run_twice: rows.count { |r| r["starts"].to_i > 1 },
    never_started: rows.count { |r| r["starts"].to_i.zero? }
  }

  if opts[:data]
    File.open(File.join(opts[:data], "#{run}-small.dat"), "w") do |f|
      small.each { |j| f.puts("#{j[2] || ended} #{wait.call(j)}") }
    end
    File.open(File.join(opts[:data], "#{run}-greedy.dat"), "w") do |f|
      greedy_claimed.each { |j| f.puts("#{j[2]} #{wait.call(j)}") }
    end
  end
end
conn.close

secs = ->(v) { v.nil? ? "-" : format("%.2f s", v) }
fifo = stats["fifo"]
fair = stats["fair"]
lines = [
  ["", RUNS[0][1], RUNS[1][1]],
  ["small tenants' jobs started (#{fifo[:small_tenants]} tenants)",
   "#{fifo[:small_claimed]} of #{fifo[:small_total]}", "#{fair[:small_claimed]} of #{fair[:small_total]}"],
  ["  their wait p50", secs.call(fifo[:small_p50]), secs.call(fair[:small_p50])],
  ["  their wait p99", secs.call(fifo[:small_p99]), secs.call(fair[:small_p99])],
  ["greedy tenant's jobs started in the first #{opts[:window].round} s",
   "#{fifo[:greedy_in_window]} of #{fifo[:greedy_total]}", "#{fair[:greedy_in_window]} of #{fair[:greedy_total]}"],
  ["throughput, first #{opts[:window].round} s (jobs/s)", format("%.1f", fifo[:throughput]),
   format("%.1f", fair[:throughput])],
  ["Jain's index (1 = fair)", fifo[:jain] ? format("%.3f", fifo[:jain]) : "-",
   fair[:jain] ? format("%.3f", fair[:jain]) : "-"],
  ["jobs run twice", fifo[:run_twice].to_s, fair[:run_twice].to_s],
  ["jobs not started when the run ended", fifo[:never_started].to_s, fair[:never_started].to_s]
]
empty_p99 = nil
unless empty.empty?
  empty_ended = empty.map { |r| r["started"]&.to_f }.compact.max || opts[:window]
  waits = empty.map { |r| (r["started"]&.to_f || empty_ended) - r["enqueued"].to_f }.sort
  empty_p99 = percentile(waits, 99)
  lines << ["small tenants alone (empty queue): wait p99", "", secs.call(empty_p99)]
end
widths = (0..2).map { |i| lines.map { |l| l[i].size }.max }
lines.each { |l| puts(format("%-#{widths[0]}s   %#{widths[1]}s   %#{widths[2]}s", *l)) }
puts

# The verdict, the demo's last line (after the picture's).
verdict = if fifo[:small_p99] && fair[:small_p99]&.positive?
            format("fairshare cut the small tenants' p99 wait from %.2f s to %.2f s (%.0fx lower), " \
                   "at %.0f%% of FIFO's throughput.",
                   fifo[:small_p99], fair[:small_p99], fifo[:small_p99] / fair[:small_p99],
                   100.0 * fair[:throughput] / [fifo[:throughput], 1e-9].max)
          else
            "fairshare could not be compared with FIFO: a run started no small tenant's job."
          end

# Machine-readable line for scripts and tests.
puts(format("RESULT fifo_small_p99=%.4f fair_small_p99=%.4f fifo_throughput=%.2f fair_throughput=%.2f " \
            "fifo_jain=%.4f fair_jain=%.4f fifo_run_twice=%d fair_run_twice=%d " \
            "fifo_not_started=%d fair_not_started=%d empty_small_p99=%.4f " \
            "fifo_drain_rate=%.2f fair_drain_rate=%.2f",
            fifo[:small_p99] || -1, fair[:small_p99] || -1, fifo[:throughput], fair[:throughput],
            fifo[:jain] || -1, fair[:jain] || -1, fifo[:run_twice], fair[:run_twice],
            fifo[:never_started], fair[:never_started], empty_p99 || -1,
            fifo[:drain_rate], fair[:drain_rate]))

unless opts[:data]
  puts(verdict)
  exit(0)
end

ymax = [fifo[:small_max] || 0, fair[:small_max] || 0, fifo[:ended], fair[:ended]].max * 1.05
xmax = [fifo[:ended], fair[:ended]].max * 1.02
script = <<~GNUPLOT
  set terminal pngcairo size 1400,560 font "sans,11" noenhanced
  set output "#{opts[:picture]}"
  set multiplot layout 1,2 title "One greedy tenant floods the queue; small tenants trickle in. How long did each job wait?" font "sans,13"
  set xlabel "seconds since the flood, when the job started"
  set ylabel "wait from enqueue to start (s)"
  set xrange [0:#{xmax}]
  set yrange [0:#{ymax}]
  set grid
  set key top left
  set title "#{RUNS[0][1]}: small tenants' p99 #{secs.call(fifo[:small_p99])}"
  plot "#{opts[:data]}/fifo-greedy.dat" using 1:2 with points pt 7 ps 0.3 lc rgb "#aaaaaa" title "greedy tenant", \\
       "#{opts[:data]}/fifo-small.dat" using 1:2 with points pt 7 ps 0.8 lc rgb "#d62728" title "small tenants"
  set title "#{RUNS[1][1]}: small tenants' p99 #{secs.call(fair[:small_p99])}"
  plot "#{opts[:data]}/fair-greedy.dat" using 1:2 with points pt 7 ps 0.3 lc rgb "#aaaaaa" title "greedy tenant", \\
       "#{opts[:data]}/fair-small.dat" using 1:2 with points pt 7 ps 0.8 lc rgb "#1f77b4" title "small tenants"
  unset multiplot
GNUPLOT
IO.popen(["gnuplot"], "w") { |g| g.write(script) }
abort("gnuplot failed") unless $?.success?
puts("picture: #{File.expand_path(opts[:picture])}")
puts(verdict)
