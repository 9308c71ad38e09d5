# frozen_string_literal: true

# Shared by the tests: real worker processes of the queue library, started
# as the library's own CLI in child processes, and waiting for their work.
require "minitest/autorun"
require "tmpdir"
require "fileutils"
require "yaml"
require "timeout"

module WorkerProcesses
  SUPPORT = File.expand_path("support", __dir__)

  # Starts one worker process with `argv`; it and its children get their
  # own process group so that stopping it stops them all.
  def spawn_worker(argv, env = {})
    out = File.open(File.join(@app_root, "worker-#{workers.size}.log"), "w")
    pid = ::Process.spawn(ENV.to_h.merge("FS_TEST_APP_ROOT" => @app_root).merge(env), RbConfig.ruby, *argv,
                          pgroup: true, out: out, err: out, chdir: @app_root)
    out.close
    workers << pid
    pid
  end

  def workers
    @workers ||= []
  end

  # Sends SIGTERM to every worker's process group, waits for them, and
  # kills what is left after 15 seconds.
  def stop_workers
    workers.each { |pid| signal_group("TERM", pid) }
    deadline = monotonic + 15
    workers.each do |pid|
      loop do
        break if ::Process.wait(pid, ::Process::WNOHANG)
        if monotonic > deadline
          signal_group("KILL", pid)
          ::Process.wait(pid)
          break
        end
        sleep 0.05
      end
    rescue Errno::ECHILD
      next
    end
    workers.clear
  end

  def signal_group(signal, pid)
    ::Process.kill(signal, -pid)
  rescue Errno::ESRCH
    nil
  end

  # The workers' logs, to show when a test fails.
  def worker_logs
    Dir[File.join(@app_root, "worker-*.log")].sort.map { |f| "--- #{File.basename(f)}\n#{File.read(f)[-4000..] || File.read(f)}" }.join("\n")
  end

  # Waits until the block returns true, failing after `seconds`.
  def wait_until(seconds = 30, message = "condition")
    deadline = monotonic + seconds
    until yield
      flunk("timed out after #{seconds}s waiting for #{message}\n#{worker_logs}") if monotonic > deadline
      sleep 0.1
    end
  end

  def monotonic
    ::Process.clock_gettime(::Process::CLOCK_MONOTONIC)
  end

  # The most jobs running at once among `runs` (each with started_at and
  # finished_at): for each, the jobs running when it started, itself too.
  def most_at_once(runs)
    runs.map { |r| runs.count { |o| o.started_at <= r.started_at && r.started_at < o.finished_at } }.max
  end

  def setup_app_root
    @app_root = Dir.mktmpdir("fsrb-test-")
  end

  def teardown_workers
    stop_workers
    FileUtils.rm_rf(@app_root) if @app_root && passed?
  end
end

# PgBouncer in transaction mode in front of the test server, started as the
# postgres user on a free port of 6601-6609.
module PgBouncer
  # Starts pgbouncer for `dbname`; returns its port.  Stopped by stop_pgbouncer.
  # A port can be taken between the check and pgbouncer's bind (then it
  # exits with "nowhere to listen"): the next free port is tried.
  def start_pgbouncer(dbname)
    (6601..6609).each do |port|
      next unless port_free?(port)

      dir = Dir.mktmpdir("fsrb-pgbouncer-")
      FileUtils.chmod(0o777, dir)
      ini = File.join(dir, "pgbouncer.ini")
      File.write(ini, <<~INI)
        [databases]
        #{dbname} = host=#{ENV.fetch("PGHOST")} port=#{ENV.fetch("PGPORT")} dbname=#{dbname} user=#{ENV.fetch("PGUSER")}
        [pgbouncer]
        listen_addr = 127.0.0.1
        listen_port = #{port}
        unix_socket_dir =
        auth_type = any
        pool_mode = transaction
        default_pool_size = 20
        max_client_conn = 200
        logfile = #{dir}/pgbouncer.log
        pidfile = #{dir}/pgbouncer.pid
      INI
      runner = ::Process.uid.zero? ? ["runuser", "-u", "postgres", "--"] : []
      exe = File.exist?("/usr/sbin/pgbouncer") ? "/usr/sbin/pgbouncer" : "pgbouncer"
      system(*runner, exe, "-d", ini, exception: true)
      @pgbouncer_dir = dir
      deadline = Time.now + 10
      while Time.now < deadline
        return port if File.exist?(File.join(dir, "pgbouncer.pid")) && !port_free?(port)
        break if (File.read(File.join(dir, "pgbouncer.log")) rescue "").include?("FATAL")

        sleep 0.05
      end
      warn "pgbouncer did not listen on #{port}: #{File.read(File.join(dir, "pgbouncer.log")) rescue "no log"}"
      stop_pgbouncer
    end
    flunk("pgbouncer could not listen on any port of 6601-6609")
  end

  def stop_pgbouncer
    return unless @pgbouncer_dir

    pidfile = File.join(@pgbouncer_dir, "pgbouncer.pid")
    if File.exist?(pidfile)
      pid = File.read(pidfile).to_i
      ::Process.kill("TERM", pid)
      sleep 0.1 while (::Process.kill(0, pid) rescue false)
    end
    FileUtils.rm_rf(@pgbouncer_dir) if passed?
    @pgbouncer_dir = nil
  end

  def port_free?(port)
    require "socket"
    TCPServer.new("127.0.0.1", port).close
    true
  rescue Errno::EADDRINUSE, Errno::EACCES
    false
  end
end
