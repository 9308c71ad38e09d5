# frozen_string_literal: true

require "fairshare"
require "active_support"
require "active_support/lazy_load_hooks"
require "concurrent"

module Fairshare
  # Fair claiming for GoodJob (4.19) with `lock_strategy: :skiplocked`.  In a
  # Rails initializer:
  #
  #   require "fairshare/good_job"
  #   Fairshare::GoodJob.enable!
  #
  # GoodJob's workers then take the next job with fs_claim() instead of
  # `ORDER BY priority, created_at LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED`;
  # queue strings, pauses, scheduled jobs, concurrency controls and retries
  # stay GoodJob's own.  The queue must be registered once with `register!`.
  module GoodJob
    DEFAULT_QUEUE = "good_job"
    # A job's tenant: its concurrency key, else its queue (then 'default').
    DEFAULT_TENANT = "coalesce(nullif(concurrency_key, ''), queue_name)"
    # Labels of a job a claim can tell apart (for label pauses): the first
    # eight.  A selector must be immutable, and array_to_string() is not.
    SELECTOR_LABELS = 8
    # What a claim selects rows by: queue, job class and labels, separated by
    # the ASCII unit separator, each label followed by a comma.
    SELECTOR = (["coalesce(queue_name, '')", "chr(31)", "coalesce(job_class, '')", "chr(31)", "','"] +
                (1..SELECTOR_LABELS).map { |i| "coalesce(labels[#{i}] || ',', '')" }).join(" || ")
    SEPARATOR = "\u001f"
    # GoodJob's filter of a job waiting to run; the scheduled_at part is
    # checked at claim time only.
    READY_FILTER = "finished_at IS NULL AND locked_by_id IS NULL"
    RUNNING_FILTER = "finished_at IS NULL AND locked_by_id IS NOT NULL"
    CLAIM_KEY = :fairshare_good_job_parsed_queues

    class << self
      # The fairshare queue the workers claim from.
      attr_reader :queue

      # Turns fair claiming on for GoodJob in this process.  `lease`: how
      # long a claimed job's slot is held without renewal (default:
      # GoodJob::Process::EXPIRED_INTERVAL, 5 minutes); a timer renews the
      # leases of running jobs every third of it.  Raises
      # Fairshare::ConfigurationError when GoodJob is configured with a lock
      # strategy other than :skiplocked.
      def enable!(queue: DEFAULT_QUEUE, lease: nil)
        check_lock_strategy!(::GoodJob.configuration.lock_strategy)
        @queue = queue.to_s
        @lease = lease
        ActiveSupport.on_load(:good_job_job) { Fairshare::GoodJob.send(:install) }
        self
      end

      def enabled?
        !@queue.nil?
      end

      # Raises unless `strategy` is :skiplocked, the only one whose claim
      # this integration replaces.
      def check_lock_strategy!(strategy)
        return if strategy.to_s == "skiplocked"

        raise Fairshare::ConfigurationError,
              "fairshare needs GoodJob's lock_strategy :skiplocked (config.good_job.lock_strategy = :skiplocked), " \
              "not #{strategy.inspect}"
      end

      # Seconds of a claimed job's lease.
      def lease_seconds(lease = @lease)
        (lease || ::GoodJob::Process::EXPIRED_INTERVAL).to_f
      end

      # The leases of the jobs running in this process.
      def leases
        @leases ||= Fairshare::Leases.new
      end

      # Registers good_jobs as a fairshare queue (run once, e.g. from a
      # migration).  `tenant`: an SQL expression over good_jobs (default:
      # the concurrency key, else the queue name; 'default' when both are
      # missing).  `order`: :created_at or :scheduled_at, as GoodJob's
      # dequeue_query_sort.  `max_slots`, `lease`: the queue's defaults.
      def register!(connection = ::GoodJob::Job.connection, queue: DEFAULT_QUEUE, tenant: DEFAULT_TENANT,
                    max_slots: nil, lease: nil, order: ::GoodJob.configuration.dequeue_query_sort)
        table = connection.quote_table_name(::GoodJob::Job.table_name)
        Fairshare::SQL.register_queue(
          connection,
          queue: queue.to_s, ready_table: table, running_table: table,
          tenant: Fairshare::SQL.with_default_tenant(tenant),
          order_by: order.to_s == "scheduled_at" ? "priority ASC NULLS LAST, scheduled_at, id" : "priority ASC NULLS LAST, created_at",
          filter: "#{READY_FILTER} AND scheduled_at <= #{now_sql}",
          running_filter: RUNNING_FILTER,
          selector: SELECTOR,
          max_slots: max_slots,
          lease_seconds: lease_seconds(lease)
        )
      end

      # Removes the registration.
      def unregister!(connection = ::GoodJob::Job.connection, queue: DEFAULT_QUEUE)
        Fairshare::SQL.select(connection, "SELECT fs_unregister_queue(?)", queue.to_s)
      end

      # The parsed queue string of the claim running in this thread.
      def current_parsed_queues
        Thread.current[CLAIM_KEY]
      end

      # Runs the block with `parsed` as the current claim's queues.
      def within_claim(parsed)
        previous = Thread.current[CLAIM_KEY]
        Thread.current[CLAIM_KEY] = parsed
        yield
      ensure
        Thread.current[CLAIM_KEY] = previous
      end

      # Claims one job in fair order among the jobs `parsed` (GoodJob's
      # parsed queue string) selects and pauses do not hold, locks it for
      # `locked_by_id` as GoodJob's own claim does, and returns it (or nil).
      # Ordered queues (`+a,b`) are tried one after the other.
      def claim(model, parsed, locked_by_id:, locked_at:, lock_type:)
        excluded = excluded_patterns(parsed)
        included_selections(parsed).each do |included|
          record = claim_one(model, included, excluded, locked_by_id, locked_at, lock_type)
          return record if record
        end
        nil
      end

      # Renews the leases of the jobs running in this process (every third
      # of the lease, from a timer started with the first claim).
      def renew_leases
        ::GoodJob::Job.connection_pool.with_connection { |connection| leases.renew(connection, lease_seconds) }
      end

      # Logs once that a claim falls back to GoodJob's own order.
      def warn_strategy(strategy)
        return if @warned

        @warned = true
        ::GoodJob.logger&.error("fairshare: GoodJob claims with lock_strategy #{strategy.inspect}, so its own " \
                                "order is used; set config.good_job.lock_strategy = :skiplocked")
      end

      private

      # The CTE of GoodJob's skip-locked claim, with fs_claim() choosing
      # the candidate.
      def claim_one(model, included, excluded, locked_by_id, locked_at, lock_type)
        table = model.quoted_table_name
        sql = <<~SQL.squish
          WITH candidate AS MATERIALIZED (
            SELECT (c.job).id AS id, c.lease_id
              FROM fs_claim(?, NULL::#{table}, 1, ? * interval '1 second', ?::text[], ?::text[]) AS c)
          UPDATE #{table} SET locked_by_id = ?, locked_at = ?, lock_type = ?
            FROM candidate WHERE #{table}.id = candidate.id
          RETURNING #{table}.*, candidate.lease_id AS fairshare_lease_id
        SQL
        record = model.unscoped.find_by_sql([sql, queue, lease_seconds, Fairshare::SQL.text_array(included),
                                             Fairshare::SQL.text_array(excluded), locked_by_id, locked_at, lock_type]).first
        hold_lease(record) if record
        record
      end

      # Remembers a claimed job's lease for renewal while it runs.
      def hold_lease(record)
        leases.add(record.id, record.attributes["fairshare_lease_id"])
        @renewer ||= Concurrent::TimerTask.new(execution_interval: lease_seconds / 3) do
          renew_leases
        rescue StandardError => e
          ::GoodJob.logger&.error("fairshare: renewing leases failed: #{e.class}: #{e.message}")
        end.tap(&:execute)
      end

      # The selections to claim from in turn: one per queue for an ordered
      # queue string, else a single one (nil: every queue).
      def included_selections(parsed)
        names = parsed[:include]
        return [nil] if parsed[:all] || names.nil?
        return names.map { |name| [queue_pattern(name)] } if parsed[:ordered_queues]

        [names.map { |name| queue_pattern(name) }]
      end

      # Patterns of the jobs a claim must leave: excluded queues, and paused
      # queues, job classes and labels (when GoodJob's pauses are enabled).
      def excluded_patterns(parsed)
        patterns = Array(parsed[:exclude]).map { |name| queue_pattern(name) }
        return patterns unless ::GoodJob.configuration.enable_pauses

        paused = ::GoodJob::Setting.paused
        patterns + Array(paused[:queues]).map { |name| queue_pattern(name) } +
          Array(paused[:job_classes]).map { |name| "*#{SEPARATOR}#{name}#{SEPARATOR}*" } +
          Array(paused[:labels]).map { |name| "*#{SEPARATOR}*#{SEPARATOR}*,#{name},*" }
      end

      def queue_pattern(name)
        "#{name}#{SEPARATOR}*"
      end

      # SQL for the current time as GoodJob stores it (timestamp in UTC,
      # unless Active Record keeps local times).
      def now_sql
        ActiveRecord.default_timezone == :local ? "LOCALTIMESTAMP" : "(now() AT TIME ZONE 'UTC')"
      end

      # Prepends the claim overrides to GoodJob::Job (called by its load
      # hook, so again if it is reloaded; once per class).
      def install
        target = ::GoodJob::Job.singleton_class
        target.prepend(JobClaim) unless target.include?(JobClaim)
      end
    end

    # Prepended to GoodJob::Job's singleton class.
    module JobClaim
      # GoodJob's claim-and-perform, remembering the parsed queue string for
      # the claim below; with another lock strategy, GoodJob's own claim.
      def perform_with_lock(lock_id:, parsed_queues: nil, queue_select_limit: nil, lock_strategy: :advisory, &block)
        strategy = effective_lock_strategy(lock_strategy)
        unless Fairshare::GoodJob.enabled? && strategy == :skiplocked
          Fairshare::GoodJob.warn_strategy(strategy) if Fairshare::GoodJob.enabled?
          return super
        end

        Fairshare::GoodJob.within_claim(parsed_queues || { all: true }) { super }
      end

      # GoodJob's skip-locked claim with the candidate chosen by fs_claim();
      # the rest (the block, unlocking, callbacks) as GoodJob does it.
      def with_skip_locked_claim(locked_by_id:, locked_at:, lock_type:, &block)
        parsed = Fairshare::GoodJob.current_parsed_queues
        return super if parsed.nil?
        raise ArgumentError, "Must provide a block" unless block

        record = Fairshare::GoodJob.claim(self, parsed, locked_by_id: locked_by_id, locked_at: locked_at,
                                                        lock_type: lock_types[lock_type.to_s])
        begin
          unscoped { yield(record) }
        ensure
          Fairshare::GoodJob.leases.delete(record.id) if record
          record.update(locked_by_id: nil, locked_at: nil, lock_type: nil) if record && !record.destroyed? && record.locked_by_id.present?
          record&.run_callbacks(:perform_unlocked)
        end
      end
    end
  end
end
