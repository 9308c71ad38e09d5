# frozen_string_literal: true

require "pg"
require "fairshare/version"
require "fairshare/leases"

# Fair dequeue for Ruby job queues, backed by the fairshare PostgreSQL
# extension.  Load an integration with `require "fairshare/solid_queue"` or
# `require "fairshare/good_job"`; this file holds what both share: the
# parameterised calls of fs_register_queue() and fs_claim().
module Fairshare
  class Error < StandardError; end

  # Raised when a queue library is configured in a way the integration
  # cannot honour (GoodJob with a lock strategy other than :skiplocked).
  class ConfigurationError < Error; end

  module SQL
    TEXT_ARRAY = PG::TextEncoder::Array.new(name: "text[]", delimiter: ",")
    REGISTRATION_PIECES = %i[filter key running_table running_filter running_key cost charge_runtime
                             create_index enqueued_at selector].freeze

    module_function

    # A Ruby array of strings as a PostgreSQL array literal, to be bound as
    # one text parameter and cast with ::text[] (nil stays NULL).  The
    # encoder quotes every element, so no element can change the query.
    def text_array(values)
      return nil if values.nil?

      TEXT_ARRAY.encode(values.map(&:to_s))
    end

    # Runs `sql` with `?` placeholders replaced by the quoted values
    # (ActiveRecord's own quoting), returning an ActiveRecord::Result.
    def select(connection, sql, *values)
      connection.select_all(ActiveRecord::Base.sanitize_sql_array([sql, *values]), "Fairshare")
    end

    # Whether the installed extension's fs_register_queue() takes the
    # per-queue defaults `max_slots` and `lease` (fairshare after 0.5.0).
    def per_queue_defaults?(connection)
      sql = "SELECT count(*) FROM pg_catalog.pg_proc WHERE proname = 'fs_register_queue' " \
            "AND 'lease' = ANY (proargnames) AND 'max_slots' = ANY (proargnames)"
      connection.select_value(sql).to_i.positive?
    end

    # Registers (or re-registers) a queue with fs_register_queue().  Every
    # piece is bound as a value: fairshare parses and checks the SQL
    # expressions itself against the table.  With an extension too old for
    # per-queue defaults, the slot default is written as the queue's '*'
    # row of fs_limits instead (no limit: 10,000 slots), and the lease is
    # left to the claims, which pass it themselves.
    def register_queue(connection, queue:, ready_table:, tenant:, order_by:, lease_seconds:, max_slots: nil, **pieces)
      unknown = pieces.keys - REGISTRATION_PIECES
      raise ArgumentError, "unknown registration pieces: #{unknown.join(', ')}" if unknown.any?

      args = { queue: queue, ready_table: ready_table, tenant: tenant, order_by: order_by }.merge(pieces.compact)
      defaults = per_queue_defaults?(connection)
      args[:lease] = "#{Float(lease_seconds)} seconds" if defaults && lease_seconds
      args[:max_slots] = Integer(max_slots) if defaults && max_slots
      named = args.keys.map { |name| "#{name} => ?#{'::regclass' if name.to_s.end_with?('_table')}" }
      select(connection, "SELECT queue FROM fs_register_queue(#{named.join(', ')})", *args.values)
      unless defaults
        select(connection, "SELECT 1 FROM fs_set_limit('*', ?, max_slots => ?)", queue, max_slots || 10_000)
      end
      queue
    end

    # The tenant expression wrapped so that rows without a tenant (NULL or
    # empty) fall into the tenant 'default' and are claimed too.
    def with_default_tenant(expression)
      "coalesce(nullif((#{expression})::text, ''), 'default')"
    end
  end
end
