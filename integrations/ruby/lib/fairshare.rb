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
    CASTS = { ready_table: "::regclass", running_table: "::regclass", lease: "::interval" }.freeze

    module_function

    # A Ruby array of strings as a PostgreSQL array literal, to be bound as
    # one text parameter and cast with ::text[] (nil stays NULL).  The
    # encoder quotes every element, so no element can change the query.
    def text_array(values)
      return nil if values.nil?

      TEXT_ARRAY.encode(values.map(&:to_s))
    end

    # Runs `sql` with `?` placeholders replaced by the values, quoted by
    # `connection` itself (the queue library's, which may be another
    # database than the application's), returning an ActiveRecord::Result.
    def select(connection, sql, *values)
      connection.select_all(bind(connection, sql, values), "Fairshare")
    end

    # `sql` with each `?` replaced by the next value, quoted.  The SQL
    # texts are the gem's own and contain no other question marks.
    def bind(connection, sql, values)
      parts = sql.split("?", -1)
      unless parts.size - 1 == values.size
        raise ArgumentError, "#{parts.size - 1} placeholders for #{values.size} values"
      end

      parts.each_with_index.map { |part, i| i.zero? ? part : connection.quote(values[i - 1]) + part }.join
    end

    # Registers (or re-registers) a queue with fs_register_queue().  Every
    # piece is bound as a value: fairshare parses and checks the SQL
    # expressions itself against the table.  `max_slots`: the queue's slot
    # limit of a tenant without a row in fs_limits (nil: no limit, a lone
    # tenant may use every free worker); `lease_seconds`: the queue's
    # default lease.
    def register_queue(connection, queue:, ready_table:, tenant:, order_by:, lease_seconds:, max_slots: nil, **pieces)
      unknown = pieces.keys - REGISTRATION_PIECES
      raise ArgumentError, "unknown registration pieces: #{unknown.join(', ')}" if unknown.any?

      args = { queue: queue, ready_table: ready_table, tenant: tenant, order_by: order_by }.merge(pieces.compact)
      args[:max_slots] = Integer(max_slots) unless max_slots.nil?
      args[:lease] = "#{Float(lease_seconds)} seconds" unless lease_seconds.nil?
      named = args.keys.map { |name| "#{name} => ?#{CASTS[name]}" }
      select(connection, "SELECT queue FROM fs_register_queue(#{named.join(', ')})", *args.values)
      queue
    end

    # The tenant expression wrapped so that every row has a tenant fairshare
    # can claim: rows without one (NULL or empty) fall into 'default', and a
    # tenant longer than fairshare's 63 bytes becomes 'md5:' and its md5.
    def with_default_tenant(expression)
      tenant = "coalesce(nullif((#{expression})::text, ''), 'default')"
      "CASE WHEN octet_length(#{tenant}) <= 63 THEN #{tenant} ELSE 'md5:' || md5(#{tenant}) END"
    end
  end
end
