# frozen_string_literal: true

# The Solid Queue demo adapter: a minimal Rails app with real Solid Queue,
# driven by this directory's executables (setup, register, worker, enqueue).
# Tenant T's jobs go to the queue tenant_T; fairshare's tenant is the queue.
require_relative "demo_common"

command = ARGV.shift
opts = Demo.options(ARGV)
ENV["DATABASE_URL"] = Demo.database_url(opts[:threads])
ENV["DEMO_WORKER_NAME"] = opts[:name] if command == "worker"

require "rails"
require "active_record/railtie"
require "active_job/railtie"
require "solid_queue"
require "tmpdir"
require "fileutils"
require "fairshare/solid_queue"

class DemoSolidQueueApp < Rails::Application
  config.load_defaults 7.1
  config.root = __dir__
  config.eager_load = false
  config.secret_key_base = "demo" * 16
  config.logger = ActiveSupport::Logger.new($stderr, level: :warn)
  config.log_level = :warn
  config.active_job.queue_adapter = :solid_queue
  config.solid_queue.logger = config.logger
  config.solid_queue.shutdown_timeout = 2
end

# The one line a user adds to an initializer for fair claiming.
# On Citus (examples/citus) the claim path's tables are distributed by
# tenant, and the integration is told so.
DEMO_CITUS = ENV["DEMO_CITUS"] == "1"
Fairshare::SolidQueue.enable!(citus: DEMO_CITUS) if command == "worker" && opts[:mode] == "fair"
Rails.application.initialize!

# The demo's job: logs its start, then works for job_ms (on Citus it also
# logs its end, for the count of each tenant's jobs running at once).
class DemoJob < ActiveJob::Base
  def perform(ref, job_ms)
    Demo.started(ref)
    sleep(job_ms / 1000.0)
    Demo.finished(ref) if DEMO_CITUS
  end
end

case command
when "setup"
  ActiveRecord::Migration.verbose = false
  load File.join(SolidQueue::Engine.root, "lib/generators/solid_queue/install/templates/db/queue_schema.rb")
when "register"
  Fairshare::SolidQueue.register!(citus: DEMO_CITUS)
when "worker"
  dir = Dir.mktmpdir("fairshare-demo-solid-queue-")
  owner = ::Process.pid # forked processes inherit at_exit; only this one removes the directory
  at_exit { FileUtils.rm_rf(dir) if ::Process.pid == owner }
  file = File.join(dir, "queue.yml")
  File.write(file, { "workers" => [{ "queues" => "*", "threads" => opts[:threads], "processes" => 1, "polling_interval" => 0.05 }],
                     "dispatchers" => [{ "polling_interval" => 0.5, "batch_size" => 500 }] }.to_yaml)
  require "solid_queue/cli"
  SolidQueue::Cli.start(["start", "--mode", "fork", "--config_file", file, "--skip-recurring"])
when "enqueue"
  Demo.enqueue(opts) { |ref, tenant| DemoJob.new(ref, opts[:job_ms]).set(queue: "tenant_#{tenant}") }
else
  abort "usage: app.rb setup|register|worker|enqueue [options]"
end
