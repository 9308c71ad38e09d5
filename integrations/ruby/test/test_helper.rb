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

  def setup_app_root
    @app_root = Dir.mktmpdir("fairshare-ruby-test-")
  end

  def teardown_workers
    stop_workers
    FileUtils.rm_rf(@app_root) if @app_root && passed?
  end
end
