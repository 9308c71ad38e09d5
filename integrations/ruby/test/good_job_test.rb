# frozen_string_literal: true

# Real GoodJob workers (`good_job start`, lock_strategy :skiplocked)
# claiming through fairshare.  Needs DATABASE_URL of a database with the
# fairshare extension.
require_relative "test_helper"
require "erb"
ENV["FAIRSHARE"] = "1"
ENV["FS_TEST_APP_ROOT"] ||= Dir.mktmpdir("fsrb-app-")
Minitest.after_run { FileUtils.rm_rf(ENV["FS_TEST_APP_ROOT"]) }
require_relative "support/good_job_app"

class GoodJobTest < Minitest::Test
  include WorkerProcesses
  include PgBouncer
  APP = File.join(WorkerProcesses::SUPPORT, "good_job_app.rb")
  TABLES = %w[good_jobs good_job_batches good_job_executions good_job_processes good_job_settings].freeze

  def setup
    setup_app_root
    FileUtils.mkdir_p(File.join(@app_root, "config"))
    File.write(File.join(@app_root, "config/environment.rb"), "require #{APP.dump}\n")
    reset_schema
  end

  def teardown
    teardown_workers
    stop_pgbouncer
  end

  # GoodJob's tables from its install migration, dropped first, and no limit
  # of fairshare's left on the queue.
  def reset_schema
    ActiveRecord::Migration.verbose = false
    TABLES.each { |t| conn.drop_table(t, if_exists: true, force: :cascade) }
    template = File.join(GoodJob::Engine.root, "lib/generators/good_job/templates/install/migrations/create_good_jobs.rb.erb")
    migration = ERB.new(File.read(template)).result_with_hash(migration_version: "[#{ActiveRecord::Migration.current_version}]")
    Object.send(:remove_const, :CreateGoodJobs) if defined?(CreateGoodJobs)
    eval(migration, TOPLEVEL_BINDING, template) # rubocop:disable Security/Eval
    CreateGoodJobs.migrate(:up)
    GoodJob::Job.reset_column_information
    # fairshare's limits outlive the tables: none is left from another test.
    conn.execute("DELETE FROM fs_limits WHERE queue = 'good_job'")
    conn.create_table :test_runs, force: true do |t|
      t.string :ref, null: false
      t.string :queue_name
      t.string :job_class
      t.integer :priority
      t.integer :attempt
      t.integer :pid
      t.datetime :started_at, precision: 6
      t.datetime :finished_at, precision: 6
    end
  end

  def conn
    ActiveRecord::Base.connection
  end

  # One `good_job start` process.
  def start_worker(queues: "*", threads: 2, env: {})
    exe = File.join(GoodJob::Engine.root, "exe/good_job")
    spawn_worker([exe, "start", "--queues=#{queues}", "--max-threads=#{threads}", "--poll-interval=1"], env)
  end

  def runs
    TestRun.order(:started_at, :id).to_a
  end

  def finished_jobs
    GoodJob::Job.finished.count
  end

  def slots_in_use(tenant)
    conn.select_value(ActiveRecord::Base.sanitize_sql_array(
      ["SELECT coalesce(sum(slots_in_use), 0) FROM fs_fair_shares WHERE queue = 'good_job' AND tenant = ?", tenant])).to_i
  end

  def test_enable_refuses_another_lock_strategy
    GoodJob.configuration.options[:lock_strategy] = :advisory
    error = assert_raises(Fairshare::ConfigurationError) { Fairshare::GoodJob.enable! }
    assert_match(/skiplocked/, error.message)
  ensure
    GoodJob.configuration.options.delete(:lock_strategy)
  end

  # `-c` leaves queue c; paused queues, job classes and labels wait until resumed.
  def test_excluded_queues_and_pauses
    Fairshare::GoodJob.register!
    GoodJob::Setting.pause(queue: "b")
    GoodJob::Setting.pause(job_class: "OtherJob")
    GoodJob::Setting.pause(label: "hold")
    jobs = %w[a b c].flat_map { |q| Array.new(3) { |i| RecordJob.new("#{q}-#{i}", 10).set(queue: q) } }
    jobs << OtherJob.new("other", 10).set(queue: "a")
    jobs << RecordJob.new("held", 10).set(queue: "a").tap { |job| job.good_job_labels = %w[x hold] }
    ActiveJob.perform_all_later(jobs)
    start_worker(queues: "-c", threads: 2)
    wait_until(30, "queue a") { TestRun.where(queue_name: "a").count == 3 }
    sleep 2
    assert_equal %w[a-0 a-1 a-2], TestRun.pluck(:ref).sort
    GoodJob::Setting.unpause(queue: "b")
    GoodJob::Setting.unpause(job_class: "OtherJob")
    GoodJob::Setting.unpause(label: "hold")
    wait_until(40, "the resumed jobs") { TestRun.count == 8 }
    assert_equal 0, TestRun.where(queue_name: "c").count
  end

  # `+b,a`: every job of b before any of a; priorities within a queue.
  def test_ordered_queues_and_priorities
    Fairshare::GoodJob.register!
    jobs = [3, 1, 2].map { |p| RecordJob.new("a-#{p}", 10).set(queue: "a", priority: p) } +
           [3, 1, 2].map { |p| RecordJob.new("b-#{p}", 10).set(queue: "b", priority: p) }
    ActiveJob.perform_all_later(jobs)
    start_worker(queues: "+b,a", threads: 1)
    wait_until(40, "six jobs") { TestRun.count == 6 }
    assert_equal %w[b-1 b-2 b-3 a-1 a-2 a-3], runs.map(&:ref)
  end

  # `a,b` with a's backlog first: b's jobs are not held behind it.
  def test_a_greedy_tenant_does_not_starve_small_ones
    Fairshare::GoodJob.register!
    ActiveJob.perform_all_later(Array.new(150) { |i| RecordJob.new("g-#{i}", 20).set(queue: "greedy") })
    ActiveJob.perform_all_later((1..4).flat_map { |t| Array.new(3) { |i| RecordJob.new("s#{t}-#{i}", 20).set(queue: "small_#{t}") } })
    start_worker(queues: "greedy,small_1,small_2,small_3,small_4", threads: 2)
    start_worker(queues: "*", threads: 2)
    wait_until(60, "the small tenants") { TestRun.where("ref LIKE 's%'").count == 12 }
    greedy_before = TestRun.where("ref LIKE 'g-%'").count
    assert_operator greedy_before, :<, 40, "small tenants' 12 jobs ran after only #{greedy_before} greedy jobs (FIFO: 150)"
  end

  # perform_limit's check runs unchanged under fairshare's claims: jobs over
  # the limit are retried by GoodJob, and all of them run.  (GoodJob orders
  # the key's running jobs by performed_at, which each job commits before
  # its check, so two jobs that start at once can both pass: the exact
  # bound is fairshare's max_slots, tested below.)
  def test_concurrency_perform_limit
    Fairshare::GoodJob.register!
    ActiveJob.perform_all_later(Array.new(6) { |i| LimitedJob.new("k-#{i}", 400).set(queue: "q") })
    start_worker(threads: 3)
    start_worker(threads: 3)
    wait_until(90, "six limited jobs") { GoodJob::Job.where(job_class: "LimitedJob").finished.count == 6 }
    done = runs
    assert_equal 6, done.map(&:ref).uniq.size
    assert_equal 6, done.size
    assert_equal 0, GoodJob::Job.where.not(error: nil).count
    assert_operator GoodJob::Job.maximum(:executions_count), :>, 1, "jobs over the limit were retried by GoodJob"
  end

  # fairshare's max_slots bounds a tenant's running jobs exactly, as the
  # integration's README advises for a concurrency key: at most two of the
  # tenant's jobs at once with six threads free (the jobs have no limit of
  # GoodJob's, which would hide a miss).
  def test_max_slots_bounds_a_tenant_exactly
    Fairshare::GoodJob.register!
    conn.execute("SELECT fs_set_limit('kq', 'good_job', max_slots => 2)")
    ActiveJob.perform_all_later(Array.new(6) { |i| RecordJob.new("kq-#{i}", 400).set(queue: "kq") })
    start_worker(threads: 3)
    start_worker(threads: 3)
    wait_until(90, "six jobs") { finished_jobs == 6 }
    done = runs
    overlap = most_at_once(done)
    assert_operator overlap, :<=, 2, "at most two jobs of the tenant at once (jobs running when one started)"
    assert_equal 2, overlap, "two at once: the limit, not less"
    assert_equal 6, done.map(&:ref).uniq.size
  end

  # Several worker processes, retries, a scheduled job and jobs without a
  # tenant: every job runs once per attempt.
  def test_nothing_lost_or_run_twice_with_retries_schedules_and_default_tenant
    Fairshare::GoodJob.register!
    jobs = Array.new(150) { |i| RecordJob.new("j-#{i}", 5, i % 10 == 0 ? 1 : 0).set(queue: i.even? ? "t#{i % 6}" : "") }
    ActiveJob.perform_all_later(jobs)
    enqueued_at = Time.now
    RecordJob.set(queue: "t1", wait: 2.seconds).perform_later("later", 0)
    3.times { start_worker(threads: 3) }
    wait_until(90, "every job") { TestRun.count == 151 + 15 && finished_jobs == 151 }
    counts = TestRun.group(:ref).count
    assert_equal 151, counts.size
    assert(counts.all? { |ref, n| n == (ref.start_with?("j-") && ref.delete_prefix("j-").to_i % 10 == 0 ? 2 : 1) },
           "each job ran once per attempt: #{counts.reject { |_, n| n == 1 }.first(5)}")
    assert_operator TestRun.find_by(ref: "later").started_at, :>=, enqueued_at + 2
    assert_operator TestRun.distinct.count(:pid), :>=, 2, "several worker processes took part"
    tenants = conn.select_rows("SELECT tenant FROM fs_fair_shares WHERE queue = 'good_job'").flatten
    assert_includes tenants, "default"
    assert_includes tenants, "t0"
    assert_operator conn.select_value("SELECT rows_claimed FROM fs_fairness WHERE queue = 'good_job'").to_i, :>=, 151
  end

  # A running job's lease is renewed past its length and released at the end.
  def test_leases_are_renewed_while_a_job_runs
    Fairshare::GoodJob.register!(lease: 3)
    RecordJob.set(queue: "long").perform_later("long", 6000)
    start_worker(threads: 1, env: { "FS_TEST_LEASE" => "3" })
    wait_until(30, "the long job to start") { slots_in_use("long") == 1 }
    sleep 4.5
    assert_equal 1, slots_in_use("long"), "the lease outlived its 3 s through renewals"
    wait_until(30, "the long job to finish") { finished_jobs == 1 }
    wait_until(5, "the release") { slots_in_use("long").zero? }
  end

  # Workers connected through PgBouncer in transaction mode (no prepared
  # statements, no LISTEN/NOTIFY).
  def test_workers_through_pgbouncer_in_transaction_mode
    Fairshare::GoodJob.register!
    db = conn.current_database
    port = start_pgbouncer(db)
    url = "postgresql://#{ENV.fetch("PGUSER")}@127.0.0.1:#{port}/#{db}?prepared_statements=false&pool=10"
    ActiveJob.perform_all_later(Array.new(60) { |i| RecordJob.new("p-#{i}", 5).set(queue: "t#{i % 4}") })
    2.times { start_worker(threads: 3, env: { "DATABASE_URL" => url, "FS_TEST_LISTEN" => "0" }) }
    wait_until(60, "every job") { finished_jobs == 60 }
    assert_equal 60, TestRun.distinct.count(:ref)
    assert_equal 60, TestRun.count
    assert_equal 0, slots_in_use("t0")
  end

  # `rails generate fairshare:good_job`: a migration whose up registers the
  # queue and whose down unregisters it, and the initializer's one line.
  def test_generator_writes_the_migration_and_the_initializer
    require "rails/generators"
    generator = Rails::Generators.find_by_namespace("fairshare:good_job")
    assert_equal "Fairshare::Generators::GoodJobGenerator", generator&.name, "rails generate finds fairshare:good_job"
    capture_io { generator.start([], destination_root: @app_root) }
    migration = Dir[File.join(@app_root, "db/migrate/*_register_fairshare_good_job.rb")].first
    refute_nil migration, "a migration in db/migrate"
    assert_match(/Fairshare::GoodJob\.enable!/, File.read(File.join(@app_root, "config/initializers/fairshare.rb")))
    registered = -> { conn.select_value("SELECT count(*) FROM fs_fair_queues WHERE queue = 'good_job'").to_i }
    load migration
    RegisterFairshareGoodJob.migrate(:up)
    assert_equal 1, registered.call
    RegisterFairshareGoodJob.migrate(:down)
    assert_equal 0, registered.call
  end
end
