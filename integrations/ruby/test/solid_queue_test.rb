# frozen_string_literal: true

# Real Solid Queue workers (SolidQueue::Cli, fork mode) claiming through
# fairshare.  Needs DATABASE_URL of a database with the fairshare extension.
require_relative "test_helper"
ENV["FAIRSHARE"] = "1"
ENV["FS_TEST_APP_ROOT"] ||= Dir.mktmpdir("fsrb-app-")
Minitest.after_run { FileUtils.rm_rf(ENV["FS_TEST_APP_ROOT"]) }
require_relative "support/solid_queue_app"

class SolidQueueTest < Minitest::Test
  include WorkerProcesses
  include PgBouncer
  APP = File.join(WorkerProcesses::SUPPORT, "solid_queue_app.rb")

  def setup
    setup_app_root
    reset_schema
  end

  def teardown
    teardown_workers
    stop_pgbouncer
  end

  # Solid Queue's own tables from its install template (force: :cascade
  # drops and recreates them, which also ends a fairshare registration).
  def reset_schema
    ActiveRecord::Migration.verbose = false
    load File.join(SolidQueue::Engine.root, "lib/generators/solid_queue/install/templates/db/queue_schema.rb")
    conn.create_table :test_runs, force: true do |t|
      t.string :ref, null: false
      t.string :queue_name
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

  # One `bin/jobs` process: a supervisor forking one worker (and a dispatcher).
  def start_worker(queues: "*", threads: 2, polling: 0.05, env: {})
    file = File.join(@app_root, "queue-#{workers.size}.yml")
    config = { "workers" => [{ "queues" => queues, "threads" => threads, "processes" => 1, "polling_interval" => polling }],
               "dispatchers" => [{ "polling_interval" => 0.1, "batch_size" => 100 }] }
    File.write(file, config.to_yaml)
    spawn_worker([APP, "--jobs", "start", "--mode", "fork", "--config_file", file, "--skip-recurring"], env)
  end

  def runs
    TestRun.order(:started_at, :id).to_a
  end

  def finished_jobs
    SolidQueue::Job.where.not(finished_at: nil).count
  end

  def slots_in_use(tenant)
    conn.select_value(ActiveRecord::Base.sanitize_sql_array(
      ["SELECT coalesce(sum(slots_in_use), 0) FROM fs_fair_shares WHERE queue = 'solid_queue' AND tenant = ?", tenant])).to_i
  end

  def test_registration_is_stored_with_default_tenant_and_selector
    Fairshare::SolidQueue.register!
    row = conn.select_one("SELECT tenant, order_by, key, running_table::text, selector FROM fs_fair_queues WHERE queue = 'solid_queue'")
    assert_match(/coalesce\(NULLIF\(\(?queue_name\)?(::text)?, ''::text\), 'default'::text\)/i, row["tenant"])
    assert_match(/octet_length/, row["tenant"], "long tenants are shortened")
    assert_equal "solid_queue_claimed_executions", row["running_table"].sub(/\Apublic\./, "")
    assert_match(/queue_name/, row["selector"])
    defaults = conn.select_one("SELECT max_slots, extract(epoch FROM lease)::int AS lease FROM fs_fair_queues WHERE queue = 'solid_queue'")
    assert_nil defaults["max_slots"], "no slot limit per tenant by default"
    assert_equal SolidQueue.process_alive_threshold.to_i, defaults["lease"], "the lease is Solid Queue's process_alive_threshold"
    Fairshare::SolidQueue.register!(max_slots: 4, lease: 90)
    defaults = conn.select_one("SELECT max_slots, extract(epoch FROM lease)::int AS lease FROM fs_fair_queues WHERE queue = 'solid_queue'")
    assert_equal [4, 90], [defaults["max_slots"], defaults["lease"]]
  end

  # Listed order, a prefix wildcard, a queue left out and a paused queue.
  def test_queue_list_order_wildcard_and_pause
    Fairshare::SolidQueue.register!
    SolidQueue::Queue.find_by_name("tenant_a2").pause
    jobs = []
    %w[mailers tenant_b tenant_a2 tenant_a1 tenant_a3].each do |queue|
      4.times { |i| jobs << RecordJob.new("#{queue}-#{i}", 20).set(queue: queue) }
    end
    ActiveJob.perform_all_later(jobs)
    start_worker(queues: ["tenant_a*", "mailers"], threads: 1)
    wait_until(40, "tenant_a1, tenant_a3 and mailers") { TestRun.count >= 12 }
    sleep 1
    ran = runs.map(&:queue_name)
    assert_equal 12, ran.size, "only the listed, unpaused queues run: #{ran.tally}"
    assert_equal %w[mailers], ran.last(4).uniq, "the prefix entry is listed first: #{ran}"
    assert_equal({ "tenant_a1" => 4, "tenant_a3" => 4 }, ran.first(8).tally)
    assert_includes ran.first(2), "tenant_a3", "the queues of one entry are claimed fairly, not one after the other: #{ran}"

    SolidQueue::Queue.find_by_name("tenant_a2").resume
    wait_until(30, "the resumed queue") { TestRun.where(queue_name: "tenant_a2").count == 4 }
    assert_equal 0, TestRun.where(queue_name: "tenant_b").count
  end

  # `*` with a paused queue: QueueSelector lists the other queues one by
  # one; they are claimed as one fair selection, the paused one never.
  def test_all_queues_with_one_paused
    Fairshare::SolidQueue.register!
    SolidQueue::Queue.find_by_name("q_paused").pause
    jobs = %w[q_a q_b q_paused].flat_map { |queue| Array.new(4) { |i| RecordJob.new("#{queue}-#{i}", 20).set(queue: queue) } }
    ActiveJob.perform_all_later(jobs)
    start_worker(queues: "*", threads: 1)
    wait_until(30, "q_a and q_b") { TestRun.count >= 8 }
    sleep 1
    ran = runs.map(&:queue_name)
    assert_equal({ "q_a" => 4, "q_b" => 4 }, ran.tally)
    assert_equal 2, ran.first(2).uniq.size, "q_a and q_b take turns: #{ran}"
  end

  # Within a tenant, Solid Queue's order: priority, then job id.
  def test_priorities_within_a_tenant
    Fairshare::SolidQueue.register!
    jobs = [5, 1, 3, 0, 2].map { |p| RecordJob.new("p#{p}", 10).set(queue: "tenant_x", priority: p) }
    ActiveJob.perform_all_later(jobs)
    start_worker(threads: 1)
    wait_until(30, "five jobs") { TestRun.count == 5 }
    assert_equal [0, 1, 2, 3, 5], runs.map(&:priority)
  end

  # A greedy tenant's backlog does not hold back tenants that come later.
  def test_a_greedy_tenant_does_not_starve_small_ones
    Fairshare::SolidQueue.register!
    ActiveJob.perform_all_later(Array.new(300) { |i| RecordJob.new("g-#{i}", 20).set(queue: "tenant_greedy") })
    ActiveJob.perform_all_later((1..5).flat_map { |t| Array.new(3) { |i| RecordJob.new("s#{t}-#{i}", 20).set(queue: "tenant_small_#{t}") } })
    start_worker(threads: 2)
    start_worker(threads: 2)
    wait_until(60, "the small tenants") { TestRun.where("ref LIKE 's%'").count == 15 }
    greedy_before = TestRun.where("ref LIKE 'g-%'").count
    assert_operator greedy_before, :<, 60, "small tenants' 15 jobs ran after only #{greedy_before} greedy jobs (FIFO: 300)"
    shares = conn.select_rows("SELECT tenant FROM fs_fair_shares WHERE queue = 'solid_queue'").flatten
    assert_includes shares, "tenant_small_1"
  end

  # Concurrency limits: executions over the limit wait as blocked
  # executions (never ready, so never claimed) and are released one by one.
  def test_concurrency_limits_and_blocked_executions
    Fairshare::SolidQueue.register!
    ActiveJob.perform_all_later(Array.new(8) { |i| LimitedJob.new("k-#{i}", 300).set(queue: "tenant_k") })
    assert_equal 2, SolidQueue::ReadyExecution.count
    assert_equal 6, SolidQueue::BlockedExecution.count
    start_worker(threads: 3)
    start_worker(threads: 3)
    wait_until(60, "eight limited jobs") { finished_jobs == 8 }
    all = runs
    overlap = most_at_once(all)
    assert_operator overlap, :<=, 2, "at most two jobs of the key at once (jobs running when one started)"
    assert_equal 8, all.map(&:ref).uniq.size
  end

  # Several worker processes, retries, scheduled jobs and a custom tenant
  # expression with a default tenant: every job runs once per attempt.
  def test_nothing_lost_or_run_twice_with_retries_schedules_and_default_tenant
    Fairshare::SolidQueue.register!(tenant: "split_part(queue_name, '.', 1)")
    jobs = Array.new(240) { |i| RecordJob.new("j-#{i}", 5, i % 10 == 0 ? 1 : 0).set(queue: i.even? ? "org#{i % 6}.work" : ".misc") }
    ActiveJob.perform_all_later(jobs)
    enqueued_at = Time.now
    RecordJob.set(queue: "org1.work", wait: 2.seconds).perform_later("later", 0)
    RecordJob.set(queue: "#{'long' * 20}.work").perform_later("long", 0) # a tenant over 63 bytes
    3.times { start_worker(threads: 3) }
    wait_until(90, "every job") { finished_jobs == 242 + 24 }
    counts = TestRun.group(:ref).count
    assert_equal 242, counts.size
    assert(counts.all? { |ref, n| n == (ref.start_with?("j-") && ref.delete_prefix("j-").to_i % 10 == 0 ? 2 : 1) },
           "each job ran once per attempt: #{counts.reject { |_, n| n == 1 }.first(5)}")
    assert_operator TestRun.find_by(ref: "later").started_at, :>=, enqueued_at + 2
    assert_operator TestRun.distinct.count(:pid), :>=, 2, "several worker processes took part"
    tenants = conn.select_rows("SELECT tenant FROM fs_fair_shares WHERE queue = 'solid_queue'").flatten
    assert_includes tenants, "default"
    assert_includes tenants, "org0"
    assert_equal 0, SolidQueue::FailedExecution.count
  end

  # Each process heartbeat renews the leases of its running jobs: a job
  # running past the lease (here the 3 s alive threshold) keeps its slot,
  # and finishing it releases the slot.
  def test_heartbeats_renew_leases
    env = { "FS_TEST_HEARTBEAT" => "0.5", "FS_TEST_ALIVE" => "3" }
    Fairshare::SolidQueue.register!(lease: 3)
    RecordJob.set(queue: "tenant_long").perform_later("long", 6000)
    start_worker(threads: 1, env: env)
    wait_until(30, "the long job to start") { slots_in_use("tenant_long") == 1 }
    sleep 4.5
    assert_equal 1, slots_in_use("tenant_long"), "the lease outlived its 3 s through renewals"
    wait_until(30, "the long job to finish") { finished_jobs == 1 }
    wait_until(5, "the release") { slots_in_use("tenant_long").zero? }
  end

  # Workers connected through PgBouncer in transaction mode (Active Record
  # with prepared_statements: false): the claim, its lease and the release
  # all happen inside transactions, so they work across pooled connections.
  def test_workers_through_pgbouncer_in_transaction_mode
    Fairshare::SolidQueue.register!
    db = conn.current_database
    port = start_pgbouncer(db)
    url = "postgresql://#{ENV.fetch("PGUSER")}@127.0.0.1:#{port}/#{db}?prepared_statements=false&pool=10"
    ActiveJob.perform_all_later(Array.new(80) { |i| RecordJob.new("p-#{i}", 5).set(queue: "tenant_#{i % 4}") })
    2.times { start_worker(threads: 3, env: { "DATABASE_URL" => url }) }
    wait_until(60, "every job") { finished_jobs == 80 }
    assert_equal 80, TestRun.distinct.count(:ref)
    assert_equal 80, TestRun.count
    wait_until(5, "every lease released") { (0..3).sum { |t| slots_in_use("tenant_#{t}") }.zero? }
  end

  # `rails generate fairshare:solid_queue`: a migration whose up registers the
  # queue and whose down unregisters it, and the initializer's one line.
  def test_generator_writes_the_migration_and_the_initializer
    require "rails/generators"
    generator = Rails::Generators.find_by_namespace("fairshare:solid_queue")
    assert_equal "Fairshare::Generators::SolidQueueGenerator", generator&.name, "rails generate finds fairshare:solid_queue"
    capture_io { generator.start([], destination_root: @app_root) }
    migration = Dir[File.join(@app_root, "db/migrate/*_register_fairshare_solid_queue.rb")].first
    refute_nil migration, "a migration in db/migrate"
    assert_match(/Fairshare::SolidQueue\.enable!/, File.read(File.join(@app_root, "config/initializers/fairshare.rb")))
    registered = -> { conn.select_value("SELECT count(*) FROM fs_fair_queues WHERE queue = 'solid_queue'").to_i }
    load migration
    RegisterFairshareSolidQueue.migrate(:up)
    assert_equal 1, registered.call
    RegisterFairshareSolidQueue.migrate(:down)
    assert_equal 0, registered.call
  end
end
