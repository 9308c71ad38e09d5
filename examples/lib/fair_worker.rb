# frozen_string_literal: true

# FairWorker: the process around a recipe's transactions, kept out of the
# recipes so that each shows only what its queue does.  One polling thread
# claims as many jobs as it has idle threads (as Solid Queue's and GoodJob's
# workers do), a pool of threads, each with its own connection, performs
# and finishes them, the process heartbeats, and it exits once it found no
# work for a while.  A recipe supplies:
#
#   register(conn) / heartbeat(conn) / deregister(conn)   its process row
#   claim(conn, n)      -> up to n jobs, claimed with fs_claim()
#   perform(conn, job)  run the job and finish it (its finish transaction)
require "optparse"
require "pg"
require "socket"

module FairWorker
  Options = Struct.new(:conninfo, :queue, :threads, :poll, :exit_when_idle, :heartbeat, :name, :stock_claim)

  def self.options(argv, queue)
    opts = Options.new(ENV.fetch("DATABASE_URL", ""), queue, 3, 0.05, 2.0, 1.0,
                       "#{Socket.gethostname}-#{Process.pid}", false)
    OptionParser.new do |p|
      p.banner = "usage: #{$PROGRAM_NAME} [options]"
      p.on("--db CONNINFO", "libpq connection string (default: $DATABASE_URL, then PG* variables)") { |v| opts.conninfo = v }
      p.on("--queue NAME", "fairshare queue (default: #{queue})") { |v| opts.queue = v }
      p.on("--threads N", Integer, "jobs run at once (default: 3)") { |v| opts.threads = v }
      p.on("--poll SECONDS", Float, "wait between claims that found nothing (default: 0.05)") { |v| opts.poll = v }
      p.on("--exit-when-idle SECONDS", Float, "exit after this long without work (default: 2)") { |v| opts.exit_when_idle = v }
      p.on("--name NAME", "process name (default: host-pid)") { |v| opts.name = v }
      p.on("--stock-claim", "claim with the queue's own FIFO query instead of fs_claim(), for comparison") do
        opts.stock_claim = true
      end
    end.parse!(argv)
    abort("--threads must be at least 1") if opts.threads < 1
    opts
  end

  def self.monotonic
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  # Runs the recipe until it has been idle for opts.exit_when_idle seconds.
  def self.run(opts, recipe)
    main = PG.connect(opts.conninfo)
    recipe.register(main)
    jobs = Thread::Queue.new
    done = Thread::Queue.new
    pool = Array.new(opts.threads) do
      Thread.new do
        conn = PG.connect(opts.conninfo)
        while (job = jobs.pop) != :stop
          recipe.perform(conn, job)
          done << 1
        end
        conn.close
      end
    end
    pool.each { |t| t.abort_on_exception = true }

    busy = 0
    performed = 0
    last_work = last_beat = monotonic
    loop do
      finished = 0
      finished += done.pop until done.empty?
      busy -= finished
      performed += finished
      claimed = busy < opts.threads ? recipe.claim(main, opts.threads - busy) : []
      claimed.each { |job| jobs << job }
      busy += claimed.size
      now = monotonic
      last_work = now if claimed.any? || busy.positive?
      if now - last_beat >= opts.heartbeat
        recipe.heartbeat(main)
        last_beat = now
      end
      break if busy.zero? && now - last_work >= opts.exit_when_idle

      sleep(opts.poll) if claimed.empty?
    end
    opts.threads.times { jobs << :stop }
    pool.each(&:join)
    recipe.deregister(main)
    main.close
    warn("#{opts.name}: performed #{performed} jobs")
  end
end
