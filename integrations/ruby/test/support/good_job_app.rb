# frozen_string_literal: true

# A minimal Rails application running real GoodJob, for the tests.  Loaded
# by the test process (to enqueue and inspect) and, as config/environment.rb
# of a temporary app directory, by `good_job start` worker processes.
#
# Env: DATABASE_URL; FAIRSHARE=1 enables the integration (the one line of an
# initializer); FS_TEST_LEASE: lease seconds; FS_TEST_LISTEN=0 turns
# LISTEN/NOTIFY off (needed behind PgBouncer in transaction mode).
require "rails"
require "active_record/railtie"
require "active_job/railtie"
require "good_job"
require "logger"
require "fairshare/good_job"

class FairshareGoodJobTestApp < Rails::Application
  config.load_defaults 7.1
  config.root = ENV.fetch("FS_TEST_APP_ROOT", Dir.pwd)
  config.eager_load = false
  config.secret_key_base = "fairshare" * 8
  config.log_level = ENV.fetch("FS_TEST_LOG_LEVEL", "warn").to_sym
  config.logger = ActiveSupport::Logger.new($stderr, level: config.log_level)
  config.active_job.queue_adapter = :good_job
  config.good_job.execution_mode = :external
  config.good_job.enable_cron = false
  config.good_job.shutdown_timeout = 3
  config.good_job.lock_strategy = :skiplocked
  config.good_job.enable_pauses = true
  config.good_job.enable_listen_notify = ENV["FS_TEST_LISTEN"] != "0"
end

Fairshare::GoodJob.enable!(lease: ENV["FS_TEST_LEASE"]&.to_f) if ENV["FAIRSHARE"] == "1"
Rails.application.initialize!

# What the test jobs did: one row per perform.
class TestRun < ActiveRecord::Base
  self.table_name = "test_runs"
end

# Records its run (with the worker's pid) and sleeps `ms`.  `fail_times`:
# how many first attempts raise, to exercise retries.
class RecordJob < ActiveJob::Base
  include GoodJob::ActiveJobExtensions::Labels
  retry_on RuntimeError, wait: 0, attempts: 3

  def perform(ref, ms = 0, fail_times = 0)
    started = Time.now
    sleep(ms / 1000.0)
    TestRun.create!(ref: ref, queue_name: queue_name, priority: priority, attempt: executions, job_class: self.class.name,
                    pid: ::Process.pid, started_at: started, finished_at: Time.now)
    raise "attempt #{executions} of #{ref} fails" if executions <= fail_times
  end
end

# A second job class, to pause by class.
class OtherJob < RecordJob; end

# RecordJob under GoodJob's concurrency control: two performing per key.
class LimitedJob < RecordJob
  include GoodJob::ActiveJobExtensions::Concurrency
  good_job_control_concurrency_with(perform_limit: 2, key: -> { arguments.first.split("-").first })
  # GoodJob retries a job over the limit with a growing wait; a short fixed
  # one keeps the test quick.
  retry_on GoodJob::ActiveJobExtensions::Concurrency::ConcurrencyExceededError, attempts: Float::INFINITY, wait: ->(_executions) { 0.2 }
end
