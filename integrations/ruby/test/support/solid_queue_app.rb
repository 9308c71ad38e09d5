# frozen_string_literal: true

# A minimal Rails application running real Solid Queue, for the tests.
# Loaded by the test process (to enqueue and inspect) and, as a script, by
# the worker processes it spawns:
#
#   ruby solid_queue_app.rb --jobs start --mode fork --config_file FILE --skip-recurring
#
# Env: DATABASE_URL; FAIRSHARE=1 enables the integration (the one line of an
# initializer); FS_TEST_APP_ROOT: the application's directory.
require "rails"
require "active_record/railtie"
require "active_job/railtie"
require "solid_queue"
require "logger"
require "fairshare/solid_queue"

class FairshareSolidQueueTestApp < Rails::Application
  config.load_defaults 7.1
  config.root = ENV.fetch("FS_TEST_APP_ROOT", Dir.pwd)
  config.eager_load = false
  config.secret_key_base = "fairshare" * 8
  config.log_level = ENV.fetch("FS_TEST_LOG_LEVEL", "warn").to_sym
  config.logger = ActiveSupport::Logger.new($stderr, level: config.log_level)
  config.active_job.queue_adapter = :solid_queue
  config.solid_queue.logger = config.logger
  config.solid_queue.shutdown_timeout = 3
  config.solid_queue.process_heartbeat_interval = Float(ENV.fetch("FS_TEST_HEARTBEAT", "60"))
  config.solid_queue.process_alive_threshold = Float(ENV.fetch("FS_TEST_ALIVE", "300"))
end

Fairshare::SolidQueue.enable! if ENV["FAIRSHARE"] == "1"
Rails.application.initialize!

# What the test jobs did: one row per perform.
class TestRun < ActiveRecord::Base
  self.table_name = "test_runs"
end

# Records its run (with the worker's pid) and sleeps `ms`.  `fail_times`:
# how many first attempts raise, to exercise retries.
class RecordJob < ActiveJob::Base
  retry_on RuntimeError, wait: 0, attempts: 3

  def perform(ref, ms = 0, fail_times = 0)
    started = Time.now
    sleep(ms / 1000.0)
    TestRun.create!(ref: ref, queue_name: queue_name, priority: priority, attempt: executions,
                    pid: ::Process.pid, started_at: started, finished_at: Time.now)
    raise "attempt #{executions} of #{ref} fails" if executions <= fail_times
  end
end

# RecordJob under a Solid Queue concurrency limit: two at a time per key.
class LimitedJob < RecordJob
  limits_concurrency to: 2, key: ->(ref, *) { ref.split("-").first }, duration: 5.minutes
end

if ARGV.first == "--jobs"
  require "solid_queue/cli"
  SolidQueue::Cli.start(ARGV.drop(1))
end
