# frozen_string_literal: true

require "fairshare"
require "active_support"
require "active_support/lazy_load_hooks"

module Fairshare
  # Fair claiming for Solid Queue (1.5).  In a Rails initializer:
  #
  #   require "fairshare/solid_queue"
  #   Fairshare::SolidQueue.enable!
  #
  # Solid Queue's workers then take ready executions with fs_claim() instead
  # of `ORDER BY priority, job_id LIMIT n FOR UPDATE SKIP LOCKED`; everything
  # else (queue lists, pauses, priorities, concurrency limits, retries) stays
  # Solid Queue's own.  The queue must be registered once with `register!`.
  module SolidQueue
    DEFAULT_QUEUE = "solid_queue"
    DEFAULT_TENANT = "queue_name"

    class << self
      # The fairshare queue the workers claim from.
      attr_reader :queue

      # Turns fair claiming on for Solid Queue's workers in this process.
      # `lease`: how long a claimed job's slot is held without renewal
      # (default: Solid Queue's process_alive_threshold); each process
      # heartbeat renews the leases of the jobs its workers claimed.
      # `citus`: Solid Queue's ready and claimed executions are distributed
      # by Citus by their queue_name (claimed executions with a queue_name
      # column): claimed executions are written, and ready ones deleted,
      # one queue at a time, so that each statement reaches one shard.
      def enable!(queue: DEFAULT_QUEUE, lease: nil, citus: false)
        @queue = queue.to_s
        @lease = lease
        @citus = citus
        install_when_loaded
        self
      end

      def enabled?
        !@queue.nil?
      end

      def citus?
        enabled? && @citus
      end

      # The leases held by this process's workers, renewed by heartbeats.
      def leases
        @leases ||= Fairshare::Leases.new
      end

      # Seconds of a claimed job's lease: the `lease` given, or Solid
      # Queue's process_alive_threshold, after which Solid Queue itself
      # considers a silent process dead and releases its jobs.
      def lease_seconds(lease = @lease)
        (lease || ::SolidQueue.process_alive_threshold).to_f
      end

      # Registers Solid Queue's ready executions as a fairshare queue (run
      # once, e.g. from a migration).  `tenant`: an SQL expression over
      # solid_queue_ready_executions (default: the queue name); rows whose
      # tenant is NULL or empty go to the tenant 'default'.  `max_slots`:
      # the default slot limit of a tenant (nil: none).  `lease`: the
      # queue's default lease (default: process_alive_threshold).  `citus`:
      # the tables are distributed by Citus by `tenant`, a column, which is
      # then the tenant itself (there is no 'default' for an empty one).
      def register!(connection = ::SolidQueue::Record.connection, queue: DEFAULT_QUEUE, tenant: DEFAULT_TENANT,
                    max_slots: nil, lease: nil, citus: false)
        Fairshare::SQL.register_queue(
          connection,
          queue: queue.to_s,
          ready_table: connection.quote_table_name(::SolidQueue::ReadyExecution.table_name),
          running_table: connection.quote_table_name(::SolidQueue::ClaimedExecution.table_name),
          tenant: citus ? "(#{tenant})::text" : Fairshare::SQL.with_default_tenant(tenant),
          order_by: "priority, job_id",
          key: "job_id",
          selector: "queue_name",
          enqueued_at: "created_at",
          max_slots: max_slots,
          lease_seconds: lease_seconds(lease)
        )
      end

      # Removes the registration (its triggers and the index it created).
      def unregister!(connection = ::SolidQueue::Record.connection, queue: DEFAULT_QUEUE)
        Fairshare::SQL.select(connection, "SELECT fs_unregister_queue(?)", queue.to_s)
      end

      # Claims up to `limit` ready executions among the queues `names` (nil:
      # every queue) in fair order; returns ReadyExecution records holding
      # id and job_id, as Solid Queue's own candidate query does.
      def claim_candidates(model, names, limit)
        sql = "SELECT (c.job).id AS id, (c.job).job_id AS job_id, (c.job).queue_name AS queue_name, " \
              "c.lease_id AS lease_id " \
              "FROM fs_claim(?, NULL::#{model.quoted_table_name}, ?, ? * interval '1 second', ?::text[]) AS c"
        rows = Fairshare::SQL.select(model.connection, sql, queue, Integer(limit), lease_seconds,
                                     Fairshare::SQL.text_array(names))
        rows.map do |row|
          leases.add(row["job_id"], row["lease_id"])
          model.instantiate("id" => row["id"], "job_id" => row["job_id"], "queue_name" => row["queue_name"])
        end
      end

      # Renews this process's leases; called after each process heartbeat.
      def renew_leases(connection = ::SolidQueue::Record.connection)
        leases.renew(connection, lease_seconds)
      end

      private

      # Solid Queue's models are autoloaded (and reloaded in development):
      # install into them once the application is initialized, and again
      # after each reload.
      def install_when_loaded
        return install unless defined?(::Rails) && ::Rails.application

        ::Rails.application.reloader.to_prepare { Fairshare::SolidQueue.send(:install) }
        install if ::Rails.application.initialized?
      end

      # Prepends the claim, heartbeat and (acting on Citus only) claimed
      # execution overrides to the classes loaded now (once per class).
      def install
        claim_target = ::SolidQueue::ReadyExecution.singleton_class
        claim_target.prepend(ReadyExecutionClaim) unless claim_target.include?(ReadyExecutionClaim)
        ::SolidQueue::Process.prepend(ProcessHeartbeat) unless ::SolidQueue::Process.include?(ProcessHeartbeat)
        claimed = ::SolidQueue::ClaimedExecution
        claimed.prepend(ClaimedExecutionOnCitus) unless claimed.include?(ClaimedExecutionOnCitus)
        return unless citus?

        # On Citus the tables' primary keys became unique keys that hold
        # queue_name (examples/citus.d/distribute.sql): id stays the key.
        ::SolidQueue::ReadyExecution.primary_key = "id"
        claimed.primary_key = "id"
      end
    end

    # The queues of one claim, grouped as the worker listed them: QueueSelector
    # expands a wildcard (`tenant_*`, `*` with some queues paused) into one
    # relation per queue; the queues one listed entry expanded to become one
    # relation, claimed in fair order, and the entries keep their order.
    class Selection
      # The queue names a relation of ReadyExecution selects: an array, nil
      # for every queue, or :unknown for a relation built otherwise.
      def self.names_of(relation)
        hash = relation.where_values_hash
        return Array(hash["queue_name"]).map(&:to_s) if hash.key?("queue_name")
        return nil if relation.where_clause.empty?

        :unknown
      end

      def initialize(selector)
        @selector = selector
      end

      # The relations to claim from, in order.
      def relations
        scoped = @selector.scoped_relations
        return scoped if scoped.size <= 1

        names = scoped.map { |relation| self.class.names_of(relation) }
        return scoped if names.any? { |n| !n.is_a?(Array) }

        names.flatten.chunk_while { |a, b| entry_of(a) == entry_of(b) }
             .map { |group| @selector.relation.queued_as(group) }
      end

      private

      # Index of the listed entry a queue name came from: an exact name, a
      # prefix (`tenant_*`) or `*` (which takes every queue).
      def entry_of(name)
        raw = @selector.raw_queues
        raw.index("*") || raw.index(name) ||
          raw.index { |entry| entry.end_with?("*") && name.start_with?(entry.delete_suffix("*")) }
      end
    end

    # Prepended to ReadyExecution's singleton class: Solid Queue's claim with
    # its candidate query replaced by fs_claim().
    module ReadyExecutionClaim
      # Claims up to `limit` executions for `process_id` from `queue_list`,
      # one listed entry at a time as Solid Queue does, each fairly.
      def claim(queue_list, limit, process_id)
        return super unless Fairshare::SolidQueue.enabled?

        selection = Fairshare::SolidQueue::Selection.new(::SolidQueue::QueueSelector.new(queue_list, self))
        selection.relations.flat_map do |queue_relation|
          select_and_lock(queue_relation, process_id, limit).tap { |locked| limit -= locked.size }
        end
      end

      private

      # Solid Queue's candidate query, in fair order among the relation's
      # queues; a relation the integration does not recognise keeps the
      # stock query.
      def select_candidates(queue_relation, limit)
        names = Fairshare::SolidQueue::Selection.names_of(queue_relation)
        return super if names == :unknown || !Fairshare::SolidQueue.enabled?

        Fairshare::SolidQueue.claim_candidates(self, names, limit)
      end

      # Solid Queue's lock of the candidates; on Citus one queue (one shard)
      # at a time: the claimed executions written with their queue_name,
      # then the ready ones deleted by queue_name and id.
      def lock_candidates(executions, process_id)
        return super unless Fairshare::SolidQueue.citus?
        return [] if executions.none?

        job_ids = executions.map(&:job_id)
        ::SolidQueue.instrument(:claim, process_id: process_id, job_ids: job_ids) do |payload|
          claimed = executions.group_by(&:queue_name).flat_map do |queue_name, group|
            where(queue_name: queue_name, id: group.map(&:id)).delete_all
            # Saved without validation, as insert_all would: no read of the
            # process and the job per row.
            group.map do |execution|
              ::SolidQueue::ClaimedExecution.new(job_id: execution.job_id, process_id: process_id,
                                                 queue_name: queue_name).tap { |c| c.save!(validate: false) }
            end
          end
          payload[:size] = claimed.size
          payload[:claimed_job_ids] = job_ids
          claimed
        end
      end
    end

    # Prepended to SolidQueue::ClaimedExecution, for tables distributed by
    # Citus by queue_name: a claimed execution is locked, updated and
    # deleted by its queue_name and id, so that each of those statements
    # reaches the one shard that holds it (Citus refuses a FOR UPDATE over
    # every shard, and sends an update or delete by id alone to all of
    # them).
    module ClaimedExecutionOnCitus
      private

      # Solid Queue's guard against finishing a job twice, with the lock
      # taken on the execution's own shard.
      def unless_already_finalized(&block)
        return super unless Fairshare::SolidQueue.citus?

        transaction do
          return false unless self.class.unscoped.lock.find_by(queue_name: queue_name, id: id)

          block.call
        end
      end

      # The WHERE of Active Record's update and delete of this record: its
      # id and, on Citus, its queue_name.
      def _query_constraints_hash
        return super unless Fairshare::SolidQueue.citus?

        super.merge("queue_name" => attribute_in_database("queue_name"))
      end
    end

    # Prepended to SolidQueue::Process: every heartbeat of a process record
    # also renews the leases of the jobs its workers hold.
    module ProcessHeartbeat
      # Solid Queue's heartbeat, then a renewal of this process's leases (a
      # failing renewal is logged and does not stop the heartbeat).
      def heartbeat
        super.tap do
          Fairshare::SolidQueue.renew_leases
        rescue StandardError => e
          ::SolidQueue.logger&.error("fairshare: renewing leases failed: #{e.class}: #{e.message}")
        end
      end
    end
  end
end
