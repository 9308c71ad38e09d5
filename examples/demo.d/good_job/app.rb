# frozen_string_literal: true

# The GoodJob demo adapter: a minimal Rails app with real GoodJob, driven by
# this directory's executables (setup, register, worker, enqueue).  Tenant
# T's jobs go to the queue tenant_T; fairshare's tenant is the job's
# concurrency key, else its queue, so here the queue.  Both modes use
# lock_strategy :skiplocked (what fair claiming needs), so that the runs
# differ by the claim alone.
require_relative "../solid_queue/demo_common"

command = ARGV.shift
opts = Demo.options(ARGV)
ENV["DATABASE_URL"] = Demo.database_url(opts[:threads])
require "tmpdir"
require "fileutils"
if command == "worker"
  ENV["DEMO_WORKER_NAME"] = opts[:name]
  # `good_job start` loads ./config/environment.rb (a path GoodJob fixes when
  # it is loaded); the application is loaded by this file instead.
  dir = Dir.mktmpdir("fairshare-demo-good-job-")
  at_exit { FileUtils.rm_rf(dir) }
  FileUtils.mkdir_p(File.join(dir, "config"))
  File.write(File.join(dir, "config/environment.rb"), "# the application is loaded by #{__FILE__}\n")
  Dir.chdir(dir)
end

require "rails"
require "active_record/railtie"
require "active_job/railtie"
require "good_job"
require "erb"
require "fairshare/good_job"

class DemoGoodJobApp < Rails::Application
  config.load_defaults 7.1
  config.root = __dir__
  config.eager_load = false
  config.secret_key_base = "demo" * 16
  config.logger = ActiveSupport::Logger.new($stderr, level: :warn)
  config.log_level = :warn
  config.active_job.queue_adapter = :good_job
  config.good_job.execution_mode = :external
  config.good_job.enable_cron = false
  config.good_job.shutdown_timeout = 2
  config.good_job.lock_strategy = :skiplocked
end

# The one line a user adds to an initializer for fair claiming.
Fairshare::GoodJob.enable! if command == "worker" && opts[:mode] == "fair"
Rails.application.initialize!

# The demo's job: logs its start, then works for job_ms.
class DemoJob < ActiveJob::Base
  def perform(ref, job_ms)
    Demo.started(ref)
    sleep(job_ms / 1000.0)
  end
end

case command
when "setup"
  ActiveRecord::Migration.verbose = false
  %w[good_jobs good_job_batches good_job_executions good_job_processes good_job_settings].each do |table|
    ActiveRecord::Base.connection.drop_table(table, if_exists: true, force: :cascade)
  end
  template = File.join(GoodJob::Engine.root, "lib/generators/good_job/templates/install/migrations/create_good_jobs.rb.erb")
  eval(ERB.new(File.read(template)).result_with_hash(migration_version: "[#{ActiveRecord::Migration.current_version}]"),
       TOPLEVEL_BINDING, template)
  CreateGoodJobs.migrate(:up)
when "register"
  Fairshare::GoodJob.register!
when "worker"
  require "good_job/cli"
  GoodJob::CLI.start(["start", "--queues=*", "--max-threads=#{opts[:threads]}", "--poll-interval=1"])
when "enqueue"
  Demo.enqueue(opts) { |ref, tenant| DemoJob.new(ref, opts[:job_ms]).set(queue: "tenant_#{tenant}") }
else
  abort "usage: app.rb setup|register|worker|enqueue [options]"
end
